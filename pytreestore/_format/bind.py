"""Binding a stored tree to the classes a program defines today, by field name.

A stored custom node lists its children's keypath entries (field names) and its static data.
On open, each node is rebuilt from those names, never by position:

each node kind binds as its entry in :mod:`pytreestore._format.kinds` says; dataclasses and
NamedTuples bind by field name and other custom nodes are rebuilt from their stored static
data (:mod:`pytreestore._format.classbind`). Today's classes are built into a *template*
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

from collections.abc import Sequence
from typing import Any

from jax.tree_util import tree_flatten_with_path

from pytreestore._format import fields as _fields
from pytreestore._format import keys as _keys
from pytreestore._format import kinds as _kinds
from pytreestore._format.binding import Binding
from pytreestore._format.classbind import Default
from pytreestore._format.consts import Const
from pytreestore.errors import SchemaMismatchError


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
    (a :class:`~pytreestore._format.classbind.Binder`)."""

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


__all__ = ["bind"]
