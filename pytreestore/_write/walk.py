"""The walk of a ragged store's records along its layout, compiled once per layout.

A :class:`Plan` turns the layout (:mod:`pytreestore._tree.layout`) into one closure per node,
built when the writer opens its tables (and again when it learns a structure), so a record
costs no dispatch on node kinds, no slot lookups and no per-call bookkeeping. Each record
goes in two phases:

1. :meth:`Plan.stage` walks it and checks everything but the record table's own leaves:
   structure (:class:`Mismatch`, :class:`PendingStructure`), every element's and every
   ragged leading axis's values, cast into column blocks (or, for a list of numpy-scalar
   elements, kept as they are: :meth:`~pytreestore._write.lists.FlatList.exact_values`), and
   every offset (each table's rows so far plus those staged). Nothing is written.
2. :meth:`Plan.write` appends the record table's row first (the one call that checks
   values, and writes nothing if it refuses them), then each axis table's rows. Only a
   table writer that fills a chunk can fail here (storage); then every table is put back.

So a refused record leaves nothing in any table, and the common record (no chunk to write)
takes no snapshot of any table.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-walk", {"x": np.int32(0), "p": [np.float32(0)]},
    ...                        ragged=["['p']"])
    >>> plan = s._writer._plan
    >>> row, stage = plan.stage({"x": np.int32(7), "p": [np.float32(1), np.float32(2)]})
    >>> row, stage.counts
    ([np.int32(7), 2], [2])
    >>> plan.write(row, stage, undo=True); s.flush(); s[0]["p"]
    [Array(1., dtype=float32), Array(2., dtype=float32)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from pytreestore._tree.layout_nodes import (
    Fixed,
    Kept,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    node_class,
    plain_leaf,
    visit,
)
from pytreestore._write.lists import ElementRows, FlatList
from pytreestore.errors import SchemaMismatchError

#: what a staged entry holds: exact numpy scalars (row after row), column blocks, or a table row
VALUES, BLOCKS, ROW = 0, 1, 2


class Mismatch(Exception):
    """A record departs from the layout (internal: the writer explains it)."""


class PendingStructure(Exception):
    """A record shows the structure of a list or optional subtree no record had (internal)."""


class Stage:
    """One record's rows before any is written: per axis table (by number) the rows staged,
    and the entries to write, in walk order."""

    __slots__ = ("counts", "entries", "risky", "rows")

    def __init__(self, tables: int) -> None:
        self.counts = [0] * tables
        self.entries: list[tuple[int, int, Any]] = []
        self.rows = False  # whether some entry is a ROW (converted at the end of the walk)
        self.risky = False  # whether some entry goes to a table writer that may write


#: a compiled node: (value, the row of its table, the record's stage, a shared-axis node's
#: blocks by slot or None)
Step = Callable[[Any, list, Stage, "dict[int, np.ndarray] | None"], None]


class Plan(Visitor):
    """The compiled walk of records of layout ``spec`` into ``tables`` (table -> writer,
    record table None first), whose columns are at ``slots[table][(role, keypath)]``;
    ``flat``: the lists whose elements are fixed trees. Its visitor methods compile a node of
    each kind (:mod:`pytreestore._tree.layout_nodes`), once per layout."""

    def __init__(
        self,
        spec: LayoutNode,
        tables: dict[str | None, Any],
        slots: dict[str | None, dict[tuple[str, str], int]],
        flat: dict[str, FlatList],
    ) -> None:
        self._records = tables[None]
        self._names = [t for t in tables if t is not None]
        self._index = {t: i for i, t in enumerate(self._names)}
        self._tables = [tables[t] for t in self._names]
        self._slots = slots
        self._flat = flat
        self._deferring = [isinstance(t, ElementRows) for t in self._tables]
        self._queues = [t for t in self._tables if isinstance(t, ElementRows)]
        self._width = len(slots[None])
        self._puts = [self._putter(i) for i in range(len(self._tables))]
        self._root = self._compile(spec, None, None)

    # ---- the two phases --------------------------------------------------------------------

    def push_due(self) -> None:
        """Buffers the rows waiting in a table whose block is due (before a record)."""
        for queue in self._queues:
            if queue.waiting >= queue.due_at:
                queue.push()

    def stage(self, record: Any) -> tuple[list[Any], Stage]:
        """The record table's row of ``record`` and its other tables' rows, checked.

        Raises:
            Mismatch: ``record`` departs from the layout.
            PendingStructure: it shows a structure no record had.
            SchemaMismatchError: a value of an axis table cannot be stored.
        """
        row: list[Any] = [None] * self._width
        stage = Stage(len(self._tables))
        self._root(record, row, stage, None)
        if stage.rows:
            self._convert_rows(stage)
        return row, stage

    def write(self, row: list[Any], stage: Stage, *, undo: bool) -> None:
        """Appends a staged record: its row (SchemaMismatchError for a leaf it refuses,
        nothing written), then every table's rows. With ``undo``, a table write that fails
        puts every table back (without, the caller rolls back: ``extend``)."""
        records = self._records
        if not (undo and stage.risky):
            records.append(row)
            puts = self._puts
            for i, kind, data in stage.entries:
                puts[i](kind, data)
            return
        before = records.snapshot()
        records.append(row)
        done: list[tuple[int, Any]] = []
        try:
            for i, kind, data in stage.entries:
                table = self._tables[i]
                done.append((i, table.waiting if self._deferring[i] else table.snapshot()))
                self._put(i, kind, data)
        except BaseException:
            for i, position in reversed(done):
                table = self._tables[i]
                table.forget(position) if self._deferring[i] else table.rollback(position)
            records.rollback(before)
            raise

    def _put(self, i: int, kind: int, data: Any) -> None:
        self._puts[i](kind, data)

    def _putter(self, i: int) -> Callable[[int, Any], None]:
        """How table ``i`` takes a staged entry (bound once per layout)."""
        table = self._tables[i]
        if self._deferring[i]:
            defer, defer_blocks = table.defer, table.defer_blocks

            def queue(kind: int, data: Any) -> None:
                defer(data) if kind == VALUES else defer_blocks(data)

            return queue
        flat = self._flat.get(self._names[i])

        def write(kind: int, data: Any) -> None:
            table.write_batch(flat.blocks(data) if kind == VALUES else data)  # type: ignore[union-attr]

        return write

    def _convert_rows(self, stage: Stage) -> None:
        """The ROW entries of each table as one entry of column blocks, checked and cast."""
        rows: dict[int, list[list[Any]]] = {}
        entries = []
        for i, kind, data in stage.entries:
            if kind == ROW:
                rows.setdefault(i, []).append(data)
            else:
                entries.append((i, kind, data))
        for i, table_rows in rows.items():
            entries.append((i, BLOCKS, rows_blocks(self._tables[i].casters, table_rows)))
            stage.risky = stage.risky or not self._deferring[i]
        stage.entries = entries

    # ---- compiling the layout ----------------------------------------------------------------

    def _compile(self, spec: LayoutNode | None, table: str | None, shared: Any) -> Step:
        """The step of ``spec``, a node of ``table`` below the shared axis ``shared``."""
        return visit(spec, self, table, shared)

    def kept(self, node: Kept, table: str | None, shared: Any) -> Step:
        return _kept(node.value)

    def _offsets(self, axis: str, table: str | None) -> tuple[int, int, Any]:
        """The axis's table number, its offsets' slot in ``table``'s row, its writer."""
        i = self._index[axis]
        return i, self._slots[table][("offsets", axis)], self._tables[i]

    def leaf(self, node: Leaf, table: str | None, shared: Any) -> Step:
        if node.axis is None:
            slot = self._slots[table][("leaf", node.path)]

            def leaf(value: Any, row: list, stage: Stage, blocks: Any) -> None:
                row[slot] = value

            return leaf
        axis = node.axis.path
        into = self._slots[axis][("leaf", node.path)]
        i = self._index[axis]
        caster = self._tables[i].casters[into]

        def block_of(value: Any) -> np.ndarray:
            shape = np.shape(value)
            if not shape:
                raise Mismatch
            return caster.coerce(value, batch=shape[0])

        if node.axis is shared:

            def shared_leaf(value: Any, row: list, stage: Stage, blocks: Any) -> None:
                blocks[into] = block_of(value)

            return shared_leaf
        _, slot, writer = self._offsets(axis, table)

        def leading(value: Any, row: list, stage: Stage, blocks: Any) -> None:
            block = block_of(value)
            stage.entries.append((i, BLOCKS, [block]))
            stage.counts[i] += len(block)
            stage.risky = True
            row[slot] = len(writer) + stage.counts[i]

        return leading

    def fixed(self, node: Fixed, table: str | None, shared: Any) -> Step:
        flatten = node.treedef.flatten_up_to
        own = node.common_axis
        below = own if own is not None else shared
        plain: list[tuple[int, int]] = []
        steps: list[tuple[int, Step]] = []
        for k, child in enumerate(node.children):
            leaf = plain_leaf(child)
            if leaf is not None:
                plain.append((k, self._slots[table][("leaf", leaf.path)]))
            else:
                steps.append((k, self._compile(child, table, below)))

        cls = node_class(node)  # flatten_up_to takes a dataclass of another class too

        def fixed_node(value: Any, row: list, stage: Stage, blocks: Any) -> None:
            if cls is not None and type(value) is not cls:
                raise Mismatch
            try:
                children = flatten(value)
            except (ValueError, TypeError):
                raise Mismatch from None
            for k, slot in plain:
                row[slot] = children[k]
            for k, step in steps:
                step(children[k], row, stage, blocks)

        if own is None:
            return fixed_node
        i, slot, writer = self._offsets(own.path, table)
        paths = [c.path for c in writer.schema.columns]

        def shared_node(value: Any, row: list, stage: Stage, blocks: Any) -> None:
            mine: dict[int, np.ndarray] = {}
            fixed_node(value, row, stage, mine)
            lengths = {len(b) for b in mine.values()}
            if len(lengths) > 1:
                detail = ", ".join(f"{paths[j]}: {len(b)}" for j, b in sorted(mine.items()))
                raise SchemaMismatchError(
                    f"the leaves below {node.path or 'the root'} share one ragged leading "
                    f"axis, but their lengths differ ({detail})"
                )
            if mine:
                stage.entries.append((i, BLOCKS, [mine[j] for j in range(len(mine))]))
                stage.counts[i] += lengths.pop()
                stage.risky = True
            row[slot] = len(writer) + stage.counts[i]

        return shared_node

    def ragged(self, node: RaggedList, table: str | None, shared: Any) -> Step:
        axis = node.axis.path
        i, slot, writer = self._offsets(axis, table)
        flat = self._flat.get(axis)
        if flat is not None:
            casters = writer.casters
            risky = not self._deferring[i]

            def flat_list(value: Any, row: list, stage: Stage, blocks: Any) -> None:
                if type(value) is not list:
                    raise Mismatch
                if value:
                    values = flat.exact_values(value)
                    if values is None:
                        stage.entries.append((i, BLOCKS, flat_blocks(flat, casters, value)))
                    else:
                        stage.entries.append((i, VALUES, values))
                    stage.counts[i] += len(value)
                    if risky:
                        stage.risky = True
                row[slot] = len(writer) + stage.counts[i]

            return flat_list
        element = None if node.element is None else self._compile(node.element, axis, None)
        width = len(self._slots[axis])
        path = node.path

        def walked_list(value: Any, row: list, stage: Stage, blocks: Any) -> None:
            if type(value) is not list:
                raise Mismatch
            if value:
                if element is None:
                    raise PendingStructure(path)
                for item in value:
                    sub: list[Any] = [None] * width
                    element(item, sub, stage, None)
                    stage.entries.append((i, ROW, sub))
                stage.counts[i] += len(value)
                stage.rows = True
            row[slot] = len(writer) + stage.counts[i]

        return walked_list

    def optional(self, node: OptionalTree, table: str | None, shared: Any) -> Step:
        presence = self._slots[table][("presence", node.path)]
        path = node.path
        if node.inner is None:

            def unknown(value: Any, row: list, stage: Stage, blocks: Any) -> None:
                row[presence] = value is not None
                if value is not None:
                    raise PendingStructure(path)

            return unknown
        inner = self._compile(node.inner, table, shared)
        absent = _Absent(self, table)
        visit(node.inner, absent)
        zeros, empty = absent.zeros, absent.empty

        def optional(value: Any, row: list, stage: Stage, blocks: Any) -> None:
            if value is not None:
                row[presence] = True
                inner(value, row, stage, blocks)
                return
            row[presence] = False
            for slot, zero in zeros:
                row[slot] = zero
            for slot, i, writer in empty:
                row[slot] = len(writer) + stage.counts[i]

        return optional


