"""Binding a stored tree to the classes a program defines today, by field name.

A stored custom node lists its children's keypath entries (field names) and its static data.
On open, each node is rebuilt from those names, never by position:

* a dataclass-based node (``flax.struct.dataclass``, ``jax.tree_util.register_dataclass``,
  chex dataclasses, equinox Modules) becomes a *template* instance of today's class, made
  without calling user code (``object.__new__`` and ``object.__setattr__``): every data field
  that the store has gets a placeholder for its stored column(s), a field the store lacks gets
  its default, static fields get their stored values (by name where the store recorded the
  names, format 2); the class's own flatten then gives today's treedef;
* a NamedTuple is bound the same way by its field names;
* any other custom node is rebuilt from its stored static data and flattened again, and its
  keys and static data must come back as stored.

Every difference is collected and reported together in one :class:`SchemaMismatchError`.
The result is today's treedef and a :class:`Binding` from today's leaves to the stored
columns (None when they are the same, in the same order).

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> schema = TreeSchema.from_example({"a": np.float32(0)})
    >>> schema.binding is None
    True
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import (
    GetAttrKey,
    tree_flatten_with_path,
    tree_map,
    tree_structure,
)

from pytreestore._format import consts as _consts
from pytreestore._format import keys as _keys
from pytreestore._format import nodes as _nodes
from pytreestore._format import values as _values
from pytreestore.errors import ClassResolutionError, CorruptStoreError, SchemaMismatchError

_LEAF = tree_structure(0)


class _Col:
    """Placeholder leaf of a template: stored column ``index``."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Default:
    """Placeholder leaf of a template: a field the store lacks, filled with ``value``."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray) -> None:
        self.value = value


class _Probe:
    """Placeholder for one dataclass field while finding which fields are data or static."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


@dataclasses.dataclass(frozen=True)
class Binding:
    """How today's leaves map to the stored columns.

    Attributes:
        sources: per leaf of today's treedef, the index of its stored column, an array:
            the default of a field that the store lacks, or a constant leaf (a function,
            stored in the schema: :class:`pytreestore._format.consts.Const`).
        shapes: per stored column, its per-record shape (to find the batch shape of a load).
        unwritable: why records of today's classes cannot be appended ("" when they can).
    """

    sources: tuple[int | np.ndarray | _consts.Const, ...]
    shapes: tuple[tuple[int, ...], ...]
    unwritable: str

    def leaves(self, columns: Sequence[Any]) -> list[Any]:
        """Today's leaves from loaded ``columns`` (None where a column was not loaded)."""
        ref = next(((c, s) for c, s in zip(columns, self.shapes) if c is not None), None)
        return [_leaf(s, columns, ref) for s in self.sources]

    @property
    def consts_only(self) -> bool:
        """Whether the columns are today's leaves in order, with only constants added."""
        cols = [s for s in self.sources if not isinstance(s, _consts.Const)]
        return cols == list(range(len(self.shapes)))

    def columns(self, leaves: Sequence[Any]) -> list[Any]:
        """The stored columns' values from today's leaves (for appends)."""
        if self.unwritable:
            raise SchemaMismatchError(self.unwritable)
        out: list[Any] = [None] * len(self.shapes)
        for leaf, source in zip(leaves, self.sources):
            if isinstance(source, _consts.Const):
                source.check(leaf)
            else:
                out[source] = leaf  # type: ignore[index]
        return out


def _leaf(source: Any, columns: Sequence[Any], ref: Any) -> Any:
    if isinstance(source, int):
        return columns[source]
    if isinstance(source, _consts.Const):
        return source.value
    return _fill(source, ref)


def _fill(value: np.ndarray, ref: tuple[Any, tuple[int, ...]] | None) -> Any:
    """``value`` repeated over the batch shape of the loaded column ``ref``."""
    if ref is None:
        return None
    leaf, shape = ref
    batch = tuple(np.shape(leaf)[: np.ndim(leaf) - len(shape)])
    if isinstance(leaf, jax.Array):
        return jax.numpy.broadcast_to(jax.numpy.asarray(value), batch + value.shape)
    return np.broadcast_to(value, batch + value.shape).copy()


