"""Static (aux) values as JSON, exactly: tuples, lists, dicts and non-finite floats round-trip.

Plain JSON scalars stand for themselves and lists for lists; everything else is a one-key
object: ``{"tuple": [...]}``, ``{"dict": {...}}``, ``{"float": "nan"}``, ``{"complex": [re, im]}``,
``{"ordered_dict": [[key, value], ...]}``,
``{"scalar": {"dtype": "float32", "value": 0.5}}`` (a numpy scalar), ``{"dtype": "bfloat16"}``,
``{"enum": {"type": "pkg.mod:Color", "name": "RED"}}``, ``{"ref": "jax._src.nn.functions:relu"}``
(a module-level function or class, by import path), ``{"sentinel": {"type": ..., "name": ...}}``
(a stateless singleton bound at module level, such as equinox's ``MISSING``),
``{"dataclass": {"type": ..., "fields": {...}}}`` (a frozen dataclass of static values),
``{"bytes": <base64>}``, ``{"ndarray": {"dtype": "int32", "shape": [2], "data": <base64>}}``
(a numpy array: its C-order little-endian bytes) and ``{"wrapped": {"type": ..., "value": ...}}``
(an object a static codec stores by its inner value, :mod:`pytreestore._format.statics`).

A numpy array is a static value only inside a wrapper that a codec stores (such as MJX's
hashable wrapper): JAX can neither hash nor compare a bare array in static data.

Decoding only imports modules and reads attributes (``getattr``); it calls nothing the schema
names but registered codecs: a frozen dataclass is rebuilt with ``object.__new__`` and its
fields set directly.

Example:
    >>> encode((1, "a", None))
    {'tuple': [1, 'a', None]}
    >>> decode(encode((1, ("b", 2.5)))) == (1, ("b", 2.5))
    True
    >>> import numpy as np
    >>> encode(np.float32(0.5)), decode(encode(np.dtype("int8")))
    ({'scalar': {'dtype': 'float32', 'value': 0.5}}, dtype('int8'))
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import enum
import importlib
import math
import sys
from typing import Any

import numpy as np

from pytreestore._format import dtypes as _dtypes
from pytreestore._format import statics as _statics
from pytreestore.errors import ClassResolutionError, CorruptStoreError


def encode(value: Any, *, arrays: bool = False) -> Any:
    """Encodes a static value; raises TypeError for anything outside the supported set.

    ``arrays``: whether numpy arrays may appear (inside a codec's inner value).
    """
    t = type(value)
    if value is None or t in (bool, str, int):
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    if t is list:
        return [encode(v, arrays=arrays) for v in value]
    if t is tuple:
        return {"tuple": [encode(v, arrays=arrays) for v in value]}
    if t is dict:
        if not all(type(k) is str for k in value):
            raise TypeError(f"dict with non-str keys {list(value)!r}")
        return {"dict": {k: encode(v, arrays=arrays) for k, v in value.items()}}
    if t is collections.OrderedDict:
        return {"ordered_dict": [[encode(k), encode(v, arrays=arrays)] for k, v in value.items()]}
    if t is bytes:
        return {"bytes": base64.b64encode(value).decode("ascii")}
    if t is np.ndarray:
        return _encode_array(value, arrays)
    return _encode_object(value)


def _encode_array(value: np.ndarray, allowed: bool) -> dict[str, Any]:
    if not allowed:
        raise TypeError(
            f"{describe(value)} is a bare numpy array: JAX can neither hash nor compare "
            "arrays in static data (its treedefs raise), so keep it in a hashable wrapper "
            "and register the wrapper with pytreestore.register_static_codec (MJX's is "
            "registered), or make it a data field (a column)"
        )
    native = value if value.dtype.isnative else value.astype(value.dtype.newbyteorder("="))
    if not _dtypes.is_supported(native.dtype):
        raise TypeError(f"{describe(value)}: arrays of dtype {value.dtype} cannot be stored")
    data = np.ascontiguousarray(native)
    if sys.byteorder == "big":
        data = data.byteswap()
    return {
        "ndarray": {
            "dtype": value.dtype.name,
            "shape": list(value.shape),
            "data": base64.b64encode(data.tobytes()).decode("ascii"),
        }
    }


def _encode_wrapped(value: Any, codec: _statics.StaticCodec) -> dict[str, Any]:
    """A value stored by its codec, checked to come back equal (so treedefs compare equal)."""
    try:
        inner = encode(codec.encode(value), arrays=True)
        back = codec.decode(_decode(inner))
        same = type(back) is type(value) and bool(back == value)
    except TypeError:
        raise
    except Exception as err:  # the codec is user code
        raise TypeError(f"{describe(value)}: its static codec failed ({err!r:.200})") from err
    if not same:
        raise TypeError(
            f"{describe(value)}: its static codec does not round-trip (the decoded value "
            f"{describe(back)} is not equal to it, so its treedef would not compare equal)"
        )
    return {"wrapped": {"type": codec.path, "value": inner}}


def _encode_object(value: Any) -> Any:
    codec = _statics.for_value(value)
    if codec is not None:
        return _encode_wrapped(value, codec)
    if isinstance(value, np.generic) and _dtypes.is_supported(value.dtype):
        return {"scalar": {"dtype": value.dtype.name, "value": encode(value.item())}}
    if isinstance(value, np.dtype) and _dtypes.is_supported(value):
        return {"dtype": value.name}
    if isinstance(value, enum.Enum):
        return _encode_enum(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encode_dataclass(value)
    if isinstance(value, type) or callable(value):
        return {"ref": _path_of(value)}
    name = _sentinel_name(value)
    if name is not None:
        return {"sentinel": {"type": _path_of(type(value)), "name": name}}
    cls = type(value)
    raise TypeError(
        f"{describe(value)} of type {cls.__name__} (the class {cls.__module__}:"
        f"{cls.__qualname__} has no static codec: pytreestore.register_static_codec adds one)"
    )


def describe(value: Any, width: int = 200) -> str:
    """A short description of a static value for messages: its repr, or, where that shows
    only an object address, its class and attributes; arrays by dtype, shape and values.

    Example:
        >>> import numpy as np
        >>> describe(np.arange(3, dtype=np.int32))
        'array(int32, shape=(3,), [0 1 2])'
    """
    if isinstance(value, np.ndarray):
        values = np.array2string(value, threshold=8, edgeitems=2, separator=" ")
        values = " ".join(values.split()).replace("[ ", "[")
        text = f"array({value.dtype}, shape={value.shape}, {values})"
    elif type(value) in (tuple, list):
        items = ", ".join(describe(v, width) for v in value)
        text = (
            f"({items}{',' if len(value) == 1 else ''})" if type(value) is tuple else f"[{items}]"
        )
    elif _statics.for_value(value) is not None:
        text = f"{type(value).__qualname__}({_describe_inner(value, width)})"
    else:
        text = " ".join(repr(value).split())
        if " at 0x" in text:
            attrs = _attributes(value)
            inner = ", ".join(f"{k}={describe(v, width)}" for k, v in attrs.items())
            text = f"{type(value).__qualname__}({inner})"
    return text if len(text) <= width else text[: width - 3] + "..."


def _describe_inner(value: Any, width: int) -> str:
    try:
        return describe(_statics.for_value(value).encode(value), width)  # type: ignore[union-attr]
    except Exception:  # the codec is user code; a message must still be made
        return "..."


def _attributes(value: Any) -> dict[str, Any]:
    slots = [s for c in type(value).__mro__ for s in getattr(c, "__slots__", ())]
    names = [*slots, *getattr(value, "__dict__", {})]
    out = {}
    for name in names:
        if isinstance(name, str) and not name.startswith("__") and hasattr(value, name):
            out[name] = getattr(value, name)
    return out


def _encode_enum(value: enum.Enum) -> dict[str, Any]:
    """A member by name; a combination of Flag members (the zero flag too) by its value."""
    path = _path_of(type(value))
    if type(value).__members__.get(str(value.name)) is value:
        return {"enum": {"type": path, "name": value.name}}
    if isinstance(value, enum.Flag) and type(value.value) is int:
        return {"enum": {"type": path, "value": value.value}}
    raise TypeError(f"{value!r} is an Enum value that is not a member of {path}")


def _encode_dataclass(value: Any) -> dict[str, Any]:
    params = getattr(type(value), "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(
            f"{describe(value)} is a dataclass that is not frozen (static values must be immutable; "
            "declare it @dataclasses.dataclass(frozen=True))"
        )
    fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return {"dataclass": {"type": _path_of(type(value)), "fields": fields}}


def _path_of(obj: Any) -> str:
    """``module:qualname`` of a module-level function or class, checked to import back as itself."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        kind = "lambda" if qualname == "<lambda>" else "local or unnamed object"
        raise TypeError(
            f"{obj!r} is a {kind}, which cannot be stored by import path; define it at "
            "module level (def name(...)) so that it can be imported by name"
        )
    path = f"{module}:{qualname}"
    try:
        same = _statics.import_path(path) is obj
    except (ImportError, AttributeError, ValueError):
        same = False
    if not same:
        raise TypeError(
            f"{obj!r} is not importable as {path} (importing that name gives another object); "
            "static functions and classes are stored by import path and must be module-level"
        )
    return path


def _sentinel_name(value: Any) -> str | None:
    """The module-level name of a stateless singleton (no instance attributes), if it has one."""
    if getattr(value, "__dict__", None) or getattr(type(value), "__slots__", None):
        return None
    module = sys.modules.get(type(value).__module__)
    names = [k for k, v in vars(module).items() if v is value] if module else []
    return names[0] if names else None


def decode(obj: Any) -> Any:
    """Inverts :func:`encode`.

    Raises:
        ClassResolutionError: a class, function or sentinel the value names cannot be imported
            or is no longer what was stored.
            Also raised when the JSON is not an encoded static value.
        CorruptStoreError: an encoded array's dtype, shape or bytes do not agree, or a
            codec cannot rebuild its value from what the schema holds.
    """
    try:
        return _decode(obj)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as err:
        if isinstance(err, ClassResolutionError | CorruptStoreError):
            raise
        if isinstance(err, _Malformed):
            raise CorruptStoreError(
                f"the store's schema is damaged: the static value {obj!r:.200} cannot be "
                f"rebuilt: {err}"
            ) from err
        raise ClassResolutionError(
            f"cannot rebuild the static value {obj!r:.200} stored in the schema: {err!r}. Make "
            "the class or function it names importable again, or open with generic=True"
        ) from err


class _Malformed(ValueError):
    """An encoded array or wrapped value that no writer wrote."""


def _decode(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    ((tag, inner),) = obj.items()
    if tag == "tuple":
        return tuple(decode(v) for v in inner)
    if tag == "dict":
        return {k: decode(v) for k, v in inner.items()}
    if tag == "float":
        return float(inner)
    if tag == "ordered_dict":
        return collections.OrderedDict((_decode(k), _decode(v)) for k, v in inner)
    if tag == "complex":
        return complex(decode(inner[0]), decode(inner[1]))
    if tag == "scalar":
        return _dtypes.from_name(inner["dtype"]).type(decode(inner["value"]))
    if tag == "dtype":
        return _dtypes.from_name(inner)
    if tag == "bytes":
        try:
            return base64.b64decode(inner, validate=True)
        except (TypeError, ValueError) as err:
            raise _Malformed(f"bytes are not base64 ({err})") from err
    if tag == "ndarray":
        return _decode_array(inner)
    if tag == "wrapped":
        return _decode_wrapped(inner)
    return _decode_object(tag, inner)


def _decode_array(inner: dict[str, Any]) -> np.ndarray:
    if not isinstance(inner, dict) or set(inner) != {"dtype", "shape", "data"}:
        raise _Malformed("an array needs exactly its dtype, shape and data")
    if inner["dtype"] not in _dtypes.SUPPORTED:
        raise _Malformed(f"{inner['dtype']!r:.40} is not a dtype name a store holds")
    dtype = _dtypes.from_name(inner["dtype"])
    shape = inner["shape"]
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise _Malformed(f"array shape {shape!r:.80} is not a list of sizes")
    try:
        raw = base64.b64decode(inner["data"], validate=True)
    except (TypeError, ValueError) as err:
        raise _Malformed(f"array data is not base64 ({err})") from err
    want = math.prod(shape) * dtype.itemsize
    if len(raw) != want:
        raise _Malformed(
            f"array data holds {len(raw)} bytes, its dtype {dtype.name} and shape "
            f"{tuple(shape)} need {want}"
        )
    array = np.frombuffer(raw, dtype).reshape(shape)
    return (array.byteswap() if sys.byteorder == "big" else array).copy()


def _decode_wrapped(inner: dict[str, Any]) -> Any:
    try:
        codec = _statics.for_path(inner["type"])
    except LookupError as err:
        raise ClassResolutionError(
            f"cannot rebuild the static value of class {inner['type']} stored in the schema: "
            f"{err}. Open with generic=True to read the records as dicts and lists"
        ) from err
    value = _decode(inner["value"])
    try:
        return codec.decode(value)
    except Exception as err:  # the codec is user code
        raise _Malformed(
            f"the static codec of {inner['type']} failed on the stored value: {err!r:.200}"
        ) from err


def _decode_object(tag: str, inner: Any) -> Any:
    if tag == "ref":
        return _statics.import_path(inner)
    if tag == "enum":
        cls = _statics.import_path(inner["type"])
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise ValueError(f"{inner['type']} is not an Enum class")
        if "name" in inner:
            return cls[inner["name"]]
        if not (issubclass(cls, enum.Flag) and type(inner["value"]) is int):
            raise ValueError(f"{inner['type']} is not an enum.Flag class, so it holds no value")
        return cls(inner["value"])  # Flag's own lookup of a combination of its members
    if tag == "sentinel":
        value = getattr(importlib.import_module(inner["type"].partition(":")[0]), inner["name"])
        if _path_of(type(value)) != inner["type"]:
            raise ValueError(f"{inner['name']} is no longer a {inner['type']}")
        return value
    if tag == "dataclass":
        return _decode_dataclass(inner)
    raise ValueError(f"unknown tag {tag!r} in static value")


def _decode_dataclass(inner: dict[str, Any]) -> Any:
    cls = _statics.import_path(inner["type"])
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"{inner['type']} is not a dataclass")
    names = {f.name for f in dataclasses.fields(cls)}
    if names != set(inner["fields"]):
        raise ValueError(
            f"{inner['type']} has fields {sorted(names)} today, the store holds "
            f"{sorted(inner['fields'])}"
        )
    value = object.__new__(cls)
    for name, field in inner["fields"].items():
        object.__setattr__(value, name, decode(field))
    return value


__all__ = ["decode", "encode"]