class _Absent(Visitor):
    """What the row of an optional subtree that is None holds: ``zeros`` (slot, value) for
    its leaves (and False for each optional subtree inside), ``empty`` (slot, axis table,
    its writer) for each of its axes: no elements."""

    def __init__(self, plan: Plan, table: str | None) -> None:
        self.plan, self.table, self.slots = plan, table, plan._slots[table]
        self.zeros: list[tuple[int, Any]] = []
        self.empty: list[tuple[int, int, Any]] = []

    def leaf(self, node: Leaf) -> None:
        if node.axis is None:
            self.zeros.append((self.slots[("leaf", node.path)], np.zeros(node.shape, node.dtype)))
        else:
            self.no_rows(node.axis.path)

    def ragged(self, node: RaggedList) -> None:
        self.no_rows(node.axis.path)

    def optional(self, node: OptionalTree) -> None:
        self.zeros.append((self.slots[("presence", node.path)], False))
        visit(node.inner, self)

    def fixed(self, node: Fixed) -> None:
        for child in node.children:
            visit(child, self)

    def no_rows(self, axis: str) -> None:
        i, slot, writer = self.plan._offsets(axis, self.table)
        self.empty.append((slot, i, writer))


def _kept(kept: Any) -> Step:
    def check(value: Any, row: list, stage: Stage, blocks: Any) -> None:
        if value is not kept and value != kept:
            raise Mismatch

    return check


