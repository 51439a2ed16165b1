"""Stand-in classes: a record like a store's, built from its stored tree alone, for readers
whose classes cannot be imported (the CLI, ``copy``).

A fixed store has a generic view (dicts, lists and tuples); a ragged or optional store has
none, because its layout walks records by the keypaths its declarations name (``.agents``),
which a dict would spell ``['agents']``. A stand-in class has the stored class's name and
module, its fields in stored order with the stored keypath entries, and its static data, so a
record of stand-ins flattens to the stored keypaths: ``open(path, like=stand_in_record)`` then
binds it as it would bind the writer's own classes. Stand-ins hold values; they have no
methods of the classes they stand in for.

Example:
    >>> tree = {"node": "custom", "type": "gone.module:Point", "aux": None,
    ...         "keys": [{"attr": "x"}], "children": [{"node": "leaf"}]}
    >>> import numpy as np
    >>> p = like_of(tree, [(np.dtype("float32"), (2,))])
    >>> type(p).__name__, type(p).__module__, p.x.shape
    ('Point', 'gone.module', (2,))
"""

from __future__ import annotations

import collections
import functools
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from pytreestore._format import keys as _keys
from pytreestore._format import validate as _validate
from pytreestore._format import values as _values
from pytreestore._format.columns import ColumnSpec
from pytreestore._location import Location
from pytreestore._open import open as _open
from pytreestore._open.root import read_root
from pytreestore.backends import default_backend
from pytreestore.backends._registry import backend_at
from pytreestore.errors import ClassResolutionError, CorruptStoreError, SchemaMismatchError


class StandIn:
    """The base of every stand-in class: its fields, by name, as attributes."""

    _entries: tuple[Any, ...] = ()

    def __init__(self, children: Iterable[Any], aux: Any = None) -> None:
        self._children = tuple(children)
        self._aux = aux
        for name, value in fields_of(self):
            if name.isidentifier() and not name.startswith("_"):
                setattr(self, name, value)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in fields_of(self))
        return f"{type(self).__name__}({fields})"


def fields_of(obj: StandIn) -> list[tuple[str, Any]]:
    """A stand-in's fields: ``(name, value)`` in stored order."""
    return [(_keys.entry_name(e), c) for e, c in zip(obj._entries, obj._children)]


def _flatten(obj: StandIn) -> tuple[list[tuple[Any, Any]], Any]:
    return list(zip(obj._entries, obj._children)), obj._aux


@functools.cache
def standin_class(path: str, entries: tuple[Any, ...]) -> type[StandIn]:
    """A pytree class named as ``path`` (``module:qualname``) whose children have the
    keypath entries ``entries``; one per (path, entries), registered with JAX once."""
    module, _, qualname = path.partition(":")
    cls = type(qualname.rpartition(".")[2], (StandIn,), {"_entries": entries})
    cls.__module__, cls.__qualname__ = module, qualname
    jax.tree_util.register_pytree_with_keys(cls, _flatten, lambda aux, children: cls(children, aux))
    return cls


@functools.cache
def _namedtuple(path: str, fields: tuple[str, ...]) -> type:
    module, _, qualname = path.partition(":")
    cls = collections.namedtuple(qualname.rpartition(".")[2], fields)  # type: ignore[misc]
    cls.__module__, cls.__qualname__ = module, qualname
    return cls


def like_of(tree: dict[str, Any], columns: Sequence[tuple[np.dtype, tuple[int, ...]]]) -> Any:
    """A record of the stored ``tree`` (zeros of each column's dtype and shape, in column
    order), with stand-ins for its classes.

    Raises:
        CorruptStoreError: a node of a kind this does not know, or static data that cannot
            be read without importing what it names.
    """
    return _node(tree, iter(columns))


def _node(node: dict[str, Any], columns: Iterator[tuple[np.dtype, tuple[int, ...]]]) -> Any:
    kind = node["node"]
    if kind == "leaf":
        dtype, shape = next(columns)
        return np.zeros(shape, dtype)
    if kind == "none":
        return None
    if kind == "const":
        return _values.decode(node["value"])
    children = [_node(c, columns) for c in node.get("children", [])]
    if kind == "list":
        return children
    if kind == "tuple":
        return tuple(children)
    if kind == "dict":
        return dict(zip(node["keys"], children))
    if kind == "ordered_dict":
        return collections.OrderedDict(zip(node["keys"], children))
    if kind == "namedtuple":
        return _namedtuple(node["type"], tuple(node["fields"]))(*children)
    if kind == "custom":
        entries = tuple(_keys.entry_from_json(k) for k in node["keys"])
        return standin_class(node["type"], entries)(children, _values.decode(node["aux"]))
    raise CorruptStoreError(f"the store's schema has a node of unknown kind {kind!r}")


def open_without_classes(
    path: str | os.PathLike[str], *, storage_options: Any = None, **options: Any
) -> Any:
    """A reader of the store at ``path`` that needs none of its classes: the generic view
    where the store has one, else its own classes, else (missing, or changed in a way a
    ragged store cannot bind) stand-ins for them.

    Raises:
        PyTreeStoreError: the store cannot be opened (missing, damaged, ...).
    """
    store = _open.open_any(path, storage_options=storage_options, **options)
    try:
        store.schema  # noqa: B018 (a reader parses its schema, and binds classes, on first use)
        return store
    except (ClassResolutionError, SchemaMismatchError):  # classes missing, or changed since
        store.close()
    like = stored_like(path, storage_options, options.get("backend"))
    return _open.open(path, like=like, storage_options=storage_options, **options)


def stored_like(
    path: str | os.PathLike[str], storage_options: Any = None, backend: str | None = None
) -> Any:
    """A record of the store at ``path`` as its root schema describes it, of stand-ins."""
    location = Location.parse(path, storage_options)
    engine = backend_at(backend or default_backend(location), location)
    info = _validate.root_schema(read_root(engine, location), str(location))
    columns = [ColumnSpec.from_json(c) for c in info["columns"]]
    return like_of(info["tree"], [(c.dtype, c.shape) for c in columns])


__all__ = [
    "StandIn",
    "fields_of",
    "like_of",
    "open_without_classes",
    "standin_class",
    "stored_like",
]
