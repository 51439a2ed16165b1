"""Static (aux) values as JSON, exactly: tuples, lists, dicts and non-finite floats round-trip.

Plain JSON scalars stand for themselves and lists for lists; everything else is a one-key
object: ``{"tuple": [...]}``, ``{"dict": {...}}``, ``{"float": "nan"}``.

Example:
    >>> encode((1, "a", None))
    {'tuple': [1, 'a', None]}
    >>> decode(encode((1, ("b", 2.5)))) == (1, ("b", 2.5))
    True
"""

from __future__ import annotations

import math
from typing import Any


def encode(value: Any) -> Any:
    """Encodes a static value; raises TypeError for anything outside the JSON-able set."""
    t = type(value)
    if value is None or t in (bool, str):
        return value
    if t is int:
        return value
    if t is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if t is list:
        return [encode(v) for v in value]
    if t is tuple:
        return {"tuple": [encode(v) for v in value]}
    if t is dict:
        if not all(type(k) is str for k in value):
            raise TypeError(f"dict with non-str keys {list(value)!r}")
        return {"dict": {k: encode(v) for k, v in value.items()}}
    raise TypeError(f"{value!r} of type {t.__name__}")


def decode(obj: Any) -> Any:
    """Inverts :func:`encode`."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        ((tag, inner),) = obj.items()
        if tag == "tuple":
            return tuple(decode(v) for v in inner)
        if tag == "dict":
            return {k: decode(v) for k, v in inner.items()}
        if tag == "float":
            return float(inner)
        raise ValueError(f"unknown tag {tag!r} in static value")
    return obj
