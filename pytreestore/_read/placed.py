"""Records of different shapes served from one device copy of their rows: a record is taken
by one compiled call, as a fixed store's record is (:func:`pytreestore._read.ahead.take`).

A read-ahead block of a ragged store holds its records exactly (numpy trees). Placing each
record's leaves from the host costs one transfer per leaf; instead the block's leaf columns
(each table's rows of each leaf) go to the device once, padded to a power of two, and each
record is gathered from them by :func:`take_rows`. Which rows a record's leaves are is told by
its *tags*: the record built again from the same rows with each leaf column's values replaced
by :func:`tag` numbers (column number and row), so the tags have the record's structure.

A record's gather is compiled once per *plan*: per column, how many scalar rows the record
takes (rounded up to a power of two, at least :data:`MIN_ROWS`, so a few plans serve every
length) and the padded length of each array leaf (a ragged leading axis). Records whose plan
would be compiled past :data:`MAX_PLANS` plans are placed leaf by leaf from the host.

Example:
    >>> import numpy as np
    >>> rows = Placed.of([np.arange(4, dtype=np.int32)], [".x"], [[tag(0, 2), tag(0, 3)]],
    ...                  frozenset(), device=None, cast=False)
    >>> [int(x) for x in rows.leaves(0, [np.int32(2), np.int32(3)])]
    [2, 3]
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from pytreestore._read import device as _device
from pytreestore.errors import X64DisabledError

SHIFT = 32  # a tag: (column << SHIFT) | row
MIN_ROWS = 4  # scalar rows of a column a plan takes, at least (unless the column's max is 1)
MAX_PLANS = 64  # compiled plans, at most, in a process

#: a plan: per entry (column, rows, array): ``rows`` scalar leaves of the column, or one array
#: leaf of ``rows`` rows (padded) when ``array``
Plan = tuple[tuple[int, int, bool], ...]

_plans: set[Plan] = set()
_plans_lock = threading.Lock()


def tag(column: int, row: Any) -> Any:
    """The tag of ``row`` (an int or an int array) of leaf column ``column``."""
    return (np.int64(column) << SHIFT) | np.asarray(row, np.int64)


def tags(column: int, count: int) -> np.ndarray:
    """The tags of rows ``0 .. count`` of leaf column ``column``."""
    return tag(column, np.arange(count, dtype=np.int64))


@functools.partial(jax.jit, static_argnums=2)
def take_rows(columns: list[jax.Array], index: jax.Array, plan: Plan) -> list[jax.Array]:
    """The leaves ``plan`` names, rows ``index`` of ``columns``, in one compiled call."""
    out = []
    at = 0
    for column, rows, array in plan:
        if array:
            out.append(columns[column][index[at : at + rows]])
        else:
            out.extend(columns[column][index[at + k]] for k in range(rows))
        at += rows
    return out


def _round(rows: int) -> int:
    return max(MIN_ROWS, 1 << (rows - 1).bit_length())


class Placed:
    """A block's leaf columns on the device, and the records' tags to take them by."""

    def __init__(self, columns: list[jax.Array], tags: list[Any], single: frozenset[int]):
        self.columns = columns
        self.tags = tags
        self.single = single  # the columns of which a record holds one row at most

    @classmethod
    def of(
        cls,
        host: Sequence[np.ndarray],
        paths: Sequence[str],
        record_tags: list[Any],
        single: frozenset[int],
        *,
        device: Any,
        cast: bool,
    ) -> Placed | None:
        """``host`` (each leaf column's rows) placed on ``device``, or None where the dtype
        policy refuses a column (then each record is placed from the host, and only a
        record holding such a value raises).

        Args:
            host: each leaf column's rows, numbered as the tags number them.
            paths: each column's keypath (for the dtype policy's errors).
            record_tags: each record built from the tags of its rows (see the module).
            single: the columns of which a record holds one row (the record table's).
            device: where to place (None: the default device).
            cast: whether 64-bit columns are cast to 32 bits.
        """
        padded = []
        for a in host:
            size = 1 << max(len(a) - 1, 0).bit_length()
            pad = np.zeros((size - len(a), *a.shape[1:]), a.dtype)
            padded.append(np.concatenate([a, pad]) if size > len(a) else a)
        try:
            placed = _device.to_jax(padded, list(paths), device=device, cast=cast)
        except X64DisabledError:
            return None
        return cls([p for p in placed if p is not None], record_tags, single)

    def leaves(self, j: int, host_leaves: list[Any]) -> list[Any] | None:
        """Record ``j``'s leaves on the device, in the order of ``host_leaves`` (its host
        leaves, flattened as its tags are), or None when its plan is not compiled and no
        more may be."""
        tag_leaves = jax.tree_util.tree_leaves(self.tags[j], is_leaf=lambda x: x is None)
        scalars: dict[int, list[int]] = {}
        arrays: list[tuple[int, np.ndarray]] = []
        where: list[tuple[int, int, int] | None] = []  # (column, k, rows) per leaf
        for t, h in zip(tag_leaves, host_leaves, strict=True):  # h: to tell kept values
            if t is h or not isinstance(t, np.ndarray | np.integer) or (t.ndim == 1 and not len(t)):
                where.append(None)  # a kept value, None, or an empty array: the host's
            elif t.ndim == 0:
                column, row = int(t) >> SHIFT, int(t) & ((1 << SHIFT) - 1)
                rows = scalars.setdefault(column, [])
                where.append((column, len(rows), -1))
                rows.append(row)
            else:
                where.append((-1, len(arrays), len(t)))
                arrays.append((int(t[0]) >> SHIFT, t & ((1 << SHIFT) - 1)))
        plan, index = self._plan(scalars, arrays)
        if not self._compiled(plan):
            return None
        out = take_rows(self.columns, index, plan)
        return self._assign(out, plan, where, host_leaves)

    def _plan(
        self, scalars: dict[int, list[int]], arrays: list[tuple[int, np.ndarray]]
    ) -> tuple[Plan, np.ndarray]:
        plan: list[tuple[int, int, bool]] = []
        parts: list[Any] = []
        for column in sorted(scalars):
            rows = scalars[column]
            size = 1 if column in self.single else _round(len(rows))
            plan.append((column, size, False))
            parts.append(rows + [0] * (size - len(rows)))
        for column, rows in arrays:
            size = _round(len(rows))
            plan.append((column, size, True))
            parts.append(np.concatenate([rows, np.zeros(size - len(rows), np.int64)]).tolist())
        index = np.fromiter((r for p in parts for r in p), np.int32)
        return tuple(plan), index

    @staticmethod
    def _compiled(plan: Plan) -> bool:
        with _plans_lock:
            if plan in _plans:
                return True
            if len(_plans) >= MAX_PLANS:
                return False
            _plans.add(plan)
            return True

    @staticmethod
    def _assign(
        out: list[jax.Array],
        plan: Plan,
        where: list[tuple[int, int, int] | None],
        host_leaves: list[Any],
    ) -> list[Any]:
        first: dict[int, int] = {}  # each column's first scalar output
        arrays: list[int] = []  # each array leaf's output
        at = 0
        for column, rows, array in plan:
            if array:
                arrays.append(at)
                at += 1
            else:
                first[column] = at
                at += rows
        leaves = []
        for w, h in zip(where, host_leaves, strict=True):
            if w is None:
                leaves.append(h if not isinstance(h, np.ndarray | np.generic) else None)
            elif w[2] < 0:
                leaves.append(out[first[w[0]] + w[1]])
            else:
                got = out[arrays[w[1]]]
                leaves.append(got if got.shape[0] == w[2] else got[: w[2]])
        return leaves


__all__ = ["MAX_PLANS", "Placed", "tag", "tags", "take_rows"]
