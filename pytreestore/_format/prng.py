"""Typed PRNG key leaves (``jax.random.key(0)`` and arrays of keys).

A column of keys holds their key data (:func:`jax.random.key_data`: uint32 with a trailing
axis, 2 for ``threefry2x32``) and names the implementation in its spec (``key_impl``). Device
reads wrap the data back into typed keys with :func:`jax.random.wrap_key_data`; numpy reads
(``as_numpy=True``) return the key data itself, since numpy has no key dtype.

Example:
    >>> import jax
    >>> k = jax.random.key(0)
    >>> impl_of(k), key_layout(k)
    ('threefry2x32', (dtype('uint32'), (2,)))
    >>> wrap(unwrap(k, "threefry2x32", ".k"), "threefry2x32").dtype
    key<fry>
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_key(value: Any) -> bool:
    """Whether ``value`` is a typed PRNG key array (its dtype is a ``key<...>`` dtype)."""
    dtype = getattr(value, "dtype", None)
    try:
        return dtype is not None and bool(jnp.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        return False


def impl_of(key: Any) -> str:
    """The name of a key array's implementation, e.g. ``threefry2x32``."""
    return str(jax.random.key_impl(key))


def key_layout(key: Any) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and per-record shape of the column that holds ``key``'s data."""
    data = jax.random.key_data(key)
    return np.dtype(data.dtype), tuple(data.shape)


def unwrap(value: Any, impl: str, where: str) -> np.ndarray:
    """The key data of ``value``, a key array of implementation ``impl``, as numpy.

    Raises:
        TypeError: ``value`` is not a key array of that implementation (the caller turns it
            into an error that names the column).
    """
    if not is_key(value):
        raise TypeError(
            f"expected a PRNG key array ({impl}) at {where}, got {type(value).__name__}; "
            "make keys with jax.random.key(...)"
        )
    got = impl_of(value)
    if got != impl:
        raise TypeError(f"expected a {impl} PRNG key at {where}, got a {got} key")
    return np.asarray(jax.random.key_data(value))


def wrap(data: Any, impl: str) -> jax.Array:
    """Typed keys of implementation ``impl`` around key data (numpy or ``jax.Array``)."""
    return jax.random.wrap_key_data(data, impl=impl)


def wrap_columns(leaves: list[Any], impls: Sequence[str | None]) -> list[Any]:
    """``leaves`` with each loaded key column (impl not None) wrapped back into typed keys."""
    return [
        wrap(leaf, impl) if impl is not None and leaf is not None else leaf
        for leaf, impl in zip(leaves, impls)
    ]
