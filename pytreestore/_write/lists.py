"""The tables of ragged lists: elements that are numpy scalars, and elements that are fixed trees.

The table of a ragged list whose elements' leaves are numpy scalars: their values kept
as they are until a block is due, then converted one column at a time.

An element's leaves that are numpy scalars of exactly their columns' dtypes
(:meth:`~pytreestore._write.lists.FlatList.exact_values`) need no check and no cast, and
numpy scalars cannot change once made: :class:`ElementRows` keeps each record's values
as they are, element after element in one list, and converts a block of them when it is
due (:meth:`ElementRows.push`: one ``np.fromiter`` per column of about 20 ns a value, against
about 0.5 us per column and record for one record's handful). Anything else appended to the table (blocks already checked and
cast) waits in the same queue, in order.

It stands in for the table's :class:`~pytreestore._write.writer.Writer` in a
:class:`~pytreestore._write.records.RecordWriter`: its length counts the rows waiting,
``flush``, ``snapshot`` and ``rollback`` push or forget them first, so every commit holds
every row of the records it counts. A push writes whole chunks only at chunk boundaries; if
a chunk write fails, the rows not written stay queued and the writer is as before that
chunk (nothing acknowledged is lost).

Example:
    >>> import numpy as np
    >>> from pytreestore._log.commit_record import Commit
    >>> from pytreestore._log.protocol import layouts
    >>> from pytreestore._write.writer import Writer
    >>> from pytreestore._format.schema import TreeSchema
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import TensorStoreBackend
    >>> schema = TreeSchema.from_example({"x": np.float32(0)}, chunk_records=4)
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-elements"))
    >>> backend.create_columns(layouts(schema))
    >>> rows = ElementRows(Writer(backend, schema, Commit(0, 0)), (np.float32,))
    >>> rows.defer([np.float32(1), np.float32(2)]); len(rows), rows.waiting
    (2, 2)
    >>> rows.push(); len(rows), rows.waiting, rows.writer.buffers[0][:2].tolist()
    (2, 0, [1.0, 2.0])

Ragged lists whose elements are fixed trees (no list, optional subtree, ragged axis or
constant inside): a writer takes their elements column by column, never walking one.

Two ways, tried in this order:

* :meth:`FlatList.exact_values`: the elements' leaves, element after element (each
  element's in table order), read by one C-level getter per element
  (``operator.attrgetter`` of a ``register_dataclass``/flax dataclass's fields,
  ``itemgetter`` of a dict's keys or a tuple's places) and chained into one list, never
  turned into columns (a table turns a whole block of them into columns at once:
  :meth:`FlatList.blocks`); taken only when every element is of the element's class
  (``type(x) is C``) and every leaf is a numpy scalar of exactly its column's dtype (one
  comparison of the elements' and leaves' types against the expected pattern), so the values
  hold nothing to check or cast, and nothing that can change after the call (numpy scalars
  are immutable). Elements one level deep only (a node of leaves, or a leaf).
* :meth:`FlatList.columns`: one ``tree_flatten`` of the whole list, its treedef compared
  with a list of ``n`` elements', and the leaves cut into columns, for any other elements
  (Python scalars, arrays, jax arrays, nested nodes); None when the structure differs.

Example:
    >>> import numpy as np
    >>> from pytreestore._tree.layout_nodes import Fixed, Leaf
    >>> from jax.tree_util import tree_structure
    >>> x, y = Leaf("[*]['x']", np.dtype("float32"), ()), Leaf("[*]['y']", np.dtype("int8"), ())
    >>> spec = Fixed("[*]", tree_structure({"x": 0, "y": 0}), [x, y])
    >>> flat = FlatList(spec, [0, 1])
    >>> values = flat.exact_values([{"x": np.float32(1), "y": np.int8(2)}] * 2); values
    [np.float32(1.0), np.int8(2), np.float32(1.0), np.int8(2)]
    >>> [b.tolist() for b in flat.blocks(values)]
    [[1.0, 1.0], [2, 2]]
    >>> flat.exact_values([{"x": 1.0, "y": np.int8(2)}]) is None  # a Python float: columns()
    True
    >>> flat.columns([{"x": 1.0, "y": np.int8(2)}])
    [[1.0], [np.int8(2)]]
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
from jax.tree_util import GetAttrKey, tree_flatten, tree_structure

from pytreestore._format import nodes as _nodes
from pytreestore._log.model import representative
from pytreestore._runtime import RUNTIME
from pytreestore._tree.layout_nodes import (
    Fixed,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    below,
    node_class,
    plain_leaf,
    visit,
)
from pytreestore._write.roles import Block, Held, Position, Row
from pytreestore._write.writer import Writer


class ElementRows:
    """The table ``writer`` (a :class:`~pytreestore._write.writer.Writer`) of a ragged
    list whose columns hold numpy scalars of ``types`` (its columns' scalar types, in
    order), with rows waiting to be converted."""

    def __init__(self, writer: Writer, types: Sequence[type]) -> None:
        self.writer = writer
        self.schema = writer.schema
        self.casters = writer.casters
        self._dtypes = [np.dtype(t) for t in types]
        #: what waits, in order: blocks (one array per column), then the values of the
        #: records deferred since (element after element, each element's in column order)
        self._blocks: list[list[np.ndarray]] = []
        self._values: list[object] = []
        self._counts: list[int] = []  # rows of each of those records
        self.waiting = 0  # rows waiting, in both
        self.due_at = 0  # rows waiting from which a push is due (see due)
        self._due()

    def __len__(self) -> int:
        return len(self.writer) + self.waiting

    @property
    def due(self) -> bool:
        """Whether enough rows wait to fill the writer's chunk, or a block."""
        return self.waiting >= self.due_at

    # ---- what a record's walk appends (never any I/O, never a failure) -------------------

    def defer(self, values: list[object]) -> None:
        """Queues rows of exact numpy scalars given row after row (each row's values in
        column order); the list is the table's from now on."""
        n = len(values) // len(self._dtypes)
        self._values += values
        self._counts.append(n)
        self.waiting += n

    def defer_blocks(self, blocks: Sequence[np.ndarray]) -> None:
        """Queues checked and cast column blocks this table owns (no caller keeps them)."""
        self._close_columns()
        self._blocks.append(list(blocks))
        self.waiting += len(blocks[0])

    def forget(self, waiting: int) -> None:
        """Forgets the rows queued last, down to ``waiting`` rows (:attr:`waiting` before)."""
        drop = self.waiting - waiting
        while drop and self._counts:  # whole records' values, the last first
            assert self._counts[-1] <= drop, "forget() never cuts one deferral's rows"
            count = self._counts.pop()
            del self._values[len(self._values) - count * len(self._dtypes) :]
            drop -= count
        while drop:
            last = self._blocks[-1]
            if len(last[0]) <= drop:
                drop -= len(self._blocks.pop()[0])
            else:
                self._blocks[-1] = [b[: len(b) - drop] for b in last]
                drop = 0
        self.waiting = waiting

    def _close_columns(self) -> None:
        """The records' values waiting, as one block (one ``np.fromiter`` per column)."""
        if not self._counts:
            return
        values, count, k = self._values, sum(self._counts), len(self._dtypes)
        self._blocks.append(
            [
                np.fromiter(values[j::k] if k > 1 else values, t, count)
                for j, t in enumerate(self._dtypes)
            ]
        )
        self._values, self._counts = [], []

    # ---- the table writer's calls ----------------------------------------------------------

    def push(self) -> None:
        """Converts and buffers every queued row (whole chunks written as they fill).

        If a chunk write fails, the writer is as it was before that chunk and the rows not
        buffered stay queued."""
        if not self.waiting:
            return
        self._close_columns()
        parts = self._blocks
        blocks = parts[0] if len(parts) == 1 else [np.concatenate(c) for c in zip(*parts)]
        self._blocks, self.waiting = [], 0
        writer, count, done = self.writer, len(blocks[0]), 0
        while done < count:
            take = min(count - done, max(writer.chunk - writer.fill, 1))
            position = (writer.start, writer.fill)
            try:
                writer.write_batch([b[done : done + take] for b in blocks])
            except BaseException:
                writer.rollback(position)
                self._blocks = [[b[done:] for b in blocks]]
                self.waiting = count - done
                raise
            done += take
        self._due()

    def _due(self) -> None:
        writer = self.writer
        self.due_at = max(1, min(RUNTIME.writes.table_block_rows, writer.chunk - writer.fill))

    @property
    def chunk(self) -> int:
        return self.writer.chunk

    @property
    def start(self) -> int:
        return self.writer.start

    @property
    def fill(self) -> int:
        """The writer's rows buffered (the rows waiting here come after them)."""
        return self.writer.fill

    def buffered_rows(self) -> Held:
        """The writer's rows only memory holds, then the rows waiting here, converted (one
        block, kept for the push), for a read; nothing is written."""
        held = self.writer.buffered_rows()
        if not self.waiting:
            return held
        self._close_columns()
        parts = self._blocks
        blocks = parts[0] if len(parts) == 1 else [np.concatenate(c) for c in zip(*parts)]
        self._blocks = [blocks]
        return Held(held.start, held.stop + self.waiting, (*held.pieces, (held.stop, blocks)))

    def hand_partial(self) -> Callable[[], None] | None:
        """The writer's job for its rows not yet committed, every waiting row buffered first
        (:meth:`~pytreestore._write.writer.Writer.hand_partial`)."""
        self.push()
        return self.writer.hand_partial()

    def append_blocks(self, blocks: Iterator[Block]) -> None:
        self.push()
        self.writer.append_blocks(blocks)

    def append(self, leaves: Row) -> None:
        self.push()
        self.writer.append(leaves)

    def append_many(self, leaves_iter: Iterator[Row]) -> None:
        self.push()
        self.writer.append_many(leaves_iter)

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        self.push()
        self.writer.write_batch(blocks)

    def flush(self) -> None:
        self.push()
        self.writer.flush()
        self._due()

    def snapshot(self) -> Position:
        """The writer's position once every queued row is buffered."""
        self.push()
        return self.writer.snapshot()

    def rollback(self, position: Position) -> None:
        """Forgets the queue, and the writer's rows since ``position``."""
        self._blocks, self._values, self._counts, self.waiting = [], [], [], 0
        self.writer.rollback(position)
        self._due()


