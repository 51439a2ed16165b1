"""Records of different shapes served from one device copy of their rows: a record is taken
by one compiled call, as a fixed store's record is (:func:`pytreestore._read.ahead.take`).

A read-ahead block of a ragged store holds its records exactly (numpy trees). Placing each
record's leaves from the host costs one transfer per leaf; instead the block's leaf columns
(each table's rows of each leaf) go to the device once, padded to a power of two, and each
record is gathered from them by :func:`take_rows`. Which rows a record's leaves are is told by
its *tags*: the record built again from the same rows with each leaf column's values replaced
by :func:`tag` numbers (column number and row), so the tags have the record's structure.

A record's gather is compiled once per *plan*: per column, how many scalar rows the record
takes (rounded up to a power of two, at least ``RUNTIME.reads.plan_min_rows``, so a few plans serve
every
length) and the padded length of each array leaf (a ragged leading axis). Records whose plan
would be compiled past ``RUNTIME.caches.placement_plans`` plans are placed leaf by leaf from the
host.

A record's rows in each table are consecutive, and which of them each leaf holds depends
only on the record's structure (its lists' lengths and which optional subtrees it holds: its
treedef). So records of one structure share a *layout*, made once a read from the tags of the
first such record (:func:`layouts_of`): per row the gather takes, its column and its row from
the record's start there, per leaf its output, and the treedef. A record's structure is told
by a key read from its rows of the offsets and presence arrays (:func:`structure_keys`,
made for a whole block at once), so a record costs one index (its start rows plus the
layout's), one compiled call and one unflatten, as a fixed record does: no host tree is
built or flattened. The tags of a block are built only when it holds a structure the read
has not met yet.

Example:
    >>> import numpy as np
    >>> record_tags = [[tag(0, 2), tag(0, 3)]]  # record 0: rows 2 and 3 of column 0
    >>> rows = Placed.of([np.arange(4, dtype=np.int32)], [".x"], np.array([[2]]),
    ...                  lambda: record_tags, frozenset(), device=None, cast=False)
    >>> [int(x) for x in rows.record(0)]
    [2, 3]
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from pytreestore._read import place as _device
from pytreestore._runtime import RUNTIME
from pytreestore.errors import X64DisabledError

SHIFT = 32  # a tag: (column << SHIFT) | row

#: a plan: per entry (column, rows, array): ``rows`` scalar leaves of the column, or one array
#: leaf of ``rows`` rows (padded) when ``array``
Plan = tuple[tuple[int, int, bool], ...]

_plans: set[Plan] = set()
_plans_lock = threading.Lock()


class Tag(np.ndarray):
    """Tags, as an array class of their own: a record built from tags tells its tags (the
    leaves of this class) from the values it keeps as they are (which may be int64 arrays)."""


def tag(column: int, row: Any) -> Any:
    """The tag of ``row`` (an int or an int array) of leaf column ``column``."""
    return np.asarray((np.int64(column) << SHIFT) | np.asarray(row, np.int64)).view(Tag)


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
    return max(RUNTIME.reads.plan_min_rows, 1 << (rows - 1).bit_length())


class Placed:
    """A block's leaf columns on the device, and where each record's rows start in them."""

    def __init__(
        self,
        columns: list[jax.Array],
        starts: np.ndarray,
        tags: Callable[[], list[Any]],
        single: frozenset[int],
        layouts: dict[Any, Any],
        keys: Sequence[Any],
    ):
        self.columns = columns
        self.starts = starts
        self._tags = tags
        self._tagged: list[Any] | None = None
        self.single = single  # the columns of which a record holds one row at most
        self.layouts = layouts
        self.keys = keys  # per record, its structure (records of one key share a layout)

    @classmethod
    def of(
        cls,
        host: Sequence[np.ndarray],
        paths: Sequence[str],
        starts: np.ndarray,
        tags: Callable[[], list[Any]],
        single: frozenset[int],
        *,
        device: Any,
        cast: bool,
        layouts: dict[Any, Any] | None = None,
        weak: Sequence[bool] | None = None,
        keys: Sequence[Any] | None = None,
    ) -> Placed | None:
        """``host`` (each leaf column's rows) placed on ``device``, or None where the dtype
        policy refuses a column (then each record is placed from the host, and only a
        record holding such a value raises).

        Args:
            host: each leaf column's rows, numbered as the tags number them.
            paths: each column's keypath (for the dtype policy's errors).
            starts: per record, the row of each column where its rows start (records by
                columns; the rows of a record in a table are consecutive).
            tags: builds each record from the tags of its rows (see the module); called
                only when a record has a structure no layout was made for yet.
            single: the columns of which a record holds one row (the record table's).
            device: where to place (None: the default device).
            cast: whether 64-bit columns are cast to 32 bits.
            layouts: the layouts made so far for records of these columns (shared by the
                blocks of one read; see :func:`layouts_of`).
            weak: which columns are weakly typed (None: none): placed weak, so that the
                records taken from them are (:func:`take_rows` keeps the weak type).
            keys: per record, a key of its structure (:func:`structure_keys`): records of
                one key share a layout (None: each record its own).
        """
        padded = []
        for a in host:
            size = 1 << max(len(a) - 1, 0).bit_length()
            pad = np.zeros((size - len(a), *a.shape[1:]), a.dtype)
            padded.append(np.concatenate([a, pad]) if size > len(a) else a)
        try:
            placed = _device.to_jax(padded, list(paths), device=device, cast=cast, weak=weak)
        except X64DisabledError:
            return None
        pad = np.zeros((len(starts), 1), np.int64)  # the padding rows' column: row 0
        starts = np.concatenate([starts, pad], axis=1).astype(np.int32)  # JAX's index type
        columns = [p for p in placed if p is not None]
        keys = [(j,) for j in range(len(starts))] if keys is None else keys
        return cls(columns, starts, tags, single, {} if layouts is None else layouts, keys)

    def record(self, j: int) -> Any:
        """Record ``j`` with its leaves on the device, or None when it is to be placed from
        the host: its plan is not compiled and no more may be, or it holds an empty array."""
        key = self.keys[j]
        layout = self.layouts.get(key)
        if layout is None:
            layout = self.layouts[key] = self._layout(j)
        if layout.plan is None:
            return None
        index = self.starts[j][layout.column] + layout.row
        out = take_rows(self.columns, index, layout.plan)
        leaves = [kept if k < 0 else out[k] for kept, k in zip(layout.kept, layout.pick)]
        for i, length in layout.cut:
            leaves[i] = leaves[i][:length]
        return layout.treedef.unflatten(leaves)

    def _layout(self, j: int) -> _Layout:
        """The layout of record ``j``'s structure, read from its tags; with no plan where
        that plan may not be compiled (no more plans may be)."""
        if self._tagged is None:
            self._tagged = self._tags()
        tag_leaves, treedef = jax.tree_util.tree_flatten(self._tagged[j])
        layout = _Layout.of(tag_leaves, treedef, self.single, self.starts[j])
        if layout.plan is not None and not self._compiled(layout.plan):
            return dataclasses.replace(layout, plan=None)
        return layout

    @staticmethod
    def _compiled(plan: Plan) -> bool:
        with _plans_lock:
            if plan in _plans:
                return True
            if len(_plans) >= RUNTIME.caches.placement_plans:
                return False
            _plans.add(plan)
            return True


_ROW = (1 << SHIFT) - 1


def host_records(
    host: Sequence[np.ndarray],
    starts: np.ndarray,
    keys: Sequence[Any],
    tags: Callable[[], list[Any]],
    single: frozenset[int],
    layouts: dict[Any, Any],
    fallback: Callable[[], list[Any]],
) -> list[Any]:
    """Each record of a block exactly, as a numpy tree whose leaves are views of ``host``
    (the block's leaf columns), built by its structure's layout: one view per leaf and one
    unflatten, as a fixed record is. The arguments are those of :meth:`Placed.of`;
    ``fallback`` builds every record another way (called once, for the records that hold an
    empty array, which their tags do not place)."""
    records: list[Any] = []
    tagged: list[Any] | None = None
    others: list[Any] | None = None
    for j, (key, first) in enumerate(zip(keys, starts.tolist(), strict=True)):
        layout = layouts.get(key)
        if layout is None:
            tagged = tags() if tagged is None else tagged
            tag_leaves, treedef = jax.tree_util.tree_flatten(tagged[j])
            layout = layouts[key] = _Layout.of(tag_leaves, treedef, single, starts[j])
        if layout.empty:
            others = fallback() if others is None else others
            records.append(others[j])
            continue
        leaves = [
            kept if c < 0 else host[c][first[c] + r, ...] if n < 0 else host[c][first[c] + r :][:n]
            for kept, (c, r, n) in zip(layout.kept, layout.rows)
        ]
        records.append(layout.treedef.unflatten(leaves))
    return records


def _is_tag(t: Any) -> bool:
    """Whether leaf ``t`` of a record of tags names rows (not a kept value or an empty
    array)."""
    return isinstance(t, Tag) and (t.ndim == 0 or bool(len(t)))


def structure_keys(parts: Sequence[tuple[np.ndarray, np.ndarray | None]]) -> list[Any]:
    """Per record, a key of its structure: its lists' lengths and which optional subtrees
    it holds, as the rows of its tables' offsets and presence arrays tell them.

    Args:
        parts: per table that holds offsets or presence arrays, each row's lengths and
            presence flags (rows by arrays, int64) and the bounds of each record's rows
            there (None: the record table, one row a record).
    """
    keyed = []
    for codes, bounds in parts:
        codes = np.ascontiguousarray(codes, np.int64)
        if bounds is None:
            width = codes.shape[1] * codes.itemsize
            keyed.append(codes.view(np.dtype((np.void, width))).ravel().tolist())
        else:
            cuts = bounds.tolist()
            keyed.append([codes[a:b].tobytes() for a, b in itertools.pairwise(cuts)])
    return keyed[0] if len(keyed) == 1 else list(zip(*keyed))


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How the records of one structure (and ragged leading axis lengths) are taken: the
    rows of a record in a table are consecutive, and which of them each leaf holds is told by
    the structure, so a record's gather index is its start rows plus the layout's.

    Attributes:
        plan: the compiled gather's plan; None: such records are placed from the host (one
            holds an empty array).
        column: per row the plan takes, its column (the last, of start 0: a padding row).
        row: per row the plan takes, its row from the record's start in that column.
        pick: per leaf, its output of the gather, or -1 for a value kept as it is.
        cut: the leaves (array leaves padded in the plan) cut back to their rows.
        kept: per leaf, the value kept as it is (for the others, their tags: unused).
        treedef: the records' treedef.
        rows: per leaf, its rows in the host columns: ``(column, row from the record's
            start, -1)`` for a scalar leaf, ``(column, first row, count)`` for an array
            leaf (a ragged leading axis), ``(-1, 0, 0)`` for a value kept as it is.
        empty: whether the records hold an empty array (which no tag places).
    """

    plan: Plan | None
    column: np.ndarray
    row: np.ndarray
    pick: tuple[int, ...]
    cut: tuple[tuple[int, int], ...]
    kept: tuple[Any, ...]
    treedef: Any
    rows: tuple[tuple[int, int, int], ...]
    empty: bool

    @classmethod
    def of(
        cls,
        tag_leaves: list[Any],
        treedef: Any,
        single: frozenset[int],
        starts: np.ndarray,
    ) -> _Layout:
        """The layout read from one record's tags (``starts``: its start rows)."""
        by_column: dict[int, list[int]] = {}
        arrays: list[int] = []
        empty = False
        host_rows = []
        for p, t in enumerate(tag_leaves):
            host_rows.append(_host_rows(t, starts))
            if not _is_tag(t):
                empty = empty or isinstance(t, Tag)  # an empty array
            elif t.ndim == 0:
                by_column.setdefault(int(t) >> SHIFT, []).append(p)
            else:
                arrays.append(p)
        pad = len(starts) - 1
        plan: list[tuple[int, int, bool]] = []
        column: list[int] = []
        row: list[int] = []
        pick = [-1] * len(tag_leaves)
        for c in sorted(by_column):
            leaves = by_column[c]
            size = 1 if c in single else _round(len(leaves))
            for p in leaves:
                pick[p] = len(column)
                column.append(c)
                row.append((int(tag_leaves[p]) & _ROW) - int(starts[c]))
            column += [pad] * (size - len(leaves))
            row += [0] * (size - len(leaves))
            plan.append((c, size, False))
        cut = []
        scalars = len(column)  # the gather's outputs before its arrays: one per scalar row
        for k, p in enumerate(arrays):
            t = tag_leaves[p]
            c, size = int(t[0]) >> SHIFT, _round(len(t))
            plan.append((c, size, True))
            pick[p] = scalars + k  # the k-th array's output (its rows are one output)
            column += [c] * len(t) + [pad] * (size - len(t))
            row += ((t & _ROW) - int(starts[c])).tolist() + [0] * (size - len(t))
            if size != len(t):
                cut.append((p, len(t)))
        return cls(
            None if empty else tuple(plan),
            np.asarray(column, np.intp),
            np.asarray(row, np.int32),
            tuple(pick),
            tuple(cut),
            tuple(tag_leaves),
            treedef,
            tuple(host_rows),
            empty,
        )


def _host_rows(t: Any, starts: np.ndarray) -> tuple[int, int, int]:
    """Where the leaf of tag ``t`` lies in the host columns (see :class:`_Layout`)."""
    if not _is_tag(t):
        return (-1, 0, 0)
    first = int(t.flat[0])
    c, row = first >> SHIFT, (first & _ROW) - int(starts[first >> SHIFT])
    return (c, row, -1) if t.ndim == 0 else (c, row, len(t))


def layouts_of(owner: Any, key: Any) -> dict[Any, Any]:
    """The layouts cache of the blocks read for ``key`` (the columns placed and their
    numbering) from ``owner`` (a read's schema, by identity): records of a structure seen in
    an earlier block need no tags again. Kept while ``owner`` lives."""
    with _plans_lock:
        held = _LAYOUTS.get(id(owner))
        if held is None or held[0]() is not owner:
            if len(_LAYOUTS) >= 16:
                _LAYOUTS.clear()
            held = _LAYOUTS[id(owner)] = (weakref.ref(owner), {})
        return held[1].setdefault(key, {})


#: per owner (by id, with a weak reference telling a reused id), per key, the layouts
_LAYOUTS: dict[int, tuple[weakref.ref[Any], dict[Any, dict[Any, Any]]]] = {}


__all__ = [
    "Placed",
    "Tag",
    "host_records",
    "layouts_of",
    "structure_keys",
    "tag",
    "tags",
    "take_rows",
]
