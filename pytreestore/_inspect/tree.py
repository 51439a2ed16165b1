"""The column tree of a store, as ``pytreestore info`` and notebooks draw it: one row per node
of the schema's tree, leaves in column order; in a ragged store, ragged lists drawn as
``list[*]`` with their one element ``[*]``, and ragged axes and optional subtrees marked.

Example:
    >>> tree = {"node": "dict", "keys": ["p"], "children": [
    ...     {"node": "list", "children": [{"node": "leaf"}]}]}
    >>> for row in tree_rows(tree, axes=["['p']"]):
    ...     print(row.prefix + row.label)
    dict
    └── ['p']  list[*]
        └── [*]
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from jax.tree_util import keystr

from pytreestore._format import consts as _consts
from pytreestore._format.kinds import child_entry


@dataclasses.dataclass(frozen=True)
class TreeRow:
    """One line of the column tree: the drawing to its left, its label, and its column if a leaf."""

    prefix: str
    label: str
    column: int | None


def tree_rows(
    tree: dict[str, Any], axes: Sequence[str] = (), optional: Sequence[str] = ()
) -> list[TreeRow]:
    """The column tree of a schema's JSON ``tree``, root first, leaves in column order.

    In a ragged store, a ragged list (keypath in ``axes``) is drawn as ``list[*]`` with its
    one element as ``[*]``, a node whose leaves share a ragged leading axis is marked
    ``(ragged axis)``, and an optional subtree (keypath in ``optional``) ``(optional)``.

    Example:
        >>> from pytreestore._format.schema import TreeSchema
        >>> schema = TreeSchema.from_example({"a": 0, "b": [0, 0]})
        >>> for row in tree_rows(schema.tree):
        ...     print(row.prefix + row.label, row.column)
        dict None
        ├── ['a'] 0
        └── ['b']  list[2] None
            ├── [0] 1
            └── [1] 2
        >>> for row in tree_rows(schema.tree, axes=["['b']"]):
        ...     print(row.prefix + row.label, row.column)
        dict None
        ├── ['a'] 0
        └── ['b']  list[*] None
            ├── [*] 1
            └── [*] 2
    """
    marks = _Marks(frozenset(axes), frozenset(optional))
    if tree["node"] == "leaf":
        return [TreeRow("", "(the root leaf)" + marks.of(tree, ""), 0)]
    rows = _child_rows(tree, "", itertools.count(), "", marks)
    return [TreeRow("", _node_label(tree, "" in marks.axes) + marks.of(tree, ""), None), *rows]


@dataclasses.dataclass(frozen=True)
class _Marks:
    """A ragged store's ragged axes and optional subtrees, by keypath."""

    axes: frozenset[str]
    optional: frozenset[str]

    def of(self, node: dict[str, Any], path: str) -> str:
        """What to add to the label of ``node`` at ``path``."""
        out = ""
        if path in self.axes and node["node"] not in ("list", "leaf"):
            out += "  (ragged axis)"
        if path in self.optional:
            out += "  (optional)" if node["node"] != "none" else "  (optional, none so far)"
        return out


def _child_rows(
    node: dict[str, Any], indent: str, counter: Iterator[int], path: str, marks: _Marks
) -> Iterator[TreeRow]:
    children = node.get("children", [])
    ragged = node["node"] == "list" and path in marks.axes
    for i, child in enumerate(children):
        last = i == len(children) - 1
        entry = "[*]" if ragged else keystr((child_entry(node, i),))
        where = path + entry
        is_leaf = child["node"] == "leaf"
        label = entry if is_leaf else f"{entry}  {_node_label(child, where in marks.axes)}"
        yield TreeRow(
            indent + ("└── " if last else "├── "),
            label + marks.of(child, where),
            next(counter) if is_leaf else None,
        )
        if not is_leaf:
            inner = indent + ("    " if last else "│   ")
            yield from _child_rows(child, inner, counter, where, marks)


def _node_label(node: dict[str, Any], ragged: bool = False) -> str:
    kind = node["node"]
    n = len(node.get("children", []))
    if kind in ("custom", "namedtuple"):
        return node["type"].rpartition(":")[2]
    if kind in ("list", "tuple"):
        return f"{kind}[{'*' if ragged and kind == 'list' else n}]"
    if kind == "ordered_dict":
        return "OrderedDict"
    if kind == "const":
        return f"= {_consts.label(node)} (constant)"
    return {"dict": "dict", "none": "None", "leaf": "leaf"}[kind]


__all__ = ["TreeRow", "tree_rows"]
