"""Ragged lists whose elements are fixed trees (no list, optional subtree, ragged axis or
constant inside): a writer appends their elements as whole rows, one flatten per list,
instead of walking each element.

Example:
    >>> import numpy as np
    >>> flat = FlatList({"x": np.float32(0), "y": np.int8(0)}, None)
    >>> flat.width, flat.of_length(2).num_leaves
    (2, 4)
"""

from __future__ import annotations

from typing import Any

from jax.tree_util import tree_structure

from pytreestore._commit.model import representative
from pytreestore._tree.layout import Fixed, LayoutNode, Leaf, OptionalTree, RaggedList


class FlatList:
    """A ragged list whose elements are fixed trees: the treedef of a list of ``n`` of
    them, the leaves per element, and the table columns in flatten order (None: the table's
    own order)."""

    def __init__(self, element: Any, order: list[int] | None) -> None:
        self._element = element
        self.width = tree_structure(element).num_leaves
        self.order = order
        self._lists: dict[int, Any] = {}

    def of_length(self, n: int) -> Any:
        treedef = self._lists.get(n)
        if treedef is None:
            treedef = self._lists[n] = tree_structure([self._element] * n)
        return treedef


def flat_elements(
    spec: LayoutNode | None, slots: dict[str | None, dict[tuple[str, str], int]]
) -> dict[str, FlatList]:
    """The ragged lists whose elements are fixed trees (no list, optional subtree, ragged
    axis or constant inside)."""
    out: dict[str, FlatList] = {}
    if isinstance(spec, RaggedList):
        leaves: list[Leaf] = []
        if spec.element is not None and _is_fixed(spec.element, leaves):
            table = slots[spec.axis.path]
            order = [table[("leaf", leaf.path)] for leaf in leaves]
            if len(order) == len(table):
                inverse = sorted(range(len(order)), key=order.__getitem__)
                same = inverse == list(range(len(order)))
                element = representative(spec.element)
                out[spec.axis.path] = FlatList(element, None if same else inverse)
        out.update(flat_elements(spec.element, slots))
    elif isinstance(spec, OptionalTree):
        out.update(flat_elements(spec.inner, slots))
    elif isinstance(spec, Fixed):
        for child in spec.children:
            out.update(flat_elements(child, slots))
    return out


def _is_fixed(spec: LayoutNode, leaves: list[Leaf]) -> bool:
    """Whether ``spec`` is a fixed tree (collecting its leaves in flatten order)."""
    if isinstance(spec, Leaf):
        leaves.append(spec)
        return spec.axis is None
    if isinstance(spec, Fixed):
        return spec.common_axis is None and all(_is_fixed(c, leaves) for c in spec.children)
    return False


__all__ = ["FlatList", "flat_elements"]
