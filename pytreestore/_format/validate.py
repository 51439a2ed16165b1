"""Checking what a reader finds on disk against the format, before trusting it.

Two checks, each failing with an error that names the file and the problem:

* :func:`root_schema` parses the root group's ``zarr.json`` and validates it against
  ``pytreestore/schema.json`` (JSON Schema, draft 2020-12), after checking ``format_version``:
  a newer version is refused with :class:`FormatVersionError` before its content is judged,
  since a newer format may follow a newer schema.
* :func:`check_column` compares one column array's metadata (its data type, shape and chunk
  shape) with the column the schema describes.

jsonschema takes tens of microseconds per column, far more than the rest of an open, so the
full validation runs only when it can find something. A writer validates the schema before
it writes it (:func:`stamped`) and stores a ``digest`` of its canonical JSON beside it; a
reader that finds the digest matching the content knows the document is exactly what a
writer validated. A document without a digest, or edited since (by hand, by another program,
by damage), is validated in full. Documents that passed are also remembered, by a digest of
their bytes, for the life of the process, and :func:`load_schema` keeps the schemas they
parsed to, so that opening an unchanged store again costs a read and a hash.

Example:
    >>> import json
    >>> raw = json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}).encode()
    >>> root_schema(raw, "/data/run")
    Traceback (most recent call last):
    ...
    pytreestore.errors.NotAStoreError: /data/run is a zarr node but not a pytreestore store: /data/run/zarr.json has no 'pytreestore' attribute
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.resources
import json
import re
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jsonschema
import jsonschema.exceptions

from pytreestore._format.keys import ROOT_KEY
from pytreestore._format.nodes import resolve_class
from pytreestore._format.schema import FORMAT_VERSION, TreeSchema
from pytreestore._runtime import RUNTIME
from pytreestore.errors import (
    CorruptStoreError,
    FormatVersionError,
    NotAStoreError,
    PyTreeStoreError,
    UnsupportedTreeError,
)

if TYPE_CHECKING:
    from pytreestore.backends._base import ColumnShape

DIGEST_KEY = "digest"
_DIGEST_PREFIX = "blake2b-160:"
_VALIDATED: dict[bytes, None] = {}
_VALIDATED_LOCK = threading.Lock()
#: parsed schemas by (document digest, generic): the schema and the classes its treedef holds
_SCHEMAS: dict[tuple[bytes, bool], tuple[TreeSchema, tuple[tuple[str, type], ...]]] = {}


@functools.cache
def json_schema() -> dict[str, Any]:
    """The JSON Schema of the root metadata, as shipped in ``pytreestore/schema.json``."""
    text = importlib.resources.files("pytreestore").joinpath("schema.json").read_text("utf-8")
    return json.loads(text)


@functools.cache
def validator(definition: str | None = None) -> jsonschema.Draft202012Validator:
    """A validator for the root metadata, or for one of its ``$defs`` (``"commit"``, ...)."""
    schema = json_schema()
    if definition is not None:
        schema = {"$ref": f"#/$defs/{definition}", "$defs": schema["$defs"]}
    return jsonschema.Draft202012Validator(schema)


def schema_errors(document: Any, definition: str | None = None) -> list[str]:
    """Every way ``document`` breaks the schema, each as ``"at /json/pointer: message"``."""
    errors = sorted(validator(definition).iter_errors(document), key=lambda e: list(e.path))
    return [_describe(e) for e in errors]


def root_schema(raw: bytes | None, where: str) -> dict[str, Any]:
    """The ``pytreestore`` attribute of root metadata ``raw``, once it has passed every check.

    Args:
        raw: the bytes of the store's root ``zarr.json`` (not None: the caller reports a
            missing file, since only it can tell an empty location from other data).
        where: the store's location, for messages.

    Raises:
        NotAStoreError: not JSON, not a zarr group, or no ``pytreestore`` attribute.
        FormatVersionError: a ``format_version`` newer than this pytreestore reads.
        CorruptStoreError: the document breaks the format's JSON Schema.
    """
    return _root_info(raw, where, _head_bytes(raw))


def _root_info(
    raw: bytes | None, where: str, head_bytes: bytes | None, seen: bytes | None = None
) -> dict[str, Any]:
    file = f"{where}/{ROOT_KEY}"
    head = _head(head_bytes)
    document = _parse(raw, file) if head is None else head[0]
    attrs = document.get("attributes") if isinstance(document, dict) else None
    info = attrs.get("pytreestore") if isinstance(attrs, dict) else None
    if not isinstance(info, dict):
        raise NotAStoreError(
            f"{where} is a zarr node but not a pytreestore store: {file} has no "
            "'pytreestore' attribute"
        )
    _check_version(info.get("format_version"), where, file)
    if seen is None or head is None:
        seen = _digest_bytes(raw if head is None else head[1])
    if seen not in _VALIDATED:
        envelope = (document.get("zarr_format"), document.get("node_type")) == (3, "group")
        if not envelope or info.get(DIGEST_KEY) != digest(info):
            _validate_root(document, file)
        _remember(seen)
    return info


def load_schema(raw: bytes, where: str, *, like: Any = None, generic: bool = False) -> TreeSchema:
    """The store's :class:`TreeSchema` from root metadata ``raw``, checked by
    :func:`root_schema`.

    Opening the same unchanged store again in this process (same bytes, no ``like``) reuses
    the schema parsed the first time, as long as every class its treedef holds is still the
    class its ``module:qualname`` names (a reloaded module's classes are picked up afresh).
    """
    head = _head_bytes(raw)
    key = (_digest_bytes(raw if head is None else head), generic)
    if like is None and (hit := _SCHEMAS.get(key)) is not None:
        schema, classes = hit
        if all(_same_class(name, cls) for name, cls in classes):
            return schema
    info = _root_info(raw, where, head, key[0])
    schema = TreeSchema.from_json(info, like=like, generic=generic)
    schema = dataclasses.replace(schema, digest=schema_id(info))
    if like is None:
        classes = () if generic else tuple((n, resolve_class(n)) for n in _class_names(schema.tree))
        with _VALIDATED_LOCK:
            if len(_SCHEMAS) >= RUNTIME.caches.parsed_schemas:
                _SCHEMAS.pop(next(iter(_SCHEMAS)))
            _SCHEMAS[key] = (schema, classes)
    return schema


def _class_names(node: dict[str, Any]) -> set[str]:
    names = {node["type"]} if "type" in node else set()
    for child in node.get("children", ()):
        names |= _class_names(child)
    return names


def _same_class(name: str, cls: type) -> bool:
    try:
        return resolve_class(name) is cls
    except PyTreeStoreError:
        return False


def _digest_bytes(raw: bytes | None) -> bytes:
    return hashlib.blake2b(raw or b"", digest_size=20).digest()


def digest(info: dict[str, Any]) -> str:
    """The digest of a schema: BLAKE2b (160 bits) of its canonical JSON without ``digest``.

    Canonical JSON: keys sorted, no whitespace, UTF-8 (``json.dumps(..., sort_keys=True,
    separators=(",", ":"), ensure_ascii=False)``).
    """
    body = {k: v for k, v in info.items() if k != DIGEST_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _DIGEST_PREFIX + hashlib.blake2b(text.encode(), digest_size=20).hexdigest()


def schema_id(info: dict[str, Any]) -> str:
    """The id of a stored schema document in the version log: its ``digest`` (computed for
    documents of older writers that have none)."""
    stamp = info.get(DIGEST_KEY)
    return stamp if isinstance(stamp, str) and stamp.startswith(_DIGEST_PREFIX) else digest(info)


def id_of(schema: TreeSchema) -> str:
    """The id of ``schema``: the digest it was read with, or that of the document it writes."""
    return schema.digest or digest(schema.to_json())


def stamped(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` (a schema about to be written) validated, with its ``digest`` added.

    Raises:
        UnsupportedTreeError: the schema would break the format's JSON Schema (a tree the
            format cannot describe).
    """
    info = {k: v for k, v in info.items() if k != DIGEST_KEY}
    stamp = digest(info)
    seen = f"stamped:{stamp}".encode()  # the same schema again (a new store of the same tree)
    if seen not in _VALIDATED:
        document = {"zarr_format": 3, "node_type": "group", "attributes": {"pytreestore": info}}
        error = jsonschema.exceptions.best_match(validator().iter_errors(document))
        if error is not None:
            raise UnsupportedTreeError(
                f"the store's schema would not follow the pytreestore format: {_describe(error)}"
            )
        _remember(seen)
    return {**info, DIGEST_KEY: stamp}


#: where a root ``zarr.json`` that pytreestore wrote (``json.dumps(..., indent=1)``) starts
#: its last member, the consolidated metadata
CONSOLIDATED_AT = b',\n "consolidated_metadata": '
_TAIL = CONSOLIDATED_AT


def root_head(raw: bytes | None) -> bytes | None:
    """The root ``zarr.json`` ``raw`` before its consolidated metadata (whole or not), or
    None if it has none where pytreestore writes it."""
    at = raw.find(_TAIL) if raw else -1
    return raw[:at] if raw and at >= 0 else None


#: how a root ``zarr.json`` that pytreestore wrote starts, up to its format version
_HEAD = re.compile(
    rb'\s*\{\s*"zarr_format": 3,\s*"node_type": "group",\s*"attributes": \{\s*'
    rb'"pytreestore": \{\s*"format_version": (\d{1,9}),'
)


def deferrable(raw: bytes, where: str) -> bool:
    """Whether a reader may parse root metadata ``raw`` later, on first use: it starts as
    pytreestore writes it, with a format version this pytreestore reads (found without
    parsing the rest). Anything else is parsed at once, where every error can be named.

    Raises:
        FormatVersionError: the format version is newer than this pytreestore reads.

    Example:
        >>> deferrable(b'{"zarr_format": 3, "node_type": "group", "attributes": '
        ...            b'{"pytreestore": {"format_version": 3, "tree": {}}}}', "/data/run")
        True
        >>> deferrable(b'{"node_type": "group"}', "/data/run")
        False
    """
    match = _HEAD.match(raw)
    if match is None:
        return False
    _check_version(int(match[1]), where, f"{where}/{ROOT_KEY}")
    return True


def _head_bytes(raw: bytes | None) -> bytes | None:
    """The root ``zarr.json`` ``raw`` up to its consolidated metadata (which pytreestore's
    readers never use), or None if it has none where pytreestore writes it, or its tail does
    not look whole (its braces unbalanced): then the whole document is parsed."""
    if not raw:
        return None
    at = raw.find(_TAIL)
    if at < 0:
        return None
    if not raw.rstrip().endswith(b"}") or _unbalanced(raw, at):
        return None
    return raw[:at]


def _unbalanced(raw: bytes, at: int) -> bool:
    return raw.count(b"{", at) - raw.count(b"}", at) != -1


def _head(head: bytes | None) -> tuple[dict[str, Any], bytes] | None:
    """The root document less its consolidated metadata (``head``, from :func:`_head_bytes`),
    parsed, and the bytes it came from; None where the whole document must be parsed.

    The consolidated metadata of a root ``zarr.json`` of 1,000 columns is about 1 MB, five
    times the schema, and only zarr readers use it: an open parses the schema alone, and
    :func:`pytreestore._inspect.verify.verify_store` checks the consolidated metadata.
    """
    if head is None:
        return None
    try:
        document = json.loads(head + b"}")
    except ValueError:
        return None
    return (document, head) if isinstance(document, dict) else None


def root_document(raw: bytes | None) -> dict[str, Any]:
    """A root ``zarr.json`` that passed :func:`root_schema`, parsed to rewrite it: whole, or
    without its consolidated metadata if only that is damaged (the writer rewrites it)."""
    try:
        document = json.loads(raw or b"{}")
    except ValueError:
        head = _head(_head_bytes(raw))
        if head is None:
            raise
        document = head[0]
    return document


def _parse(raw: bytes | None, file: str) -> Any:
    try:
        return json.loads(raw or b"")
    except ValueError as err:
        raise NotAStoreError(
            f"{file} is not valid JSON ({err}; {len(raw or b'')} bytes): the store's root "
            "metadata is truncated or damaged. Restore it from a copy of the store."
        ) from err


def _check_version(version: Any, where: str, file: str) -> None:
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise NotAStoreError(
            f"{file} has an invalid format_version {version!r}: expected an integer from 1 "
            f"to {FORMAT_VERSION}"
        )
    if version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{file} says {where} is in pytreestore format {version}, newer than the {FORMAT_VERSION} "
            "this version reads; upgrade pytreestore to read it"
        )


