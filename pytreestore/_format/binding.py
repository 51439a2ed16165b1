"""How the leaves of today's treedef map to the stored columns: :class:`Binding`.

A load reads columns; a record of today's classes has leaves. They are the same, in the same
order, unless the classes changed since the store was written (fields reordered, added with a
default, removed: :mod:`pytreestore._format.binding`) or the tree holds constant leaves
(functions, stored in the schema: :mod:`pytreestore._format.consts`). A :class:`Binding`
says, per leaf of today's treedef, where its value comes from.

Example:
    >>> import jax
    >>> from pytreestore._format.schema import TreeSchema
    >>> tree = TreeSchema.from_example({"f": jax.nn.relu, "w": 0.0}).tree
    >>> binding = const_binding(tree, [()])
    >>> binding.leaves([1.0])[1]
    1.0

Binding a stored tree to the classes a program defines today, by field name.

A stored custom node lists its children's keypath entries (field names) and its static data.
On open, each node is rebuilt from those names, never by position:

each node kind binds as its entry in :mod:`pytreestore._format.kinds` says; dataclasses and
NamedTuples bind by field name and other custom nodes are rebuilt from their stored static
data (:mod:`pytreestore._format.classes`). Today's classes are built into a *template*
whose leaves are placeholders for the stored columns; flattening it gives today's treedef.

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

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten_with_path

from pytreestore._format import classes as _fields
from pytreestore._format import consts as _consts
from pytreestore._format import keys as _keys
from pytreestore._format import kinds as _kinds
from pytreestore._format.classes import Default
from pytreestore._format.consts import Const
from pytreestore.errors import SchemaMismatchError


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


def sources(tree: dict[str, Any]) -> list[int | _consts.Const]:
    """Per leaf of the tree, in flatten order: its column index, or the constant."""
    counter = iter(range(1 << 62))
    return list(_sources(tree, (), counter))


def _sources(
    node: dict[str, Any], path: tuple, counter: Iterator[int]
) -> Iterator[int | _consts.Const]:
    kind = node["node"]
    if kind == "leaf":
        yield next(counter)
    elif kind == "const":
        yield _consts.Const(_consts.decode(node), _keys.path_str(path))
    for i, child in enumerate(node.get("children", ())):
        yield from _sources(child, (*path, _kinds.child_entry(node, i)), counter)


def only_consts_note(tree: dict[str, Any], selector: str) -> str:
    """For a column selector that names no column: a note naming the constants below it."""
    names = [
        f"{s.path} = {_consts.describe(s.value)}"
        for s in sources(tree)
        if isinstance(s, _consts.Const) and _keys.is_under(s.path, selector)
    ]
    if not names:
        return ""
    return (
        f" (only constant leaves live there: {', '.join(names)}; they are stored in the schema, "
        "not as columns, and every load returns them whatever columns= selects)"
    )


def has_consts(tree: dict[str, Any]) -> bool:
    """Whether the schema tree holds a ``const`` node."""
    if tree["node"] == "const":
        return True
    return any(has_consts(c) for c in tree.get("children", ()))


def const_binding(tree: dict[str, Any], shapes: Sequence[tuple[int, ...]]) -> Binding | None:
    """The binding of a tree whose leaves are its columns in order plus constants (None when
    it has no constants)."""
    if not has_consts(tree):
        return None
    return Binding(tuple(sources(tree)), tuple(shapes), "")


class _Col:
    """Placeholder leaf of a template: stored column ``index``."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def bind(
    tree: dict[str, Any], shapes: Sequence[tuple[int, ...]], paths: Sequence[str]
) -> tuple[Any, Binding | None]:
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
            f"today's classes cannot be flattened around the stored fields "
            f"({_fields.reason(err)}). Open with like=<an example record> or generic=True."
        ) from None
    sources = tuple(
        v.index if isinstance(v, _Col) else v if isinstance(v, Const) else v.value for _, v in flat
    )
    if sources == tuple(range(len(shapes))):
        return treedef, None
    return treedef, Binding(sources, tuple(shapes), _unwritable(flat, paths))


def _unwritable(flat: list, paths: Sequence[str]) -> str:
    used = {v.index for _, v in flat if isinstance(v, _Col)}
    gone = [p for i, p in enumerate(paths) if i not in used]
    new = [_keys.path_str(k) for k, v in flat if isinstance(v, Default)]
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


class _Binder:
    """Builds the template of today's classes for a stored tree, collecting problems
    (a :class:`~pytreestore._format.classes.Binder`)."""

    def __init__(self) -> None:
        self.next_column = 0
        self.problems: list[str] = []

    def node(self, node: dict[str, Any], path: tuple) -> Any:
        kind = _kinds.kind(node)
        stored = node.get("children", [])
        entries = [kind.entry(node, i) for i in range(len(stored))]
        children = [self.node(c, (*path, e)) for c, e in zip(stored, entries)]
        return kind.bind(self, node, entries, children, path)

    def column(self) -> _Col:
        self.next_column += 1
        return _Col(self.next_column - 1)

    def problem(self, path: tuple, text: str) -> None:
        self.problems.append(f"{_keys.path_str(path) or 'the root'}: {text}")


__all__ = ["Binding", "bind", "const_binding", "has_consts", "only_consts_note", "sources"]
