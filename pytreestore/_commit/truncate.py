"""What ``truncate(n)`` commits: the rows of every table at record ``n``, and the schema.

A fixed store's version of ``n`` records is rows ``[0, n)`` of its columns. In a ragged store
each axis's table holds the elements of the records before it: with cumulative end offsets,
the rows of an axis's table at ``n`` records are ``offsets[rows - 1]`` of the table its offsets
live in (0 for no rows), parents before children.

A column that ``evolve`` added (or a ragged structure first shown) after those rows starts
past them; its ``start`` is lowered to them (:func:`lower_starts`), which reads the same:
rows before ``start`` read the column's default, and the array holds its fill value, the
default, in every row no record wrote.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-truncate-rows", {"p": [np.int8(0)]}, ragged=True)
    >>> s.extend([{"p": [np.int8(1)] * 2}, {"p": [np.int8(2)] * 3}]); s.flush()
    >>> rows_at(s._backend, s.schema, s.commit_now(), 1, s.path)
    {None: 1, "['p']": 2}
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytreestore._commit.record import Commit
from pytreestore._format.schema import TreeSchema
from pytreestore.backends import Backend


def rows_at(
    backend: Backend, schema: TreeSchema, commit: Commit, records: int, where: str
) -> dict[str | None, int]:
    """The rows of every table of a store holding its first ``records`` records: the record
    table (None) and each axis's table."""
    rows: dict[str | None, int] = {None: records}
    if schema.ragged is not None:
        for axis in schema.ragged.axes:
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
    ragged = schema.ragged
    if ragged is not None:
        axes = tuple(_lowered(a, rows[a.table]) for a in ragged.axes)
        presence = tuple(_lowered(p, rows[p.table]) for p in ragged.presence)
        ragged = dataclasses.replace(ragged, axes=axes, presence=presence)
    if columns == schema.columns and ragged == schema.ragged:
        return None
    return dataclasses.replace(schema, columns=columns, ragged=ragged, digest=None)


def _lowered(item: Any, rows: int) -> Any:
    return dataclasses.replace(item, start=rows) if item.start > rows else item


def _rows(backend: Backend, offsets: str, parent: int, commit: Commit, table: str | None) -> int:
    """Rows of an axis's table at ``parent`` rows of the table holding its offsets."""
    if parent == 0:
        return 0
    (end,) = backend.read([offsets], slice(parent - 1, parent), commit.rows(table))
    return int(end[0])


__all__ = ["lower_starts", "rows_at", "tables_of"]
