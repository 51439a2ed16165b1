"""A ragged or optional store's records as columns of per-record values, one column per leaf:
the form rows of a table take (a Ray Data dataset, :mod:`pytreestore.ray`).

A leaf's column holds, for each record, the leaf's value in that record:

* the value itself, for a leaf outside every ragged list (an array leaf with a ragged
  leading axis: its array of that record, of any length along that axis);
* below a ragged list, the list of that leaf's values in the list's elements (a list, or an
  array whose leading axis is the list's), nested once more for each ragged list above;
* ``None`` where an optional subtree holding the leaf is absent: every leaf column of the
  subtree holds ``None`` there (the subtree's leaves must agree).

A column is named by its leaf's keypath in JAX's simple form with the ``[*]`` of ragged
lists left out (``.p[*].x`` reads the column ``p.x``; a store of bare values ``item``).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ragged-columns",
    ...                        {"p": [{"x": np.float32(0)}], "n": np.int8(0)}, ragged=["['p']"])
    >>> column_names(s.schema)
    ['n', 'p.x']
    >>> records = records_from_columns(s.schema, {"['n']": [1, 2], "['p'][*]['x']": [[0.5], []]})
    >>> records[0]["p"], records[1]
    ([{'x': 0.5}], {'n': 2, 'p': []})
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pytreestore._format.ragged import KEYPATH_TOKEN
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.layout_nodes import (
    Fixed,
    Kept,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    visit,
)
from pytreestore.errors import SchemaMismatchError


def column_name(path: str) -> str:
    """The column of the leaf at keypath ``path``: its simple form, ``[*]`` left out.

    Example:
        >>> column_name("['regions'][*].events[*]"), column_name(".p[0]"), column_name("")
        ('regions.events', 'p.0', 'item')
    """
    parts = [_simple(t) for t in KEYPATH_TOKEN.findall(path) if t != "[*]"]
    return ".".join(parts) or "item"


def _simple(token: str) -> str:
    if token.startswith("."):
        return token[1:]
    inner = token[1:-1]
    if inner[:1] in "'\"":
        try:
            return str(ast.literal_eval(inner))
        except (ValueError, SyntaxError):
            pass
    return inner


def column_names(schema: TreeSchema) -> list[str]:
    """The column of each of ``schema``'s leaf columns, in column order."""
    return [column_name(c.path) for c in schema.columns]


def records_from_columns(
    schema: TreeSchema,
    columns: Mapping[str, Sequence[Any]],
    dtypes: Mapping[str, np.dtype | None] | None = None,
) -> list[Any]:
    """The records whose leaves' columns (by leaf keypath, ``schema.paths``) are
    ``columns``, each a sequence of one value per record. A leaf's value given as a (nested)
    list becomes an array, of the column's element dtype in ``dtypes`` when given (the
    dtype the values had before they became Python numbers); then the store's casting rule
    applies to it as to any appended value.

    Raises:
        SchemaMismatchError: columns of unequal lengths; leaves of one ragged list whose
            lists differ in length, or of one optional subtree of which some are None and
            some not, in a record (named with the keypath).
    """
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise SchemaMismatchError(f"the columns hold different numbers of rows: {sorted(lengths)}")
    below = _Below(schema.layout.spec, dtypes or {})
    rows = lengths.pop() if lengths else 0
    return [
        below.build(schema.layout.spec, {p: v[i] for p, v in columns.items()}, i)
        for i in range(rows)
    ]


