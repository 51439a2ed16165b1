"""The ragged part of a schema (format 3): where records may vary, and the arrays that say how.

A store created with ``ragged=`` or ``optional=`` keeps its records in *tables*. The record
table has one row per record (every column of a fixed store lives there). Each ragged axis (a
ragged list, the ragged leading axis of an array leaf, or the one leading axis shared by the
leaves below a node) has its own table, one row per element, whose columns are the leaves below
it concatenated along that element axis: a list of dataclasses is stored struct of arrays.

* An axis's **offsets** array (int64, in the table of the node that holds the axis) has one row
  per row of that table: the cumulative count of the axis's elements up to and including that
  row. Row ``i``'s elements are rows ``[offsets[i - 1], offsets[i])`` of the axis's table
  (``offsets[-1]`` taken as 0). Nested ragged lists nest offsets.
* An optional subtree's **presence** array (bool, in the table of the optional node) says
  whether the subtree is there; where it is not, its leaves hold zeros and its axes no element.

Example:
    >>> info = RaggedInfo.from_json({
    ...     "declared": {"ragged": [".p"], "optional": []},
    ...     "axes": [{"path": ".p", "offsets": "p-offsets", "table": None, "chunk_rows": 64}],
    ...     "optional": []})
    >>> [(c.key, c.dtype.name, c.table) for c in info.index_columns(1024)]
    [('p-offsets', 'int64', None)]
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from pytreestore._format import keys as _keys
from pytreestore._format.columns import ColumnSpec

#: a commit record's or fragment's ``tables``: (axis keypath, rows), sorted
Rows = tuple[tuple[str, int], ...]

#: one keystr token: .name, [*], [0], ['key'] (quotes escaped as repr escapes them),
#: ["key"], [other]
KEYPATH_TOKEN = re.compile(
    r"\.[^.\[\]]+|\[\*\]|\[\d+\]|\['(?:[^'\\]|\\.)*'\]|\[\"(?:[^\"\\]|\\.)*\"\]|\[[^\]]*\]"
)
#: appended to a node's key (``-`` then letters: never an escape's output, so no keypath maps
#: to it); stores written before the ``-XX`` escapes used ``%offsets`` and ``%present``
OFFSETS_SUFFIX = "-offsets"
PRESENCE_SUFFIX = "-present"
#: the key component of ``[*]``, the elements of a ragged list: ``*`` escaped
ELEMENTS = _keys.escape("*")
#: the roles of a ragged store's arrays (a :class:`ColumnSpec`'s ``role``, None for a leaf)
LEAF, OFFSETS, PRESENCE = "leaf", "offsets", "presence"
#: what one array of a ragged store is, whatever its storage key: its role and the keypath of
#: its leaf, ragged axis or optional subtree
Slot = tuple[str, str]


def slot(column: ColumnSpec) -> Slot:
    """The :data:`Slot` of ``column``. Readers and writers find an array by its slot and use
    the key the schema stores for it: a key is derived from a keypath (:func:`path_key`) only
    when an array is created, and stores written by another key scheme (the ``%XX`` escapes
    before ``-XX``) keep theirs."""
    return (column.role or LEAF, column.path)


def path_key(path: str) -> str:
    """The storage key of the node or leaf at ``path`` in a ragged store: one component per
    keypath token, ``[*]`` (the elements of a ragged list) written ``-2A``.

    Example:
        >>> path_key(".p[*].x"), path_key("['a/b'][0]"), path_key("")
        ('p/-2A/x', 'a-2Fb/0', '-')
    """
    tokens = KEYPATH_TOKEN.findall(path)
    if not tokens:
        return _keys.EMPTY
    return "/".join(_component(t) for t in tokens)


def _component(token: str) -> str:
    if token.startswith("."):
        return _keys.escape(token[1:])
    inner = token[1:-1]
    if inner == "*":
        return ELEMENTS
    if inner[:1] in "'\"":
        try:
            return _keys.escape(str(ast.literal_eval(inner)))
        except (ValueError, SyntaxError):
            pass
    return _keys.escape(inner)


def offsets_key(axis_path: str) -> str:
    """The storage key of the offsets array of the ragged axis at ``axis_path``."""
    return ("" if axis_path == "" else path_key(axis_path)) + OFFSETS_SUFFIX


def presence_key(path: str) -> str:
    """The storage key of the presence array of the optional subtree at ``path``."""
    return path_key(path) + PRESENCE_SUFFIX


@dataclasses.dataclass(frozen=True)
class AxisInfo:
    """One ragged axis: its keypath, its offsets array's key, the table that array lives in
    (None: the record table) and the rows per chunk of the axis's own table."""

    path: str
    offsets: str
    table: str | None
    chunk_rows: int
    start: int = 0  # rows of its table when a record first showed the axis (0: from create)


@dataclasses.dataclass(frozen=True)
class PresenceInfo:
    """One optional subtree: its keypath, its presence array's key and the table it lives in."""

    path: str
    presence: str
    table: str | None
    start: int = 0  # rows of its table when a record first showed the subtree


