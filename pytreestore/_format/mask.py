"""Column masks: ``columns=`` given as a pytree of bools, the optax and equinox habit.

A mask has the structure of a record (or of a padded batch, or a prefix of either) with a bool
where a leaf is: True selects the column, False leaves it out; a bool at a node stands for every
column below it. :func:`selectors` turns a mask into the tree-path selectors that
:meth:`pytreestore.TreeSchema.select` takes.

Under a ragged list, a record's mask holds one element per item (``.p[0]``, ``.p[1]``, ...),
all of which stand for the same columns (``.p[*]``): a column is selected when any element
selects it. A padded batch's mask holds the stacked element itself (``batch.p`` is one
``Params``), which stands for ``.p[*]`` too. An optional subtree that is None in the mask
selects nothing.

Example:
    >>> selectors({"a": True, "b": {"c": False, "d": True}}, ("['a']", "['b']['c']", "['b']['d']"))
    ["['a']", "['b']['d']"]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pytreestore._format import keys as _keys
from pytreestore._format import nodes as _nodes
from pytreestore.errors import ArgumentTypeError, UnknownColumnError

_ANY = "[*]"


def is_mask(columns: Any) -> bool:
    """Whether ``columns=`` is a mask rather than a selector string or a list of them."""
    if columns is None or isinstance(columns, str):
        return False
    if isinstance(columns, list | tuple) and type(columns) in (list, tuple):
        return any(not isinstance(c, str) for c in columns)
    return True


def selectors(mask: Any, paths: Sequence[str], consts: Sequence[str] = ()) -> list[str]:
    """The selectors for the True leaves of ``mask``, against a store whose columns are
    ``paths`` and whose constant leaves are at ``consts``.

    Raises:
        ArgumentTypeError: a mask leaf that is no bool (its keypath named).
        UnknownColumnError: a mask node where the store has no column (its keypath named).
    """
    chosen: list[str] = []
    _walk(mask, "", "", _Store((*paths, *consts)), chosen)
    return chosen


class _Store:
    """The store's leaves' keypaths, and every node at or above one (each keypath cut where
    one of its entries starts): :func:`~pytreestore._format.keys.is_under` as a set lookup."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        cuts = {p[:i] for p in paths for i, c in enumerate(p) if c in ".["}
        self.nodes = frozenset(cuts | set(paths))

    def below(self, at: str) -> list[str]:
        return [p for p in self.paths if _keys.is_under(p, at)]


def _walk(node: Any, where: str, at: str, store: _Store, chosen: list[str]) -> None:
    """Walks the mask ``node``, found at ``where`` in the mask and standing for the store's
    node ``at``."""
    if node is None:
        return
    level = _nodes.one_level(node)
    if level is None:
        if _flag(node, where):
            chosen.append(at)  # select() refuses one that names no column
        else:
            _check_exists(at, where, store)
        return
    _, entries, children = level
    ragged = at + _ANY in store.nodes
    if not children:  # an empty node: a ragged list with no items, or the store's empty node
        if at in store.nodes and not (ragged and isinstance(node, list | tuple)):
            raise UnknownColumnError(
                f"the columns= mask has an empty {type(node).__name__} at {where or 'the root'}, "
                f"where the store has columns: {', '.join(store.below(at))}; build the mask "
                f"from a record of the store"
            )
        return
    _check_exists(at, where, store)
    if ragged and isinstance(node, list | tuple):
        for entry, child in zip(entries, children):
            _walk(child, where + _keys.path_str((entry,)), at + _ANY, store, chosen)
        return
    if ragged:  # a padded batch's mask: the stacked element stands for every item
        at += _ANY
    for entry, child in zip(entries, children):
        step = _keys.path_str((entry,))
        _walk(child, where + step, at + step, store, chosen)


def _flag(leaf: Any, where: str) -> bool:
    """A mask leaf's bool."""
    if isinstance(leaf, bool | np.bool_):
        return bool(leaf)
    dtype, shape = getattr(leaf, "dtype", None), getattr(leaf, "shape", None)
    if dtype == np.bool_ and shape == ():
        return bool(leaf)
    raise ArgumentTypeError(
        f"columns= takes tree-path strings, or a mask: a pytree of bools (True selects the "
        f"column, False leaves it out); at {where or 'the root'} it holds "
        f"{type(leaf).__name__} {leaf!r:.60}"
        + (" (a padded batch's data mask is no column mask)" if shape else "")
    )


def _check_exists(at: str, where: str, store: _Store) -> None:
    if at not in store.nodes:
        raise UnknownColumnError(
            f"the columns= mask has a subtree at {where or 'the root'}, where the store has no "
            f"column; build the mask from a record of the store (e.g. "
            f"jax.tree.map(lambda _: False, store.load(0))). The store's columns are "
            f"{', '.join(store.paths)}"
        )
