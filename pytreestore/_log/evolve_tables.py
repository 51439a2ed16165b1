"""A ragged store's tables: each seen as a fixed store of its own columns, and as ``evolve`` edits them.

The tables of a ragged store as ``evolve`` edits them: which list nodes hold elements
(``[*]``), which table a new column joins, and the axes, optional subtrees and declarations
that a drop or a rename moves with the tree.

A fixed store has no tables: every column lives in the record table (None), and nothing here
changes its schema. In a ragged store (docs/format.md, "Ragged stores") a column inside the
elements of a ragged list lives in that list's table, one row per element: an added column
there starts at a row of that table (:meth:`Tables.table_of`). Tables are named by the keypath
of their axis, in the schema and in every commit record, so an evolve never renames one: a
rename of a ragged axis, or of a node above one, is refused (:meth:`Tables.check_rename`).

Example:
    >>> tables = Tables.of({"ragged": {"declared": {"ragged": [".p"], "optional": []},
    ...     "axes": [{"path": ".p", "offsets": "p-offsets", "table": None, "chunk_rows": 8}],
    ...     "optional": []}})
    >>> tables.table_of(".p[*].q"), tables.chunk_rows(".p", 64)
    ('.p', 8)

The tables of a ragged store (format 3), each seen as a fixed store of its own columns.

A ragged store keeps a record table and one table per ragged axis
(:mod:`pytreestore._format.ragged`); each is a set of columns with one row count, which is
what the writer (:mod:`pytreestore._write.writer`) and the repair
(:mod:`pytreestore._log.repair`) handle. This module cuts a ragged schema into them.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-tables", {"p": [np.int8(0)]}, ragged=["['p']"])
    >>> {t: [c.key for c in sub.columns] for t, sub in table_schemas(s.schema).items()}
    {None: ['p-offsets'], "['p']": ['p/-2A']}
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any

from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore.errors import SchemaMismatchError

#: how an evolve of a ragged store refuses a change its tables cannot follow
COPY_INSTEAD = (
    "copy the records into a new store created with the new classes instead "
    "(docs/ragged.md, 'What ragged and optional stores refuse')"
)


def under(path: str, node: str) -> bool:
    """Whether keypath ``path`` is ``node`` or lies below it."""
    return path == node or (path.startswith(node) and path[len(node) : len(node) + 1] in (".", "["))


@dataclasses.dataclass
class Tables:
    """The ragged part of a schema document (``info["ragged"]``, edited in place), or None
    for a fixed store."""

    info: dict[str, Any] | None

    @classmethod
    def of(cls, info: dict[str, Any]) -> Tables:
        """The tables of schema document ``info`` (a copy: ``info`` is not changed)."""
        return cls(copy.deepcopy(info.get("ragged")))

    @property
    def axes(self) -> list[dict[str, Any]]:
        return [] if self.info is None else self.info["axes"]

    @property
    def presence(self) -> list[dict[str, Any]]:
        return [] if self.info is None else self.info["optional"]

    def keys(self) -> set[str]:
        """The storage keys of the offsets and presence arrays."""
        return {a["offsets"] for a in self.axes} | {p["presence"] for p in self.presence}

    def axis_paths(self) -> set[str]:
        """The keypaths of the ragged axes."""
        return {a["path"] for a in self.axes}

    def table_of(self, path: str) -> str | None:
        """The table a new leaf at ``path`` joins: the innermost ragged list whose elements
        hold it (None: the record table)."""
        tables = [a["path"] for a in self.axes if path.startswith(a["path"] + "[*]")]
        return max(tables, key=len, default=None)

    def chunk_rows(self, table: str | None, chunk_records: int) -> int:
        """Rows per chunk of ``table``."""
        if table is None:
            return chunk_records
        return int(next(a["chunk_rows"] for a in self.axes if a["path"] == table))

    def check_add(self, path: str, lists: frozenset[str], shape: tuple[int, ...]) -> None:
        """Refuses a leaf at ``path`` (per-record ``shape``) that the store's declarations
        make ragged: below a node declared ragged whose leaves share one leading axis, named
        by ``ragged=``, or an array in a store created with ``ragged=True``. Its rows would
        need a length per record, which a default cannot give."""
        if self.info is None:
            return
        declared = self.info["declared"]["ragged"]
        if (declared is True and shape) or (declared is not True and path in declared):
            why = (
                "the store was created with ragged=True, which gives every array leaf a "
                "ragged leading axis (add a scalar instead)"
                if declared is True
                else "the store's ragged= declares it ragged"
            )
            raise SchemaMismatchError(
                f"evolve: cannot add {path!r} of shape {shape}: {why}, and a default cannot "
                f"give a length per record; {COPY_INSTEAD}"
            )
        for axis in self.axes:
            shared = axis["path"] not in lists and under(path, axis["path"])
            if shared and not path.startswith(axis["path"] + "[*]"):
                raise SchemaMismatchError(
                    f"evolve: cannot add {path!r}: it lies below {axis['path']!r}, declared "
                    "ragged, whose leaves share one ragged leading axis that a default cannot "
                    f"follow; {COPY_INSTEAD}"
                )

    def drop(self, path: str) -> None:
        """Forgets the axes, optional subtrees and declarations at or below ``path``."""
        if self.info is None:
            return
        self.info["axes"] = [a for a in self.axes if not under(a["path"], path)]
        self.info["optional"] = [p for p in self.presence if not under(p["path"], path)]
        declared = self.info["declared"]
        if declared["ragged"] is not True:
            declared["ragged"] = [p for p in declared["ragged"] if not under(p, path)]
        declared["optional"] = [p for p in declared["optional"] if not under(p, path)]

    def check_rename(self, old: str, new: str) -> None:
        """Refuses a rename of a ragged axis or of a node above one (tables are named by the
        keypaths of their axes, in every commit record)."""
        for axis in self.axes:
            if under(axis["path"], old):
                raise SchemaMismatchError(
                    f"evolve: cannot rename {old!r} to {new!r}: the ragged axis "
                    f"{axis['path']!r} lies there, and a ragged store names its tables by "
                    f"their axes' keypaths; rename the leaves inside the elements, or "
                    f"{COPY_INSTEAD}"
                )

    def rename(self, old: str, new: str) -> None:
        """Moves the optional subtrees and declarations at or below ``old`` to ``new``
        (after :meth:`check_rename`)."""
        if self.info is None:
            return
        for item in self.presence:
            item["path"] = _moved(item["path"], old, new)
        declared = self.info["declared"]
        if declared["ragged"] is not True:
            declared["ragged"] = [_moved(p, old, new) for p in declared["ragged"]]
        declared["optional"] = [_moved(p, old, new) for p in declared["optional"]]

    def check_counted(self, columns: Sequence[ColumnSpec], pending: frozenset[str]) -> None:
        """Refuses a schema in which a ragged axis's table holds no array (a drop of every
        leaf inside a list's elements): nothing would count its rows. A list whose elements
        no record has shown yet (``pending``) has none until one does."""
        counted = {c.table for c in columns} | {a["table"] for a in self.axes}
        counted |= {p["table"] for p in self.presence}
        for axis in self.axes:
            if axis["path"] not in counted and axis["path"] not in pending:
                raise SchemaMismatchError(
                    f"evolve would leave the ragged axis {axis['path']!r} without an array "
                    f"leaf to carry its elements; keep one, or drop {axis['path']!r} itself"
                )


def _moved(path: str, old: str, new: str) -> str:
    return new + path[len(old) :] if under(path, old) else path


def table_schemas(schema: TreeSchema) -> dict[str | None, TreeSchema]:
    """One schema per table of a store, record table (None) first (a fixed store's only
    table): the table's columns (leaves, then offsets and presence arrays) and its rows per
    chunk."""
    info = schema.tables
    by_table: dict[str | None, list] = {t: [] for t in info.tables()}
    for c in schema.table_columns:  # packed leaves by their keys: the backend packs them
        by_table[c.table].append(c)
    return {
        t: TreeSchema(
            {},
            tuple(cols),
            info.chunk_rows(t, schema.chunk_records),
            schema.codec,
            None,
            inner_chunk_bytes=schema.inner_chunk_bytes,
        )
        for t, cols in by_table.items()
    }


__all__ = ["COPY_INSTEAD", "Tables", "table_schemas", "under"]
