"""Helpers for testing pytreestore and its backends.

This package never imports hypothesis at import time: ``import pytreestore.testing`` works
without it. The hypothesis strategies live in :mod:`pytreestore.testing.strategies`, which
needs hypothesis installed.

Example:
    >>> import numpy as np
    >>> from pytreestore.testing import assert_trees_equal
    >>> assert_trees_equal({"x": np.array([np.nan, 1.0])}, {"x": np.array([np.nan, 1.0])})
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path, tree_structure

__all__ = ["assert_trees_equal", "describe_tree", "weak_type"]


def assert_trees_equal(actual: Any, expected: Any, *, err_msg: str = "") -> None:
    """Asserts one treedef and, leaf by leaf, the same dtype, ``weak_type``, shape and values.

    Leaves may be numpy or ``jax.Array``; NaN equals NaN (``np.testing.assert_array_equal``).
    The treedefs compare node classes and static data. A leaf's ``weak_type`` is that of a
    ``jax.Array`` (``jnp.asarray(0.5)`` is weakly typed); numpy arrays and scalars are not
    weakly typed, so a weakly typed ``jax.Array`` never equals a numpy leaf: JAX promotes the
    two differently and a jitted function traces them apart.

    Raises:
        AssertionError: naming the first differing keypath.
    """
    got, got_def = tree_flatten_with_path(actual)
    want, want_def = tree_flatten_with_path(expected)
    note = f" ({err_msg})" if err_msg else ""
    if got_def != want_def:
        raise AssertionError(f"treedefs differ{note}:\n  got  {got_def}\n  want {want_def}")
    for (path, a_leaf), (_, e_leaf) in zip(got, want):
        where = keystr(path) or "the root"
        a, e = np.asarray(a_leaf), np.asarray(e_leaf)
        if (a.dtype, a.shape) != (e.dtype, e.shape):
            raise AssertionError(
                f"leaf at {where}{note}: got {a.dtype}{list(a.shape)}, "
                f"want {e.dtype}{list(e.shape)}"
            )
        if weak_type(a_leaf) != weak_type(e_leaf):
            raise AssertionError(
                f"leaf at {where}{note}: got weak_type={weak_type(a_leaf)}, "
                f"want weak_type={weak_type(e_leaf)} ({a.dtype}{list(a.shape)})"
            )
        np.testing.assert_array_equal(a, e, err_msg=f"leaf at {where}{note}")


def weak_type(leaf: Any) -> bool:
    """Whether ``leaf`` is a weakly typed ``jax.Array`` (numpy values never are).

    Example:
        >>> import jax.numpy as jnp
        >>> weak_type(jnp.asarray(0.5)), weak_type(jnp.float32(0.5))
        (True, False)
    """
    return isinstance(leaf, jax.Array) and bool(leaf.weak_type)


def describe_tree(tree: Any) -> dict[str, Any]:
    """A JSON-able, process-independent description of a tree, to compare across processes.

    Returns:
        ``treedef``: the treedef as ``str`` prints it (class names and static data);
        ``nodes``: ``{keypath: "module:qualname"}`` of every inner node;
        ``leaves``: ``{keypath: [dtype, shape, hex of the bytes]}`` of every leaf.
    """
    nodes: dict[str, str] = {}
    leaves: dict[str, list[Any]] = {}
    _walk(tree, (), nodes, leaves)
    return {"treedef": str(tree_structure(tree)), "nodes": nodes, "leaves": leaves}


def _walk(node: Any, path: tuple[Any, ...], nodes: dict, leaves: dict) -> None:
    flat, sub = tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if sub.num_nodes == 1 and sub.num_leaves == 1:
        array = np.asarray(node)
        leaves[keystr(path)] = [array.dtype.name, list(array.shape), array.tobytes().hex()]
        return
    cls = type(node)
    nodes[keystr(path)] = f"{cls.__module__}:{cls.__qualname__}"
    for entry, child in flat:
        _walk(child, (*path, *entry), nodes, leaves)