#: the leaves of a list of elements, element after element (None: not all of the element's
#: class)
Getter = Callable[[list], "list[Any] | None"]


class FlatList:
    """A ragged list whose elements are fixed trees ``spec``; ``slots[j]`` is the table
    column of the element's ``j``-th leaf in flatten order."""

    def __init__(self, spec: LayoutNode, slots: list[int]) -> None:
        self._element = representative(spec)
        self.width = len(slots)
        inverse = sorted(range(len(slots)), key=slots.__getitem__)
        #: flatten position of each table column (None: the same order)
        self.order = None if inverse == list(range(len(slots))) else inverse
        self._lists: dict[int, Any] = {}
        level = [spec] if plain_leaf(spec) is not None else below(spec)
        #: the numpy scalar type of each column, in table order (None: some column cannot
        #: hold bare scalars, a shaped leaf or a dtype without its own scalar type, or the
        #: element is more than one level deep)
        self.types = (
            _scalar_types([level[j] for j in inverse]) if len(level) == len(slots) else None
        )
        self._get = _getter(spec, inverse) if self.types is not None else None
        #: the element's class, checked with the leaves' types (None: a leaf element)
        self._cls = node_class(spec)
        self._patterns: dict[int, tuple[list[Any], list[type]]] = {}

    def of_length(self, n: int) -> Any:
        """The treedef of a list of ``n`` elements."""
        treedef = self._lists.get(n)
        if treedef is None:
            treedef = self._lists[n] = tree_structure([self._element] * n)
        return treedef

    def exact_values(self, items: list) -> list[Any] | None:
        """The leaves of the elements ``items``, element after element (each element's in
        table order), when every element is of the element's class and every leaf a numpy
        scalar of its column's exact dtype; else None."""
        if self._get is None:
            return None
        values = self._get(items)
        if values is None:
            return None
        n = len(items)
        classes, leaves = self._patterns.get(n) or self._pattern(n)
        if self._cls is not None and list(map(type, items)) != classes:
            return None  # an element of another class
        if list(map(type, values)) != leaves:  # a leaf of another type
            return None
        return values

    def _pattern(self, n: int) -> tuple[list[Any], list[type]]:
        """The types of ``n`` elements and of their leaves, when every one is exact."""
        pattern = self._patterns[n] = ([self._cls] * n, [*self.types] * n)  # type: ignore[misc]
        return pattern

    def blocks(self, values: list[Any]) -> list[np.ndarray]:
        """The column blocks of :meth:`exact_values`' ``values`` (of one or more calls),
        one ``np.fromiter`` per column."""
        k, types = self.width, self.types
        n = len(values) // k
        if k == 1:
            return [np.fromiter(values, types[0], n)]  # type: ignore[index]
        return [np.fromiter(values[j::k], t, n) for j, t in enumerate(types)]  # type: ignore[arg-type]

    def columns(self, items: list) -> list[list] | None:
        """Each table column's values (in table order) of the elements ``items``, by one
        flatten of the list; None when the list is not ``len(items)`` elements of the
        element's structure."""
        leaves, got = tree_flatten(items)
        if not _nodes.same_structure(got, self.of_length(len(items))):
            return None
        k = self.width
        columns = [leaves[j::k] for j in range(k)]
        return columns if self.order is None else [columns[i] for i in self.order]