def _validate_root(document: Any, file: str) -> None:
    error = jsonschema.exceptions.best_match(validator().iter_errors(document))
    if error is not None:
        raise CorruptStoreError(
            f"{file} does not follow the pytreestore format {FORMAT_VERSION} (its JSON Schema "
            f"is pytreestore/schema.json): {_describe(error)}. The store's root metadata was "
            "damaged or written by another program."
        )


def _remember(digest: bytes) -> None:
    with _VALIDATED_LOCK:
        if len(_VALIDATED) >= RUNTIME.caches.validated_documents:
            _VALIDATED.pop(next(iter(_VALIDATED)))
        _VALIDATED[digest] = None


def forget_validated() -> None:
    """Forgets which documents passed and what they parsed to, so that the next open
    validates and parses again (for benchmarks and tests)."""
    with _VALIDATED_LOCK:
        _VALIDATED.clear()
        _SCHEMAS.clear()


def _describe(error: jsonschema.exceptions.ValidationError) -> str:
    pointer = "".join(f"/{p}" for p in error.absolute_path) or "/"
    message = error.message if len(error.message) <= 200 else error.message[:197] + "..."
    return f"at {pointer}: {message}"


# ---- column arrays -------------------------------------------------------------------------------


def check_column(
    file: str,
    layout: ColumnShape,
    *,
    data_type: Any,
    shape: Sequence[int],
    chunks: Sequence[int | None] | None,
    records: int,
) -> None:
    """Checks one column array's metadata, found in ``file``, against its ``layout``.

    ``shape`` is the array's, record axis first. The array may hold more than ``records``
    rows (a writer's uncommitted tail), never fewer.

    Raises:
        CorruptStoreError: naming ``file``, what the schema expects and what the file holds.
    """
    problems = []
    if data_type != layout.dtype.name:
        problems.append(f"data_type {data_type!r} where the schema says {layout.dtype.name!r}")
    if len(shape) != len(layout.shape) + 1 or tuple(shape[1:]) != layout.shape:
        want = ", ".join(["records", *map(str, layout.shape)])
        problems.append(f"shape {list(shape)} where the schema says [{want}]")
    if chunks is not None and tuple(chunks) != layout.chunks:
        problems.append(f"chunk shape {list(chunks)} where the schema says {list(layout.chunks)}")
    if not problems and shape[0] < records:
        problems.append(f"{shape[0]} records where {records} are committed")
    if problems:
        raise CorruptStoreError(
            f"{file} disagrees with the store's schema: it has {'; '.join(problems)}. The "
            "column was rewritten or damaged outside pytreestore."
        )


