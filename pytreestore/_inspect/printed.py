"""Printing records and static fields without importing the classes (``pytreestore head``
and ``info``).

:func:`format_record` prints one record whole, as its classes would print it;
:func:`summary_lines` prints one line per leaf (keypath, dtype and shape, the first values);
:func:`static_fields` lists the static fields the schema's tree holds, printed from their
stored JSON by :func:`static_text`.

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> tree = TreeSchema.from_example({"a": 0}).tree
    >>> format_record(tree, [np.int32(3)])
    "{'a': 3}"
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from jax.tree_util import keystr

from pytreestore._format import consts as _consts
from pytreestore._format.kinds import child_entry
from pytreestore._format.nodes import one_level
from pytreestore._format.ragged import NO_TABLES, RaggedInfo

#: How many values a summary line shows of each leaf, at most.
PREVIEW_VALUES = 6


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
    """Every value of a leaf, each float as the shortest text that reads back the same."""
    array = np.asarray(value)
    return np.array2string(
        array, separator=", ", threshold=sys.maxsize, floatmode="unique", max_line_width=1 << 30
    )


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


# ---- one line per leaf -------------------------------------------------------------------------


def summary_lines(items: Sequence[tuple[str, Any]], *, width: int = 100) -> list[str]:
    """One line per ``(keypath, value)``: the keypath, dtype and shape, and the first values.

    A value that is a string (``list[2]`` for a ragged list, ``None`` for an absent optional
    subtree) is printed in the dtype column as it is. Values are cut to fit ``width``.

    Example:
        >>> import numpy as np
        >>> for line in summary_lines([(".x", np.arange(10.0)), (".n", np.int32(3))]):
        ...     print(line)
          .x  float64[10]  [0., 1., 2., 3., 4., 5., ...]
          .n  int32[]      3
    """
    kinds = [(path, v if isinstance(v, str) else _type_text(np.asarray(v))) for path, v in items]
    left = max((len(p) for p, _ in kinds), default=0)
    middle = max((len(k) for _, k in kinds), default=0)
    room = max(width - left - middle - 6, 12)
    lines = []
    for (path, value), (_, kind) in zip(items, kinds):
        shown = "" if isinstance(value, str) else preview(np.asarray(value), room)
        lines.append(f"  {path.ljust(left)}  {kind.ljust(middle)}  {shown}".rstrip())
    return lines


def _type_text(array: np.ndarray) -> str:
    return f"{array.dtype.name}[{','.join(map(str, array.shape))}]"


def preview(array: np.ndarray, room: int = 80) -> str:
    """The first values of ``array``, flattened, numpy-style, ``...`` when cut; at most ``room``
    characters.

    Example:
        >>> preview(np.arange(12).reshape(3, 4)), preview(np.float32(0.5)), preview(np.zeros(0))
        ('[0, 1, 2, 3, 4, 5, ...]', '0.5', '[]')
    """
    if array.ndim == 0:
        return _clip(_array_text(array), room)
    flat = array.reshape(-1)
    for count in range(min(PREVIEW_VALUES, flat.size), 0, -1):
        text = _array_text(flat[:count])
        if count < flat.size:
            text = text[:-1] + ", ...]"
        if len(text) <= room:
            return text
    return _clip(_array_text(flat[:1])[:-1] + (", ...]" if flat.size > 1 else "]"), room)


def _array_text(array: np.ndarray) -> str:
    return np.array2string(array, separator=", ", precision=4, max_line_width=1 << 30)


def _clip(text: str, room: int) -> str:
    return text if len(text) <= room else text[: max(room - 3, 1)] + "..."


def record_items(record: Any, tables: RaggedInfo) -> list[tuple[str, Any]]:
    """The ``(keypath, leaf)`` pairs of a record read exactly (a ragged store's ``store[i]``),
    with a ``list[n]`` line for each ragged list and ``None`` for each absent optional subtree.

    Leaves that hold no array (constant leaves, columns not loaded) are left out.
    """
    lists = {a.path for a in tables.axes}
    optional = {p.path for p in tables.presence}
    return list(_walk(record, (), "", lists, optional))


def _walk(
    node: Any, path: tuple[Any, ...], pattern: str, lists: set[str], optional: set[str]
) -> Iterator[tuple[str, Any]]:
    """``pattern`` is the keypath with ``[*]`` for the elements of ragged lists."""
    where = keystr(path) or "(root)"
    if node is None:
        if pattern in optional:
            yield where, "None"
        return
    level = one_level(node)
    if level is None:
        if isinstance(node, np.ndarray | np.generic):
            yield where, node
        return
    ragged_list = isinstance(node, list) and pattern in lists
    if ragged_list:
        yield where, f"list[{len(node)}]"
    for entry, child in zip(level[1], level[2]):
        step = "[*]" if ragged_list else keystr((entry,))
        yield from _walk(child, (*path, entry), pattern + step, lists, optional)


# ---- static fields ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StaticField:
    """One static field the schema holds.

    Attributes:
        path: the keypath of the node that holds it (``[*]`` for a ragged list's elements).
        name: the field's name, or None for static data not named by fields (a class
            registered with its own flatten).
        value: the value as the schema stores it (JSON, see :mod:`pytreestore._format.values`).
    """

    path: str
    name: str | None
    value: Any

    @property
    def keypath(self) -> str:
        """``.cfg.name`` for a named field; the node's keypath, ``(static data)``, otherwise."""
        if self.name is not None:
            return f"{self.path}.{self.name}"
        return f"{self.path or '(root)'} (static data)"

    @property
    def text(self) -> str:
        """``.cfg.name = 'run-a'``."""
        return f"{self.keypath} = {static_text(self.value)}"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.keypath, "value": self.value, "text": static_text(self.value)}