def _scalar_types(leaves: list[LayoutNode]) -> tuple[type, ...] | None:
    out = []
    for leaf in leaves:
        leaf = plain_leaf(leaf)
        if leaf is None or leaf.shape != ():
            return None
        scalar = leaf.dtype.type
        if not (isinstance(scalar, type) and issubclass(scalar, np.generic)):
            return None
        if np.dtype(scalar) != leaf.dtype or scalar is np.object_:
            return None
        out.append(scalar)
    return tuple(out)


class _Getter(Visitor):
    """The columns of a list of elements, by one C-level getter per element (a leaf element
    is its own column); None where the element's class has no getter known to match its
    flatten."""

    def leaf(self, node: Leaf, inverse: list[int]) -> Getter | None:
        return list

    def fixed(self, node: Fixed, inverse: list[int]) -> Getter | None:
        if all(plain_leaf(c) is not None for c in node.children):
            return _node_getter(node, inverse)
        return None


def _getter(spec: LayoutNode, inverse: list[int]) -> Getter | None:
    return visit(spec, _Getter(), inverse)


def _node_getter(spec: Fixed, inverse: list[int]) -> Getter | None:
    cls = node_class(spec)
    n = len(spec.children)
    if n == 0 or not isinstance(cls, type):
        return None
    try:
        probe_leaves = [object() for _ in range(n)]
        probe = spec.treedef.unflatten(probe_leaves)
        level = _nodes.one_level(probe)
    except Exception:  # a class that cannot be built from placeholders: no getter
        return None
    if level is None or level[0] != spec.treedef:
        return None
    fields = _fields(cls, level[1], inverse)
    if fields is None:
        return None
    getter, names = fields
    if any(getter(name)(probe) is not probe_leaves[j] for name, j in zip(names, inverse)):
        return None  # the getters do not read what the flatten gives
    return _columns_getter(getter, names, check_len=cls in (dict, list, tuple))


