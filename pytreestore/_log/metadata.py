"""The zarr v3 metadata a commit writes: each array's ``zarr.json``, and the consolidated root.

The on-disk layout of a schema: what each array's ``zarr.json`` holds, and the groups
between the root and the arrays.

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> schema = TreeSchema.from_example({"a": {"x": np.zeros(3, np.float32)}}, chunk_records=64)
    >>> [(l.key, l.shape, l.chunks) for l in layouts(schema)], group_paths(schema)
    ([('a/x', (3,), (64, 3))], ['a'])

zarr v3 consolidated metadata in the root ``zarr.json``, kept in step with every commit.

zarr-python and xarray open a group by its consolidated metadata when it has some: they then
list nothing (so they never meet ``.pytreestore/``, which is no zarr node) and warn about
nothing. The root ``zarr.json`` therefore carries ``consolidated_metadata``: every group below
the root and every array, each array with the record axis cut to the rows its table has
**committed**. A reader that goes by it (zarr-python and xarray with default arguments) sees
committed records only, even while a writer has grown the arrays past the commit.

It is written after the commit record (:meth:`pytreestore._log.committer.Committer.advance`)
and when a writer opens the store (:func:`pytreestore._log.protocol.prepare_append`), so
it lags a commit at most, and only until the next writer opens the store; a truncate writes
it before its commit record (:func:`pytreestore._log.prune.shrink_root`). Either way it
never shows a row past the commit record in force. pytreestore's own
readers never use it: they trust the commit record and each array's ``zarr.json``.

The array documents are built from the schema (:func:`pytreestore.backends._metadata.array_document`,
which both backends write byte for byte), so a commit reads no array metadata.

Example:
    >>> import json, numpy as np, pytreestore
    >>> from pytreestore._format.keys import ROOT_KEY
    >>> s = pytreestore.create("memory://doc-consolidated", {"a": {"x": np.int8(0)}})
    >>> s.extend({"a": {"x": np.int8(i)}} for i in range(3)); s.flush()
    >>> meta = json.loads(s._backend.read_bytes(ROOT_KEY))["consolidated_metadata"]["metadata"]
    >>> sorted(meta), meta["a/x"]["shape"]
    (['a', 'a/x'], [3])
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from pytreestore._format import dtypes as _dtypes
from pytreestore._format.columns import inner_records
from pytreestore._format.keys import ROOT_KEY
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore._format.validate import CONSOLIDATED_AT, root_document, root_head
from pytreestore._log.commit_record import Commit
from pytreestore.backends import Backend, ColumnLayout
from pytreestore.backends._metadata import array_document


def layouts(schema: TreeSchema) -> list[ColumnLayout]:
    """The on-disk layout of every column of ``schema``."""
    return column_layouts(schema.storage_columns, schema.codec, schema.inner_chunk_bytes)


def column_layouts(
    columns: Sequence[ColumnSpec], codec: str | None, inner_chunk_bytes: int | None = None
) -> list[ColumnLayout]:
    """The on-disk layout of ``columns``, compressed with ``codec``, each chunk a shard of
    inner chunks of at most ``inner_chunk_bytes`` where :func:`inner_records` says."""
    return [
        ColumnLayout(
            key=c.key,
            dtype=c.dtype,
            shape=c.shape,
            chunks=c.chunks,
            codec=codec,
            dimension_names=tuple(c.dimension_names),
            fill_value=_dtypes.fill_value(c.dtype) if c.default is None else c.default,
            inner=inner_records(c, inner_chunk_bytes),
        )
        for c in columns
    ]


def group_paths(schema: TreeSchema) -> list[str]:
    """The paths of the groups between the root and ``schema``'s arrays, sorted: every
    proper prefix of a storage key."""
    groups: set[str] = set()
    for c in schema.storage_columns:
        parts = c.key.split("/")
        groups.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return sorted(groups)


def group_document(attributes: dict[str, object]) -> dict[str, object]:
    """A zarr v3 group's ``zarr.json`` document with ``attributes``."""
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes}


#: the member of the root document zarr-python reads consolidated metadata from
MEMBER = "consolidated_metadata"


def _empty() -> dict[str, object]:
    return {"kind": "inline", "must_understand": False, "metadata": {}}


def _group() -> dict[str, object]:
    """A group below the root as zarr-python's ``consolidate_metadata`` records it."""
    return {**group_document({}), MEMBER: _empty()}


def consolidated(schema: TreeSchema, commit: Commit) -> dict[str, object]:
    """The ``consolidated_metadata`` of a store of ``schema`` at ``commit``: every group and
    array below the root, each array holding the rows of its table that ``commit`` holds."""
    members: dict[str, object] = {path: _group() for path in group_paths(schema)}
    for column, layout in zip(schema.storage_columns, layouts(schema)):
        members[column.key] = array_document(layout, commit.rows(column.table))
    return {**_empty(), "metadata": dict(sorted(members.items()))}


def with_consolidated(document: dict[str, object], schema: TreeSchema, commit: Commit) -> bytes:
    """``document`` (a root ``zarr.json``, left unchanged) with the consolidated metadata of
    ``schema`` at ``commit``, as the bytes to write; it comes last, after the attributes."""
    out = {k: v for k, v in document.items() if k != MEMBER}
    head = json.dumps(out, indent=1).encode()
    return spliced(head[: head.rindex(b"\n}")], consolidated(schema, commit))


def spliced(head: bytes, metadata: dict[str, object]) -> bytes:
    """The root ``head`` (:func:`pytreestore._format.validate.root_head`, written with
    ``json.dumps(..., indent=1)``) followed by the consolidated ``metadata`` on one line.

    One line, by json's C encoder: every commit rewrites it, and for a store of a hundred
    columns ``indent=1`` (Python's encoder) took 15 ms a commit where this takes one."""
    return head + CONSOLIDATED_AT + json.dumps(metadata).encode() + b"\n}"


def write(backend: Backend, schema: TreeSchema, commit: Commit) -> None:
    """Rewrites the root ``zarr.json`` with the consolidated metadata of ``commit`` (one
    atomic put, none when it holds them already; its attributes, the schema, stay)."""
    raw = backend.read_bytes(ROOT_KEY)
    if raw is None:
        return  # not a store (yet): nothing to consolidate into
    head = root_head(raw)
    if head is None:  # a root of an older pytreestore, or written by another program
        data = with_consolidated(root_document(raw), schema, commit)
    else:  # the schema not encoded again
        data = spliced(head, consolidated(schema, commit))
    if data != raw:  # a writer opening a store already in step writes nothing
        backend.write_bytes(ROOT_KEY, data)


__all__ = [
    "MEMBER",
    "column_layouts",
    "consolidated",
    "group_document",
    "group_paths",
    "layouts",
    "spliced",
    "with_consolidated",
    "write",
]
