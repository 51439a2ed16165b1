"""Flattening many records of one known structure at once, a column per leaf.

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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter
from typing import Any

import jax
from jax.tree_util import default_registry

from pytreestore._format import nodes as _nodes

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


__all__ = ["BlockFlattener", "block_flattener", "dataclass_fields"]
