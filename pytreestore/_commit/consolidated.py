"""zarr v3 consolidated metadata in the root ``zarr.json``, kept in step with every commit.

zarr-python and xarray open a group by its consolidated metadata when it has some: they then
list nothing (so they never meet ``.pytreestore/``, which is no zarr node) and warn about
nothing. The root ``zarr.json`` therefore carries ``consolidated_metadata``: every group below
the root and every array, each array with the record axis cut to the rows its table has
**committed**. A reader that goes by it (zarr-python and xarray with default arguments) sees
committed records only, even while a writer has grown the arrays past the commit.

It is written after the commit record (:meth:`pytreestore._commit.committer.Committer.advance`)
and when a writer opens the store (:func:`pytreestore._commit.protocol.prepare_append`), so
it lags a commit at most, and only until the next writer opens the store; a truncate writes
it before its commit record (:func:`pytreestore._commit.truncate.shrink_root`). Either way it
never shows a row past the commit record in force. pytreestore's own
readers never use it: they trust the commit record and each array's ``zarr.json``.

The array documents are built from the schema (:func:`pytreestore.backends._metadata.array_document`,
which both backends write byte for byte), so a commit reads no array metadata.

Example:
    >>> import json, numpy as np, pytreestore
    >>> from pytreestore._format.names import ROOT_KEY
    >>> s = pytreestore.create("memory://doc-consolidated", {"a": {"x": np.int8(0)}})
    >>> s.extend({"a": {"x": np.int8(i)}} for i in range(3)); s.flush()
    >>> meta = json.loads(s._backend.read_bytes(ROOT_KEY))["consolidated_metadata"]["metadata"]
    >>> sorted(meta), meta["a/x"]["shape"]
    (['a', 'a/x'], [3])
"""

from __future__ import annotations

import json

from pytreestore._commit.layouts import group_document, group_paths, layouts
from pytreestore._commit.record import Commit
from pytreestore._format.names import ROOT_KEY
from pytreestore._format.schema import TreeSchema
from pytreestore._format.validate import CONSOLIDATED_AT, root_document, root_head
from pytreestore.backends import Backend
from pytreestore.backends._metadata import array_document

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


__all__ = ["MEMBER", "consolidated", "spliced", "with_consolidated", "write"]
