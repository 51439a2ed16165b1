"""Encoding custom pytree nodes: which classes have their own flatten, their keys and static data.

A class registered with JAX (``register_pytree_node``, ``register_pytree_with_keys``,
``register_dataclass``, flax and chex dataclasses, equinox Modules) is stored as a ``custom``
node: its class path, the keypath entry of each child and its static (aux) data as JSON
(:mod:`pytreestore._format.values`). A NamedTuple is stored by its field names only when JAX flattens it
as a plain NamedTuple; one registered with its own flatten is a custom node, since its children
need not come in field order.

Example:
    >>> from typing import NamedTuple
    >>> class Plain(NamedTuple):
    ...     a: int
    >>> has_own_flatten(Plain)
    False
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

from jax._src import tree_util as _jax_tree_util
from jax.tree_util import (
    PyTreeDef,
    default_registry,
    tree_flatten,
    tree_flatten_with_path,
    tree_structure,
)

from pytreestore._format import keys as _keys
from pytreestore._format import statics as _statics
from pytreestore._format import values as _values
from pytreestore.errors import ClassResolutionError, UnsupportedTreeError

#: ``jax.tree_util.PyTreeDef``, which JAX defines as a runtime alias that type checkers can't use.
TreeDef = Any


def one_level(node: Any) -> tuple[TreeDef, list[Any], list[Any]] | None:
    """Flattens ``node`` one level: its treedef, child keypath entries and children.

    Returns None when ``node`` is a leaf.
    """
    flat, sub = tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if sub.num_nodes == 1 and sub.num_leaves == 1:
        return None
    return sub, [p[0] for p, _ in flat], [c for _, c in flat]


#: :func:`same_structure`'s ``want_hash`` when the caller has not worked it out
_UNKNOWN: Any = object()


def structure_hash(treedef: TreeDef) -> int | None:
    """The hash of ``treedef``, which tells a dataclass node's class (None: its static data
    does not hash)."""
    try:
        return hash(treedef)
    except TypeError:
        return None


def same_structure(got: TreeDef, want: TreeDef, want_hash: int | None = _UNKNOWN) -> bool:
    """Whether treedef ``got`` is ``want``, classes included: JAX's treedef equality does not
    compare the class of a dataclass node (``register_dataclass``, flax ``struct.dataclass``),
    so two classes with the same fields compare equal; their hashes differ, and are compared
    too where ``want``'s static data hashes. ``want_hash``: :func:`structure_hash` of
    ``want``, for a caller that keeps it.

    Example:
        >>> from jax.tree_util import tree_structure
        >>> same_structure(tree_structure({"a": 1}), tree_structure({"a": 2}))
        True
    """
    if got != want:
        return False
    if want_hash is _UNKNOWN:
        want_hash = structure_hash(want)
    if want_hash is None:  # unhashable static data: equality is all there is to go by
        return True
    return structure_hash(got) == want_hash


def class_path(cls: type) -> str:
    """``module:qualname`` of a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def class_path_checked(cls: type, where: str) -> str:
    """``module:qualname`` of the class of the node at ``where``, or UnsupportedTreeError."""
    if not isinstance(cls, type):
        raise UnsupportedTreeError(f"node at {where} is not a class instance: {cls!r}")
    return class_path(cls)


def check_imports_as(cls: type, path: str, where: str) -> None:
    """Refuses to record ``cls`` (of the node at ``where``) as ``path`` when importing
    ``path`` gives another object.

    A reader imports each class by the name the schema records, so a name that imports as
    another class (a ``collections.namedtuple("Point", ...)`` bound as ``Point2`` beside a
    class ``Point``; a class object left behind by ``importlib.reload``) would bring records
    back as that other class: it is refused, as pickle refuses it. A name that imports as
    nothing (a class defined in a function, or in another process's ``__main__``) is kept:
    its readers get a :class:`ClassResolutionError` and pass ``like=`` or ``generic=True``.

    Raises:
        UnsupportedTreeError: naming the keypath, the name and how to fix it.
    """
    found = _imported_as(path)
    if found is None or found is cls:
        return
    raise UnsupportedTreeError(
        f"the {cls.__name__} node at {where} would be recorded as {path}, but importing "
        f"{path} gives another object ({found!r:.80}), so the store would read its records "
        f"back as that (pickle refuses this class for the same reason). {_naming_advice(cls)}"
    )


