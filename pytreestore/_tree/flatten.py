"""Many records flattened into columns, one per leaf: of one known structure, or of one layout.

Flattening many records of one known structure at once, a column per leaf.

``jax.tree_util.tree_flatten`` walks each record node by node and builds a treedef to compare;
for a block of records whose structure is known beforehand, a :class:`BlockFlattener` walks
the structure once per block instead, taking each node's children for every record of the
block with one C-level ``map`` (``itemgetter``, ``attrgetter``), and checking each node's
class, length, keys or static fields the same way. It returns the leaves as columns (one list
per leaf, in flatten order), or None when any record of the block differs from the structure
in a way the treedef comparison would catch, so that the caller falls back to
``tree_flatten`` and its mismatch message.

Exact by construction: a node of a kind that cannot be checked both cheaply and exactly (a
class with a flatten of its own, such as an ``OrderedDict`` or an equinox Module) gives no
flattener (:func:`block_flattener` returns None), and the caller flattens each record.
Leaves are values of a class JAX does not flatten, checked per class once a block.

Example:
    >>> import jax
    >>> treedef = jax.tree_util.tree_structure({"a": 0, "b": (0, 0)})
    >>> flat = block_flattener(treedef)
    >>> flat.columns([{"a": 1, "b": (2, 3)}, {"b": (5, 6), "a": 4}])
    [[1, 4], [2, 5], [3, 6]]
    >>> flat.columns([{"a": 1, "b": [2, 3]}]) is None  # a list where a tuple was
    True

A ragged or optional store's records as columns of per-record values, one column per leaf:
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
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import jax
import numpy as np
from jax.tree_util import default_registry

from pytreestore._format import nodes as _nodes
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

#: ``jax.tree_util.PyTreeDef``, which JAX defines as a runtime alias that type checkers can't use.
TreeDef = Any


#: one node of a compiled structure: given the node's value in every record of a block, appends
#: its leaves' columns to ``out`` (flatten order) and says whether every record matched
Node = Callable[[list[Any], list[list[Any]]], bool]


_NONE = type(None)


class BlockFlattener:
    """The leaves of records of one structure (a treedef), a column per leaf, many at once."""

    __slots__ = ("_root", "num_leaves")

    def __init__(self, root: Node, num_leaves: int) -> None:
        self._root = root
        #: the number of leaves (columns) of a record
        self.num_leaves = num_leaves

    def columns(self, records: Sequence[Any]) -> list[list[Any]] | None:
        """Per leaf, in ``tree_flatten`` order, its value in each of ``records``; None when a
        record's structure is not the treedef's (flatten it to find which, and why)."""
        out: list[list[Any]] = []
        try:
            ok = self._root(list(records), out)
        except Exception:  # a getter or an __eq__ of a record that differs: not this structure
            return None
        return out if ok else None


def block_flattener(treedef: TreeDef) -> BlockFlattener | None:
    """A :class:`BlockFlattener` for records of ``treedef``, or None when a node of it cannot
    be checked exactly without its own flatten (a class registered with a flatten function
    of its own, rather than as a dataclass)."""
    if treedef is None:
        return None
    root = _compile(treedef)
    return None if root is None else BlockFlattener(root, treedef.num_leaves)


def _compile(treedef: TreeDef) -> Node | None:
    data = treedef.node_data()
    if data is None:  # a leaf
        return _leaf
    cls, aux = data
    if cls is _NONE:
        return _none
    children = [_compile(c) for c in treedef.children()]
    if any(c is None for c in children):
        return None
    kids: list[Node] = children  # type: ignore[assignment]
    if cls is dict:
        return _keyed(dict, [itemgetter(k) for k in aux], kids)
    if cls is list or cls is tuple:
        return _keyed(cls, [itemgetter(i) for i in range(len(kids))], kids)
    if _nodes.is_plain_namedtuple(cls):
        return _keyed(cls, [itemgetter(i) for i in range(len(kids))], kids)
    fields = dataclass_fields(cls)
    if fields is None or len(fields[0]) != len(kids) or len(fields[1]) != len(aux):
        return None
    return _dataclass(cls, fields, tuple(aux), kids)


def _leaf(xs: list[Any], out: list[list[Any]]) -> bool:
    """A leaf: every value of a class JAX does not flatten (checked once per class)."""
    is_node = default_registry.is_node
    if any(is_node(t) for t in set(map(type, xs))):
        return False
    out.append(xs)
    return True


def _none(xs: list[Any], out: list[list[Any]]) -> bool:
    return set(map(type, xs)) == {_NONE}


def _keyed(cls: type, getters: list[Callable[[Any], Any]], children: list[Node]) -> Node:
    """A dict (by its sorted keys), list, tuple or NamedTuple node: of class ``cls`` exactly,
    with as many children as ``getters`` (a dict: the same keys), each taken by its getter."""
    want, count = {cls}, {len(getters)}

    def node(xs: list[Any], out: list[list[Any]]) -> bool:
        if set(map(type, xs)) != want or set(map(len, xs)) != count:
            return False
        return _children(getters, children, xs, out)  # a missing dict key: KeyError, no match

    return node


def _dataclass(
    cls: type, fields: tuple[tuple[str, ...], tuple[str, ...]], aux: tuple, children: list[Node]
) -> Node:
    """A dataclass node (``register_dataclass``, flax and chex dataclasses): of class ``cls``
    exactly, its static fields equal to ``aux`` (as the treedef compares them), its data
    fields the children."""
    data, meta = fields
    getters = [attrgetter(f) for f in data]
    want = {cls}
    static = attrgetter(*meta) if meta else None
    one = len(meta) == 1

    def node(xs: list[Any], out: list[list[Any]]) -> bool:
        if set(map(type, xs)) != want:
            return False
        if static is not None:
            values = map(static, xs)
            if not all(map(aux.__eq__, zip(values) if one else values)):
                return False
        return _children(getters, children, xs, out)

    return node


def _children(
    getters: list[Callable[[Any], Any]], children: list[Node], xs: list[Any], out: list[list[Any]]
) -> bool:
    """Takes each child of every node in ``xs`` by its getter and flattens it in turn."""
    return all(child(list(map(get, xs)), out) for get, child in zip(getters, children))


def dataclass_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The data and static (meta) field names ``cls`` is registered with by
    ``jax.tree_util.register_dataclass`` (which flax's and chex's dataclasses call), or None
    when it is registered otherwise (its flatten is its own function) or not at all.

    JAX flattens such a class in C++ by ``getattr`` of the data fields, its static data the
    tuple of the meta fields; the names are those its registered flatten closes over.
    """
    entry = _nodes.registration(cls)
    flatten = getattr(entry, "to_iter", None)
    code, cells = getattr(flatten, "__code__", None), getattr(flatten, "__closure__", None)
    if code is None or code is not _register_dataclass_flatten() or cells is None:
        return None
    names = dict(zip(code.co_freevars, (c.cell_contents for c in cells)))
    data, meta = names.get("data_fields"), names.get("meta_fields")
    if not (_names(data) and _names(meta)):
        return None
    return data, meta  # type: ignore[return-value]


def _names(value: Any) -> bool:
    return type(value) is tuple and all(type(v) is str for v in value)


def _register_dataclass_flatten() -> Any:
    """The code of the flatten function ``register_dataclass`` registers (None: not found)."""
    consts = getattr(getattr(jax.tree_util.register_dataclass, "__code__", None), "co_consts", ())
    found = [c for c in consts if getattr(c, "co_name", None) == "flatten_func"]
    return found[0] if len(found) == 1 else None


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


__all__ = [
    "BlockFlattener",
    "block_flattener",
    "column_name",
    "column_names",
    "dataclass_fields",
    "records_from_columns",
]
