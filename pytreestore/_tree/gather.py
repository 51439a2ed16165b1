"""Records of one layout (:mod:`pytreestore._tree.layout`) walked once into columns: the fast
path of ``stack(records, ragged=/optional=)``.

A layout is cut into *segments*: the fixed nodes between two ragged lists (or optional
subtrees) form one treedef whose leaves are *holes*, one per column below it: an array leaf,
a ragged list (whose elements form a segment of their own) or an optional subtree (its
inner segment). A segment flattens all its values with one ``flatten_up_to`` each (a ragged
list, all its elements at once), which checks every fixed node's class, keys and static data
as the per-record walk does; every value a column gathers is checked where it is converted
(:mod:`pytreestore._tree.scatter`). Whatever departs from the layout raises
:class:`Departs`, and the caller takes the checked per-record path, which says what differs
and where.

Example:
    >>> from pytreestore._tree.layout import build_layout
    >>> from pytreestore._tree.ragged import Declarations
    >>> records = [{"p": [1.0, 2.0], "s": 1}, {"p": [3.0], "s": 2}]
    >>> top = segment(build_layout(records, None, Declarations.parse(True, None)))
    >>> walk(top, records)
    >>> top.columns[0].lengths.tolist(), top.columns[0].element.columns[0].values
    ([2, 1], [1.0, 2.0, 3.0])
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.tree_util import tree_structure

from pytreestore._tree.layout_nodes import (
    Fixed,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    visit,
)


class Departs(Exception):
    """A value departs from the layout, or the layout has a node this path leaves to the
    checked per-record path (internal: never reaches the user)."""


@dataclasses.dataclass(eq=False)
class LeafColumn:
    """An array leaf: ``values`` holds one value per row of its segment."""

    spec: Leaf
    values: list[Any] = dataclasses.field(default_factory=list)
    #: after padding (ragged leading axis only): per kept row, the length kept; the padded one
    kept: Any = None
    size: int = 0


@dataclasses.dataclass(eq=False)
class ListColumn:
    """A ragged list: ``lengths`` per row; its elements are the rows of ``element``."""

    spec: RaggedList
    element: Segment
    lengths: Any = None
    #: after padding: per kept row, the count of elements kept; the padded length
    kept: Any = None
    size: int = 0

    def treedef(self, n: int) -> Any:
        """The treedef of a list of ``n`` elements, whose leaves are the element's holes."""
        try:
            return _cached_list_treedef(self.element.treedef, n)
        except TypeError:  # static data that cannot be hashed
            return list_treedef(self.element.treedef, n)


def list_treedef(element: Any, n: int) -> Any:
    """The treedef of a list of ``n`` elements of the treedef ``element``."""
    return tree_structure([element.unflatten([_HOLE] * element.num_leaves)] * n)


#: a ragged list needs one treedef per length it takes, in every call
_cached_list_treedef = functools.lru_cache(maxsize=4096)(list_treedef)


@dataclasses.dataclass(eq=False)
class OptionalColumn:
    """An optional subtree: ``present`` per row; the present ones are the rows of ``inner``."""

    spec: OptionalTree
    inner: Segment
    present: Any = None
    #: after padding: ``present`` of the kept rows
    kept: Any = None


Column = LeafColumn | ListColumn | OptionalColumn


@dataclasses.dataclass(eq=False)
class Segment:
    """Fixed nodes down to the next holes: ``treedef`` has one leaf per column, in order;
    ``shared``: the columns of each node whose leaves share one ragged leading axis."""

    treedef: Any
    columns: list[Column]
    shared: list[list[LeafColumn]]

    @property
    def bare(self) -> bool:
        """Whether the segment is one hole (no fixed node above its column)."""
        return self.treedef.num_nodes == 1 and self.treedef.num_leaves == 1


_HOLE = 0