def _naming_advice(cls: type) -> str:
    """How to give ``cls`` a name that imports as itself."""
    module = sys.modules.get(cls.__module__)
    names = [k for k, v in vars(module).items() if v is cls] if module else []
    if not names:
        return (
            "Give the class a unique name (qualname) in its module, bound at module level; "
            "if the module was reloaded, build the records from today's classes."
        )
    name = names[0]
    how = f"collections.namedtuple({name!r}, ...)" if hasattr(cls, "_fields") else "class"
    return (
        f"Give the class a unique name: it is bound as {cls.__module__}.{name}, so make it "
        f"under that name ({how}) or set {name}.__qualname__ = {name!r}."
    )


def _imported_as(path: str) -> Any:
    """What importing ``module:qualname`` gives, as a reader would; None when it gives
    nothing (no such module or attribute, or a ``<locals>`` qualname)."""
    if "<" in path.partition(":")[2]:
        return None
    try:
        obj: Any = _statics.import_path(path)
    except Exception:  # an import that fails in any way gives the reader nothing either
        return None
    return obj


def resolve_class(name: str, *, namedtuple: bool = False) -> type:
    """Imports the class a schema names as ``module:qualname``; calls nothing."""
    advice = (
        "Make it importable, pass like=<an example record> to pytreestore.open, "
        "or open with generic=True to get dicts and lists instead."
    )
    try:
        obj: Any = _statics.import_path(name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ClassResolutionError(
            f"cannot import class {name} named in the schema ({err}). {advice}"
        ) from err
    if not isinstance(obj, type):
        raise ClassResolutionError(f"{name} named in the schema is not a class. {advice}")
    if namedtuple and not (issubclass(obj, tuple) and hasattr(obj, "_fields")):
        raise ClassResolutionError(f"{name} named in the schema is not a NamedTuple. {advice}")
    return obj


def is_plain_namedtuple(cls: type) -> bool:
    """Whether JAX flattens ``cls`` as a NamedTuple, in field order (no flatten of its own)."""
    return issubclass(cls, tuple) and hasattr(cls, "_fields") and not has_own_flatten(cls)


def has_own_flatten(cls: type) -> bool:
    """Whether ``cls`` is registered with JAX's default registry with a flatten of its own.

    JAX keeps every registration (``register_pytree_node`` and the functions built on it) in
    ``jax._src.tree_util._registry``; a NamedTuple that is not there is flattened natively, in
    field order.
    """
    return registration(cls) is not None


def registration(cls: type) -> Any:
    """JAX's registry entry of ``cls`` (its flatten and unflatten), or None when it has none.

    JAX keeps every registration in ``jax._src.tree_util._registry``: this is the one place
    pytreestore reads it.
    """
    registry = getattr(_jax_tree_util, "_registry", None)
    return registry.get(cls) if isinstance(registry, dict) else None


def dataclass_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The data (child) and meta (static) field names of a class registered with JAX's
    ``register_dataclass`` (flax's ``struct.dataclass`` too), whose flatten is ``getattr`` of
    each data field in order; None for a class registered any other way, or not at all.

    Example:
        >>> import dataclasses, jax
        >>> @jax.tree_util.register_dataclass
        ... @dataclasses.dataclass
        ... class P:
        ...     x: float
        ...     y: float
        >>> dataclass_fields(P)
        (('x', 'y'), ())
    """
    flatten: Any = getattr(registration(cls), "to_iter", None)
    code = getattr(flatten, "__code__", None)
    if code is None or flatten.__qualname__ != "register_dataclass.<locals>.flatten_func":
        return None
    cells: dict[str, Any] = dict(zip(code.co_freevars, flatten.__closure__ or ()))
    try:
        data: Any = cells["data_fields"].cell_contents
        meta: Any = cells["meta_fields"].cell_contents
    except (KeyError, ValueError):  # another JAX's register_dataclass: not recognised
        return None
    names: tuple[Any, ...] = (*data, *meta)
    if not all(isinstance(n, str) for n in names):
        return None
    return tuple(data), tuple(meta)


def encode_aux(cls: type, aux: Any, keys: Sequence[Any], where: str) -> Any:
    """The static (aux) data of a ``cls`` node at ``where`` as JSON, or UnsupportedTreeError."""
    try:
        return _values.encode(aux)
    except TypeError as err:
        field = _failing_field(cls, aux, keys)
        what = f"static field .{field}" if field else "static (aux) data"
        raise UnsupportedTreeError(
            f"{cls.__name__} at {where} has {what} that cannot be stored: {err}. "
            "Static fields may hold None, bool, int, float, complex, str, lists, tuples and "
            "str-keyed dicts of those, bytes, numpy scalars and dtypes, Enum members, frozen "
            "dataclasses of static values, module-level functions and classes (stored by "
            "import path), module-level sentinels (such as equinox's MISSING) and objects of "
            "classes with a static codec (pytreestore.register_static_codec), such as MJX's "
            "hashable array wrapper."
        ) from err


def _failing_field(cls: type, aux: Any, keys: Sequence[Any]) -> str | None:
    try:
        entries = [_keys.entry_to_json(k) for k in keys]
    except TypeError:
        return None
    names = _static_names(cls, entries, aux)
    for name, value in zip(names or (), aux if names else ()):
        try:
            _values.encode(value)
        except TypeError:
            return name
    return None


def encode_keys(cls: type, keys: Sequence[Any], where: str) -> list[dict[str, Any]]:
    """The keypath entries of a ``cls`` node's children as JSON, or UnsupportedTreeError."""
    try:
        return [_keys.entry_to_json(k) for k in keys]
    except TypeError as err:
        raise UnsupportedTreeError(f"{cls.__name__} at {where}: {err}") from err


def make_treedef(cls: type, aux: Any, children: Sequence[TreeDef]) -> TreeDef:
    """The treedef of a ``cls`` node with static data ``aux`` over ``children``.

    ``PyTreeDef.from_node_data_and_children`` builds a plain NamedTuple node for every
    NamedTuple class, even one registered with its own flatten, which would then unflatten the
    stored children in the wrong order. Such a class's node is built by flattening a probe
    instance made with ``tuple.__new__`` (the class itself is not called) whose fields hold
    placeholder subtrees, so that JAX's registered flatten decides the order.
    """
    if not (issubclass(cls, tuple) and hasattr(cls, "_fields") and has_own_flatten(cls)):
        return PyTreeDef.from_node_data_and_children(default_registry, (cls, aux), children)
    fields = cls._fields  # pyright: ignore[reportAttributeAccessIssue]
    marks = [_Mark() for _ in fields]
    kids, (_, probe_aux) = _one_level(tuple.__new__(cls, marks))
    index = {id(m): j for j, m in enumerate(marks)}
    order = [index.get(id(k)) for k in kids]
    if None in order or len(kids) != len(children):
        raise TypeError(
            f"{cls.__qualname__}'s registered flatten does not return its fields as children, "
            "so its node cannot be rebuilt without calling the class"
        )
    values: list[Any] = list(marks)
    for field, value in _static_fields(probe_aux, aux, index):
        values[field] = value
    for child, field in zip(children, order):
        assert field is not None  # checked above
        values[field] = child.unflatten([_Mark() for _ in range(child.num_leaves)])
    treedef = tree_structure(tuple.__new__(cls, values), is_leaf=lambda x: isinstance(x, _Mark))
    if treedef.node_data() != (cls, aux):
        raise TypeError(
            f"{cls.__qualname__}'s registered flatten keeps static data that cannot be "
            "rebuilt from its fields"
        )
    return treedef


def registered_order(cls: type) -> list[int]:
    """The field index of each child that ``cls``'s registered flatten returns, in order, for a
    NamedTuple stored as a plain NamedTuple with its children in that flatten's order
    (:data:`pytreestore._format.upgrades.FLATTEN_ORDER`).

    Raises:
        TypeError: the flatten does not return every field once, or keeps static data, which
            such a node does not hold.
    """
    fields = cls._fields  # pyright: ignore[reportAttributeAccessIssue]
    marks = [_Mark() for _ in fields]
    kids, (_, probe_aux) = _one_level(tuple.__new__(cls, marks))
    index = {id(m): j for j, m in enumerate(marks)}
    order = [index.get(id(k)) for k in kids]
    if None in order or probe_aux is not None or sorted(order) != list(range(len(fields))):  # type: ignore[type-var]
        raise TypeError(
            f"{cls.__qualname__} was stored as a plain NamedTuple, but today its registered "
            "flatten does not return each field once as a child (or keeps static data), so "
            "the stored children cannot be bound to its fields; write the store again with "
            "this pytreestore, or open with generic=True"
        )
    return order  # type: ignore[return-value]


def _static_fields(probe: Any, aux: Any, index: dict[int, int]) -> list[tuple[int, Any]]:
    """Which fields the probe's static data holds, with their stored values."""
    if id(probe) in index:
        return [(index[id(probe)], aux)]
    if type(probe) in (tuple, list) and type(aux) is type(probe) and len(aux) == len(probe):
        return [(index[id(p)], a) for p, a in zip(probe, aux) if id(p) in index]
    return []


class _Mark:
    """A placeholder leaf."""


def _one_level(node: Any) -> tuple[list[Any], Any]:
    flat, sub = tree_flatten(node, is_leaf=lambda x: x is not node)
    return flat, sub.node_data()


def only_aux_differs(want: dict[str, Any], got: dict[str, Any]) -> bool:
    """Whether two encoded custom nodes differ in their static data and nothing else."""
    rest = ("aux", "children")
    return (
        want.get("node") == got.get("node") == "custom"
        and want.get("aux") != got.get("aux")
        and {k: v for k, v in want.items() if k not in rest}
        == {k: v for k, v in got.items() if k not in rest}
    )


def static_differences(
    cls: type, want: dict[str, Any], got: dict[str, Any], path: tuple[Any, ...]
) -> list[str]:
    """One line per static field whose stored value differs from the record's.

    Dataclass-like nodes (``register_dataclass``, flax and chex dataclasses, equinox Modules)
    name their static fields; other nodes name the position in their static data.
    """
    stored, current = _values.decode(want["aux"]), _values.decode(got["aux"])
    names = _static_names(cls, want["keys"], stored)
    if names is None:
        where = _keys.path_str(path) or "the root"
        show = _values.describe
        return [f"{where}: static data stored {show(stored)}, got {show(current)}"]
    return [
        f"{_keys.path_str(path)}.{name}: stored {_values.describe(s)}, got {_values.describe(c)}"
        for name, s, c, ws, gs in zip(
            names, stored, current, want["aux"]["tuple"], got["aux"]["tuple"]
        )
        if ws != gs
    ]


def _static_names(cls: type, keys: list[dict[str, Any]], aux: Any) -> list[str] | None:
    """Names of the entries of a dataclass node's static data, or None when they are unknown.

    flax, chex and ``register_dataclass`` keep one entry per static field; equinox keeps its
    wrapper data first, then one entry per static field.
    """
    if not dataclasses.is_dataclass(cls) or type(aux) is not tuple:
        return None
    children = {k.get("attr") for k in keys}
    static = [f.name for f in dataclasses.fields(cls) if f.name not in children]
    if len(static) == len(aux):
        return static
    if len(static) + 1 == len(aux):
        return ["<equinox wrapper data>", *static]
    return None