def array_facts(document: Any, file: str) -> tuple[Any, list[int], list[int] | None]:
    """``(data_type, shape, chunk_shape)`` of a parsed array ``zarr.json``, or a clear error."""
    try:
        if document["node_type"] != "array":
            raise ValueError(f"node_type is {document['node_type']!r}, not 'array'")
        shape = [int(n) for n in document["shape"]]
        grid = document["chunk_grid"]
        chunks = [int(n) for n in grid["configuration"]["chunk_shape"]]
        return document["data_type"], shape, chunks
    except (KeyError, TypeError, ValueError) as err:
        raise CorruptStoreError(
            f"{file} is not the zarr v3 array metadata of a column ({err!r})"
        ) from err


#: why a column's array the schema lists is not there, and what to do
COLUMN_GONE = (
    "the column the store's schema lists has no array on disk. If a writer dropped it "
    "(evolve) and vacuum() removed its array since this store object opened an older "
    "version, open the store again; else it was deleted outside pytreestore: restore it "
    "from a copy of the store"
)


def parse_array_json(raw: bytes | None, file: str) -> dict[str, Any]:
    """A column array's ``zarr.json``, parsed; a clear error when missing or damaged."""
    if raw is None:
        raise CorruptStoreError(f"{file} is missing: {COLUMN_GONE}")
    try:
        document = json.loads(raw)
    except ValueError as err:
        raise CorruptStoreError(
            f"{file} is not valid JSON ({err}; {len(raw)} bytes): the column's metadata is "
            "truncated or damaged"
        ) from err
    if not isinstance(document, dict):
        raise CorruptStoreError(f"{file} is not a JSON object")
    return document


__all__ = [
    "COLUMN_GONE",
    "CONSOLIDATED_AT",
    "array_facts",
    "check_column",
    "deferrable",
    "digest",
    "forget_validated",
    "id_of",
    "json_schema",
    "load_schema",
    "parse_array_json",
    "root_document",
    "root_head",
    "root_schema",
    "schema_errors",
    "schema_id",
    "stamped",
    "validator",
]
