"""Ragged lists whose elements are fixed trees (no list, optional subtree, ragged axis or
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
from collections.abc import Callable
from itertools import chain
from typing import Any

import numpy as np
from jax.tree_util import GetAttrKey, tree_flatten, tree_structure

from pytreestore._commit.model import representative
from pytreestore._format import nodes as _nodes
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


__all__ = ["FlatList", "flat_elements"]