def _fields(cls: type, keys: list[Any], inverse: list[int]) -> tuple[Any, list[Any]] | None:
    """``operator.attrgetter`` or ``itemgetter``, and the name, key or place of each child
    (keypath entries ``keys``, flatten order) in table order, when ``cls`` flattens to
    exactly them; else None."""
    if cls is dict:
        return operator.itemgetter, [keys[j].key for j in inverse]
    if cls in (list, tuple) or _nodes.is_plain_namedtuple(cls):
        return operator.itemgetter, list(inverse)
    fields = _nodes.dataclass_fields(cls)
    if fields is None or fields[1] or not all(type(k) is GetAttrKey for k in keys):
        return None  # static fields, or a flatten of its own: the generic way
    if tuple(k.name for k in keys) != fields[0]:
        return None
    return operator.attrgetter, [keys[j].name for j in inverse]


def _columns_getter(getter: Any, names: list[Any], *, check_len: bool) -> Getter:
    """The leaves of elements, element after element: one C-level ``getter`` of all of an
    element's children ``names`` (in table order) per element, chained into one list. The
    elements' class is checked by the caller, with the leaves' types (a dict's, list's or
    tuple's length here: a longer one reads too)."""
    sizes = {len(names)}
    get = getter(*names)
    one = len(names) == 1  # the getter gives the value, not a tuple of one

    def values(items: list) -> list[Any] | None:
        try:
            if check_len and set(map(len, items)) != sizes:
                return None
            return list(map(get, items)) if one else list(chain.from_iterable(map(get, items)))
        except Exception:  # no length, no such key or field (another class: refused after)
            return None

    return values


def flat_elements(
    spec: LayoutNode | None, slots: dict[str | None, dict[tuple[str, str], int]]
) -> dict[str, FlatList]:
    """The ragged lists whose elements are fixed trees (no list, optional subtree, ragged
    axis or constant inside)."""
    found = _FlatLists(slots)
    visit(spec, found)
    return found.out


class _FlatLists(Visitor):
    """Collects :func:`flat_elements`."""

    def __init__(self, slots: dict[str | None, dict[tuple[str, str], int]]) -> None:
        self.slots = slots
        self.out: dict[str, FlatList] = {}

    def ragged(self, node: RaggedList) -> None:
        leaves: list[Leaf] = []
        if node.element is not None and visit(node.element, _FixedLeaves(), leaves):
            table = self.slots[node.axis.path]
            order = [table[("leaf", leaf.path)] for leaf in leaves]
            if len(order) == len(table):
                self.out[node.axis.path] = FlatList(node.element, order)
        visit(node.element, self)

    def optional(self, node: OptionalTree) -> None:
        visit(node.inner, self)

    def fixed(self, node: Fixed) -> None:
        for child in node.children:
            visit(child, self)


class _FixedLeaves(Visitor):
    """Whether a node is a fixed tree (collecting its leaves in flatten order): no list,
    optional subtree, ragged axis or constant inside."""

    def leaf(self, node: Leaf, leaves: list[Leaf]) -> bool:
        leaves.append(node)
        return node.axis is None

    def fixed(self, node: Fixed, leaves: list[Leaf]) -> bool:
        return node.common_axis is None and all(visit(c, self, leaves) for c in node.children)

    def other(self, node: LayoutNode, *args: Any) -> bool:
        return False


__all__ = ["ElementRows", "FlatList", "flat_elements"]
