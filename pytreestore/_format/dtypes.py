"""The dtypes a column can hold and the casting rule of appends; typed PRNG keys and weakly typed leaves.

The dtypes a column can hold, and the casting rule of appends.

Columns hold bool, int8-64, uint8-64, float16/32/64, bfloat16, the float8 types of ml_dtypes
and complex64/128. Python scalars take JAX's dtypes (int32 and float32 while x64 is disabled).
A value is converted to its column's dtype when ``numpy.can_cast(value, column, "same_kind")``
holds; integer values are also checked to fit, so nothing wraps around.

Example:
    >>> import numpy as np
    >>> can_cast(np.dtype("int32"), np.dtype("float32")), can_cast(np.dtype("float32"), np.dtype("int32"))
    (True, False)

Typed PRNG key leaves (``jax.random.key(0)`` and arrays of keys).

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

Weakly typed leaves: which values JAX treats as weakly typed, kept per column.

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

import functools
from collections.abc import Collection, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax._src.lax import lax as _lax  # _convert_element_type(weak_type=): no public API
from jax.tree_util import keystr

ML_FLOATS = (
    "bfloat16",
    "float8_e3m4",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
)


_NUMPY = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)


SUPPORTED: dict[str, np.dtype] = {n: np.dtype(n) for n in _NUMPY} | {
    n: np.dtype(getattr(ml_dtypes, n)) for n in ML_FLOATS
}


_ML = frozenset(SUPPORTED[n] for n in ML_FLOATS)


_PYTHON_SCALARS = (bool, int, float, complex)


_PYTHON_KIND = {bool: "b", int: "i", float: "f", complex: "c"}


_X64 = frozenset(np.dtype(n) for n in ("int64", "uint64", "float64", "complex128"))


def from_name(name: str) -> np.dtype:
    """The dtype a schema names; raises ``KeyError`` for an unknown name."""
    return SUPPORTED[name]


_SUPPORTED_SET = frozenset(SUPPORTED.values())


_NAMES = {dtype: name for name, dtype in SUPPORTED.items()}


def name_of(dtype: np.dtype) -> str:
    """``dtype.name``, looked up (numpy computes it anew each time, slowly)."""
    name = _NAMES.get(dtype)
    return dtype.name if name is None else name


def is_supported(dtype: np.dtype) -> bool:
    """Whether a column can hold ``dtype``."""
    return dtype in _SUPPORTED_SET


def kind(dtype: np.dtype) -> str:
    """numpy's kind letter, with the ml_dtypes floats counted as floats (``"f"``)."""
    return "f" if dtype in _ML else dtype.kind


def python_scalar_dtype(value: bool | int | float | complex) -> np.dtype:
    """The dtype JAX gives a Python scalar under the current x64 setting."""
    wide = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}
    return np.dtype(jax.dtypes.canonicalize_dtype(wide[type(value)]))


def value_dtype(value: Any) -> np.dtype | None:
    """The dtype of a leaf value, or None when it is not an array or scalar."""
    if type(value) in _PYTHON_SCALARS:
        return python_scalar_dtype(value)
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return None
    dtype = np.dtype(dtype)
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def python_kinds_accepted(column: np.dtype) -> frozenset[type]:
    """The Python scalar types that may be appended to a ``column`` without a cast check."""
    ok = {"b": "b", "i": "bi", "u": "bi", "f": "bif", "c": "bifc"}[kind(column)]
    return frozenset(t for t, k in _PYTHON_KIND.items() if k in ok)


@functools.cache
def can_cast(src: np.dtype, dst: np.dtype) -> bool:
    """numpy's ``same_kind`` rule, extended to the ml_dtypes floats."""
    if src == dst:
        return True
    if src in _ML or dst in _ML:
        order = "buifc"
        s, d = kind(src), kind(dst)
        return order.index(s) <= order.index(d) and not (s == "i" and d == "u")
    return bool(np.can_cast(src, dst, "same_kind"))


def needs_range_check(src: np.dtype, dst: np.dtype) -> bool:
    """Whether casting integers from ``src`` to ``dst`` may wrap around."""
    return src.kind in "iu" and dst.kind in "iu" and not np.can_cast(src, dst, "safe")


def fits(values: np.ndarray, dst: np.dtype) -> bool:
    """Whether every integer in ``values`` is representable in ``dst``."""
    if values.size == 0:
        return True
    info = np.iinfo(dst)
    return bool(values.min() >= info.min and values.max() <= info.max)


def needs_x64(dtype: np.dtype) -> bool:
    """Whether JAX can hold ``dtype`` only with ``jax_enable_x64``."""
    return dtype in _X64


def jax_holds(dtype: np.dtype) -> bool:
    """Whether JAX, as configured now, holds ``dtype`` without a cast."""
    return not needs_x64(dtype) or bool(jax.config.read("jax_enable_x64"))


def fill_value(dtype: np.dtype) -> Any:
    """The zarr v3 ``fill_value`` JSON for a column of ``dtype``."""
    k = kind(dtype)
    if k == "b":
        return False
    if k == "c":
        return [0.0, 0.0]
    return 0.0 if k == "f" else 0


def describe(dtype: np.dtype, shape: tuple[int, ...]) -> str:
    """``float32[3]``, ``int32[]``: how errors print a leaf's type."""
    return f"{dtype.name}[{','.join(map(str, shape))}]"


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
