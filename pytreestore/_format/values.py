"""Static (aux) values as JSON, exactly: tuples, lists, dicts and non-finite floats round-trip.

Plain JSON scalars stand for themselves and lists for lists; everything else is a one-key
object: ``{"tuple": [...]}``, ``{"dict": {...}}``, ``{"float": "nan"}``, ``{"complex": [re, im]}``,
``{"ordered_dict": [[key, value], ...]}``,
``{"scalar": {"dtype": "float32", "value": 0.5}}`` (a numpy scalar), ``{"dtype": "bfloat16"}``,
``{"enum": {"type": "pkg.mod:Color", "name": "RED"}}``, ``{"ref": "jax._src.nn.functions:relu"}``
(a module-level function or class, by import path), ``{"sentinel": {"type": ..., "name": ...}}``
(a stateless singleton bound at module level, such as equinox's ``MISSING``) and
``{"dataclass": {"type": ..., "fields": {...}}}`` (a frozen dataclass of static values).

Decoding only imports modules and reads attributes (``getattr``); it calls nothing the schema
names: a frozen dataclass is rebuilt with ``object.__new__`` and its fields set directly.

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

import collections
import dataclasses
import enum
import importlib
import math
import sys
from typing import Any

import numpy as np

from pytreestore._format import dtypes as _dtypes
from pytreestore.errors import ClassResolutionError


def encode(value: Any) -> Any:
    """Encodes a static value; raises TypeError for anything outside the supported set."""
    t = type(value)
    if value is None or t in (bool, str, int):
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is complex:
        return {"complex": [encode(value.real), encode(value.imag)]}
    if t is list:
        return [encode(v) for v in value]
    if t is tuple:
        return {"tuple": [encode(v) for v in value]}
    if t is dict:
        if not all(type(k) is str for k in value):
            raise TypeError(f"dict with non-str keys {list(value)!r}")
        return {"dict": {k: encode(v) for k, v in value.items()}}
    if t is collections.OrderedDict:
        return {"ordered_dict": [[encode(k), encode(v)] for k, v in value.items()]}
    return _encode_object(value)


def _encode_object(value: Any) -> Any:
    if isinstance(value, np.generic) and _dtypes.is_supported(value.dtype):
        return {"scalar": {"dtype": value.dtype.name, "value": encode(value.item())}}
    if isinstance(value, np.dtype) and _dtypes.is_supported(value):
        return {"dtype": value.name}
    if isinstance(value, enum.Enum):
        return {"enum": {"type": _path_of(type(value)), "name": value.name}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _encode_dataclass(value)
    if isinstance(value, type) or callable(value):
        return {"ref": _path_of(value)}
    name = _sentinel_name(value)
    if name is not None:
        return {"sentinel": {"type": _path_of(type(value)), "name": name}}
    raise TypeError(f"{value!r} of type {type(value).__name__}")


def _encode_dataclass(value: Any) -> dict[str, Any]:
    params = getattr(type(value), "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(
            f"{value!r} is a dataclass that is not frozen (static values must be immutable; "
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
        same = _import(path) is obj
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


def _import(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = sys.modules.get(module) or importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def decode(obj: Any) -> Any:
    """Inverts :func:`encode`.

    Raises:
        ClassResolutionError: a class, function or sentinel the value names cannot be imported
            or is no longer what was stored.
            Also raised when the JSON is not an encoded static value.
    """
    try:
        return _decode(obj)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError) as err:
        if isinstance(err, ClassResolutionError):
            raise
        raise ClassResolutionError(
            f"cannot rebuild the static value {obj!r:.200} stored in the schema: {err!r}. Make "
            "the class or function it names importable again, or open with generic=True"
        ) from err


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
    return _decode_object(tag, inner)


def _decode_object(tag: str, inner: Any) -> Any:
    if tag == "ref":
        return _import(inner)
    if tag == "enum":
        cls = _import(inner["type"])
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise ValueError(f"{inner['type']} is not an Enum class")
        return cls[inner["name"]]
    if tag == "sentinel":
        value = getattr(importlib.import_module(inner["type"].partition(":")[0]), inner["name"])
        if _path_of(type(value)) != inner["type"]:
            raise ValueError(f"{inner['name']} is no longer a {inner['type']}")
        return value
    if tag == "dataclass":
        return _decode_dataclass(inner)
    raise ValueError(f"unknown tag {tag!r} in static value")


def _decode_dataclass(inner: dict[str, Any]) -> Any:
    cls = _import(inner["type"])
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
