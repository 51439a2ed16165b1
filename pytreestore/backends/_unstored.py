"""Rows that a column never stored: those below the ``start`` of a column added by ``evolve``.

``store.evolve(add={path: default})`` adds a column at record ``start`` without writing a
chunk: every record before ``start`` reads the default (the column's ``fill_value``). Both
backends read a missing chunk as lost data (:func:`~pytreestore.backends._base.missing_chunk`),
so those rows are served here, from the default, and never asked of storage; only the rows at
and after ``start`` are read, and a chunk of them that is missing is still an error.

Example:
    >>> import numpy as np
    >>> rows = Unstored()
    >>> rows.note([Column("c", np.dtype("int32"), (), 3, 7)])
    >>> rows.read_many([("c", slice(1, 5))], 5, lambda reqs, n: [np.array([40, 41])])
    [array([ 7,  7, 40, 41], dtype=int32)]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ReadMany = Callable[[Sequence[tuple[str, Any]], int], list[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Column:
    """A column whose records before ``start`` are not stored and read ``default``."""

    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    default: Any  # zarr fill_value JSON


class Unstored:
    """The columns of one backend whose first records are not stored."""

    def __init__(self) -> None:
        self._columns: dict[str, Column] = {}

    def note(self, columns: Sequence[Any]) -> None:
        """Records the ``start`` of every column given with one (a ``ColumnSpec``; a creation
        layout has none and changes nothing): a later ``start`` replaces an earlier one, and
        0 forgets it (``truncate`` lowers the start of a column added after its records)."""
        for c in columns:
            start = getattr(c, "start", None)
            if start:
                self._columns[c.key] = Column(c.key, c.dtype, tuple(c.shape), start, c.default)
            elif start is not None:
                self._columns.pop(c.key, None)

    def first_stored(self, key: str) -> int:
        """The first record of column ``key`` that storage holds (0 for most columns)."""
        column = self._columns.get(key)
        return column.start if column is not None else 0

    def read_many(
        self, requests: Sequence[tuple[str, Any]], records: int, read_many: ReadMany
    ) -> list[np.ndarray]:
        """``read_many(requests, records)``, with the unstored rows filled from the defaults."""
        if not any(key in self._columns for key, _ in requests):
            return read_many(requests, records)
        stored: list[tuple[str, Any]] = []
        plans: list[tuple[Column | None, Any, int]] = []
        for key, index in requests:
            column = self._columns.get(key)
            if column is None:
                plans.append((None, None, len(stored)))
                stored.append((key, index))
                continue
            where, part = _split(index, column.start, records)
            plans.append((column, where, len(stored) if part is not None else -1))
            if part is not None:
                stored.append((key, part))
        got = read_many(stored, records) if stored else []
        return [
            got[i] if column is None else _assemble(column, where, got[i] if i >= 0 else None)
            for column, where, i in plans
        ]


def _split(index: Any, start: int, records: int) -> tuple[Any, Any]:
    """``(where, stored)``: which output rows come from storage, and the index that reads them
    (None when every selected row is below ``start``)."""
    if isinstance(index, slice):
        first, stop, step = index.indices(records)
        if step < 0:
            return _split(np.arange(first, stop, step, dtype=np.int64), start, records)
        count = len(range(first, stop, step))
        below = len(range(first, min(stop, start), step)) if first < start else 0
        where = slice(below, count)
        return where, (slice(first + below * step, stop, step) if below < count else None)
    rows = np.asarray(index, dtype=np.int64)
    mask = rows >= start
    return mask, (rows[mask] if mask.any() else None)


def _assemble(column: Column, where: Any, part: np.ndarray | None) -> np.ndarray:
    count = (where.stop if isinstance(where, slice) else len(where)) or 0
    out = np.full((count, *column.shape), default_value(column.default, column.dtype))
    if part is not None:
        out[where] = part
    return out


def default_value(fill: Any, dtype: np.dtype) -> np.ndarray:
    """A zarr v3 ``fill_value`` (JSON) as a 0-d array of ``dtype``."""
    if isinstance(fill, list):  # complex: [real, imag]
        return np.asarray(complex(float(fill[0]), float(fill[1])), dtype)
    if isinstance(fill, str):  # "NaN", "Infinity", "-Infinity"
        return np.asarray(float(fill), dtype)
    return np.asarray(fill, dtype)
