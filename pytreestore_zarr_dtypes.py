"""zarr-python data types for the ml_dtypes floats: bfloat16 and the float8 family.

zarr-python 3.1 knows none of them, so without these it can neither read nor write a
bfloat16 or float8 column. Each is a :class:`zarr.core.dtype.ZDType` named as TensorStore
names it in ``zarr.json`` (``"bfloat16"``, ``"float8_e4m3fn"``, ...), with the zarr v3 float
rules for fill values: a JSON number, ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, or ``"0x"``
and the value's bytes in hex, big-endian. A float8 fill value is written as its bits
(``"0x00"``), the one form zarrs (the Rust implementation) reads, which the zarr v3 spec and
zarr-extensions allow for every float type.

This module ships in the pytreestore distribution but outside the ``pytreestore`` package: it
imports only numpy, ml_dtypes and zarr, so zarr-python can load it from an entry point
without importing pytreestore (and jax). An installed pytreestore registers these types with
every zarr-python process on its own (``pytreestore_zarr_autoload``, docs/interop.md);
:func:`register` does it by hand.

Example:
    >>> import numpy as np, ml_dtypes, zarr
    >>> register()
    >>> a = zarr.create_array({}, shape=(2,), dtype=np.dtype(ml_dtypes.bfloat16))
    >>> a[:] = np.array([1.5, -2], ml_dtypes.bfloat16)
    >>> a.metadata.data_type.to_json(zarr_format=3), a[:].tolist()
    ('bfloat16', [1.5, -2.0])
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
from zarr.core.dtype import data_type_registry
from zarr.core.dtype.common import DataTypeValidationError
from zarr.core.dtype.npy.float import BaseFloat

# pytreestore._format.dtypes.ML_FLOATS, which imports jax; a test keeps the two equal
NAMES = (
    "bfloat16",
    "float8_e3m4",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
)
_SPECIAL = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLFloat(BaseFloat[Any, Any]):
    """A zarr data type wrapping one ml_dtypes float; one subclass per type in :data:`NAMES`."""

    native: ClassVar[np.dtype]
    _zarr_v2_names: ClassVar[tuple[str, ...]] = ()  # zarr v2 has no name for these

    @property
    def item_size(self) -> int:
        return self.native.itemsize

    @classmethod
    def from_native_dtype(cls, dtype: Any) -> MLFloat:
        if np.dtype(dtype) == cls.native and type(dtype) is cls.dtype_cls:
            return cls()
        raise DataTypeValidationError(f"Invalid data type: {dtype}. Expected {cls.native}")

    def to_native_dtype(self) -> Any:
        return self.native

    def _cast_scalar_unchecked(self, data: Any) -> Any:
        return self.native.type(data)

    def from_json_scalar(self, data: Any, *, zarr_format: Any) -> Any:
        if isinstance(data, str) and data in _SPECIAL:
            return self.native.type(_SPECIAL[data])
        if isinstance(data, str) and data.startswith("0x"):
            return self._from_hex(data)
        if isinstance(data, int | float) and not isinstance(data, bool):
            return self.native.type(data)
        raise TypeError(f"invalid {self._zarr_v3_name} fill value {data!r}")

    def to_json_scalar(self, data: Any, *, zarr_format: Any) -> float | str:
        value = self.cast_scalar(data)
        if self.native.itemsize == 1:  # float8: the bits (zarrs reads no other form)
            return "0x" + np.asarray(value).tobytes().hex()
        if np.isnan(value):
            return "NaN"
        if np.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return float(value)

    def _from_hex(self, data: str) -> Any:
        raw = bytes.fromhex(data[2:])
        if len(raw) != self.native.itemsize:
            raise ValueError(
                f"invalid {self._zarr_v3_name} fill value {data!r}: expected "
                f"{2 * self.native.itemsize} hex digits"
            )
        return np.frombuffer(raw[::-1], dtype=self.native)[0]


def _make(name: str) -> type[MLFloat]:
    native = np.dtype(getattr(ml_dtypes, name))
    attrs = {"dtype_cls": type(native), "_zarr_v3_name": name, "native": native}
    cls = type(f"ZarrDType_{name}", (MLFloat,), attrs)
    cls.__module__ = __name__
    cls.__doc__ = f"The zarr data type ``{name}`` ({native.itemsize} bytes, ml_dtypes.{name})."
    return dataclasses.dataclass(frozen=True, kw_only=True)(cls)


DTYPES: dict[str, type[MLFloat]] = {name: _make(name) for name in NAMES}

# One module-level name per class, its __qualname__: the targets of the zarr.data_type entry
# points in pyproject.toml (for zarr-python releases that load them; 3.1 does not).
ZarrDType_bfloat16 = DTYPES["bfloat16"]
ZarrDType_float8_e3m4 = DTYPES["float8_e3m4"]
ZarrDType_float8_e4m3fn = DTYPES["float8_e4m3fn"]
ZarrDType_float8_e4m3fnuz = DTYPES["float8_e4m3fnuz"]
ZarrDType_float8_e4m3b11fnuz = DTYPES["float8_e4m3b11fnuz"]
ZarrDType_float8_e5m2 = DTYPES["float8_e5m2"]
ZarrDType_float8_e5m2fnuz = DTYPES["float8_e5m2fnuz"]
ZarrDType_float8_e8m0fnu = DTYPES["float8_e8m0fnu"]


def register() -> None:
    """Registers every data type of :data:`NAMES` with zarr-python (idempotent).

    A name zarr-python already knows (a later zarr-python, another package) is left alone.
    """
    with _LOCK:
        for name, cls in DTYPES.items():
            if name not in data_type_registry.contents:
                data_type_registry.register(name, cls)


__all__ = ["DTYPES", "NAMES", "MLFloat", "register"]
