"""The node kinds of a schema tree, one table entry each: how a kind is recognised, encoded
to JSON, named in keypaths, decoded (generic view), described in errors and bound.

A schema tree node is ``{"node": <kind>, ...}``. ``leaf`` (a column) and ``const`` (a constant
leaf, :mod:`pytreestore._format.consts`) are leaves; the other kinds are the containers JAX
flattens: ``none``, ``dict`` and ``ordered_dict`` (their ``str`` or ``int`` keys kept as JSON
strings and numbers), ``list``, ``tuple``, ``namedtuple`` (a
NamedTuple JAX flattens in field order) and ``custom`` (any other registered class). Adding a
node kind is adding one :class:`NodeKind` to :data:`KINDS`.

Example:
    >>> encode_node(dict, ["a", "b"], [], ())
    {'node': 'dict', 'keys': ['a', 'b']}
    >>> child_entry({"node": "dict", "keys": ["a", "b"]}, 1)
    DictKey(key='b')
    >>> describe({"node": "tuple", "children": [{"node": "leaf"}]})
    'a tuple of 1'
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from jax.tree_util import DictKey, GetAttrKey, SequenceKey

from pytreestore._format import classes as _classbind
from pytreestore._format import consts as _consts
from pytreestore._format import keys as _keys
from pytreestore._format import nodes as _nodes
from pytreestore._format import values as _values
from pytreestore.errors import CorruptStoreError, UnsupportedTreeError

#: ``encode(cls, aux, child keypath entries, where)``: the node's JSON, children not included
Encode = Callable[[type, Any, list[Any], str], dict[str, Any]]
#: ``bind(binder, node, child entries, bound children, path)``: today's object for the node
Bind = Callable[[_classbind.Binder, dict[str, Any], list[Any], list[Any], tuple], Any]


@dataclasses.dataclass(frozen=True)
class NodeKind:
    """One kind of schema tree node.

    Attributes:
        name: the ``node`` member of its JSON.
        recognise: whether a node of a class (``treedef.node_data()[0]``) is of this kind;
            None for the leaf kinds, which are no class's.
        encode: the node's JSON from its class, static data and child keys (None: a leaf).
        entry: the keypath entry of child ``i`` of a stored node.
        generic: the generic view of a stored node from its children's views, and the
            iterator of loaded columns (which a ``leaf`` takes its value from).
        describe: a stored node in words, for error messages.
        bind: today's object for a stored node, around its bound children.
        names: the member that names each child (``keys``, ``fields``), or None.
    """

    name: str
    recognise: Callable[[type], bool] | None
    encode: Encode | None
    entry: Callable[[dict[str, Any], int], Any]
    generic: Callable[[dict[str, Any], list[Any], Iterator[Any]], Any]
    describe: Callable[[dict[str, Any]], str]
    bind: Bind
    names: str | None = None


def _by_position(node: dict[str, Any], i: int) -> Any:
    return SequenceKey(i)


def _by_key(node: dict[str, Any], i: int) -> Any:
    return DictKey(node["keys"][i])


def _as_dict(node: dict[str, Any], children: list[Any], leaves: Iterator[Any]) -> Any:
    names = [_keys.entry_name(KINDS[node["node"]].entry(node, i)) for i in range(len(children))]
    return dict(zip(names, children))


def _encode_mapping(name: str) -> Encode:
    def encode(cls: type, aux: Any, keys: list[Any], where: str) -> dict[str, Any]:
        bad = [k for k in aux if type(k) not in (str, int)]
        if bad and type(bad[0]) is bool:
            raise UnsupportedTreeError(
                f"dict at {where} has a key {bad[0]!r} of type bool; stored dicts need str or "
                "int keys (a bool key equals the int key 0 or 1, so it could not be told "
                "from one when binding): convert the keys to int or str"
            )
        if bad:
            raise UnsupportedTreeError(
                f"dict at {where} has a key {bad[0]!r} of type {type(bad[0]).__name__}; "
                "stored dicts need str or int keys (convert the keys)"
            )
        return {"node": name, "keys": list(aux)}

    return encode


def _mapping_view(node: dict[str, Any], children: list[Any], leaves: Iterator[Any]) -> Any:
    return dict(zip(node["keys"], children))


def _encode_namedtuple(cls: type, aux: Any, keys: list[Any], where: str) -> dict[str, Any]:
    return {
        "node": "namedtuple",
        "type": _nodes.class_path_checked(cls, where),
        "fields": list(cls._fields),  # pyright: ignore[reportAttributeAccessIssue]
    }


def _encode_custom(cls: type, aux: Any, keys: list[Any], where: str) -> dict[str, Any]:
    return {
        "node": "custom",
        "type": _nodes.class_path_checked(cls, where),
        "aux": _nodes.encode_aux(cls, aux, keys, where),
        "keys": _nodes.encode_keys(cls, keys, where),
    }


def _class_name(node: dict[str, Any]) -> str:
    return node["type"].rpartition(":")[2]


def _describe_custom(node: dict[str, Any]) -> str:
    fields = [_keys.entry_name(_keys.entry_from_json(k)) for k in node["keys"]]
    static = _values.decode(node["aux"])
    return f"{_class_name(node)} with fields {fields} and static data {static!r}"


def _sequence(name: str, make: Callable[[list[Any]], Any]) -> NodeKind:
    return NodeKind(
        name,
        recognise=lambda cls: cls is make,
        encode=lambda cls, aux, keys, where: {"node": name},
        entry=_by_position,
        generic=lambda node, children, leaves: make(children),
        describe=lambda node: f"a {name} of {len(node.get('children', []))}",
        bind=lambda binder, node, entries, children, path: make(children),
    )


def _mapping(name: str, make: type) -> NodeKind:
    return NodeKind(
        name,
        recognise=lambda cls: cls is make,
        encode=_encode_mapping(name),
        entry=_by_key,
        generic=_mapping_view,
        describe=lambda node: f"a {name.replace('_', ' ')} with keys {node['keys']}",
        bind=lambda binder, node, entries, children, path: make(zip(node["keys"], children)),
        names="keys",
    )


_LEAF_KINDS = (
    NodeKind(
        "leaf",
        recognise=None,
        encode=None,
        entry=_by_position,
        generic=lambda node, children, leaves: next(leaves),
        describe=lambda node: "a leaf",
        bind=lambda binder, node, entries, children, path: binder.column(),
    ),
    NodeKind(
        "const",
        recognise=None,
        encode=None,
        entry=_by_position,
        generic=lambda node, children, leaves: _consts.decode(node),
        describe=lambda node: f"the constant {_consts.label(node)}",
        bind=lambda binder, node, entries, children, path: _consts.Const(
            _consts.decode(node), _keys.path_str(path)
        ),
    ),
)
#: the container kinds, in the order a node's class is matched against them
_CONTAINER_KINDS = (
    NodeKind(
        "none",
        recognise=lambda cls: cls is type(None),
        encode=lambda cls, aux, keys, where: {"node": "none"},
        entry=_by_position,
        generic=lambda node, children, leaves: None,
        describe=lambda node: "None",
        bind=lambda binder, node, entries, children, path: None,
    ),
    _mapping("dict", dict),
    _mapping("ordered_dict", collections.OrderedDict),
    _sequence("list", list),
    _sequence("tuple", tuple),
    NodeKind(
        "namedtuple",
        recognise=_nodes.is_plain_namedtuple,
        encode=_encode_namedtuple,
        entry=lambda node, i: GetAttrKey(node["fields"][i]),
        generic=_as_dict,
        describe=lambda node: f"{_class_name(node)} (NamedTuple)",
        bind=_classbind.bind_namedtuple,
        names="fields",
    ),
    NodeKind(
        "custom",
        recognise=lambda cls: True,  # any other registered class
        encode=_encode_custom,
        entry=lambda node, i: _keys.entry_from_json(node["keys"][i]),
        generic=_as_dict,
        describe=_describe_custom,
        bind=_classbind.bind_custom,
        names="keys",
    ),
)
#: every node kind by its name
KINDS: dict[str, NodeKind] = {k.name: k for k in (*_LEAF_KINDS, *_CONTAINER_KINDS)}
#: classes JAX flattens that a store refuses, and why
_REFUSED = {
    collections.defaultdict: "cannot be stored (its default_factory is code); use a dict instead"
}


def kind(node: dict[str, Any]) -> NodeKind:
    """The kind of a stored node.

    Raises:
        CorruptStoreError: the schema names a kind this version does not know.
    """
    found = KINDS.get(node["node"])
    if found is None:
        raise CorruptStoreError(f"unknown node kind {node['node']!r} in the store's schema")
    return found


def encode_node(
    cls: type, aux: Any, keys: list[Any], path: tuple[Any, ...], *, recorded: bool = True
) -> dict[str, Any]:
    """The JSON of a node of class ``cls`` at ``path`` (children not included).

    ``recorded=False`` describes a tree that no store records (``like=``, ``stack``): its
    class name need not import back as ``cls``.

    Raises:
        UnsupportedTreeError: the node cannot be stored (naming the keypath and why), or
            (``recorded``) its class name imports as another object.
    """
    where = _keys.path_str(path) or "the root"
    if cls in _REFUSED:
        raise UnsupportedTreeError(f"{cls.__name__} at {where} {_REFUSED[cls]}")
    found = next(k for k in _CONTAINER_KINDS if k.recognise(cls))  # type: ignore[misc]
    out = found.encode(cls, aux, keys, where)  # type: ignore[misc]
    if recorded and "type" in out:
        _nodes.check_imports_as(cls, out["type"], where)
    return out


def child_entry(node: dict[str, Any], i: int) -> Any:
    """The keypath entry (``DictKey``, ``GetAttrKey``, ...) of child ``i`` of a stored node."""
    return kind(node).entry(node, i)


def describe(node: dict[str, Any]) -> str:
    """A stored node in words: ``a dict with keys ['a']``, ``Pair (NamedTuple)``..."""
    return kind(node).describe(node)


def generic(node: dict[str, Any], leaves: Iterator[Any]) -> Any:
    """The generic view of a stored tree (dicts, lists and tuples) around the ``leaves``."""
    children = [generic(c, leaves) for c in node.get("children", [])]
    return kind(node).generic(node, children, leaves)


def check_tree(tree: dict[str, Any], columns: int) -> None:
    """Checks what the JSON Schema cannot: each node names as many children as it has, and
    the tree has one leaf per column.

    Raises:
        CorruptStoreError: naming the node.
    """
    leaves = 0
    todo: list[tuple[dict[str, Any], tuple[int, ...]]] = [(tree, ())]
    while todo:
        node, where = todo.pop()
        found = KINDS.get(node["node"])
        children, names = node.get("children", ()), found.names if found else None
        if names is not None and len(node.get(names, ())) != len(children):
            place = "".join(f", child {i}" for i in where)
            raise CorruptStoreError(
                f"the store's schema is damaged: the {node['node']} node at the root{place} "
                f"has {len(children)} children but {len(node.get(names, ()))} {names}"
            )
        if children:
            todo += [(c, (*where, i)) for i, c in enumerate(children)]
        else:
            leaves += node["node"] == "leaf"
    if leaves != columns:
        raise CorruptStoreError(
            f"the store's schema is damaged: its tree has {leaves} leaves but it lists "
            f"{columns} columns"
        )


__all__ = [
    "KINDS",
    "NodeKind",
    "check_tree",
    "child_entry",
    "describe",
    "encode_node",
    "generic",
    "kind",
]
