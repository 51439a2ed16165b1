"""A padded batch's table rows taken at once, for ``extend_batch(batch, mask)``.

A padded batch whose layout is leaves under one fixed node, some with a ragged leading axis
of their own (episodes of ``obs`` float32[n, 8] beside fixed ``action`` and ``reward``),
goes to the tables without a walk of each record: each record-table leaf is its column's
block, each ragged leaf's real rows (``value[mask]``) its axis table's block, and the
offsets the running sum of the mask's lengths. The rows are those the walk of
:func:`~pytreestore._tree.unpad.unpad_records`'s records gives, checked and cast by the same
casters. Any other layout (ragged lists, optional subtrees, shared or nested axes, a pending
structure), and a batch that departs from the layout or is refused, is left to the walk
(:meth:`PaddedBatch.tables` returns None), which explains a refusal.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-padded", {"o": np.zeros((1, 2), np.float32),
    ...                        "r": np.float32(0)}, ragged=["['o']"])
    >>> batch = {"o": np.ones((2, 3, 2), np.float32), "r": np.float32([1, 2])}
    >>> s.extend_batch(batch, {"o": np.array([[1, 1, 0], [1, 0, 0]], bool), "r": None})
    >>> s.lengths([0, 1])
    {"['o']": array([2, 1])}
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytreestore._tree.layout_nodes import Fixed, Leaf, Visitor, visit

#: a table's rows: their count and one block per column
Blocks = tuple[int, list[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class _Axis:
    """A leaf with a ragged leading axis of its own: its place among the node's children,
    its axis table, its offsets' slot in the record table, its caster and offsets' dtype."""

    child: int
    table: str
    slot: int
    caster: Any
    dtype: Any


class _Root(Visitor):
    """A :class:`PaddedBatch` of a layout whose root is a fixed node of leaves, each in the
    record table or with a ragged leading axis of its own; None for any other."""

    def fixed(self, node: Fixed, made: type[PaddedBatch], tables: Any, slots: Any) -> Any:
        if node.common_axis is not None:
            return None
        records = tables[None]
        parts = [visit(c, _Child(), tables, slots) for c in node.children]
        if any(p is None for p in parts):
            return None
        plain = [(k, p[1], records.casters[p[1]]) for k, p in enumerate(parts) if p[0] is None]
        axes = [
            _Axis(k, p[0], p[1], tables[p[0]].casters[0], records.schema.columns[p[1]].dtype)
            for k, p in enumerate(parts)
            if p[0] is not None
        ]
        width = len(records.schema.columns)
        if len(parts) != width or len(tables) != 1 + len(axes):
            return None
        return made(node.treedef, width, plain, axes)


class _Child(Visitor):
    """A leaf's table (None: the record table's) and its column's slot in the record table
    (a ragged leaf: its offsets'); None for any other node."""

    def leaf(self, node: Leaf, tables: Any, slots: Any) -> Any:
        if node.axis is None:
            return None, slots[None][("leaf", node.path)]
        table = tables.get(node.axis.path)
        if table is None or len(table.schema.columns) != 1:
            return None
        return node.axis.path, slots[None][("offsets", node.axis.path)]


@typing.final
class PaddedBatch:
    """The tables' rows of a padded batch of one layout (made by :meth:`of`, once per
    layout of a writer's tables)."""

    def __init__(
        self, treedef: Any, width: int, plain: Sequence[tuple[int, int, Any]], axes: Sequence[_Axis]
    ) -> None:
        self._treedef, self._width = treedef, width
        self._plain, self._axes = tuple(plain), tuple(axes)

    @classmethod
    def of(
        cls, model: Any, tables: Mapping[str | None, Any], slots: Mapping[Any, Any]
    ) -> PaddedBatch | None:
        """The taking of ``model``'s padded batches into ``tables`` (a writer's, whose columns
        are at ``slots``), or None where the layout needs the walk."""
        if model.pending:
            return None
        return visit(model.spec, _Root(), cls, tables, slots)

    def tables(self, batch: Any, mask: Any) -> dict[str | None, Blocks] | None:
        """Each table's rows of ``batch`` (offsets counted from row 0 of its added rows), or
        None: the batch is left to the walk (it departs from the layout, or is refused)."""
        try:
            values = self._treedef.flatten_up_to(batch)
            masks = self._treedef.flatten_up_to(mask)
            return self._rows(values, masks)
        except Exception:  # the walk refuses it again, and explains it
            return None

    def _rows(self, values: list[Any], masks: list[Any]) -> dict[str | None, Blocks] | None:
        shapes = [np.shape(v) for v in values]
        count = next((s[0] for s in shapes if s), None)
        if count is None:
            return None
        row: list[Any] = [None] * self._width
        for k, slot, caster in self._plain:
            row[slot] = caster.coerce(values[k], batch=count, what="batch")
        out: dict[str | None, Blocks] = {None: (count, row)}
        for axis in self._axes:
            real = np.asarray(masks[axis.child]).astype(bool, copy=False)
            value = np.asarray(values[axis.child])
            if real.ndim != 2 or value.shape[:2] != real.shape or real.shape[0] != count:
                return None
            lengths = real.sum(axis=1)
            if (real != (np.arange(real.shape[1]) < lengths[:, None])).any():
                return None  # not a run of True then False: the walk says which row
            total = int(lengths.sum())
            out[axis.table] = (total, [axis.caster.coerce(value[real], batch=total, what="batch")])
            row[axis.slot] = np.cumsum(lengths, dtype=axis.dtype)
        return out


__all__ = ["Blocks", "PaddedBatch"]
