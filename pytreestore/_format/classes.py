"""Today's classes and a stored tree: dataclass fields found by probing, NamedTuples and custom nodes bound by field name.

The fields of dataclass nodes: which are data (children) and which static, found by probing.

A dataclass-based pytree node (``flax.struct.dataclass``, ``jax.tree_util.register_dataclass``,
chex dataclasses, equinox Modules) is flattened once around placeholders, made without calling
user code (``object.__new__`` and ``object.__setattr__``), to learn which of its fields become
children and where each static field sits in its static (aux) data. Binding by name
(:mod:`pytreestore._format.classes`) and the schema's ``aux_fields`` are built on that.

Example:
    >>> import dataclasses, jax
    >>> @jax.tree_util.register_dataclass
    ... @dataclasses.dataclass
    ... class Tagged:
    ...     x: float
    ...     tag: str = dataclasses.field(default="t", metadata={"static": True})
    >>> probe(Tagged).data, probe(Tagged).static
    (('x',), {'tag': 0})

Binding stored NamedTuple and custom nodes to today's classes, by field name.

* a dataclass-based node becomes a *template* instance of today's class, made without calling
  user code: every data field that the store has gets a placeholder for its stored column(s),
  a field the store lacks gets its default, static fields get their stored values (by name,
  or by position where the node says its names were never recorded); the class's own flatten
  then gives today's treedef;
* a NamedTuple is bound the same way by its field names (or, where the node says its children
  are in the registered flatten's order, by that order);
* any other custom node is rebuilt from its stored static data and flattened again, and its
  keys and static data must come back as stored.

Nodes are read in today's shape only: :mod:`pytreestore._format.upgrades` marks what an older
format left unsaid.

Problems are reported to the :class:`Binder` (:mod:`pytreestore._format.binding` collects them
all into one error), so that every differing keypath is named at once.

Example:
    >>> class Collect:
    ...     def problem(self, path, text): print(text)
    ...     def column(self): return 0
    >>> node = {"type": "pytreestore.testing.strategies:Pair", "fields": ["second", "first"]}
    >>> bind_namedtuple(Collect(), node, [], ["S", "F"], ())
    Pair(first='F', second='S')
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Protocol

import numpy as np
from jax.tree_util import GetAttrKey, tree_flatten_with_path, tree_map, tree_structure

from pytreestore._format import dtypes as _dtypes
from pytreestore._format import keys as _keys
from pytreestore._format import nodes as _nodes
from pytreestore._format import upgrades as _upgrades
from pytreestore._format import values as _values
from pytreestore.errors import ClassResolutionError, CorruptStoreError

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


#: the containers JAX flattens natively (its registry lists them too)
_BUILT_IN = (tuple, list, dict, collections.OrderedDict, collections.defaultdict)


def unbuildable(cls: type) -> str:
    """Why a node of ``cls`` cannot safely be rebuilt from stored static data ("" if it can).

    JAX's C++ crashes (no exception) when a built-in node or a ``register_dataclass`` node is
    rebuilt from static data of the wrong shape, so only Python-registered nodes are (a
    NamedTuple or a ``dict`` subclass such as :class:`~pytreestore.BatchState` registered
    with a flatten of its own is one).
    """
    own = _nodes.has_own_flatten(cls) and cls not in _BUILT_IN
    if (issubclass(cls, tuple | list | dict) and not own) or cls is type(None):
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


_LEAF = tree_structure(0)


class Binder(Protocol):
    """What binding a node reports to: problems by keypath, and the next stored column."""

    def problem(self, path: tuple, text: str) -> None: ...

    def column(self) -> Any: ...


class Default:
    """Placeholder leaf of a template: a field the store lacks, filled with ``value``."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<Default>"