@dataclasses.dataclass(frozen=True)
class RaggedInfo:
    """What ``create(ragged=, optional=)`` declared and the axes and optional subtrees the
    example record showed."""

    ragged: bool | tuple[str, ...]
    optional: tuple[str, ...]
    axes: tuple[AxisInfo, ...]
    presence: tuple[PresenceInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "declared": {
                "ragged": self.declared_ragged,
                "optional": list(self.optional),
            },
            "axes": [_without_zero_start(dataclasses.asdict(a)) for a in self.axes],
            "optional": [_without_zero_start(dataclasses.asdict(p)) for p in self.presence],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RaggedInfo:
        """Raises KeyError, TypeError or ValueError on a malformed document."""
        declared = obj["declared"]
        ragged = declared["ragged"]
        if ragged is not True:
            ragged = tuple(str(p) for p in ragged)
        axes = tuple(
            AxisInfo(
                str(a["path"]),
                str(a["offsets"]),
                a["table"],
                int(a["chunk_rows"]),
                int(a.get("start", 0)),
            )
            for a in obj["axes"]
        )
        presence = tuple(
            PresenceInfo(str(p["path"]), str(p["presence"]), p["table"], int(p.get("start", 0)))
            for p in obj["optional"]
        )
        return cls(ragged, tuple(str(p) for p in declared["optional"]), axes, presence)

    @property
    def declared_ragged(self) -> bool | list[str]:
        """``ragged=`` as ``create`` took it: True, or the keypaths."""
        return list(self.ragged) if isinstance(self.ragged, tuple) else True

    def chunk_rows(self, table: str | None, chunk_records: int) -> int:
        """Rows per chunk of ``table`` (None: the record table)."""
        if table is None:
            return chunk_records
        return next(a.chunk_rows for a in self.axes if a.path == table)

    def index_columns(self, chunk_records: int) -> list[ColumnSpec]:
        """The offsets and presence arrays, as columns of the tables they live in."""
        out = [
            ColumnSpec(
                a.path,
                a.offsets,
                np.dtype("int64"),
                (),
                (self.chunk_rows(a.table, chunk_records),),
                table=a.table,
                role=OFFSETS,
                **_started(a.start, 0),
            )
            for a in self.axes
        ]
        out += [
            ColumnSpec(
                p.path,
                p.presence,
                np.dtype("bool"),
                (),
                (self.chunk_rows(p.table, chunk_records),),
                table=p.table,
                role=PRESENCE,
                **_started(p.start, False),
            )
            for p in self.presence
        ]
        return out

    def tables(self) -> list[str | None]:
        """Every table: the record table (None) first, then one per axis."""
        return [None, *(a.path for a in self.axes)]

    def section(self) -> RaggedInfo | None:
        """What a schema keeps as its ``ragged`` section (:class:`NoTables`: none)."""
        return self

    def schema_json(self) -> dict[str, Any]:
        """The schema document's ``ragged`` entry (none for a fixed store: format 3)."""
        return {"ragged": self.to_json()}

    def first_tables(self) -> tuple[tuple[str, int], ...] | None:
        """The ``tables`` of an empty store's first commit record: each axis's table with
        no rows (None for a fixed store, whose commit records have no ``tables``)."""
        return tuple((a.path, 0) for a in self.axes)

    def listed(self, rows: Mapping[str | None, int]) -> tuple[tuple[str, int], ...] | None:
        """The ``tables`` a fragment's description lists: each axis table's ``rows``,
        sorted (None for a fixed store, whose fragments list no ``tables``)."""
        return tuple(sorted((t, n) for t, n in rows.items() if t is not None))

    def axis_paths(self) -> set[str] | None:
        """The axes' keypaths, as a fragment's ``tables`` must name them (None for a fixed
        store)."""
        return {a.path for a in self.axes}

    def fits(self, tables: Rows | None) -> bool:
        """Whether a commit record's ``tables`` fit this store: listed (a fixed store's
        records list none)."""
        return tables is not None

    def lists_axes(self, tables: Rows | None) -> bool:
        """Whether a fragment's ``tables`` name exactly this store's axes (a fixed store's
        fragments list none)."""
        return tables is not None and {t for t, _ in tables} == self.axis_paths()


@dataclasses.dataclass(frozen=True)
class NoTables(RaggedInfo):
    """The tables of a fixed store: the record table alone, no axes, no optional subtrees.

    The record model's empty case (``TreeSchema.tables``), so that code walking axes,
    presence and index columns needs no branch. On disk a fixed store has none of it: no
    ``ragged`` section in its schema, no ``tables`` in its commit records (format 3).
    """

    ragged: bool | tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    axes: tuple[AxisInfo, ...] = ()
    presence: tuple[PresenceInfo, ...] = ()

    def section(self) -> RaggedInfo | None:
        return None

    def schema_json(self) -> dict[str, Any]:
        return {}

    def first_tables(self) -> tuple[tuple[str, int], ...] | None:
        return None

    def listed(self, rows: Mapping[str | None, int]) -> tuple[tuple[str, int], ...] | None:
        return None

    def axis_paths(self) -> set[str] | None:
        return None

    def fits(self, tables: Rows | None) -> bool:
        return tables is None

    def lists_axes(self, tables: Rows | None) -> bool:
        return tables is None


NO_TABLES = NoTables()


def tables_entry(tables: Rows | None) -> dict[str, Any]:
    """The ``tables`` entry of a commit record's or a fragment's JSON: each axis table's
    rows; none at all for a fixed store's (format 3), whose ``tables`` are None in memory."""
    return {} if tables is None else {"tables": dict(tables)}


def _without_zero_start(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "start" or v}


def _started(start: int, default: Any) -> dict[str, Any]:
    """A learnt array's ``start`` and the ``default`` of the rows before it."""
    return {"start": start, "default": default} if start else {}


__all__ = [
    "ELEMENTS",
    "KEYPATH_TOKEN",
    "LEAF",
    "NO_TABLES",
    "OFFSETS",
    "OFFSETS_SUFFIX",
    "PRESENCE",
    "PRESENCE_SUFFIX",
    "AxisInfo",
    "NoTables",
    "PresenceInfo",
    "RaggedInfo",
    "Rows",
    "Slot",
    "offsets_key",
    "path_key",
    "presence_key",
    "slot",
    "tables_entry",
]