def bind(tree: dict[str, Any], shapes: Sequence[tuple[int, ...]], paths: Sequence[str]) -> tuple:
    """Today's treedef for the stored ``tree`` and the :class:`Binding` (None if identity).

    Raises:
        ClassResolutionError: a class the schema names cannot be imported.
        SchemaMismatchError: today's classes differ from the stored nodes in a way that
            cannot be bound; every differing keypath is listed.
    """
    binder = _Binder()
    template = binder.node(tree, ())
    if binder.problems:
        raise SchemaMismatchError(_report(binder.problems))
    try:
        flat, treedef = tree_flatten_with_path(template)
    except Exception as err:  # a user flatten function failed on the template
        raise SchemaMismatchError(
            f"today's classes cannot be flattened around the stored fields ({_reason(err)}). "
            "Open with like=<an example record> or generic=True."
        ) from None
    sources = tuple(
        v.index if isinstance(v, _Col) else v if isinstance(v, _consts.Const) else v.value
        for _, v in flat
    )
    if sources == tuple(range(len(shapes))):
        return treedef, None
    return treedef, Binding(sources, tuple(shapes), _unwritable(flat, paths))


def _unwritable(flat: list, paths: Sequence[str]) -> str:
    used = {v.index for _, v in flat if isinstance(v, _Col)}
    gone = [p for i, p in enumerate(paths) if i not in used]
    new = [_keys.path_str(k) for k, v in flat if isinstance(v, _Default)]
    if not gone and not new:
        return ""
    parts = []
    if gone:
        parts.append(
            f"the store has columns {gone} that today's classes no longer have "
            f"(store.evolve(drop={gone!r}) hides them)"
        )
    if new:
        example = "{" + ", ".join(f"{p!r}: <default>" for p in new) + "}"
        parts.append(
            f"today's classes have fields {new} that the store lacks (loads fill them with "
            f"their defaults; store.evolve(add={example}) adds them as columns)"
        )
    return "records of today's classes cannot be appended: " + "; ".join(parts)


def _report(problems: list[str]) -> str:
    lines = "\n".join(f"  {p}" for p in problems)
    return (
        "the store's schema does not match today's classes:\n"
        f"{lines}\n"
        "Fix: change the store with pytreestore.evolve(path, add=..., drop=..., rename=..., "
        "rename_class=...) (or store.evolve on a store open with mode='a'), open with "
        "like=<an example record of the stored classes>, or open with generic=True."
    )


def _reason(err: BaseException) -> str:
    text = str(err)
    if "std::" in text or not text:  # C++ exception text tells a user nothing
        return type(err).__name__
    return f"{type(err).__name__}: {text}"