def bind_namedtuple(binder: Binder, node: dict, entries: list, children: list, path: tuple) -> Any:
    """Today's NamedTuple for a stored ``namedtuple`` node, its fields bound by name."""
    cls = _nodes.resolve_class(node["type"], namedtuple=True)
    if node.get(_upgrades.FLATTEN_ORDER) and _nodes.has_own_flatten(cls):
        try:
            order = _nodes.registered_order(cls)
        except TypeError as err:
            binder.problem(path, str(err))
            return None
        fields_in_order = [cls._fields[i] for i in order]  # type: ignore[attr-defined]
        stored = dict(zip(fields_in_order, children))
    else:
        stored = dict(zip(node.get("fields", []), children))
    fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
    defaults: dict[str, Any] = getattr(cls, "_field_defaults", {})
    values = [_field(binder, path, f, stored, defaults.get(f, NO_DEFAULT)) for f in fields]
    _check_names(binder, path, cls, list(stored), list(fields), defaults)
    return tuple.__new__(cls, values)


def bind_custom(binder: Binder, node: dict, entries: list, children: list, path: tuple) -> Any:
    """Today's object for a stored ``custom`` node: a dataclass by field name, else rebuilt."""
    cls = _nodes.resolve_class(node["type"])
    try:
        aux = _values.decode(node["aux"])
    except (TypeError, ValueError) as err:
        raise CorruptStoreError(
            f"the store's schema is damaged: static data {node['aux']!r} of the node at "
            f"{_keys.path_str(path) or 'the root'} cannot be decoded ({err})"
        ) from err
    probed = probe(cls) if dataclasses.is_dataclass(cls) else None
    if probed is not None:
        names = [_keys.entry_name(e) for e in entries]
        return _dataclass(binder, node, cls, aux, dict(zip(names, children)), probed, path)
    refusal = unbuildable(cls)
    if refusal.endswith(UNREGISTERED):
        raise ClassResolutionError(
            f"{node['type']} is not a registered pytree node type here. Register it "
            "(import the module that defines it), pass like=<an example record> to open, "
            "or open with generic=True for dicts and lists."
        )
    if refusal:
        binder.problem(path, f"stored as a custom node of class {node['type']}, but {refusal}")
        return None
    return _rebuilt(binder, cls, aux, entries, children, path)


def _dataclass(
    binder: Binder, node: dict, cls: type, aux: Any, stored: dict, probe: Fields, path: tuple
) -> Any:
    statics = _stored_statics(binder, node, aux, probe, path)
    obj = object.__new__(cls)
    data_defaults: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        default = field_default(f)
        if f.name in probe.data:
            data_defaults[f.name] = default
            value = _field(binder, path, f.name, stored, default)
        elif f.name in probe.static:
            value = _static(binder, path, cls, f.name, statics, default)
            if f.name in stored:
                binder.problem(
                    (*path, GetAttrKey(f.name)),
                    "stored as a data field (a column), static in today's class",
                )
        elif default is not NO_DEFAULT:
            value = default
        else:
            continue
        object.__setattr__(obj, f.name, value)
    _check_names(binder, path, cls, list(stored), list(probe.data), data_defaults)
    _check_flatten(binder, obj, cls, probe, path)
    return obj


def _field(binder: Binder, path: tuple, name: str, stored: dict, default: Any) -> Any:
    if name in stored:
        return stored[name]
    if default is NO_DEFAULT:
        return None  # reported by _check_names, with the stored names beside it
    try:
        return tree_map(lambda v: Default(default_array(v)), default)
    except (TypeError, ValueError) as err:
        binder.problem(
            (*path, GetAttrKey(name)), f"added with a default that is not an array ({err})"
        )
        return None


def _static(
    binder: Binder, path: tuple, cls: type, name: str, statics: dict | None, default: Any
) -> Any:
    if statics is not None and name in statics:
        return statics[name]
    if default is not NO_DEFAULT:
        return default
    if statics is not None:
        binder.problem(
            (*path, GetAttrKey(name)),
            f"static field added to {cls.__qualname__} since the store was written, with no "
            f"default; stored static fields: {sorted(statics)}. Give it a default.",
        )
    return None


