"""The rows a read sees, and the indices users write turned into those a backend reads.

What one read sees (:class:`View`): the commit it reads at and, through a writer, the rows
only the writer's memory holds (issue 46: a read of a writer commits nothing).

A read through the store's writer sees every record appended, buffered ones included, and
commits nothing: each table's rows that only the writer's memory holds (the chunk being
filled, chunks handed to the background writer and not yet written, rows waiting to be
converted: :class:`~pytreestore._write.roles.Held`) are taken from memory, the rows before
them from storage as any read's (whole chunks, through the decoded-chunk cache). A
:class:`View` is made once per read (:meth:`pytreestore._core.StoreCore.viewing`) and every
route of the read engine takes its rows through :meth:`View.read`: the fixed reads
(:mod:`pytreestore._read.reader`, sharded loads through :meth:`View.reads`) and the
gathers of a store's tables (:mod:`pytreestore._read.tables`). A read of rows that memory
alone holds touches no storage.

A reader's view, and a writer's seen while another thread appends, is its commit alone.

Example (a view):
    >>> import numpy as np
    >>> from pytreestore._log.commit_record import Commit
    >>> from pytreestore._write.roles import Held
    >>> held = Held(4, 6, ((4, [np.array([40, 50, 0, 0])]),))
    >>> view = View(Commit(6, 1), {"x": (held, 0)})
    >>> stored = lambda keys, index, records: [np.arange(records)[index] * 10]
    >>> view.read(stored, ["x"], np.array([5, 1, 4]), 6)[0].tolist()
    [50, 10, 40]

Turning indices into rows: a store whose front was released (``keep_last``) reads record
``i`` from row ``first + i`` of its record table: :func:`normalize` takes that ``first``
and gives the rows, so that the offset is applied here, once, for every read (loads,
``store[i]``, iteration, pipelines, ``copy``, the CLI).

Example (indices):
    >>> normalize(-1, 10)
    Selection(index=slice(9, 10, 1), count=1, scalar=True)
    >>> normalize([0, -1], 10).index
    array([0, 9])
    >>> normalize([0, -1], 10, first=100).index, normalize(slice(2, 4), 10, first=100).index
    (array([100, 109]), slice(102, 104, 1))
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from pytreestore._log.commit_record import Commit
from pytreestore.errors import StoreIndexError


@dataclasses.dataclass(frozen=True)
class Selection:
    """A normalised record index.

    Attributes:
        index: a slice with a positive step, or a 1-d int64 array, over ``[0, len)``.
        count: how many records it selects.
        scalar: whether the user asked for one record (``store[i]``) rather than a batch.
    """

    index: Any
    count: int
    scalar: bool

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Selection):
            return NotImplemented
        same = (
            np.array_equal(self.index, other.index)
            if isinstance(self.index, np.ndarray)
            else self.index == other.index
        )
        return bool(same) and (self.count, self.scalar) == (other.count, other.scalar)

    __hash__ = None  # type: ignore[assignment]

    def shifted(self, first: int) -> Selection:
        """The same selection ``first`` rows further on (records as rows of a store whose
        record 0 is row ``first``).

        Example:
            >>> Selection(slice(0, 2, 1), 2, False).shifted(5).index
            slice(5, 7, 1)
        """
        if not first:
            return self
        index = self.index
        if isinstance(index, slice):
            index = slice(index.start + first, index.stop + first, index.step)
        else:
            index = index + first
        return Selection(index, self.count, self.scalar)


def rows(index: Any) -> np.ndarray:
    """The record (or row) indices a normalised index selects (a slice with a positive step,
    or a 1-d int array), as int64.

    Example:
        >>> rows(slice(2, 8, 3)).tolist(), rows(np.array([4, 1])).tolist()
        ([2, 5], [4, 1])
    """
    if isinstance(index, slice):
        return np.arange(index.start, index.stop, index.step, dtype=np.int64)
    return np.asarray(index, np.int64)


def normalize(index: Any, n: int, first: int = 0) -> Selection:
    """Normalises ``index`` against a store of ``n`` records, whose record 0 is row
    ``first`` of its record table (after a ``keep_last``): the selection is of rows.

    Accepts an int (negative counts from the end), a slice, ``...``, a sequence or array of
    ints, or a bool mask of length ``n``. Raises :class:`StoreIndexError` otherwise.
    """
    return _normalized(index, n).shifted(first)


def _normalized(index: Any, n: int) -> Selection:
    if index is Ellipsis:
        return Selection(slice(0, n, 1), n, False)
    if isinstance(index, slice):
        return _from_slice(index, n)
    if _is_int_scalar(index):
        i = operator.index(index)
        if not -n <= i < n:
            raise StoreIndexError(f"record index {i} is out of range for a store of {n} records")
        i %= n
        return Selection(slice(i, i + 1, 1), 1, True)
    return _from_array(index, n)


def _is_int_scalar(index: Any) -> bool:
    if isinstance(index, (bool, np.bool_)):
        return False
    if isinstance(index, (int, np.integer)):
        return True
    dtype = getattr(index, "dtype", None)
    return getattr(index, "ndim", None) == 0 and dtype is not None and np.dtype(dtype).kind in "iu"


def _from_slice(index: slice, n: int) -> Selection:
    for part in (index.start, index.stop, index.step):
        if part is not None and not isinstance(part, (int, np.integer)):
            raise StoreIndexError(f"slice bounds must be ints or None, got {index!r}")
    if index.step == 0:
        raise StoreIndexError("slice step cannot be zero")
    start, stop, step = index.indices(n)
    step = max(-max(n, 1), min(step, max(n, 1)))  # a longer step selects the same records
    count = len(range(start, stop, step))
    if step < 0:
        return Selection(np.arange(start, stop, step, dtype=np.int64), count, False)
    if count == 0:
        return Selection(slice(0, 0, 1), 0, False)
    return Selection(slice(start, stop, step), count, False)


def _from_array(index: Any, n: int) -> Selection:
    if isinstance(index, (str, bytes, float, complex, dict, set)) or index is None:
        raise StoreIndexError(_bad_type(index))
    try:
        array = np.asarray(index)
    except (TypeError, ValueError) as err:
        raise StoreIndexError(_bad_type(index)) from err
    if array.ndim != 1:
        raise StoreIndexError(f"an index array must be 1-d, got shape {array.shape}")
    if array.dtype == np.bool_:
        if array.shape[0] != n:
            raise StoreIndexError(
                f"a bool mask must have one entry per record: got {array.shape[0]} for {n} records"
            )
        picked = np.flatnonzero(array).astype(np.int64)
        return Selection(picked, len(picked), False)
    if array.size == 0:
        return Selection(np.zeros(0, np.int64), 0, False)
    if array.dtype.kind not in "iu":
        raise StoreIndexError(_bad_type(index))
    if array.dtype == np.uint64 and int(array.max()) >= n:
        raise StoreIndexError(
            f"record index {int(array.max())} is out of range for a store of {n} records"
        )
    array = array.astype(np.int64)
    bad = array[(array < -n) | (array >= n)]
    if bad.size:
        raise StoreIndexError(
            f"record index {int(bad[0])} is out of range for a store of {n} records"
        )
    return Selection(np.where(array < 0, array + n, array), len(array), False)


def _bad_type(index: Any) -> str:
    return (
        f"a store is indexed by an int, a slice, an int array or list, or a bool mask; "
        f"got {type(index).__name__} {index!r:.60}"
    )


# ---- what a read sees ------------------------------------------------------------------------

#: reads ``keys`` at ``index`` of a table holding ``rows`` rows (storage's, or a cache's)
ReadFn = Callable[[Sequence[str], Any, int], list[np.ndarray]]


class HeldRows(Protocol):
    """A table's rows ``[start, stop)`` that only memory holds (the rows before ``start``
    are on storage): :class:`~pytreestore._write.roles.Held`."""

    @property
    def start(self) -> int: ...

    @property
    def stop(self) -> int: ...

    def take(self, columns: Sequence[int], rows: np.ndarray) -> list[np.ndarray]: ...


@dataclasses.dataclass(frozen=True)
class View:
    """What one read sees.

    Attributes:
        commit: the records and each table's rows the read sees (a writer's: buffered ones
            counted, as if committed; nothing is).
        held: by storage key, the rows of its table only memory holds and the column's
            place among them (empty: everything is on storage).
    """

    commit: Commit
    held: Mapping[str, tuple[HeldRows, int]] = dataclasses.field(default_factory=dict)

    @property
    def records(self) -> int:
        """The records the read sees."""
        return self.commit.records

    def read(self, read: ReadFn, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        """Rows ``index`` (normalised) of the columns ``keys`` (of one table, holding
        ``records`` rows): those memory holds taken from it, the others read by ``read``
        (storage, with the rows before the held ones as the table's rows)."""
        found = self.held.get(keys[0]) if keys else None
        if found is None:
            return read(keys, index, records)
        held = found[0]
        wanted = rows(index)
        memory = wanted >= held.start
        if not memory.any():
            return read(keys, index, min(records, held.start))
        columns = [self.held[k][1] for k in keys]
        if memory.all():
            return held.take(columns, wanted)
        stored = _stored_index(index, wanted[~memory], held.start)
        got = read(keys, stored, min(records, held.start))
        taken = held.take(columns, wanted[memory])
        out = []
        for array, rows_held in zip(got, taken):
            both = np.empty((len(wanted), *array.shape[1:]), array.dtype)
            both[~memory], both[memory] = array, rows_held
            out.append(both)
        return out

    def reads(self, backend: Any) -> Any:
        """``backend`` for a sharded load (its ``read`` and ``read_many``), rows memory holds
        taken from it; ``backend`` itself when memory holds none."""
        return _HeldReads(backend, self) if self.held else backend


def _stored_index(index: Any, stored: np.ndarray, start: int) -> Any:
    """The index of the rows of ``index`` before ``start`` (a slice's: a slice)."""
    if isinstance(index, slice):
        return slice(index.start, min(index.stop, start), index.step)
    return stored


class _HeldReads:
    """A backend's reads through a :class:`View` (what a sharded load reads with)."""

    def __init__(self, backend: Any, view: View) -> None:
        self._backend = backend
        self._view = view

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        return self._view.read(self._backend.read, keys, index, records)

    def read_many(self, requests: Sequence[tuple[str, Any]], records: int) -> list[np.ndarray]:
        return [self.read([key], index, records)[0] for key, index in requests]


def committed(commit: Commit) -> View:
    """The view of ``commit`` alone (a reader's, or a writer's seen from another thread)."""
    return View(commit)


def of_writer(
    commit: Commit,
    records: int,
    rows: Mapping[str | None, int],
    held: Mapping[str | None, HeldRows],
    keys: Mapping[str, tuple[str | None, int]],
) -> View:
    """The view of a writer at ``commit`` holding ``records`` records, each table's ``rows``
    and its rows only memory holds (``held``); ``keys``: each storage key's table and place
    among its table's columns."""
    tables = tuple((t, n) for t, n in rows.items() if t is not None)
    seen = dataclasses.replace(commit, records=records, tables=tables or commit.tables)
    busy = {t for t, h in held.items() if h.stop > h.start}
    return View(seen, {k: (held[t], i) for k, (t, i) in keys.items() if t in busy})
