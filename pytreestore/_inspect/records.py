"""Printing one record as its classes would print it, from the schema's JSON tree and the
record's leaves, without importing the classes (``pytreestore head``).

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> tree = TreeSchema.from_example({"a": 0}).tree
    >>> format_record(tree, [np.int32(3)])
    "{'a': 3}"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from jax.tree_util import keystr

from pytreestore._format import consts as _consts
from pytreestore._format.kinds import child_entry


@dataclasses.dataclass(frozen=True)
class _Group:
    """A bracketed node of a record being printed: ``open``, then ``(label, child)``s, ``close``."""

    open: str
    items: list[tuple[str, Any]]
    close: str


def format_record(tree: dict[str, Any], leaves: Sequence[Any], *, width: int = 88) -> str:
    """One record as its classes would print it, from a schema's JSON ``tree`` and its leaves.

    Classes are named as the schema names them, so a record prints the same whether or not its
    classes can be imported here. A record wider than ``width`` is broken over lines.

    Example:
        >>> import numpy as np
        >>> from pytreestore._format.schema import TreeSchema
        >>> tree = TreeSchema.from_example({"a": 0, "b": (0.0, np.zeros(2))}).tree
        >>> print(format_record(tree, [np.int32(1), np.float32(0.5), np.arange(2.0)]))
        {'a': 1, 'b': (0.5, [0., 1.])}
        >>> print(format_record(tree, [np.int32(1), np.float32(0.5), np.arange(2.0)], width=12))
        {
          'a': 1,
          'b': (
            0.5,
            [0., 1.],
          ),
        }
    """
    return _layout(_record_doc(tree, iter(leaves)), 0, width)


def _record_doc(node: dict[str, Any], leaves: Iterator[Any]) -> Any:
    kind = node["node"]
    if kind == "leaf":
        return _format_leaf(next(leaves))
    if kind == "none":
        return "None"
    if kind == "const":
        return _consts.label(node)
    docs = [_record_doc(child, leaves) for child in node.get("children", [])]
    if kind == "list":
        return _Group("[", [("", d) for d in docs], "]")
    if kind == "tuple":
        return _Group("(", [("", d) for d in docs], ",)" if len(docs) == 1 else ")")
    if kind in ("dict", "ordered_dict"):
        opener, closer = ("{", "}") if kind == "dict" else ("OrderedDict({", "})")
        return _Group(opener, [(f"{k!r}: ", d) for k, d in zip(node["keys"], docs)], closer)
    name = node["type"].rpartition(":")[2]
    labels = [_field_label(child_entry(node, i)) for i in range(len(docs))]
    return _Group(f"{name}(", list(zip(labels, docs)), ")")


def _field_label(entry: Any) -> str:
    name = getattr(entry, "name", None)
    return f"{name}=" if isinstance(name, str) else f"{keystr((entry,))}="


def _format_leaf(value: Any) -> str:
    array = np.asarray(value)
    return np.array2string(array, separator=", ", threshold=16, edgeitems=3, max_line_width=1 << 30)


def _flat(doc: Any) -> str:
    if isinstance(doc, str):
        return doc
    inner = ", ".join(label + _flat(child) for label, child in doc.items)
    return doc.open + inner + doc.close


def _layout(doc: Any, indent: int, width: int, column: int | None = None) -> str:
    """Lays ``doc`` out from ``column``; broken lines are indented from ``indent``."""
    column = indent if column is None else column
    flat = _flat(doc)
    if isinstance(doc, str):
        return doc.replace("\n", "\n" + " " * column)
    if column + len(flat) <= width and "\n" not in flat:
        return flat
    pad = " " * (indent + 2)
    lines = [doc.open]
    for label, child in doc.items:
        body = _layout(child, indent + 2, width, indent + 2 + len(label))
        lines.append(pad + label + body + ",")
    lines.append(" " * indent + doc.close.lstrip(","))
    return "\n".join(lines)


__all__ = ["format_record"]