def _stored_statics(
    binder: Binder, node: dict, aux: Any, probe: Fields, path: tuple
) -> dict | None:
    """Stored static values by name: recorded names (``aux_fields``), or by position where
    the node says that the names were never recorded (``upgrades.STATIC_BY_POSITION``)."""
    names = node.get("aux_fields")
    if names is not None and isinstance(aux, tuple) and len(names) == len(aux):
        return {n: v for n, v in zip(names, aux) if n is not None}
    if aux == ():
        return {}  # no static fields then: today's take their defaults
    by_position = node.get(_upgrades.STATIC_BY_POSITION)
    if by_position and isinstance(aux, tuple) and len(aux) == len(probe.aux):
        return {n: aux[i] for n, i in probe.static.items()}
    binder.problem(
        path,
        f"stored static data {aux!r} does not fit the static fields of today's class "
        f"{sorted(probe.static)} (this store did not record static field names)",
    )
    return None


def _check_names(
    binder: Binder, path: tuple, cls: type, stored: list[str], today: list[str], defaults: dict
) -> None:
    gone = [n for n in stored if n not in today]
    new = [n for n in today if n not in stored and defaults.get(n, NO_DEFAULT) is NO_DEFAULT]
    if not new:
        return
    where = _keys.path_str(path)
    hint = f"store.evolve(add={{'{where}.{new[0]}': <default>}})"
    text = (
        f"{cls.__qualname__} has fields {new} that the store lacks and that have no "
        f"default; stored fields: {stored}. Give them defaults or add them with {hint}"
    )
    if gone:
        rename = {f"{where}.{a}": f"{where}.{b}" for a, b in zip(gone, new)}
        text += (
            f". Fields {gone} are stored but not in the class: if they were renamed, "
            f"store.evolve(rename={rename})"
        )
    binder.problem(path, text)


def _check_flatten(binder: Binder, obj: Any, cls: type, probe: Fields, path: tuple) -> None:
    try:
        flat, _ = tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
    except Exception as err:
        binder.problem(path, f"{cls.__qualname__} cannot be flattened ({reason(err)})")
        return
    got = [_keys.entry_name(k[0]) for k, _ in flat]
    if got != list(probe.data):
        binder.problem(path, f"{cls.__qualname__} flattens to fields {got}, expected {probe.data}")


def _rebuilt(
    binder: Binder, cls: type, aux: Any, entries: list, children: list, path: tuple
) -> Any:
    name = cls.__qualname__
    try:
        nodedef = _nodes.make_treedef(cls, aux, [_LEAF] * len(children))
        obj = nodedef.unflatten(children)
        flat, sub = tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
        got_aux = sub.node_data()[1]  # type: ignore[index]
    except Exception as err:
        binder.problem(
            path,
            f"{name} cannot be rebuilt from its stored static data {aux!r} "
            f"({reason(err)}); is it still a registered pytree node with the same "
            "flatten?",
        )
        return None
    got = [k[0] for k, _ in flat]
    if got != entries or any(a is not b for (_, a), b in zip(flat, children)):
        want = [_keys.entry_name(e) for e in entries]
        have = [_keys.entry_name(e) for e in got]
        binder.problem(path, f"{name} children: stored {want}, today's flatten gives {have}")
    elif not same(got_aux, aux):
        binder.problem(
            path, f"{name} static data: stored {aux!r}, today's flatten gives {got_aux!r}"
        )
    return obj


__all__ = [
    "NO_DEFAULT",
    "UNREGISTERED",
    "Binder",
    "Default",
    "Fields",
    "annotate",
    "bind_custom",
    "bind_namedtuple",
    "default_array",
    "field_default",
    "probe",
    "reason",
    "same",
    "static_names",
    "unbuildable",
]