class _Binder:
    """Builds the template of today's classes for a stored tree, collecting problems."""

    def __init__(self) -> None:
        self.next_column = 0
        self.problems: list[str] = []

    def node(self, node: dict[str, Any], path: tuple) -> Any:
        kind = node["node"]
        if kind == "leaf":
            self.next_column += 1
            return _Col(self.next_column - 1)
        if kind == "none":
            return None
        if kind == "const":
            return _consts.Const(_consts.decode(node), _keys.path_str(path))
        entries = [_child_entry(node, i) for i in range(len(node.get("children", [])))]
        children = [self.node(c, (*path, e)) for c, e in zip(node.get("children", []), entries)]
        builder = _BUILDERS.get(kind)
        if builder is None:
            raise CorruptStoreError(f"unknown node kind {kind!r} in the store's schema")
        return builder(self, node, entries, children, path)

    def problem(self, path: tuple, text: str) -> None:
        self.problems.append(f"{_keys.path_str(path) or 'the root'}: {text}")

    # ---- node kinds ----------------------------------------------------------------------------

    def sequence(self, node: dict, entries: list, children: list, path: tuple) -> Any:
        return children if node["node"] == "list" else tuple(children)

    def mapping(self, node: dict, entries: list, children: list, path: tuple) -> Any:
        pairs = zip(node["keys"], children)
        return dict(pairs) if node["node"] == "dict" else collections.OrderedDict(pairs)

    def namedtuple(self, node: dict, entries: list, children: list, path: tuple) -> Any:
        from pytreestore._format.schema import resolve_class

        cls = resolve_class(node["type"], namedtuple=True)
        if _nodes.has_own_flatten(cls):  # format 1 wrote its children in the flatten's order
            try:
                order = _nodes.registered_order(cls)
            except TypeError as err:
                self.problem(path, str(err))
                return None
            fields_in_order = [cls._fields[i] for i in order]  # type: ignore[attr-defined]
            stored = dict(zip(fields_in_order, children))
        else:
            stored = dict(zip(node.get("fields", []), children))
        fields: tuple[str, ...] = cls._fields  # type: ignore[attr-defined]
        defaults: dict[str, Any] = getattr(cls, "_field_defaults", {})
        values = [self.field(path, cls, f, stored, defaults.get(f, _NONE)) for f in fields]
        self.check_names(path, cls, list(stored), list(fields), defaults)
        return tuple.__new__(cls, values)

    def custom(self, node: dict, entries: list, children: list, path: tuple) -> Any:
        from pytreestore._format.schema import resolve_class

        cls = resolve_class(node["type"])
        try:
            aux = _values.decode(node["aux"])
        except (TypeError, ValueError) as err:
            raise CorruptStoreError(
                f"the store's schema is damaged: static data {node['aux']!r} of the node at "
                f"{_keys.path_str(path) or 'the root'} cannot be decoded ({err})"
            ) from err
        probe = _probe(cls) if dataclasses.is_dataclass(cls) else None
        if probe is not None:
            names = [_keys.entry_name(e) for e in entries]
            return self.dataclass(node, cls, aux, dict(zip(names, children)), probe, path)
        refusal = _unbuildable(cls)
        if refusal.endswith(_UNREGISTERED):
            raise ClassResolutionError(
                f"{node['type']} is not a registered pytree node type here. Register it "
                "(import the module that defines it), pass like=<an example record> to open, "
                "or open with generic=True for dicts and lists."
            )
        if refusal:
            self.problem(path, f"stored as a custom node of class {node['type']}, but {refusal}")
            return None
        return self.rebuilt(cls, aux, entries, children, path)

    # ---- dataclasses and NamedTuples, by name --------------------------------------------------

    def dataclass(
        self, node: dict, cls: type, aux: Any, stored: dict[str, Any], probe: _Fields, path: tuple
    ) -> Any:
        statics = self.stored_statics(node, aux, probe, path)
        obj = object.__new__(cls)
        data_defaults: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            default = _field_default(f)
            if f.name in probe.data:
                data_defaults[f.name] = default
                value = self.field(path, cls, f.name, stored, default)
            elif f.name in probe.static:
                value = self.static(path, cls, f.name, statics, default)
                if f.name in stored:
                    self.problem(
                        (*path, GetAttrKey(f.name)),
                        "stored as a data field (a column), static in today's class",
                    )
            elif default is not _NONE:
                value = default
            else:
                continue
            object.__setattr__(obj, f.name, value)
        self.check_names(path, cls, list(stored), list(probe.data), data_defaults)
        self.check_flatten(obj, cls, probe, path)
        return obj

    def field(self, path: tuple, cls: type, name: str, stored: dict, default: Any) -> Any:
        if name in stored:
            return stored[name]
        if default is _NONE:
            return None  # reported by check_names, with the stored names beside it
        try:
            return tree_map(lambda v: _Default(_default_array(v)), default)
        except (TypeError, ValueError) as err:
            self.problem(
                (*path, GetAttrKey(name)), f"added with a default that is not an array ({err})"
            )
            return None

    def static(self, path: tuple, cls: type, name: str, statics: dict | None, default: Any) -> Any:
        if statics is not None and name in statics:
            return statics[name]
        if default is not _NONE:
            return default
        if statics is not None:
            self.problem(
                (*path, GetAttrKey(name)),
                f"static field added to {cls.__qualname__} since the store was written, with no "
                f"default; stored static fields: {sorted(statics)}. Give it a default.",
            )
        return None

    def stored_statics(self, node: dict, aux: Any, probe: _Fields, path: tuple) -> dict | None:
        """Stored static values by name: recorded names (format 2), or by position (format 1)."""
        names = node.get("aux_fields")
        if names is not None and isinstance(aux, tuple) and len(names) == len(aux):
            return {n: v for n, v in zip(names, aux) if n is not None}
        if aux == ():
            return {}  # no static fields then: today's take their defaults
        if isinstance(aux, tuple) and len(aux) == len(probe.aux):
            return {n: aux[i] for n, i in probe.static.items()}
        self.problem(
            path,
            f"stored static data {aux!r} does not fit the static fields of today's class "
            f"{sorted(probe.static)} (this store did not record static field names)",
        )
        return None

    def check_names(
        self, path: tuple, cls: type, stored: list[str], today: list[str], defaults: dict
    ) -> None:
        gone = [n for n in stored if n not in today]
        new = [n for n in today if n not in stored and defaults.get(n, _NONE) is _NONE]
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
        self.problem(path, text)

    def check_flatten(self, obj: Any, cls: type, probe: _Fields, path: tuple) -> None:
        try:
            flat, _ = tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
        except Exception as err:
            self.problem(path, f"{cls.__qualname__} cannot be flattened ({_reason(err)})")
            return
        got = [_keys.entry_name(k[0]) for k, _ in flat]
        if got != list(probe.data):
            self.problem(
                path, f"{cls.__qualname__} flattens to fields {got}, expected {probe.data}"
            )

    # ---- other custom nodes: rebuilt with the stored static data, then checked ------------------

    def rebuilt(self, cls: type, aux: Any, entries: list, children: list, path: tuple) -> Any:
        name = cls.__qualname__
        try:
            nodedef = _nodes.make_treedef(cls, aux, [_LEAF] * len(children))
            obj = nodedef.unflatten(children)
            flat, sub = tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
            got_aux = sub.node_data()[1]  # type: ignore[index]
        except Exception as err:
            self.problem(
                path,
                f"{name} cannot be rebuilt from its stored static data {aux!r} "
                f"({_reason(err)}); is it still a registered pytree node with the same flatten?",
            )
            return None
        got = [k[0] for k, _ in flat]
        if got != entries or any(a is not b for (_, a), b in zip(flat, children)):
            want = [_keys.entry_name(e) for e in entries]
            have = [_keys.entry_name(e) for e in got]
            self.problem(path, f"{name} children: stored {want}, today's flatten gives {have}")
        elif not _same(got_aux, aux):
            self.problem(
                path, f"{name} static data: stored {aux!r}, today's flatten gives {got_aux!r}"
            )
        return obj


