"""The dtypes a column can hold, and the casting rule of appends.

Columns hold bool, int8-64, uint8-64, float16/32/64, bfloat16, the float8 types of ml_dtypes
and complex64/128. Python scalars take JAX's dtypes (int32 and float32 while x64 is disabled).
A value is converted to its column's dtype when ``numpy.can_cast(value, column, "same_kind")``
holds; integer values are also checked to fit, so nothing wraps around.

Example:
    >>> import numpy as np
    >>> can_cast(np.dtype("int32"), np.dtype("float32")), can_cast(np.dtype("float32"), np.dtype("int32"))
    (True, False)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import ml_dtypes
import numpy as np

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
