"""Padding records of one layout (:mod:`pytreestore._tree.layout_nodes`) to one shape, with masks,
and cutting them back, record by record: the checked path of ``stack(records, ragged=...)``
and its inverse. ``stack`` first walks the records column by column
(:mod:`pytreestore._tree.pad_columns`, :mod:`pytreestore._tree.pad_columns`); when a record departs
anywhere, this path says which record, where, and what would accept it.

Example:
    >>> from pytreestore._tree.layout import build_layout
    >>> from pytreestore._tree.layout_nodes import Declarations
    >>> records = [{"p": [1.0, 2.0]}, {"p": [3.0]}]
    >>> spec = build_layout(records, None, Declarations.parse(True, None))
    >>> padder = Padder(spec, pad_to=4)
    >>> padded, mask, _ = padder.pad(spec, records[1], 1)
    >>> padded["p"].tolist(), mask["p"].tolist()
    ([3.0, 0.0, 0.0, 0.0], [True, False, False, False])
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from pytreestore._tree.convert import LeafCaster
from pytreestore._tree.layout_nodes import (
    Axis,
    Fixed,
    Kept,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    visit,
)
from pytreestore.errors import RaggedDeclarationError, RaggedLengthError, SchemaMismatchError

#: the longest padded axis: an axis of more elements is no batch a device holds
MAX_PAD = 2**31 - 1


def check_pad_to(pad_to: Any) -> Any:
    """``pad_to`` checked: None, a positive int, ``"pow2"`` or increasing positive buckets."""
    if pad_to is None or pad_to == "pow2":
        return pad_to
    if isinstance(pad_to, int | np.integer) and not isinstance(pad_to, bool | np.bool_):
        if not 1 <= pad_to <= MAX_PAD:
            raise RaggedDeclarationError(
                f"pad_to must be positive, got {pad_to} (at most 2**31 - 1)"
            )
        return int(pad_to)
    if isinstance(pad_to, str) or not isinstance(pad_to, Sequence) or not pad_to:
        raise RaggedDeclarationError(
            "pad_to takes None, a positive int, 'pow2' or a non-empty sequence of bucket "
            f"sizes, got {pad_to!r}"
        )
    buckets = tuple(pad_to)
    if not all(
        isinstance(b, int | np.integer) and not isinstance(b, bool | np.bool_) and 0 < b <= MAX_PAD
        for b in buckets
    ):
        raise RaggedDeclarationError(
            f"pad_to buckets must be positive ints, got {pad_to!r} (at most 2**31 - 1)"
        )
    buckets = tuple(int(b) for b in buckets)
    if any(a >= b for a, b in itertools.pairwise(buckets)):
        raise RaggedDeclarationError(
            f"pad_to buckets must be sorted, smallest first, without repeats, got {pad_to!r}"
        )
    return buckets


def padded_length(pad_to: Any, longest: int) -> int:
    """The length every ragged axis of the longest ``longest`` is padded to."""
    if pad_to is None:
        return longest
    if pad_to == "pow2":
        return 1 << max(longest - 1, 0).bit_length()
    if isinstance(pad_to, int):
        return pad_to
    fits = [b for b in pad_to if b >= longest]
    return fits[0] if fits else pad_to[-1]


@dataclasses.dataclass
class Padder:
    """Pads records of the layout ``spec``; ``skeleton`` keeps what padding hides (list
    lengths, present subtrees, leading lengths) for :func:`unpad`."""

    spec: LayoutNode
    pad_to: Any = None
    truncate: bool = False

    def length(self, axis: Axis, n: int, record: int) -> int:
        """The padded length of ``axis``; RaggedLengthError when ``n`` is above it."""
        limit = padded_length(self.pad_to, axis.longest)
        if n > limit and not self.truncate:
            raise RaggedLengthError(
                f"record {record} has length {n} at {axis.path or 'the root'}, above the limit "
                f"{limit} of pad_to={self.pad_to!r}; raise pad_to, or pass trim=True to "
                "cut longer lists and axes"
            )
        return limit

    def pad(self, spec: LayoutNode | None, value: Any, record: int) -> tuple[Any, Any, Any]:
        """(padded value, mask, skeleton) of ``value``."""
        return visit(spec, _Pad(self), value, record)

    def zeros(self, spec: LayoutNode | None) -> tuple[Any, Any]:
        """A padding value of the layout ``spec`` (zeros) and its all-False mask."""
        return visit(spec, _Zeros(self.pad_to))


class _Pad(Visitor):
    """(padded value, mask, skeleton) of a value of a node, for a :class:`Padder`."""

    def __init__(self, padder: Padder) -> None:
        self.padder = padder

    def optional(self, node: OptionalTree, value: Any, record: int) -> tuple[Any, Any, Any]:
        if value is None:
            return (*self.padder.zeros(node.inner), None)
        padded, mask, skel = visit(node.inner, self, value, record)
        return padded, mask, (skel,)

    def kept(self, node: Kept, value: Any, record: int) -> tuple[Any, Any, Any]:
        return value, np.True_, None

    def fixed(self, node: Fixed, value: Any, record: int) -> tuple[Any, Any, Any]:
        sub, children = node.treedef, node.treedef.flatten_up_to(value)
        parts = [visit(s, self, c, record) for s, c in zip(node.children, children)]
        padded, mask = (sub.unflatten([p[i] for p in parts]) for i in (0, 1))
        return padded, mask, [p[2] for p in parts]

    def ragged(self, node: RaggedList, value: list, record: int) -> tuple[Any, Any, Any]:
        size = self.padder.length(node.axis, len(value), record)
        parts = [visit(node.element, self, item, record) for item in value[:size]]
        fill = [self.padder.zeros(node.element)] * (size - len(parts))
        if not parts and not fill:
            padded, mask = self.padder.zeros(node.element)
            return empty_axis(padded), empty_axis(mask), []
        padded = stack_trees([p[0] for p in parts] + [f[0] for f in fill])
        mask = stack_trees([p[1] for p in parts] + [f[1] for f in fill])
        return padded, mask, [p[2] for p in parts]

    def leaf(self, node: Leaf, value: Any, record: int) -> tuple[Any, Any, Any]:
        shape = tuple(np.shape(value))
        array = LeafCaster(node.path, node.dtype, shape).coerce(value, what=f"record {record}")
        if node.axis is None:
            return array, np.True_, None
        size = self.padder.length(node.axis, shape[0], record)
        n = min(shape[0], size)
        out = np.zeros((size, *node.shape), node.dtype)
        out[:n] = array[:n]
        return out, np.arange(size) < n, n


class _Zeros(Visitor):
    """A padding value of a node (zeros) and its all-False mask, lists and ragged axes
    padded to ``pad_to``."""

    def __init__(self, pad_to: Any) -> None:
        self.pad_to = pad_to

    def optional(self, node: OptionalTree) -> tuple[Any, Any]:
        return visit(node.inner, self)

    def leaf(self, node: Leaf) -> tuple[Any, Any]:
        if node.axis is None:
            return np.zeros(node.shape, node.dtype), np.False_
        size = padded_length(self.pad_to, node.axis.longest)
        return np.zeros((size, *node.shape), node.dtype), np.zeros(size, bool)

    def kept(self, node: Kept) -> tuple[Any, Any]:
        return node.value, np.False_

    def ragged(self, node: RaggedList) -> tuple[Any, Any]:
        size = padded_length(self.pad_to, node.axis.longest)
        zeros, mask = visit(node.element, self)
        return repeat_zeros(zeros, size), repeat_zeros(mask, size)

    def fixed(self, node: Fixed) -> tuple[Any, Any]:
        parts = [visit(s, self) for s in node.children]
        zeros, mask = (node.treedef.unflatten([p[i] for p in parts]) for i in (0, 1))
        return zeros, mask


def is_array(leaf: Any) -> bool:
    return isinstance(leaf, np.ndarray | np.generic | jax.Array)


def stack_trees(trees: Sequence[Any]) -> Any:
    """Trees of one structure stacked leaf by leaf along a new leading axis (a leaf that is
    no array, a function, is kept from the first tree)."""
    return jax.tree.map(lambda *xs: np.stack(xs) if is_array(xs[0]) else xs[0], *trees)


def empty_axis(tree: Any) -> Any:
    """A tree with a leading axis of length 0 added to every array leaf."""
    return repeat_zeros(tree, 0)


def repeat_zeros(tree: Any, size: int) -> Any:
    """A tree with a leading axis of ``size`` zeros added to every array leaf."""

    def grow(x: Any) -> Any:
        return np.zeros((size, *np.shape(x)), np.asarray(x).dtype) if is_array(x) else x

    return jax.tree.map(grow, tree)


def unpad(spec: LayoutNode, skeleton: Any, value: Any) -> Any:
    """One record as it was before padding, from its padded value and its skeleton."""
    return visit(spec, _Unpad(), skeleton, value)


class _Unpad(Visitor):
    """:func:`unpad` of a node."""

    def optional(self, node: OptionalTree, skeleton: Any, value: Any) -> Any:
        return None if skeleton is None else visit(node.inner, self, skeleton[0], value)

    def leaf(self, node: Leaf, skeleton: Any, value: Any) -> Any:
        return value if node.axis is None else value[:skeleton]

    def kept(self, node: Kept, skeleton: Any, value: Any) -> Any:
        return value

    def ragged(self, node: RaggedList, skeleton: Any, value: Any) -> Any:
        return [
            visit(node.element, self, skel, jax.tree.map(lambda x, j=j: _row(x, j), value))
            for j, skel in enumerate(skeleton)
        ]

    def fixed(self, node: Fixed, skeleton: Any, value: Any) -> Any:
        children = node.treedef.flatten_up_to(value)
        return node.treedef.unflatten(
            [visit(s, self, k, c) for s, k, c in zip(node.children, skeleton, children)]
        )


def _row(x: Any, j: int) -> Any:
    return x[j] if is_array(x) else x


# ---- masks remember their layout --------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """What ``unstack(batch, mask)`` needs beyond the values: the layout and each record's
    skeleton (list lengths, present subtrees, leading lengths)."""

    spec: LayoutNode
    skeletons: tuple[Any, ...]
    mask_treedef: Any
    #: the batch's structure and leaf shapes (None for a leaf that is no array): a batch of
    #: other shapes is not the one this mask belongs to
    batch_treedef: Any = None
    batch_shapes: tuple[Any, ...] = ()
    #: weak references to the batch's array leaves: only that batch, unchanged, belongs to
    #: this mask (another batch of the same shapes would read its padding as values)
    batch_leaves: tuple[Any, ...] = ()
    #: the count of records stacked
    records: int = 0
    #: the top segment of records stacked column by column (:mod:`pytreestore._tree.pad_columns`),
    #: with the lengths and present subtrees it kept; None: ``skeletons`` has them
    gathered: Any = None


def leaf_refs(leaves: list[Any]) -> tuple[Any, ...]:
    """Weak references to ``leaves`` (None where a leaf cannot be weakly referenced)."""
    refs = []
    for leaf in leaves:
        try:
            refs.append(weakref.ref(leaf))
        except TypeError:
            refs.append(None)
    return tuple(refs)


def same_leaves(refs: tuple[Any, ...], leaves: list[Any]) -> bool:
    """Whether ``leaves`` are the very objects ``refs`` were taken of."""
    return len(refs) == len(leaves) and all(
        ref is None or ref() is leaf for ref, leaf in zip(refs, leaves)
    )


_LAYOUTS: dict[int, tuple[weakref.ref, Layout]] = {}


def remember(mask: Any, layout: Layout) -> None:
    """Ties ``layout`` to ``mask`` (its first leaf) for as long as that leaf lives."""
    leaves = jax.tree.leaves(mask)
    if not leaves:
        return
    key = id(leaves[0])
    _LAYOUTS[key] = (weakref.ref(leaves[0]), layout)
    weakref.finalize(leaves[0], _LAYOUTS.pop, key, None)


def recall(mask: Any) -> Layout:
    """The layout :func:`remember` tied to ``mask``.

    Raises:
        SchemaMismatchError: ``mask`` is not a mask that ``stack(..., ragged=/optional=)``
            returned in this process.
    """
    leaves, treedef = jax.tree.flatten(mask)
    entry = _LAYOUTS.get(id(leaves[0])) if leaves else None
    if entry is None or entry[0]() is not leaves[0] or entry[1].mask_treedef != treedef:
        raise SchemaMismatchError(
            "unstack(batch, mask) takes the mask that stack(..., ragged=/optional=) returned, "
            "unchanged: it carries the list lengths and present subtrees that the padded "
            "batch cannot show"
        )
    return entry[1]
