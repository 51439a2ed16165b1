"""Static codecs: how objects that wrap static values (a hashable wrapper around a numpy array)
are stored, keyed by their class's import path.

A library that keeps numpy arrays as static (aux) data wraps them in a hashable object (JAX
cannot hash or compare a bare array); MJX's ``_NumPyArrayHashWrapper`` is one. Such a value is
stored as ``{"wrapped": {"type": "module:qualname", "value": <the inner static value>}}``:
the codec's ``encode`` gives the inner value (an array, a tuple of them...), its ``decode``
rebuilds the wrapper from it. Decoding calls nothing that the schema names except a codec
found in this registry.

The project registers MJX's wrapper here by import path, without importing MJX; users
register their own classes with :func:`pytreestore.register_static_codec`.

Example:
    >>> import numpy as np
    >>> class Box:
    ...     def __init__(self, a): self.a = a
    >>> def encode(box): return box.a
    >>> codec = StaticCodec("pkg.mod:Box", encode, Box)
    >>> codec.encode(Box(np.arange(2)))
    array([0, 1])
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from pytreestore.errors import ArgumentTypeError

T = TypeVar("T")

#: MJX (mujoco-mjx) keeps static numpy arrays in this hashable wrapper
MJX_WRAPPER = "mujoco.mjx._src.dataclasses:_NumPyArrayHashWrapper"


@dataclasses.dataclass(frozen=True)
class StaticCodec:
    """How one class of static values is stored.

    Attributes:
        path: the class's import path, ``module:qualname``, as the schema names it.
        encode: the inner static value of an instance (what the schema stores).
        decode: an instance rebuilt from its inner static value.
    """

    path: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


def import_path(path: str) -> Any:
    """What ``module:qualname`` names: the module imported (if not already), then each
    attribute of the qualname read; raises what the import or ``getattr`` raises."""
    module, _, qualname = path.partition(":")
    obj: Any = sys.modules.get(module) or importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _mjx_decode(array: Any) -> Any:
    if not isinstance(array, np.ndarray):
        raise ValueError(f"MJX's array wrapper holds a numpy array, the store holds {array!r:.80}")
    return import_path(MJX_WRAPPER)(array)


#: codecs by class import path: the project's, then those registered at run time
_REGISTRY: dict[str, StaticCodec] = {
    MJX_WRAPPER: StaticCodec(MJX_WRAPPER, lambda w: w.array, _mjx_decode),
}
#: types that are static values in their own right, which no codec may replace
_NATIVE = (type(None), bool, int, float, complex, str, bytes, list, tuple, dict, np.ndarray)


def register_static_codec(
    cls: type[T], encode: Callable[[T], Any], decode: Callable[[Any], T]
) -> None:
    """Lets stores hold instances of ``cls`` in static (aux) data, by an inner static value.

    A pytree node's static data may hold an object of ``cls`` (exactly that class): the schema
    stores ``encode(obj)``, which must be a static value (tuples, numpy arrays, str...), and a
    reader rebuilds the object with ``decode``. ``decode(encode(obj))`` must equal ``obj``, so
    that the treedef read back compares equal to the original and jit caches hit; this is
    checked when a record is encoded. Readers must register the same codec before opening
    (the module that defines ``cls`` is imported first, so registering there suffices).

    Args:
        cls: a module-level class, named in the schema as ``module:qualname``.
        encode: the inner static value of an instance.
        decode: an instance rebuilt from its inner static value.

    Raises:
        ArgumentTypeError: ``cls`` is not a class importable by its name, is already stored
            as a static value (int, tuple, numpy array...), or a function is not callable.

    Example:
        >>> import numpy as np, pytreestore
        >>> from pytreestore.testing.strategies import HashableArray
        >>> pytreestore.register_static_codec(HashableArray, lambda h: h.array, HashableArray)
    """
    if not isinstance(cls, type):
        raise ArgumentTypeError(f"register_static_codec takes a class, got {cls!r:.80}")
    if issubclass(cls, (*_NATIVE, np.generic, enum.Enum, type)):
        raise ArgumentTypeError(
            f"{cls.__qualname__} values are stored as static values already; a codec is for "
            "other classes (wrappers of arrays or of other static values)"
        )
    if not (callable(encode) and callable(decode)):
        raise ArgumentTypeError("register_static_codec takes an encode and a decode function")
    path = f"{cls.__module__}:{cls.__qualname__}"
    try:
        same = "<" not in path and import_path(path) is cls
    except (ImportError, AttributeError, ValueError):
        same = False
    if not same:
        raise ArgumentTypeError(
            f"{cls!r} is not importable as {path}; a codec's class is named in the schema by "
            "import path, so it must be defined at module level under its own name"
        )
    _REGISTRY[path] = StaticCodec(path, encode, decode)


def for_value(value: Any) -> StaticCodec | None:
    """The codec of ``value``'s class (by its import path), or None when it has none."""
    cls = type(value)
    return _REGISTRY.get(f"{cls.__module__}:{cls.__qualname__}")


def for_path(path: str) -> StaticCodec:
    """The codec a schema names, importing the class's module first so that a library that
    registers its codecs on import has done so.

    Raises:
        LookupError: no codec is registered for ``path``.
    """
    if path not in _REGISTRY:
        module = path.partition(":")[0]
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise LookupError(f"the module of {path} cannot be imported ({err})") from err
    found = _REGISTRY.get(path)
    if found is None:
        raise LookupError(
            f"no static codec is registered for {path}; register it with "
            "pytreestore.register_static_codec before opening the store"
        )
    return found


__all__ = ["MJX_WRAPPER", "StaticCodec", "for_path", "for_value", "register_static_codec"]
