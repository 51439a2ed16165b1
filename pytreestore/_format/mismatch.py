"""Where a record, or a tree given as ``like=``, departs from a stored schema tree: every
differing keypath, stored against got, for :class:`~pytreestore.errors.SchemaMismatchError`.

Example:
    >>> from pytreestore._format.schema import TreeSchema
    >>> tree = TreeSchema.from_example({"a": 0.0, "b": [0.0]}).tree
    >>> list(record_differences(tree, {"a": 0.0, "b": (0.0,)}))
    ["at ['b']: expected a list of 1, got a tuple of 1"]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pytreestore._format import consts as _consts
from pytreestore._format import keys as _keys
from pytreestore._format import kinds as _kinds
from pytreestore._format import nodes as _nodes
from pytreestore.errors import UnsupportedTreeError

#: node members that name classes or fields rather than fix the structure
_NOT_STRUCTURE = ("type", "aux_fields")


def strip_types(node: Any) -> Any:
    """A stored tree without the members that name classes or fields (its bare structure)."""
    if isinstance(node, dict):
        return {k: strip_types(v) for k, v in node.items() if k not in _NOT_STRUCTURE}
    if isinstance(node, list):
        return [strip_types(v) for v in node]
    return node


def structure_differences(want: dict, got: dict, path: tuple = ()) -> Iterator[str]:
    """Every path at which the stored tree ``got`` departs from the stored tree ``want``."""
    where = _keys.path_str(path) or "the root"
    if {k: v for k, v in want.items() if k not in ("children", *_NOT_STRUCTURE)} != {
        k: v for k, v in got.items() if k not in ("children", *_NOT_STRUCTURE)
    }:
        yield f"at {where}: expected {_kinds.describe(want)}, got {_kinds.describe(got)}"
        return
    for i, (w, g) in enumerate(zip(want.get("children", []), got.get("children", []))):
        yield from structure_differences(w, g, (*path, _kinds.child_entry(want, i)))


def record_differences(
    node: dict[str, Any], value: Any, path: tuple[Any, ...] = ()
) -> Iterator[str]:
    """Every path at which ``value`` departs from the schema tree ``node``."""
    where = _keys.path_str(path) or "the root"
    level = _nodes.one_level(value)
    if node["node"] == "const":
        if level is not None or _consts.describe(value) != _consts.label(node):
            yield f"at {where}: expected {_kinds.describe(node)}, got {_consts.describe(value)}"
        return
    if node["node"] == "leaf":
        if level is not None:
            yield f"at {where}: expected a leaf, got {_describe_value(value)}"
        return
    if level is None:
        yield f"at {where}: expected {_kinds.describe(node)}, got a leaf of type {type(value).__name__}"
        return
    try:
        got = _kinds.encode_node(*level[0].node_data(), level[1], path)  # type: ignore[misc]
    except UnsupportedTreeError as err:
        yield f"at {where}: {err}"
        return
    want = {k: v for k, v in node.items() if k not in ("children", "aux_fields")}
    if _nodes.only_aux_differs(want, got) and len(level[2]) == len(node.get("children", [])):
        yield from _nodes.static_differences(level[0].node_data()[0], want, got, path)
        want = got  # the static fields are named above; the children are compared below
    if got != want or len(level[2]) != len(node.get("children", [])):
        yield f"at {where}: expected {_kinds.describe(node)}, got {_describe_value(value)}"
        return
    for i, child in enumerate(level[2]):
        yield from record_differences(
            node["children"][i], child, (*path, _kinds.child_entry(node, i))
        )


def _describe_value(value: Any) -> str:
    level = _nodes.one_level(value)
    if level is None:
        return f"a leaf of type {type(value).__name__}"
    try:
        node = _kinds.encode_node(*level[0].node_data(), level[1], ())  # type: ignore[misc]
    except UnsupportedTreeError:
        return f"a {type(value).__name__}"
    node["children"] = level[2]
    return _kinds.describe(node)


__all__ = ["record_differences", "strip_types", "structure_differences"]
