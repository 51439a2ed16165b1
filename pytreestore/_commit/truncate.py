"""What ``truncate(n)`` commits: the rows of every table at record ``n``, checked first.

A fixed store's version of ``n`` records is rows ``[0, n)`` of its columns. In a ragged store
each axis's table holds the elements of the records before it: with cumulative end offsets,
the rows of an axis's table at ``n`` records are ``offsets[rows - 1]`` of the table its offsets
live in (0 for no rows), parents before children.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-truncate-rows", {"p": [np.int8(0)]}, ragged=True)
    >>> s.extend([{"p": [np.int8(1)] * 2}, {"p": [np.int8(2)] * 3}]); s.flush()
    >>> rows_at(s._backend, s.schema, s.commit_now(), 1, s.path)
    {"['p']": 2}
"""

from __future__ import annotations

from pytreestore._commit.record import Commit
from pytreestore._format.schema import TreeSchema
from pytreestore.backends import Backend
from pytreestore.errors import StoreIndexError


def rows_at(
    backend: Backend, schema: TreeSchema, commit: Commit, records: int, where: str
) -> dict[str, int] | None:
    """The rows of every axis table of a store holding its first ``records`` records (None for
    a fixed store), after checking that no column starts past them.

    Raises:
        StoreIndexError: a column, axis or optional subtree was added after record (or row)
            ``records`` (by ``evolve`` or by a structure learnt): truncating before it is not
            supported.
    """
    rows: dict[str | None, int] = {None: records}
    if schema.ragged is not None:
        for axis in schema.ragged.axes:
            rows[axis.path] = _rows(backend, axis.offsets, rows[axis.table], commit, axis.table)
    for column in schema.storage_columns:
        if column.start > rows[column.table]:
            raise StoreIndexError(
                f"cannot truncate {where} to {records} records: column {column.path} was added "
                f"after them (at {'record' if column.table is None else 'row'} {column.start}), "
                "and truncating before a column was added is not supported. Nothing was "
                "changed; open an older version with pytreestore.open(path, version=...) to "
                "read the store as it was."
            )
    if schema.ragged is None:
        return None
    return {str(t): n for t, n in rows.items() if t is not None}


def _rows(backend: Backend, offsets: str, parent: int, commit: Commit, table: str | None) -> int:
    """Rows of an axis's table at ``parent`` rows of the table holding its offsets."""
    if parent == 0:
        return 0
    (end,) = backend.read([offsets], slice(parent - 1, parent), commit.rows(table))
    return int(end[0])


__all__ = ["rows_at"]