_BUILDERS: dict[str, Callable[..., Any]] = {
    "list": _Binder.sequence,
    "tuple": _Binder.sequence,
    "dict": _Binder.mapping,
    "ordered_dict": _Binder.mapping,
    "namedtuple": _Binder.namedtuple,
    "custom": _Binder.custom,
}
_NONE: Any = object()  # "no default"
_UNREGISTERED = " is not a registered pytree node"


@dataclasses.dataclass(frozen=True)
class _Fields:
    """Today's fields of a dataclass node: data fields in flatten order, static fields with
    their position in the node's static (aux) tuple, and the probe's aux."""

    data: tuple[str, ...]
    static: dict[str, int]
    aux: tuple


def _probe(cls: type) -> _Fields | None:
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
    return _Fields(data, static, aux)


def static_names(cls: type, aux: Any) -> list[str | None] | None:
    """The field name of each entry of a dataclass node's static tuple ``aux`` (None for an
    entry that is not a field), or None if ``cls`` is not such a node.

    Written into the schema (``aux_fields``) so that static fields bind by name.
    """
    if not dataclasses.is_dataclass(cls):
        return None
    probe = _probe(cls)
    if probe is None or not isinstance(aux, tuple) or len(aux) != len(probe.aux):
        return None
    names: list[str | None] = [None] * len(aux)
    for name, i in probe.static.items():
        names[i] = name
    return names


