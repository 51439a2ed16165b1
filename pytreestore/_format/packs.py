"""Packed columns (format 3, ``create(pack=...)``): small fixed-shape leaves of one dtype
stored side by side in one shared array, the pack.

A pack is a zarr array ``_pack_<dtype>_<n>`` at the store root of shape ``[records,
elements]``: each record's row holds the leaves it packs one after another, each flattened
(C order). The schema keeps one :class:`~pytreestore.ColumnSpec` per leaf, as without packing
(so keypaths, column selection, evolve and repr are unchanged), and lists the packs in
``packs``: for each, the columns it holds as ``[column key, element offset, element count]``.
Packed columns have no array of their own; the packs are among the schema's storage columns.

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> s = TreeSchema.from_example({"a": np.zeros(2, np.float32), "b": np.float32(0)}, chunk_records=8)
    >>> [(p.key, p.members, p.elements) for p in plan(s.columns, 1024)]
    [('_pack_float32_0', (('a', 0, 2), ('b', 2, 1)), 3)]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pytreestore import _arguments
from pytreestore._format import dtypes as _dtypes
from pytreestore._format.columns import ColumnSpec, leaf_chunks
from pytreestore.errors import CorruptStoreError, SchemaMismatchError

#: ``pack=True``: leaves of at most this many bytes per record are packed
PACK_LEAF_BYTES = 4096
#: bytes of one record's row of a pack, at most (wider groups of leaves make more packs)
_PACK_ROW_BYTES = 1 << 20
_PREFIX = "_pack_"


@dataclasses.dataclass(frozen=True)
class Pack:
    """One shared array of packed columns.

    Attributes:
        key: the pack array's storage key, ``_pack_<dtype>_<n>``.
        dtype: the dtype of every column it packs.
        chunks: the array's chunk shape, ``(records, elements)``.
        members: ``(column key, element offset, element count)`` of each packed column, in
            offset order, with no gap.
    """

    key: str
    dtype: np.dtype
    chunks: tuple[int, ...]
    members: tuple[tuple[str, int, int], ...]

    @property
    def elements(self) -> int:
        """Elements of one record's row: the sum of the members' counts."""
        return sum(count for _, _, count in self.members)

    def spec(self, table: str | None = None) -> ColumnSpec:
        """The pack array as a storage column of ``table``, its columns' table (what verify,
        repair and vacuum see)."""
        return ColumnSpec(
            f"<pack {self.key}>",
            self.key,
            self.dtype,
            (self.elements,),
            self.chunks,
            table=table,
            role="pack",
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "dtype": self.dtype.name,
            "chunks": list(self.chunks),
            "columns": [list(m) for m in self.members],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Pack:
        members = tuple((str(k), int(o), int(n)) for k, o, n in obj["columns"])
        return cls(obj["key"], _dtypes.from_name(obj["dtype"]), tuple(obj["chunks"]), members)


def check_threshold(pack: Any) -> int | None:
    """The per-record byte limit of leaves that ``pack=`` packs (None: no packing).

    Raises:
        ArgumentError: ``pack`` is not a bool or a positive int.
    """
    if pack is False or pack is None:
        return None
    if pack is True:
        return PACK_LEAF_BYTES
    return _arguments.count(
        pack,
        f"pack must be False, True (leaves of at most {PACK_LEAF_BYTES} bytes per record) "
        f"or a positive int (the most bytes per record of a packed leaf)",
        minimum=1,
    )


def packable(column: ColumnSpec, limit: int) -> bool:
    """Whether ``column`` may go into a pack: a leaf column from the start (of the record
    table or of a ragged axis's table), not empty, of at most ``limit`` bytes per row."""
    plain = column.role is None and column.default is None
    return plain and 0 < column.record_nbytes <= limit


def plan(columns: Sequence[ColumnSpec], limit: int) -> tuple[Pack, ...]:
    """The packs of ``columns``: the packable ones grouped by table and dtype in column
    order (a pack's rows are its table's rows: records, or a ragged axis's elements), each
    group cut into packs of rows of at most 1 MiB; a group of one column stays unpacked.
    Packs of one dtype are numbered across tables."""
    groups: dict[tuple[str | None, np.dtype], list[ColumnSpec]] = {}
    for c in columns:
        if packable(c, limit):
            groups.setdefault((c.table, c.dtype), []).append(c)
    packs: list[Pack] = []
    numbers: dict[np.dtype, int] = {}
    for (_, dtype), group in groups.items():
        for part in _rows_of(group, _PACK_ROW_BYTES):
            if len(part) < 2:
                continue
            members, at = [], 0
            for c in part:
                members.append((c.key, at, math.prod(c.shape)))
                at += math.prod(c.shape)
            rows = part[0].chunks[0]  # the table's rows per chunk
            chunks = (rows, *leaf_chunks(dtype, (at,), rows))
            n = numbers[dtype] = numbers.get(dtype, -1) + 1
            packs.append(Pack(f"{_PREFIX}{dtype.name}_{n}", dtype, chunks, tuple(members)))
    return tuple(packs)


def pack_tables(packs: Sequence[Pack], columns: Sequence[ColumnSpec]) -> dict[str, str | None]:
    """Each pack's table: that of its columns (``columns`` holds them, dropped ones too)."""
    table = {c.key: c.table for c in columns}
    return {p.key: table.get(p.members[0][0]) for p in packs}


def storage(
    columns: Sequence[ColumnSpec], dropped: Sequence[ColumnSpec], packs: Sequence[Pack]
) -> list[ColumnSpec]:
    """The arrays of ``columns`` (a schema's, ``dropped`` its dropped ones): the columns
    not packed, then each pack holding a column not dropped, as a column of its table."""
    packed, live = packed_keys(packs), {c.key for c in columns}
    tables = pack_tables(packs, [*columns, *dropped])
    return [
        *(c for c in columns if c.key not in packed),
        *(p.spec(tables[p.key]) for p in packs if any(k in live for k, _, _ in p.members)),
    ]


def rechunked(schema: Any, chunk_records: int) -> Any:
    """``schema`` (a new store's :class:`~pytreestore.TreeSchema`) with ``chunk_records``
    records per chunk, as its packs' widths call for."""
    columns = tuple(
        dataclasses.replace(
            c, chunks=(chunk_records, *leaf_chunks(c.dtype, c.shape, chunk_records))
        )
        for c in schema.columns
    )
    return dataclasses.replace(schema, columns=columns, chunk_records=chunk_records)


def _rows_of(group: list[ColumnSpec], limit: int) -> list[list[ColumnSpec]]:
    parts: list[list[ColumnSpec]] = [[]]
    size = 0
    for c in group:
        if parts[-1] and size + c.record_nbytes > limit:
            parts.append([])
            size = 0
        parts[-1].append(c)
        size += c.record_nbytes
    return parts


def check_keys(columns: Sequence[ColumnSpec], packs: Sequence[Pack]) -> None:
    """Refuses packs whose keys a column's key (or a group above one) already uses.

    Raises:
        SchemaMismatchError: naming the leaf, and how to fix it.
    """
    keys = {p.key for p in packs}
    for c in columns:
        top = c.key.split("/", 1)[0]
        if top in keys:
            raise SchemaMismatchError(
                f"the leaf at {c.path} has the storage key {c.key!r}, which a pack array "
                f"({top!r}) would use; rename that node (pack arrays are named "
                f"{_PREFIX}<dtype>_<n>) or create the store without pack="
            )


def check_packs(packs: Sequence[Pack], columns: Sequence[ColumnSpec]) -> None:
    """Checks a stored ``packs`` section against the schema's columns (and dropped ones).

    Raises:
        CorruptStoreError: a member that is no column, of another dtype or size, packed twice,
            or members that leave a gap.
    """
    by_key = {c.key: c for c in columns}
    seen: set[str] = set()
    for p in packs:
        at = 0
        for key, offset, count in p.members:
            c = by_key.get(key)
            problem = None
            if c is None:
                problem = f"it packs {key!r}, which is no column of the schema"
            elif key in seen:
                problem = f"it packs column {c.path} a second time"
            elif (c.dtype, math.prod(c.shape)) != (p.dtype, count):
                problem = (
                    f"it packs column {c.path} ({_dtypes.describe(c.dtype, c.shape)}) as "
                    f"{count} {p.dtype.name} elements"
                )
            elif offset != at:
                problem = f"column {c.path} sits at element {offset}, not {at}"
            if problem is not None:
                raise CorruptStoreError(
                    f"the store's schema is damaged: pack {p.key}: {problem}; the schema was "
                    "edited or damaged outside pytreestore"
                )
            seen.add(key)
            at += count
        tables = {by_key[k].table for k, _, _ in p.members}
        if len(tables) > 1:
            raise CorruptStoreError(
                f"the store's schema is damaged: pack {p.key} holds columns of the tables "
                f"{sorted(map(str, tables))}; a pack holds the columns of one table"
            )
        if len(p.chunks) != 2 or not all(n >= 1 for n in p.chunks) or not p.members:
            raise CorruptStoreError(
                f"the store's schema is damaged: pack {p.key} has chunks {list(p.chunks)} "
                f"and {len(p.members)} columns"
            )


def packed_keys(packs: Sequence[Pack]) -> frozenset[str]:
    """The keys of every packed column."""
    return frozenset(key for p in packs for key, _, _ in p.members)


__all__ = [
    "PACK_LEAF_BYTES",
    "Pack",
    "check_keys",
    "check_packs",
    "check_threshold",
    "pack_tables",
    "packable",
    "packed_keys",
    "plan",
    "rechunked",
    "storage",
]
