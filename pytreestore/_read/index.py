"""Turning the indices users write into the indices a backend reads.

A store whose front was released (``keep_last``) reads record ``i`` from row ``first + i``
of its record table: :func:`normalize` takes that ``first`` and gives the rows, so that the
offset is applied here, once, for every read (loads, ``store[i]``, iteration, pipelines,
``copy``, the CLI).

Example:
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
from typing import Any

import numpy as np

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
