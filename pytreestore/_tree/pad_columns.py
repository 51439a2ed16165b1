"""Records of one layout as columns, and columns to one padded batch and its mask: the fast path of padding.

Records of one layout (:mod:`pytreestore._tree.layout`) walked once into columns: the fast
path of ``stack(records, ragged=/optional=)``.

A layout is cut into *segments*: the fixed nodes between two ragged lists (or optional
subtrees) form one treedef whose leaves are *holes*, one per column below it: an array leaf,
a ragged list (whose elements form a segment of their own) or an optional subtree (its
inner segment). A segment flattens all its values with one ``flatten_up_to`` each (a ragged
list, all its elements at once), which checks every fixed node's class, keys and static data
as the per-record walk does; every value a column gathers is checked where it is converted
(:mod:`pytreestore._tree.pad_columns`). Whatever departs from the layout raises
:class:`Departs`, and the caller takes the checked per-record path, which says what differs
and where.

Example:
    >>> from pytreestore._tree.layout import build_layout
    >>> from pytreestore._tree.layout_nodes import Declarations
    >>> records = [{"p": [1.0, 2.0], "s": 1}, {"p": [3.0], "s": 2}]
    >>> top = segment(build_layout(records, None, Declarations.parse(True, None)))
    >>> walk(top, records)
    >>> top.columns[0].lengths.tolist(), top.columns[0].element.columns[0].values
    ([2, 1], [1.0, 2.0, 3.0])

Gathered columns (:mod:`pytreestore._tree.pad_columns`) to one padded batch and its mask: each
leaf's values converted with one numpy call (the store's casting rule, value by value only
where a column is not all of one exact type) and assigned into zeros at positions computed
from the lengths (``np.repeat``/``cumsum`` index arithmetic), never record by record.

A *space* is the rows of one segment: the records, the elements of a ragged list (all
records' elements, in order), or the present rows of an optional subtree; ``index`` gives
each row's flat position in the padded leading axes ``prefix`` (-1: cut by ``trim``).

Example:
    >>> import numpy as np
    >>> top = Space.records(2)
    >>> elements = top.child(np.array([2, 1]), 3, trim=False)
    >>> elements.index.tolist(), elements.prefix
    ([0, 1, 3], (2, 3))
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_structure

from pytreestore._format import dtypes as _dtypes
from pytreestore._tree.convert import LeafCaster
from pytreestore._tree.layout_nodes import (
    Fixed,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    visit,
)
from pytreestore.errors import SchemaMismatchError


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


#: a padded length for the longest length of an axis (pad.padded_length with its pad_to)
Limit = Callable[[int], int]


@dataclasses.dataclass(frozen=True)
class Space:
    """The rows of one segment and where they go in the padded leading axes ``prefix``."""

    rows: int
    prefix: tuple[int, ...]
    #: flat positions in ``prefix``; -1 for a row that ``trim`` cut; None: the records
    index: np.ndarray | None = None

    @classmethod
    def records(cls, n: int) -> Space:
        return cls(n, (n,))

    def positions(self) -> np.ndarray:
        return np.arange(self.rows) if self.index is None else self.index

    @functools.cached_property
    def keep(self) -> np.ndarray | None:
        """Which rows were kept (None: all)."""
        if self.index is None or self.index.size == 0 or self.index.min() >= 0:
            return None
        return self.index >= 0

    @functools.cached_property
    def mask(self) -> np.ndarray:
        """True at the kept rows' positions in ``prefix``."""
        mask = np.zeros(self.prefix, bool)
        index = self.positions() if self.keep is None else self.positions()[self.keep]
        mask.reshape(mask.size)[index] = True
        return mask

    def child(self, lengths: np.ndarray, size: int, *, trim: bool) -> Space:
        """The space of ``lengths[i]`` sub-rows per row, padded to ``size``."""
        total = int(lengths.sum())
        starts = np.cumsum(lengths) - lengths
        within = np.arange(total) - np.repeat(starts, lengths)
        parent = np.repeat(self.positions(), lengths)
        index = parent * size + within
        if trim or self.keep is not None:
            index[(within >= size) | (parent < 0)] = -1
        return Space(total, (*self.prefix, size), index)

    def subset(self, present: np.ndarray) -> Space:
        """The space of the rows where ``present`` is True."""
        return Space(int(present.sum()), self.prefix, self.positions()[present])


def pad(seg: Segment, space: Space, limit: Limit, trim: bool) -> tuple[Any, Any]:
    """The padded batch and mask of ``seg``'s gathered rows, laid out in ``space``.

    Raises:
        Departs: a value is refused (a dtype, a shape, a length above ``pad_to``) or the
            leaves of a node that shares one leading axis disagree: the checked path says so.
    """
    for group in seg.shared:
        lengths = [_axis_lengths(c) for c in group]
        if any(not np.array_equal(x, lengths[0]) for x in lengths[1:]):
            raise Departs("the leaves of a node disagree on their shared leading axis")
    parts = [_pad_column(c, space, limit, trim) for c in seg.columns]
    if seg.bare:
        return parts[0]
    return tuple(seg.treedef.unflatten([p[i] for p in parts]) for i in (0, 1))  # type: ignore[return-value]


def _pad_column(column: Any, space: Space, limit: Limit, trim: bool) -> tuple[Any, Any]:
    kept = space.keep
    if isinstance(column, LeafColumn):
        return _pad_leaf(column, space, limit, trim)
    if isinstance(column, ListColumn):
        lengths = column.lengths
        size = _size(lengths, limit, trim)
        column.spec.axis.longest = int(lengths.max(initial=0))
        column.kept, column.size = _kept(np.minimum(lengths, size), kept), size
        return pad(column.element, space.child(lengths, size, trim=trim), limit, trim)
    column.kept = _kept(column.present, kept)
    return pad(column.inner, space.subset(column.present), limit, trim)


