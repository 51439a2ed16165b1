"""Reading documents of older formats: the one place that knows what they look like.

A store written by an older pytreestore (format 1 or 2; today's is :data:`FORMAT_VERSION`) opens, reads and appends as it is: nothing
on disk changes and nothing is written back by reading it. Each function here takes a
document as read and returns a copy in today's shape, with what an older writer left unsaid
made explicit, so that every other module reads today's shape only:

* the root's schema (:func:`schema`): ``format_version`` explicit; in a format-1 tree,
  ``namedtuple`` nodes say that their children are in the registered flatten's order
  (:data:`FLATTEN_ORDER`: format 1 wrote a NamedTuple registered with its own flatten as a
  plain NamedTuple, children as that flatten returned them), and ``custom`` nodes without
  ``aux_fields`` say that their static values bind to today's static fields by position
  (:data:`STATIC_BY_POSITION`: format 1 did not record the names);
* the commit record (:func:`commit`): the members a writer before format 3 omitted
  (``store`` before format 2; ``schema``, ``time``, ``operation`` before format 3) explicit,
  as None.

The markers are members of the upgraded copy only: the schema keeps the tree as stored
(appends compare records against it, and ``evolve`` writes it), and binding
(:mod:`pytreestore._format.classes`) reads the markers, never the version.

Example:
    >>> info = {"format_version": 1, "tree": {"node": "namedtuple", "type": "m:P",
    ...         "fields": ["a"], "children": [{"node": "leaf"}]}}
    >>> schema(info)["tree"][FLATTEN_ORDER], "children_in_flatten_order" in info["tree"]
    (True, False)
    >>> commit({"format_version": 1, "records": 3, "generation": 2})["store"] is None
    True
"""

from __future__ import annotations

import copy
from typing import Any

#: a format-1 ``namedtuple`` node: its children are in the order the class's registered
#: flatten returned them (in the upgraded copy only, never written)
FLATTEN_ORDER = "children_in_flatten_order"
#: a format-1 ``custom`` node without ``aux_fields``: its static values bind to today's
#: static fields by position (in the upgraded copy only, never written)
STATIC_BY_POSITION = "static_by_position"
#: the format this pytreestore writes (re-exported as ``pytreestore.FORMAT_VERSION``); a
#: document that names none is taken to be in it
FORMAT_VERSION = 3
#: the commit record's members a writer before format 3 omitted, with the format that added each
_COMMIT_MEMBERS = {"store": 2, "schema": 3, "time": 3, "operation": 3}


def version(document: dict[str, Any]) -> int:
    """The format ``document`` (a schema or a commit record) was written in.

    Raises:
        ValueError: its ``format_version`` is not an integer (the caller says where).
    """
    return int(document.get("format_version", FORMAT_VERSION))


def schema(info: dict[str, Any]) -> dict[str, Any]:
    """The root's schema document ``info`` in today's shape (a copy; ``info`` is unchanged)."""
    out = dict(info)
    out["format_version"] = version(info)
    if out["format_version"] == 1 and isinstance(info.get("tree"), dict):
        out["tree"] = tree(info["tree"])
    return out


def tree(node: dict[str, Any]) -> dict[str, Any]:
    """A format-1 schema tree with the markers of what format 1 left unsaid (a copy)."""
    out = copy.deepcopy(node)
    _mark(out)
    return out


def _mark(node: dict[str, Any]) -> None:
    kind = node.get("node")
    if kind == "namedtuple":
        node[FLATTEN_ORDER] = True
    elif kind == "custom" and "aux_fields" not in node:
        node[STATIC_BY_POSITION] = True
    for child in node.get("children", ()):
        if isinstance(child, dict):
            _mark(child)


def commit(obj: dict[str, Any]) -> dict[str, Any]:
    """The commit record ``obj`` in today's shape (a copy): the members its writer's format
    did not have, explicit as None."""
    out = dict(obj)
    written = version(obj) if isinstance(obj.get("format_version", 0), int) else FORMAT_VERSION
    for name, since in _COMMIT_MEMBERS.items():
        if written < since:
            out.setdefault(name, None)
    return out


__all__ = [
    "FLATTEN_ORDER",
    "FORMAT_VERSION",
    "STATIC_BY_POSITION",
    "commit",
    "schema",
    "tree",
    "version",
]