# ---- values into column blocks ---------------------------------------------------------------

#: types whose values are leaves that ``np.asarray`` reads exactly (more are added as met)
_LEAF_TYPES: set[type] = {bool, int, float, complex, np.ndarray}


def _all_leaves(types: set[type]) -> bool:
    for t in types:
        if t not in _LEAF_TYPES:
            if not (issubclass(t, np.generic) or issubclass(t, jax.Array)):
                return False  # a node (a tuple of numbers reads as an array), or unknown
            _LEAF_TYPES.add(t)
    return True


def column_block(caster: Any, values: Sequence[Any]) -> np.ndarray | None:
    """``values`` (one column's, of many rows) as one block of the column's dtype and
    shape, by one conversion; None when one conversion cannot tell (a value that is no
    plain leaf, a PRNG key, mixed shapes, a value the column refuses): check them one by
    one then (:func:`one_by_one`)."""
    if caster.key_impl is not None or not _all_leaves(set(map(type, values))):
        return None
    try:
        array = np.asarray(values)
    except (ValueError, TypeError, OverflowError):
        return None
    if array.dtype is caster.dtype and array.shape[1:] == caster.shape:
        return array
    if array.dtype == object:
        return None
    try:
        return caster.coerce(array, batch=len(values))
    except SchemaMismatchError:
        return None


