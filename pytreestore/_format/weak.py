"""Weakly typed leaves: which values JAX treats as weakly typed, kept per column.

JAX gives a Python ``int``, ``float`` or ``complex`` (not ``bool``) and the results of some
operations on them (``jnp.asarray(0.5)``) a *weak type*: their dtype gives way in promotion
(``weak float32 * bfloat16 -> bfloat16``) and ``jax.jit`` keys its cache on it. A column
records whether its leaf was weakly typed when the store was created (``weak_type`` in its
JSON), and every read that returns ``jax.Array`` leaves returns that column's leaves weakly
typed (:func:`weaken`), so a jitted function traced on the original
record does not trace again on the record read back. numpy arrays and scalars are never
weakly typed, and ``as_numpy=True`` reads return numpy: no weak type.

The column's declared ``weak_type`` wins on read: appending a strongly typed value of the
column's dtype to a weak column (or the reverse) is accepted, and reads back as the column
declares.

A bool is weakly typed where JAX makes it so: a comparison of weakly typed operands
(gymnax's ``truncated = state.time >= max_steps``) is a weak ``bool``. An abstract example
(``jax.ShapeDtypeStruct``, what ``jax.eval_shape`` gives) carries its ``weak_type`` too.

Example:
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> [is_weak(x) for x in (0.5, 1, True, np.float32(0.5), jnp.asarray(0.5), jnp.float32(0.5))]
    [True, True, False, False, True, False]
    >>> is_weak(jnp.asarray(1) >= 2), is_weak(jax.eval_shape(lambda: jnp.asarray(1) >= 2))
    (True, True)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import jax
import numpy as np
from jax._src.lax import lax as _lax  # _convert_element_type(weak_type=): no public API
from jax.tree_util import keystr


def is_weak(value: Any) -> bool:
    """Whether JAX treats ``value`` as weakly typed (as ``jax.jit`` would see it)."""
    if isinstance(value, bool | np.generic | np.ndarray):  # np.float64 is a float subclass
        return False
    if isinstance(value, int | float | complex):
        return True
    if isinstance(value, jax.ShapeDtypeStruct):  # an abstract value (jax.eval_shape) says it
        return bool(value.weak_type)
    return isinstance(value, jax.Array) and bool(getattr(value, "weak_type", False))


def weaken(leaves: list[Any], weak: Sequence[bool] | None) -> list[Any]:
    """``leaves`` with each ``jax.Array`` that ``weak`` marks (its column's ``weak_type``)
    made weakly typed, as JAX itself makes one (same dtype, values and sharding); the others
    as they are. ``weak`` None (no weak column) returns ``leaves`` itself.

    Example:
        >>> import jax.numpy as jnp
        >>> [x.weak_type for x in weaken([jnp.float32(1), jnp.float32(2)], [True, False])]
        [True, False]
    """
    if weak is None:
        return leaves
    return [
        _lax._convert_element_type(x, weak_type=True)
        if w and isinstance(x, jax.Array) and not x.weak_type
        else x
        for x, w in zip(leaves, weak, strict=True)
    ]


def ragged_weak(
    keypaths: Sequence[tuple[Any, ...]],
    weak_columns: Collection[str],
    lists: Collection[str],
    *,
    exact: bool,
) -> list[bool] | None:
    """Whether each leaf of a ragged store's read (at ``keypaths``) is of a weak column.

    ``weak_columns`` are the weak columns' paths (``[*]`` for a ragged list's elements),
    ``lists`` the keypaths of the ragged lists. In an ``exact`` record a list's elements are
    indexed (``['p'][3]['b']``); in the padded and segments forms the list's node is gone
    (``['p']['b']``). Returns None when no column is weak.

    Example:
        >>> from jax.tree_util import DictKey as K, SequenceKey as S
        >>> ragged_weak([(K("p"), S(2), K("b")), (K("n"),)], {"['p'][*]['b']"}, {"['p']"},
        ...             exact=True)
        [True, False]
        >>> ragged_weak([(K("p"), K("b"))], {"['p'][*]['b']"}, {"['p']"}, exact=False)
        [True]
    """
    if not weak_columns:
        return None
    return [_column_of(kp, lists, exact) in weak_columns for kp in keypaths]


def _column_of(keypath: tuple[Any, ...], lists: Collection[str], exact: bool) -> str:
    """The column path of the leaf at ``keypath`` of a ragged read (see :func:`ragged_weak`)."""
    column = ""
    for entry in keypath:
        if column in lists:
            column += "[*]"
            if exact:
                continue  # the element's index
        column += keystr((entry,))
    return column + "[*]" if column in lists else column


__all__ = ["is_weak", "ragged_weak", "weaken"]