def static_fields(tree: dict[str, Any], tables: RaggedInfo = NO_TABLES) -> list[StaticField]:
    """The static fields of a schema's JSON ``tree``, in tree order.

    Example:
        >>> from pytreestore._format.schema import TreeSchema
        >>> from flax import struct
        >>> @struct.dataclass
        ... class Run:
        ...     x: float
        ...     name: str = struct.field(pytree_node=False, default="a")
        >>> [f.text for f in static_fields(TreeSchema.from_example(Run(0.0, "b")).tree)]
        [".name = 'b'"]
    """
    lists = {a.path for a in tables.axes}
    return list(_statics(tree, "", lists))


def _statics(node: dict[str, Any], path: str, lists: set[str]) -> Iterator[StaticField]:
    if node["node"] == "custom":
        yield from _node_statics(node, path)
    ragged_list = node["node"] == "list" and path in lists
    for i, child in enumerate(node.get("children", [])):
        step = "[*]" if ragged_list else keystr((child_entry(node, i),))
        yield from _statics(child, path + step, lists)


def _node_statics(node: dict[str, Any], path: str) -> Iterator[StaticField]:
    aux, names = node.get("aux"), node.get("aux_fields")
    values = aux["tuple"] if isinstance(aux, dict) and set(aux) == {"tuple"} else None
    if names is not None and values is not None and len(names) == len(values):
        # an equinox Module's wrapper data has no name: it is no field of the user's
        yield from (StaticField(path, n, v) for n, v in zip(names, values) if n is not None)
    elif aux is not None and values != []:
        yield StaticField(path, None, aux)


def static_text(obj: Any) -> str:
    """A static value's stored JSON printed as Python prints the value, importing nothing.

    Example:
        >>> static_text({"tuple": ["a", {"float": "nan"}]}), static_text({"dtype": "int8"})
        ("('a', nan)", "dtype('int8')")
    """
    if isinstance(obj, list):
        return "[" + ", ".join(map(static_text, obj)) + "]"
    if not isinstance(obj, dict) or len(obj) != 1:
        return repr(obj)
    ((tag, inner),) = obj.items()
    if tag == "tuple":
        items = [static_text(v) for v in inner]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if tag in ("dict", "ordered_dict"):
        pairs = inner.items() if tag == "dict" else inner
        body = "{" + ", ".join(f"{static_text(k)}: {static_text(v)}" for k, v in pairs) + "}"
        return body if tag == "dict" else f"OrderedDict({body})"
    if tag == "float":
        return str(float(inner))
    if tag == "complex":
        return repr(complex(*(_number(v) for v in inner)))
    return _object_text(tag, inner)


def _number(obj: Any) -> float:
    return float(obj["float"]) if isinstance(obj, dict) else float(obj)


def _object_text(tag: str, inner: Any) -> str:
    if tag == "scalar":
        return f"{inner['dtype']}({static_text(inner['value'])})"
    if tag == "dtype":
        return f"dtype({inner!r})"
    if tag == "ref":
        return str(inner).replace(":", ".")
    if tag in ("enum", "sentinel"):
        owner = _short(inner["type"])
        return f"{owner}.{inner['name']}" if tag == "enum" else inner["name"]
    if tag == "dataclass":
        fields = ", ".join(f"{k}={static_text(v)}" for k, v in inner["fields"].items())
        return f"{_short(inner['type'])}({fields})"
    return repr({tag: inner})


def _short(class_path: str) -> str:
    """``pkg.mod:Outer.Name`` -> ``Outer.Name``."""
    return class_path.rpartition(":")[2]


__all__ = [
    "PREVIEW_VALUES",
    "StaticField",
    "format_record",
    "preview",
    "record_items",
    "static_fields",
    "static_text",
    "summary_lines",
]