def one_by_one(casters: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[np.ndarray]:
    """Each column's block of ``rows`` (values in column order), every value checked and
    cast on its own, as one record's leaf is: the first refused raises its error."""
    cast = [[c.coerce(v) for c, v in zip(casters, row)] for row in rows]
    return [
        np.stack([row[j] for row in cast]) if cast else np.zeros((0, *c.shape), c.dtype)
        for j, c in enumerate(casters)
    ]


def columns_blocks(
    casters: Sequence[Any], columns: Sequence[Sequence[Any]], n: int
) -> list[np.ndarray]:
    """Column blocks of ``n`` rows given column by column, checked and cast."""
    blocks = [column_block(c, col) for c, col in zip(casters, columns)]
    if all(b is not None for b in blocks):
        return blocks  # type: ignore[return-value]
    return one_by_one(casters, [[col[r] for col in columns] for r in range(n)])


def rows_blocks(casters: Sequence[Any], rows: Sequence[Sequence[Any]]) -> list[np.ndarray]:
    """Column blocks of table rows (one list of values per row), checked and cast."""
    columns = [[row[j] for row in rows] for j in range(len(casters))]
    return columns_blocks(casters, columns, len(rows))


def flat_blocks(flat: FlatList, casters: Sequence[Any], items: list) -> list[np.ndarray]:
    """Column blocks of the elements ``items`` of a list of fixed trees (one flatten).

    Raises:
        Mismatch: an element is not of the element's structure.
        SchemaMismatchError: a leaf of an element cannot be stored (the first one).
    """
    columns = flat.columns(items)
    if columns is None:
        raise Mismatch
    return columns_blocks(casters, columns, len(items))


__all__ = [
    "BLOCKS",
    "ROW",
    "VALUES",
    "Mismatch",
    "PendingStructure",
    "Plan",
    "Stage",
    "column_block",
    "columns_blocks",
    "flat_blocks",
    "one_by_one",
    "rows_blocks",
]