class _Below(Visitor):
    """The leaf keypaths below each node of a layout, and records built along it (its
    visitor methods: the value of a node from its leaves' values in a row)."""

    def __init__(self, spec: LayoutNode, dtypes: Mapping[str, np.dtype | None]) -> None:
        self._paths: dict[int, list[str]] = {}
        self._dtypes = dtypes
        visit(spec, _Paths(self._paths))

    def build(self, spec: LayoutNode | None, values: dict[str, Any], row: int) -> Any:
        """The value of ``spec`` from its leaves' ``values`` in record ``row``."""
        return visit(spec, self, values, row)

    def leaf(self, node: Leaf, values: dict[str, Any], row: int) -> Any:
        return self._leaf(node, values[node.path])

    def kept(self, node: Kept, values: dict[str, Any], row: int) -> Any:
        return node.value

    def ragged(self, node: RaggedList, values: dict[str, Any], row: int) -> Any:
        return self._list(node, values, row)

    def optional(self, node: OptionalTree, values: dict[str, Any], row: int) -> Any:
        return self._optional(node, values, row)

    def fixed(self, node: Fixed, values: dict[str, Any], row: int) -> Any:
        return node.treedef.unflatten([self.build(c, values, row) for c in node.children])

    def _leaf(self, spec: Leaf, value: Any) -> Any:
        """A leaf's value as an array when it came as a list (or as a Python number of a
        column whose dtype is known); other values as they are."""
        dtype = self._dtypes.get(spec.path)
        if not isinstance(value, list) and (dtype is None or not isinstance(value, int | float)):
            return value
        if spec.axis is not None and isinstance(value, list) and not value:
            return np.zeros((0, *spec.shape), dtype or spec.dtype)  # no element: any dtype
        try:
            return np.asarray(value, dtype=dtype)
        except (TypeError, ValueError):
            return value  # refused by the writer, which names the keypath

    def _list(self, spec: RaggedList, values: dict[str, Any], row: int) -> list[Any]:
        paths = self._paths[id(spec)]
        if spec.element is None or not paths:
            return []
        lengths = {}
        for p in paths:
            value = values[p]  # a dict (an Arrow struct) or a str has a len() but no elements
            if not isinstance(value, list | tuple | np.ndarray) or getattr(value, "ndim", 1) == 0:
                raise _not_a_list(spec.path, p, value, row)
            lengths[p] = len(value)
        if len(set(lengths.values())) > 1:
            detail = ", ".join(f"{p}: {n}" for p, n in lengths.items())
            raise SchemaMismatchError(
                f"row {row}: the columns of the leaves below the ragged list at {spec.path} "
                f"hold lists of different lengths ({detail}); each holds one value per element "
                "of the record's list"
            )
        n = lengths[paths[0]]
        return [self.build(spec.element, {p: values[p][j] for p in paths}, row) for j in range(n)]

    def _optional(self, spec: OptionalTree, values: dict[str, Any], row: int) -> Any:
        paths = self._paths[id(spec)]
        absent = [values[p] is None for p in paths]
        if spec.inner is None or all(absent):
            return None
        if any(absent):
            nones = [p for p, a in zip(paths, absent) if a]
            raise SchemaMismatchError(
                f"row {row}: the optional subtree at {spec.path} is None in the columns of "
                f"{nones} but not in the others'; a subtree is absent (None) in every leaf "
                "column of it, or in none"
            )
        return self.build(spec.inner, values, row)


class _Paths(Visitor):
    """The leaf keypaths below each node (by ``id``), into ``paths``."""

    def __init__(self, paths: dict[int, list[str]]) -> None:
        self.paths = paths

    def leaf(self, node: Leaf) -> list[str]:
        return self.note(node, [node.path])

    def ragged(self, node: RaggedList) -> list[str]:
        return self.note(node, visit(node.element, self))

    def optional(self, node: OptionalTree) -> list[str]:
        return self.note(node, visit(node.inner, self))

    def fixed(self, node: Fixed) -> list[str]:
        return self.note(node, [p for child in node.children for p in visit(child, self)])

    def other(self, node: LayoutNode, *args: Any) -> list[str]:
        return self.note(node, [])

    def unknown(self, *args: Any) -> list[str]:
        return []

    def note(self, node: LayoutNode, found: list[str]) -> list[str]:
        self.paths[id(node)] = found
        return found


def _not_a_list(path: str, leaf: str, value: Any, row: int) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"row {row}: the column of {leaf}, below the ragged list at {path}, holds "
        f"{type(value).__name__} {value!r:.60}; it needs a list (or array) of one value per "
        "element of the record's list"
    )


__all__ = ["column_name", "column_names", "records_from_columns"]