def segment(spec: LayoutNode) -> Segment:
    """The segment at the top of ``spec`` (its columns' segments below it).

    Raises:
        Departs: ``spec`` has a leaf that is no array (a function: kept per record), an
            optional subtree below a node whose leaves share one ragged leading axis, or a
            node class that cannot be rebuilt from placeholders.
    """
    columns: list[Column] = []
    shared: list[list[LeafColumn]] = []
    try:
        template = _template(spec, columns, shared, [])
        treedef = tree_structure(template)
    except Departs:
        raise
    except Exception as err:  # a node class whose unflatten checks its children
        raise Departs(f"cannot rebuild {spec.path or 'the root'}") from err
    if treedef.num_leaves != len(columns):  # a node whose children depend on their values
        raise Departs(f"the nodes at {spec.path or 'the root'} do not rebuild as they flatten")
    return Segment(treedef, columns, shared)


def _template(
    spec: LayoutNode, columns: list[Column], shared: list[list[LeafColumn]], groups: list[list]
) -> Any:
    return visit(spec, _Template(columns, shared), groups)


class _Template(Visitor):
    """A segment's template: its fixed nodes with a hole for each column (appended to
    ``columns``); ``groups``: the columns of each enclosing node declared ragged so far."""

    def __init__(self, columns: list[Column], shared: list[list[LeafColumn]]) -> None:
        self.columns, self.shared = columns, shared

    def fixed(self, node: Fixed, groups: list[list]) -> Any:
        if node.common_axis is not None:
            groups = [*groups, []]
        kids = [visit(c, self, groups) for c in node.children]
        if node.common_axis is not None:
            self.shared.append(groups[-1])
        return node.treedef.unflatten(kids)

    def leaf(self, node: Leaf, groups: list[list]) -> Any:
        column = LeafColumn(node)
        if node.axis is not None:
            for group in groups:
                group.append(column)
        return self.hole(column)

    def ragged(self, node: RaggedList, groups: list[list]) -> Any:
        if node.element is None:
            return self.other(node)
        return self.hole(ListColumn(node, segment(node.element)))

    def optional(self, node: OptionalTree, groups: list[list]) -> Any:
        if node.inner is None or groups:
            return self.other(node)
        return self.hole(OptionalColumn(node, segment(node.inner)))

    def other(self, node: LayoutNode, *args: Any) -> Any:
        raise Departs(f"{type(node).__name__} at {node.path or 'the root'}")

    def hole(self, column: Column) -> Any:
        self.columns.append(column)
        return _HOLE


def walk(seg: Segment, values: Sequence[Any]) -> None:
    """Gathers ``values`` (the rows of ``seg``) into its columns, checking every fixed node.

    Raises:
        Departs: a value departs from the layout.
    """
    if seg.bare:
        take(seg.columns[0], list(values))
        return
    flatten = seg.treedef.flatten_up_to
    try:
        rows = [flatten(v) for v in values]
    except (ValueError, TypeError) as err:
        raise Departs(str(err)) from err
    _take_rows(seg, list(itertools.chain.from_iterable(rows)))


def _take_rows(seg: Segment, flat: list[Any]) -> None:
    """Gives each column of ``seg`` its values from ``flat``, the holes of its rows in order."""
    k = len(seg.columns)
    for i, column in enumerate(seg.columns):
        take(column, flat[i::k])


def take(column: Column, values: list[Any]) -> None:
    """Gathers one column's ``values`` (and those of the segments below it)."""
    if isinstance(column, LeafColumn):
        column.values = values
    elif isinstance(column, ListColumn):
        _take_lists(column, values)
    else:
        present = [v is not None for v in values]
        column.present = np.array(present, bool)
        walk(column.inner, [v for v in values if v is not None])


def _take_lists(column: ListColumn, values: list[Any]) -> None:
    if any(type(v) is not list for v in values):
        raise Departs(f"not a list at {column.spec.path}")
    column.lengths = np.fromiter(map(len, values), np.intp, len(values))
    element = column.element
    if element.bare:
        take(element.columns[0], list(itertools.chain.from_iterable(values)))
        return
    flat: list[Any] = []
    try:
        for v in values:
            flat += column.treedef(len(v)).flatten_up_to(v)
    except (ValueError, TypeError) as err:
        raise Departs(str(err)) from err
    _take_rows(element, flat)


__all__ = ["Departs", "LeafColumn", "ListColumn", "OptionalColumn", "Segment", "segment", "walk"]
