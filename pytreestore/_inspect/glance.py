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

What the notebook view shows beyond :func:`~pytreestore._inspect.repr.describe`: the first
and last records' values, the range of each ragged axis's lengths, and the versions and tags.

Everything here is cheap: two reads of one record each (the store's own ``load``), one read
of the ragged axes' offsets over the first :data:`LENGTHS_OVER` records at most, and a
listing of the version records and tags. Nothing raises: a failed read is reported by its
one-line message where its values would be. A writer holding buffered records is not read
(a read would commit them first, and a display must not write).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-glance", {"a": np.zeros(3, np.float32)})
    >>> s.extend({"a": np.full(3, i, np.float32)} for i in range(4)); s.flush()
    >>> g = glance(s)
    >>> [(x.index, x.text("['a']")) for x in g.samples]
    [(0, '[0., 0., 0.]'), (3, '[3., 3., 3.]')]
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from jax.tree_util import keystr

from pytreestore._format import consts as _consts
from pytreestore._format.kinds import child_entry
from pytreestore._format.nodes import one_level
from pytreestore._format.schema import TreeSchema
from pytreestore._log import versions as _versions
from pytreestore._log.commit_record import Commit
from pytreestore._read.reader import ReadContext
from pytreestore.backends import KeyListing


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


#: the records whose lengths an axis's range is taken over, at most (the offsets of the
#: first ones: a read of one chunk of offsets per axis at the default chunk size)
LENGTHS_OVER = 1 << 16


#: the characters of a value shown in its cell; its tooltip shows up to :data:`TITLE_WIDTH`
CELL_WIDTH = 40


TITLE_WIDTH = 400


class Glanced(Protocol):
    """What :func:`glance` needs of a store (a :class:`pytreestore.TreeStore` has it)."""

    @property
    def path(self) -> str: ...
    @property
    def schema(self) -> TreeSchema: ...
    @property
    def committed(self) -> int: ...
    def __len__(self) -> int: ...
    def load(self, index: Any = ..., *, as_numpy: bool = ...) -> Any: ...
    def lengths(self, index: Any = ...) -> dict[str, np.ndarray]: ...
    def read_context(self) -> ReadContext: ...
    def commit_now(self) -> Commit: ...


class _Marker(str):
    """What a record holds where a column has no value: an absent optional subtree or an
    empty ragged list (every column below it shows it)."""


_NONE, _EMPTY, _MORE = _Marker("None"), _Marker("[]"), _Marker("...")


#: the elements of a ragged list whose values a cell shows, at most (then ``...``)
ELEMENTS = 16


@dataclasses.dataclass(frozen=True)
class Sample:
    """One record's values by column keypath (``[*]`` for ragged lists' elements).

    Attributes:
        index: the record's index.
        values: the value of each column the record has: an array, a list of the values of a
            ragged list's elements (nested for nested lists), or a marker (``None``, ``[]``)
            at the keypath of an absent subtree or empty list.
        error: the read's one-line error, or None.
    """

    index: int
    values: Mapping[str, Any]
    error: str | None = None

    def text(self, path: str, width: int = CELL_WIDTH) -> str:
        """The value of the column at ``path``, cut to ``width`` characters."""
        if self.error is not None:
            return _cut(self.error, width)
        if path in self.values:
            return _cut(_text(self.values[path]), width)
        marks = [p for p, v in self.values.items() if isinstance(v, _Marker) and _under(path, p)]
        return str(self.values[max(marks, key=len)]) if marks else ""


@dataclasses.dataclass(frozen=True)
class AxisRange:
    """A ragged axis's lengths (a list's elements, or a leading axis's rows) per record.

    Attributes:
        path: the axis's keypath.
        low, high: the least and most over the records looked at (a nested axis: the longest
            list of each record's elements); None where there is none or the read failed.
        over: the records looked at (the first :data:`LENGTHS_OVER` at most).
        rows: the axis table's committed rows (every element of every record).
        error: the read's one-line error (or why nothing was read), or None.
    """

    path: str
    low: int | None
    high: int | None
    over: int
    rows: int | None
    error: str | None = None

    @property
    def text(self) -> str:
        """``0 to 3 per record · 8 in all`` (the range over the first records says so)."""
        if self.error is not None:
            return self.error
        if self.low is None:
            span = "no records"
        else:
            span = f"{self.low} to {self.high}" if self.low != self.high else f"{self.low}"
            span += " per record" + ("" if self.over == 0 else f" (first {self.over:,})")
        rows = "" if self.rows is None else f" · {self.rows:,} in all"
        return span + rows


@dataclasses.dataclass(frozen=True)
class Versions:
    """The version the store reads, how many the log keeps, and the tags."""

    version: int
    kept: int | None  # None: the store's keys cannot be listed (a web server)
    tags: tuple[tuple[str, int], ...]
    error: str | None = None

    @property
    def text(self) -> str:
        if self.error is not None:
            return self.error
        if self.kept is None:
            return (
                f"version {self.version} · versions and tags not listed: a web server cannot "
                "list them (store.versions() looks each one up)"
            )
        return f"version {self.version} · {self.kept:,} kept"


@dataclasses.dataclass(frozen=True)
class Glance:
    """What the notebook view shows beyond the column table.

    Attributes:
        samples: the first and last records' values (one sample for one record, none for an
            empty store or a writer holding buffered records).
        note: why no values are shown, or None.
        axes: each ragged axis's lengths.
        versions: the versions and tags.
    """

    samples: tuple[Sample, ...]
    note: str | None
    axes: tuple[AxisRange, ...]
    versions: Versions


def glance(store: Glanced) -> Glance:
    """Reads what the notebook view shows of ``store`` beyond :func:`describe`'s facts."""
    records = len(store)
    samples: tuple[Sample, ...] = ()
    note = None
    if records and store.committed != records:
        note = f"{records - store.committed:,} records buffered: values are shown once committed"
    elif records:
        samples = tuple(_sample(store, i) for i in dict.fromkeys((0, records - 1)))
    else:
        note = "no records"
    return Glance(samples, note, tuple(_axes(store, records)), _version_facts(store))


def one_line(err: BaseException) -> str:
    """``TypeName: the first line of the message``."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def _sample(store: Glanced, index: int) -> Sample:
    lists = frozenset(a.path for a in store.schema.tables.axes)
    try:
        record = store.load(index, as_numpy=True)
        return Sample(index, dict(_values(record, "", lists)))
    except Exception as err:  # a display shows any read error, never raises
        return Sample(index, {}, one_line(err))


def _values(node: Any, pattern: str, lists: frozenset[str]) -> Iterator[tuple[str, Any]]:
    """``(column keypath, value)`` of each column ``node`` holds (``pattern``: its keypath)."""
    if node is None:
        yield pattern, _NONE
        return
    if isinstance(node, list) and pattern in lists:
        elements: dict[str, list[Any]] = {}
        for element in node[:ELEMENTS]:
            for path, value in _values(element, pattern + "[*]", lists):
                elements.setdefault(path, []).append(value)
        more = [_MORE] if len(node) > ELEMENTS else []
        yield from ((p, v + more) for p, v in elements.items())
        if not node:
            yield pattern + "[*]", _EMPTY
        return
    level = one_level(node)
    if level is None:
        if isinstance(node, np.ndarray | np.generic):
            yield pattern, node
        return
    for entry, child in zip(level[1], level[2]):
        yield from _values(child, pattern + keystr((entry,)), lists)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or (path.startswith(prefix) and path[len(prefix)] in ".[")


def _text(value: Any) -> str:
    """A column's value as numpy prints it, a ragged list's values as a list of them."""
    if isinstance(value, _Marker):
        return str(value)
    if isinstance(value, list):
        more = ", ...]" if value and value[-1] is _MORE else "]"
        items = value[:-1] if value and value[-1] is _MORE else value
        arrays = items and not any(isinstance(v, list | _Marker) for v in items)
        if arrays and len({(np.shape(v), np.asarray(v).dtype) for v in items}) == 1:
            return _text(np.stack(items))[:-1] + more  # one array: numpy's summary
        return "[" + ", ".join(_text(v) for v in items) + more
    with np.printoptions(threshold=16, edgeitems=3, precision=4, linewidth=1 << 20):
        text = np.array2string(np.asarray(value), separator=", ")
    return re.sub(r"\[ +| +(?=[,\]])", lambda m: m.group().strip(), " ".join(text.split()))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _axes(store: Glanced, records: int) -> Iterator[AxisRange]:
    axes = store.schema.tables.axes
    if not axes:
        return
    over = min(store.committed, LENGTHS_OVER)
    commit = store.commit_now()
    lengths, error = {}, None
    try:
        if store.committed != records:  # a read would commit the buffered records first
            error = "buffered records: lengths are shown once committed"
        elif over:
            lengths = store.lengths(slice(0, over))
    except Exception as err:  # a display shows any read error, never raises
        error = one_line(err)
    cut = over if over < records else 0  # 0: the range covers every record
    for axis in axes:
        got = lengths.get(axis.path, np.zeros(0, np.int64))
        low, high = (int(got.min()), int(got.max())) if got.size else (None, None)
        yield AxisRange(axis.path, low, high, cut, commit.rows(axis.path), error)


def _version_facts(store: Glanced) -> Versions:
    """The version ``store`` reads; the versions kept, counted as :meth:`TreeStore.versions`
    lists them (those before the latest commit, and it) from a listing, none of them read."""
    try:
        with store.read_context().reading() as engine:
            if not isinstance(engine, KeyListing):  # a display sends no request per version
                return Versions(store.commit_now().generation, None, ())
            latest = Commit.read(engine, store.path)
            before = [n for n in _versions.numbers(engine) if n < latest.generation]
            tags = _versions.tags(engine, store.path)
        version = store.commit_now().generation
    except Exception as err:  # a display shows any read error, never raises
        return Versions(-1, 0, (), one_line(err))
    ordered = tuple(sorted(tags.items(), key=lambda t: (t[1], t[0])))
    return Versions(version, len(before) + 1, ordered)


def samples_header(samples: Sequence[Sample]) -> list[str]:
    """The headers of the value columns: ``record 0``, ``record 9``."""
    return [f"record {s.index:,}" for s in samples]


__all__ = [
    "CELL_WIDTH",
    "ELEMENTS",
    "LENGTHS_OVER",
    "TITLE_WIDTH",
    "AxisRange",
    "Glance",
    "Glanced",
    "Sample",
    "TreeRow",
    "Versions",
    "glance",
    "one_line",
    "samples_header",
    "tree_rows",
]
