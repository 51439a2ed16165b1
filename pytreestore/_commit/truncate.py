"""What ``truncate(n)`` commits: the rows of every table at record ``n``, and the schema.

A fixed store's version of ``n`` records is rows ``[0, n)`` of its columns. In a ragged store
each axis's table holds the elements of the records before it: with cumulative end offsets,
the rows of an axis's table at ``n`` records are ``offsets[rows - 1]`` of the table its offsets
live in (0 for no rows), parents before children.

A column that ``evolve`` added (or a ragged structure first shown) after those rows starts
past them; its ``start`` is lowered to them (:func:`lower_starts`), which reads the same:
rows before ``start`` read the column's default, and the array holds its fill value, the
default, in every row no record wrote.

The root ``zarr.json`` is written *before* the truncate's commit record (:func:`shrink_root`):
its consolidated metadata then shows the truncated rows, fewer than either commit holds, so
zarr-python and xarray never see rows past the commit; its schema (the starts lowered) is
not the one the commit record in force names, so pytreestore's readers read with the
commit's schema from the version log until the commit record follows
(:func:`pytreestore._open.reader.committed_schema`), and a writer opening after a crash
between the two puts the commit's schema back (:func:`pytreestore._commit.protocol.restore_root`).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-truncate-rows", {"p": [np.int8(0)]}, ragged=True)
    >>> s.extend([{"p": [np.int8(1)] * 2}, {"p": [np.int8(2)] * 3}]); s.flush()
    >>> rows_at(s._backend, s.schema, s.commit_now(), 1, s.path)
    {None: 1, "['p']": 2}
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

from pytreestore._commit import consolidated, versions
from pytreestore._commit.record import Commit
from pytreestore._format import validate as _validate
from pytreestore._format.names import ROOT_KEY
from pytreestore._format.ragged import AxisInfo, PresenceInfo
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore.backends import Backend

_Starts = TypeVar("_Starts", ColumnSpec, AxisInfo, PresenceInfo)


def rows_at(
    backend: Backend, schema: TreeSchema, commit: Commit, records: int, where: str
) -> dict[str | None, int]:
    """The rows of every table of a store holding its first ``records`` records: the record
    table (None) and each axis's table."""
    rows: dict[str | None, int] = {None: records}
    for axis in schema.tables.axes:
        rows[axis.path] = _rows(backend, axis.offsets, rows[axis.table], commit, axis.table)
    return rows


def tables_of(rows: dict[str | None, int]) -> dict[str, int] | None:
    """The ``tables`` of a commit from :func:`rows_at` (None for a fixed store)."""
    tables = {str(t): n for t, n in rows.items() if t is not None}
    return tables if len(rows) > 1 else None


def lower_starts(schema: TreeSchema, rows: dict[str | None, int]) -> TreeSchema | None:
    """``schema`` with every column, axis and optional subtree starting at most at its
    table's ``rows``; None when none starts past them."""
    columns = tuple(_lowered(c, rows[c.table]) for c in schema.columns)
    tables = schema.tables
    axes = tuple(_lowered(a, rows[a.table]) for a in tables.axes)
    presence = tuple(_lowered(p, rows[p.table]) for p in tables.presence)
    tables = dataclasses.replace(tables, axes=axes, presence=presence)
    if columns == schema.columns and tables == schema.tables:
        return None
    return dataclasses.replace(schema.with_tables(tables), columns=columns, digest=None)


def shrink_root(
    backend: Backend,
    schema: TreeSchema,
    rows: dict[str | None, int],
    where: str,
    *,
    lowered: bool,
) -> TreeSchema:
    """Writes the root ``zarr.json`` of a truncate to ``rows`` (:func:`rows_at`) before its
    commit record, in one atomic put: the consolidated metadata of those rows, and with
    ``lowered`` the new ``schema`` (:func:`lower_starts`, kept in the version log first);
    the schema for the commit to name (with its digest).

    Until the commit record follows, the root holds fewer rows than the commit in force (safe
    for zarr readers) and, with ``lowered``, a schema that commit does not name (pytreestore's
    readers then read with the one it names)."""
    raw = backend.read_bytes(ROOT_KEY)
    _validate.root_schema(raw, where)  # a root damaged outside pytreestore is not rewritten
    document = _validate.root_document(raw)
    if lowered:
        info = _validate.stamped(schema.to_json())
        versions.save_schema(backend, info)
        document.setdefault("attributes", {})["pytreestore"] = info
        schema = dataclasses.replace(schema, digest=info["digest"])
    shown = Commit(rows[None], 0, tables=_tables(rows))
    backend.write_bytes(ROOT_KEY, consolidated.with_consolidated(document, schema, shown))
    return schema


def _tables(rows: dict[str | None, int]) -> tuple[tuple[str, int], ...] | None:
    tables = tables_of(rows)
    return None if tables is None else tuple(sorted(tables.items()))


def _lowered(item: _Starts, rows: int) -> _Starts:
    return dataclasses.replace(item, start=rows) if item.start > rows else item


def _rows(backend: Backend, offsets: str, parent: int, commit: Commit, table: str | None) -> int:
    """Rows of an axis's table at ``parent`` rows of the table holding its offsets."""
    if parent == 0:
        return 0
    (end,) = backend.read([offsets], slice(parent - 1, parent), commit.rows(table))
    return int(end[0])


__all__ = ["lower_starts", "rows_at", "shrink_root", "tables_of"]