def _unbuildable(cls: type) -> str:
    """Why a node of ``cls`` cannot safely be rebuilt from stored static data ("" if it can).

    JAX's C++ crashes (no exception) when a built-in node or a ``register_dataclass`` node is
    rebuilt from static data of the wrong shape, so only Python-registered nodes are.
    """
    from jax._src import tree_util

    own_namedtuple = (
        issubclass(cls, tuple) and hasattr(cls, "_fields") and _nodes.has_own_flatten(cls)
    )
    if (issubclass(cls, tuple | list | dict) and not own_namedtuple) or cls is type(None):
        return f"today {cls.__qualname__} is a built-in container (the node kind changed)"
    entry = tree_util._registry.get(cls)
    if entry is None:
        return f"today {cls.__qualname__}{_UNREGISTERED}"
    if "register_dataclass" in getattr(entry.to_iter, "__qualname__", ""):
        return (
            f"today {cls.__qualname__} is registered with register_dataclass without being a "
            "dataclass, so its fields cannot be bound by name"
        )
    return ""


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return _NONE


def _default_array(value: Any) -> np.ndarray:
    from pytreestore._format import dtypes as _dtypes

    dtype = _dtypes.value_dtype(value)
    if dtype is None or isinstance(value, str | bytes) or not _dtypes.is_supported(dtype):
        raise TypeError(f"{value!r} of type {type(value).__name__}")
    return np.asarray(value, dtype)


def static_differences(node: dict[str, Any], got: dict[str, Any], path: tuple) -> list[str]:
    """Per static field, where a record's dataclass node ``got`` (encoded) has other static
    values than the stored ``node``: ``.tag: stored 't', got 'other'``."""
    names = node.get("aux_fields")
    same_node = (got.get("type"), got.get("keys")) == (node.get("type"), node.get("keys"))
    if not names or not same_node or "aux" not in got:
        return []
    want, have = _values.decode(node["aux"]), _values.decode(got["aux"])
    if not (isinstance(want, tuple) and isinstance(have, tuple) and len(want) == len(have)):
        return []
    return [
        f"{_keys.path_str((*path, GetAttrKey(n)))}: stored {a!r}, got {b!r}"
        for n, a, b in zip(names, want, have)
        if n is not None and not _same(a, b)
    ]


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


def _child_entry(node: dict[str, Any], i: int) -> Any:
    from pytreestore._format.schema import _child_entry as entry

    return entry(node, i)


_NAMES = {"dict": "keys", "ordered_dict": "keys", "namedtuple": "fields", "custom": "keys"}


def check_tree(tree: dict[str, Any], columns: int) -> None:
    """Checks what the JSON Schema cannot: each node names as many children as it has, and
    the tree has one leaf per column.

    Raises:
        CorruptStoreError: naming the node.
    """
    leaves = 0
    todo: list[tuple[dict[str, Any], str]] = [(tree, "the root")]
    while todo:
        node, where = todo.pop()
        children, names = node.get("children", []), _NAMES.get(node["node"])
        if names is not None and len(node.get(names, ())) != len(children):
            raise CorruptStoreError(
                f"the store's schema is damaged: the {node['node']} node at {where} has "
                f"{len(children)} children but {len(node.get(names, ()))} {names}"
            )
        leaves += node["node"] == "leaf"
        todo += [(c, f"{where}, child {i}") for i, c in enumerate(children)]
    if leaves != columns:
        raise CorruptStoreError(
            f"the store's schema is damaged: its tree has {leaves} leaves but it lists "
            f"{columns} columns"
        )


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


__all__ = ["Binding", "annotate", "bind", "static_names"]