def _kept(counts: np.ndarray, kept: np.ndarray | None) -> np.ndarray:
    return counts if kept is None else counts[kept]


def _size(lengths: np.ndarray, limit: Limit, trim: bool) -> int:
    size = limit(int(lengths.max(initial=0)))
    if not trim and lengths.size and int(lengths.max()) > size:
        raise Departs("a length above pad_to")
    return size


def _pad_leaf(column: LeafColumn, space: Space, limit: Limit, trim: bool) -> tuple[Any, Any]:
    """The padded leaf and its mask; the column lets go of the values it gathered."""
    spec = column.spec
    if spec.axis is None:
        values = leaf_values(column)
        column.values = []
        if space.index is None:
            return values, np.ones(space.rows, bool)
        return _scatter(values, space, spec.shape)
    lengths = _axis_lengths(column)
    size = _size(lengths, limit, trim)
    spec.axis.longest = int(lengths.max(initial=0))  # type: ignore[union-attr]
    column.kept, column.size = _kept(np.minimum(lengths, size), space.keep), size
    values = axis_values(column)
    column.values = []
    return _scatter(values, space.child(lengths, size, trim=trim), spec.shape)


def _scatter(values: np.ndarray, space: Space, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """``values`` (one per row of ``space``) at their positions in zeros, and the mask.

    The positions of a space's rows ascend (records, then each record's elements), so a
    boolean mask assignment puts the rows in order.
    """
    out = np.zeros((*space.prefix, *shape), values.dtype)
    out[space.mask] = values if space.keep is None else values[space.keep]
    return out, space.mask.copy()


def leaf_values(column: LeafColumn) -> np.ndarray:
    """The values of a leaf without a ragged axis as one array ``(rows, *shape)``.

    Raises:
        Departs: a value is no leaf of the leaf's shape, or the casting rule refuses it.
    """
    spec, values = column.spec, column.values
    dtype, shape = spec.dtype, spec.shape
    if not shape:
        types = set(map(type, values))
        if types <= _exact(dtype):
            out = _scalars(values, dtype, types)
            if out is not None:
                return out
    if not all(type(v) is np.ndarray and v.dtype == dtype and v.shape == shape for v in values):
        values = [_coerce(spec, v, _shape_of(v, spec, ragged=False)) for v in values]
    if not values:
        return np.zeros((0, *shape), dtype)
    return np.concatenate(values).reshape(len(values), *shape) if shape else np.stack(values)


def axis_values(column: LeafColumn) -> np.ndarray:
    """The values of a leaf with a ragged leading axis, concatenated along it.

    Raises:
        Departs: a value is no leaf of the leaf's shape, or the casting rule refuses it.
    """
    spec, values = column.spec, column.values
    dtype, shape = spec.dtype, spec.shape
    if not all(
        type(v) is np.ndarray and v.dtype == dtype and v.ndim and v.shape[1:] == shape
        for v in values
    ):
        values = [_coerce(spec, v, _shape_of(v, spec, ragged=True)) for v in values]
    return np.concatenate(values) if values else np.zeros((0, *shape), dtype)


def _axis_lengths(column: LeafColumn) -> np.ndarray:
    """Each value's leading length (its shape is checked with its values)."""
    values, spec = column.values, column.spec
    if all(type(v) is np.ndarray and v.ndim for v in values):
        lengths = (v.shape[0] for v in values)
    else:
        lengths = (_shape_of(v, spec, ragged=True)[0] for v in values)
    return np.fromiter(lengths, np.intp, len(values))


def _exact(dtype: np.dtype) -> frozenset[type]:
    return _dtypes.python_kinds_accepted(dtype) | {dtype.type}


def _scalars(values: list[Any], dtype: np.dtype, types: set[type]) -> np.ndarray | None:
    """Scalars of exact types in one array; None when a Python scalar may not fit (the
    value by value rule then refuses it, or takes an infinity that was one already)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.array(values, dtype)
    except (OverflowError, ValueError, TypeError):
        return None
    python = types - {dtype.type}
    if python and _dtypes.kind(dtype) in "fc" and not np.isfinite(out).all():
        return None
    return out


def _shape_of(value: Any, spec: Any, *, ragged: bool) -> tuple[int, ...]:
    """The shape of a value at an array leaf; Departs when it is a node, or the shape
    departs from the leaf's."""
    if not isinstance(value, np.ndarray | np.generic | jax.Array) and (
        jax.tree_util.tree_structure(value).num_leaves != 1
        or jax.tree_util.tree_structure(value).num_nodes != 1
    ):
        raise Departs(f"a node at the leaf {spec.path}")
    shape = tuple(np.shape(value))
    if (shape[1:] != spec.shape or not shape) if ragged else shape != spec.shape:
        raise Departs(f"shape {shape} at {spec.path}")
    return shape


def _coerce(spec: Any, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    try:
        return LeafCaster(spec.path, spec.dtype, shape).coerce(value)
    except SchemaMismatchError as err:
        raise Departs(str(err)) from err


__all__ = [
    "Departs",
    "LeafColumn",
    "ListColumn",
    "OptionalColumn",
    "Segment",
    "Space",
    "axis_values",
    "leaf_values",
    "pad",
    "segment",
    "walk",
]
