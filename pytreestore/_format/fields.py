"""The fields of dataclass nodes: which are data (children) and which static, found by probing.

A dataclass-based pytree node (``flax.struct.dataclass``, ``jax.tree_util.register_dataclass``,
chex dataclasses, equinox Modules) is flattened once around placeholders, made without calling
user code (``object.__new__`` and ``object.__setattr__``), to learn which of its fields become
children and where each static field sits in its static (aux) data. Binding by name
(:mod:`pytreestore._format.classbind`) and the schema's ``aux_fields`` are built on that.

Example:
    >>> import dataclasses, jax
    >>> @jax.tree_util.register_dataclass
    ... @dataclasses.dataclass
    ... class Tagged:
    ...     x: float
    ...     tag: str = dataclasses.field(default="t", metadata={"static": True})
    >>> probe(Tagged).data, probe(Tagged).static
    (('x',), {'tag': 0})
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jax.tree_util import tree_flatten_with_path

from pytreestore._format import dtypes as _dtypes
from pytreestore._format import keys as _keys
from pytreestore._format import nodes as _nodes

#: "no default": a field default that stands for none
NO_DEFAULT: Any = object()
#: the end of the reason a class cannot be rebuilt when JAX does not know it as a node
UNREGISTERED = " is not a registered pytree node"


class _Probe:
    """Placeholder for one dataclass field while finding which fields are data or static."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


@dataclasses.dataclass(frozen=True)
class Fields:
    """Today's fields of a dataclass node: data fields in flatten order, static fields with
    their position in the node's static (aux) tuple, and the probe's aux."""

    data: tuple[str, ...]
    static: dict[str, int]
    aux: tuple


def probe(cls: type) -> Fields | None:
    """Which fields of dataclass ``cls`` its flatten treats as data or static; None if its
    flatten does not take a bare instance (then it is rebuilt from stored static data)."""
    try:
        obj = object.__new__(cls)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            object.__setattr__(obj, f.name, _Probe(f.name))
        flat, sub = tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
        aux = sub.node_data()[1]  # type: ignore[index]
    except Exception:
        return None
    if sub.num_nodes == 1 and sub.num_leaves == 1:
        return None  # not registered: reported by the rebuild
    data = tuple(v.name for _, v in flat if isinstance(v, _Probe))
    keys = tuple(_keys.entry_name(k[0]) for k, _ in flat)
    if len(data) != len(flat) or keys != data or not isinstance(aux, tuple):
        return None  # children not named by their fields: rebuilt from stored static data
    static = {v.name: i for i, v in enumerate(aux) if isinstance(v, _Probe)}
    return Fields(data, static, aux)


def static_names(cls: type, aux: Any) -> list[str | None] | None:
    """The field name of each entry of a dataclass node's static tuple ``aux`` (None for an
    entry that is not a field), or None if ``cls`` is not such a node.

    Written into the schema (``aux_fields``) so that static fields bind by name.
    """
    if not dataclasses.is_dataclass(cls):
        return None
    fields = probe(cls)
    if fields is None or not isinstance(aux, tuple) or len(aux) != len(fields.aux):
        return None
    names: list[str | None] = [None] * len(aux)
    for name, i in fields.static.items():
        names[i] = name
    return names


def annotate(node: dict[str, Any], value: Any) -> None:
    """Adds ``aux_fields`` (the static fields' names) to the dataclass nodes of the schema
    tree ``node`` encoded from ``value``, so that they bind by name on open."""
    flat, sub = tree_flatten_with_path(value, is_leaf=lambda x: x is not value)
    if sub.num_nodes == 1 and sub.num_leaves == 1:
        return
    if node.get("node") == "custom":
        cls, aux = sub.node_data()  # type: ignore[misc]
        names = static_names(cls, aux)
        if names is not None:
            node["aux_fields"] = names
    for child, (_, v) in zip(node.get("children", []), flat):
        annotate(child, v)


def unbuildable(cls: type) -> str:
    """Why a node of ``cls`` cannot safely be rebuilt from stored static data ("" if it can).

    JAX's C++ crashes (no exception) when a built-in node or a ``register_dataclass`` node is
    rebuilt from static data of the wrong shape, so only Python-registered nodes are.
    """
    own_namedtuple = (
        issubclass(cls, tuple) and hasattr(cls, "_fields") and _nodes.has_own_flatten(cls)
    )
    if (issubclass(cls, tuple | list | dict) and not own_namedtuple) or cls is type(None):
        return f"today {cls.__qualname__} is a built-in container (the node kind changed)"
    entry = _nodes.registration(cls)
    if entry is None:
        return f"today {cls.__qualname__}{UNREGISTERED}"
    if "register_dataclass" in getattr(entry.to_iter, "__qualname__", ""):
        return (
            f"today {cls.__qualname__} is registered with register_dataclass without being a "
            "dataclass, so its fields cannot be bound by name"
        )
    return ""


def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default (its factory called), or :data:`NO_DEFAULT`."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return NO_DEFAULT


def default_array(value: Any) -> np.ndarray:
    """A field default as the array a column of it would hold; TypeError if it is none."""
    dtype = _dtypes.value_dtype(value)
    if dtype is None or isinstance(value, str | bytes) or not _dtypes.is_supported(dtype):
        raise TypeError(f"{value!r} of type {type(value).__name__}")
    return np.asarray(value, dtype)


def same(a: Any, b: Any) -> bool:
    """Whether two static values are equal and of one type (never raising)."""
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


def reason(err: BaseException) -> str:
    """An exception from user flatten code, as a short clause for an error message."""
    text = str(err)
    if "std::" in text or not text:  # C++ exception text tells a user nothing
        return type(err).__name__
    return f"{type(err).__name__}: {text}"


__all__ = [
    "NO_DEFAULT",
    "UNREGISTERED",
    "Fields",
    "annotate",
    "default_array",
    "field_default",
    "probe",
    "reason",
    "same",
    "static_names",
    "unbuildable",
]
