"""Reading the rows of selected records from every table of a store (a fixed store's: its
record table alone).

The record table is read at the selected records. For each ragged axis, parents first, the
offsets array is read at the parent rows and at the row before each, which gives every parent
row's range of elements; the axis's table is then read at those rows, in one read per table.
Each gathered element knows its parent row (an index into the parent table's gathered rows)
and its position in its list.

The arrays are read at the keys the schema stores (a store written by another key scheme, such
as the ``%XX`` escapes before format 3's ``-XX``, keeps its keys) and kept by what they are,
their :data:`~pytreestore._format.ragged.Slot`: a leaf, offsets or presence array and its
keypath. Nothing here derives a key from a keypath.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-gather", {"p": [np.int32(0)]}, ragged=["['p']"])
    >>> s.extend([{"p": [np.int32(1), np.int32(2)]}, {"p": [np.int32(3)]}])
    >>> s.lengths([1, 0])
    {"['p']": array([1, 2])}
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from pytreestore._format.columns import ColumnSpec
from pytreestore._format.ragged import OFFSETS, PRESENCE, Slot, slot
from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore.errors import CorruptStoreError

#: reads ``keys`` at ``index`` of a table holding ``rows`` committed rows
ReadFn = Callable[[Sequence[str], Any, int], list[np.ndarray]]


@dataclasses.dataclass
class Rows:
    """The gathered rows of one table.

    Attributes:
        count: how many rows were gathered.
        parent: for an axis's table, each row's parent row (index into the parent table's
            gathered rows); None for the record table.
        position: each row's position within its parent's list (None for the record table).
        values: the arrays read, by slot (leaves, offsets' starts and ends, presence).
    """

    count: int
    parent: np.ndarray | None = None
    position: np.ndarray | None = None
    values: dict[Slot, np.ndarray] = dataclasses.field(default_factory=dict)


def gather(
    schema: TreeSchema,
    commit: Commit,
    records: np.ndarray,
    read: ReadFn,
    *,
    leaves: Sequence[ColumnSpec] | None = None,
    distinct: bool = True,
) -> dict[str | None, Rows]:
    """The rows of every table that ``records`` (record indices) hold.

    Args:
        leaves: the leaf columns to read (default all; ``[]`` reads only the offsets and
            presence arrays, e.g. for lengths).
        distinct: ``read`` is given sorted distinct rows (storage, read in chunks); False
            where it takes any rows (memory: a replay buffer's rings), which spares the
            sort of each offsets read's rows and the rows before them.

    Raises:
        CorruptStoreError: an offsets array is damaged (decreasing, or past its table).
    """
    info = schema.tables  # a fixed store's: the record table alone
    wanted = schema.columns if leaves is None else leaves
    index_cols = _index_columns(schema)
    out: dict[str | None, Rows] = {None: Rows(len(records))}
    rows_of: dict[str | None, np.ndarray] = {None: records}
    for axis in [None, *(a.path for a in info.axes)]:
        if axis is not None:
            parent = next(a for a in info.axes if a.path == axis).table
            out[axis], rows_of[axis] = _elements(axis, out[parent], commit)
        here = rows_of[axis]
        columns = [c for c in wanted if c.table == axis]
        columns += [c for c in index_cols if c.table == axis and c.role == PRESENCE]
        offsets = [c for c in index_cols if c.table == axis and c.role == OFFSETS]
        _read_table(out[axis], columns, offsets, here, commit, read, axis, distinct)
    return out


#: per schema (by id, with a weak reference telling a reused id), its offsets and presence
#: arrays as columns: built once, not on every read
_INDEX_COLUMNS: dict[int, tuple[weakref.ref[TreeSchema], list[ColumnSpec]]] = {}


def _index_columns(schema: TreeSchema) -> list[ColumnSpec]:
    held = _INDEX_COLUMNS.get(id(schema))
    if held is None or held[0]() is not schema:
        info = schema.tables
        if len(_INDEX_COLUMNS) >= 64:
            _INDEX_COLUMNS.clear()
        held = (weakref.ref(schema), info.index_columns(schema.chunk_records))
        _INDEX_COLUMNS[id(schema)] = held
    return held[1]


def _read_table(
    rows: Rows,
    columns: list[ColumnSpec],
    offsets: list[ColumnSpec],
    index: np.ndarray,
    commit: Commit,
    read: ReadFn,
    table: str | None,
    distinct: bool = True,
) -> None:
    """Reads ``columns`` at ``index`` and each offsets array at ``index`` and at the row
    before (stored as ``(starts, ends)``), all in one read: at the union of those rows
    (``distinct``), else at ``index`` then the rows before."""
    if not len(index):  # no rows: nothing to read (a read of none still costs a backend call)
        rows.values.update((slot(c), np.zeros((0, *c.shape), c.dtype)) for c in columns)
        rows.values.update((slot(c), np.zeros((2, 0), np.int64)) for c in offsets)
        return
    if not columns and not offsets:
        return
    at, here, before = np.asarray(index), None, None
    if offsets:
        at, here, before = _with_before(index) if distinct else _then_before(index)
    got = read([c.key for c in (*columns, *offsets)], _compact(at), commit.rows(table))
    for c, array in zip(columns, got):
        rows.values[slot(c)] = array if here is None else array[here]
    for c, array in zip(offsets, got[len(columns) :]):
        assert here is not None and before is not None
        if len(index) == 1:  # a point read: the arithmetic on ints
            end = int(array[here[0]])
            start = int(array[before[0]]) if int(index[0]) > 0 else 0
            if not 0 <= start <= end <= commit.rows(c.path):
                _damaged(c, commit.rows(c.path))
            rows.values[slot(c)] = np.array([[start], [end]], np.int64)
            continue
        starts = np.where(index > 0, array[before], 0).astype(np.int64)
        ends = array[here].astype(np.int64)
        _check_offsets(c, starts, ends, commit.rows(c.path))
        rows.values[slot(c)] = np.stack([starts, ends])


def _with_before(index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows ``index`` and the row before each (row 0 for row 0), sorted and distinct, and
    where in them each of ``index`` and each row before lies."""
    if len(index) == 1:  # one record (a point read): no sort
        i = int(index[0])
        lo = max(i - 1, 0)
        return np.arange(lo, i + 1), np.array([i - lo]), np.array([0])
    previous = np.maximum(index - 1, 0)
    at = np.union1d(previous, index)
    return at, np.searchsorted(at, index), np.searchsorted(at, previous)


def _then_before(index: np.ndarray) -> tuple[np.ndarray, Any, Any]:
    """The rows ``index`` then the row before each (row 0 for row 0), and where each part
    lies in them (slices: no copy), for a read of any rows (:func:`gather`'s ``distinct``).

    Example:
        >>> at, here, before = _then_before(np.array([4, 0, 2]))
        >>> at.tolist(), at[here].tolist(), at[before].tolist()
        ([4, 0, 2, 3, 0, 1], [4, 0, 2], [3, 0, 1])
    """
    if len(index) == 1:  # the point read's arithmetic wants arrays
        return _with_before(index)
    n = len(index)
    at = np.concatenate([index, np.maximum(index - 1, 0)])
    return at, slice(0, n), slice(n, 2 * n)


def _check_offsets(column: ColumnSpec, starts: np.ndarray, ends: np.ndarray, rows: int) -> None:
    if len(ends) and ((starts < 0).any() or (ends < starts).any() or (ends > rows).any()):
        _damaged(column, rows)


def _damaged(column: ColumnSpec, rows: int) -> NoReturn:
    """Raises the error of a damaged offsets array (``rows``: its table's committed rows).

    Raises:
        CorruptStoreError: always.
    """
    raise CorruptStoreError(
        f"the offsets array {column.key} of the ragged axis {column.path or 'the root'} is "
        f"damaged: it holds a decreasing, negative or too large offset (its table has "
        f"{rows} committed rows). Restore the store from a backup; records before the "
        "damaged rows may still read with an index below them"
    )


def _elements(axis: str, parent: Rows, commit: Commit) -> tuple[Rows, np.ndarray]:
    """The element rows of ``axis`` below the gathered ``parent`` rows."""
    starts, ends = parent.values[(OFFSETS, axis)]
    if parent.count == 1:  # one parent row (a point read): one run of rows
        start, total = int(starts[0]), int(ends[0] - starts[0])
        position = np.arange(total)
        return Rows(total, np.zeros(total, np.int64), position), position + start
    lengths = ends - starts
    total = int(lengths.sum())
    owner = np.repeat(np.arange(parent.count), lengths)
    first = np.cumsum(lengths) - lengths
    position = np.arange(total) - np.repeat(first, lengths)
    element_rows = np.repeat(starts, lengths) + position
    return Rows(total, owner, position), element_rows


def _compact(index: np.ndarray) -> Any:
    """A slice for a run of consecutive rows, else the index array."""
    n = len(index)
    if n == 0:
        return slice(0, 0)
    first = int(index[0])
    if int(index[-1]) - first == n - 1 and (n <= 2 or bool((np.diff(index) == 1).all())):
        return slice(first, first + n)
    return index


def record_of(schema: TreeSchema, gathered: dict[str | None, Rows]) -> dict[str | None, np.ndarray]:
    """Per table, the selected record (index into the selection) each gathered row is in."""
    out: dict[str | None, np.ndarray] = {None: np.arange(gathered[None].count)}
    for a in schema.tables.axes:
        parent = gathered[a.path].parent
        assert parent is not None
        out[a.path] = out[a.table][parent]
    return out


def lengths(schema: TreeSchema, gathered: dict[str | None, Rows]) -> dict[str, np.ndarray]:
    """Per ragged axis, each selected record's longest list (or leading axis) there: the
    length ``load(ragged="pad")`` pads it to, with ``pad_to=None``."""
    n = gathered[None].count
    records = record_of(schema, gathered)
    out = {}
    for axis, record in records.items():
        if axis is None:
            continue
        position = gathered[axis].position
        assert position is not None
        longest = np.zeros(n, np.int64)
        np.maximum.at(longest, record, position + 1)
        out[axis] = longest
    return out


__all__ = ["Rows", "gather", "lengths", "record_of"]
