"""How a column is encoded: the codec registry, and packed columns.

A store's codec as a value: the one registry from a codec to its zarr v3 codec chain, and back.

A store compresses every column with one codec, named in its schema (``"codec"``) and by
``create(codec=)``, ``copy(codec=)`` and ``pytreestore copy --codec``. Each :class:`Codec`
registered in :data:`CODECS` says which zarr v3 codec follows ``bytes`` (little-endian) in a
column's chunks, with its configuration; ``crc32c`` ends every chain. :func:`chain` writes the
chain of a column's ``zarr.json`` (one ``sharding_indexed`` codec around it with inner
chunks); :func:`parse` reads one back, for the direct reader (plain chunks are read as files)
and ``verify`` (unchecksummed chunks are reported). Adding a codec (a compressor, or another
configuration of one, such as a zstd level) is one entry here, its row in docs/format.md
("Codecs") and its name in the shipped JSON Schema (``pytreestore/schema.json``, which
docs/format.md renders): ``tests/test_compression.py`` checks that the three agree.

Example:
    >>> import numpy as np
    >>> [c["name"] for c in chain(named("zstd"), np.dtype("float32"))]
    ['bytes', 'zstd', 'crc32c']
    >>> parse(chain(named(None), np.dtype("int8")), np.dtype("int8")).plain
    True
    >>> named("lzma")
    Traceback (most recent call last):
    pytreestore.errors.ArgumentError: unknown codec 'lzma'; choose 'zstd', 'blosc', 'gzip' or None

Packed columns (format 3, ``create(pack=...)``): small fixed-shape leaves of one dtype
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
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from pytreestore import _arguments
from pytreestore._format import dtypes as _dtypes
from pytreestore._format.columns import ColumnSpec, leaf_chunks
from pytreestore.errors import (
    ArgumentError,
    CorruptStoreError,
    FormatVersionError,
    SchemaMismatchError,
)


@dataclasses.dataclass(frozen=True)
class Codec:
    """A codec of the format: how every chunk of every column of a store is compressed.

    Attributes:
        name: the codec's name in the schema and in ``create(codec=)``; None: uncompressed.
        compressor: the name of the zarr v3 codec that follows ``bytes``; None: none (the
            chunk is its elements' bytes, then their checksum).
        configuration: the compressor's ``configuration``, as ``(member, value)`` pairs.
        itemsize: the member of the configuration that takes the column's itemsize
            (blosc's ``typesize``), if any.
    """

    name: str | None
    compressor: str | None = None
    configuration: tuple[tuple[str, Any], ...] = ()
    itemsize: str | None = None

    def compressor_json(self, dtype: np.dtype) -> dict[str, Any] | None:
        """The compressor's zarr v3 JSON for a column of ``dtype`` (None: no compressor)."""
        if self.compressor is None:
            return None
        config = dict(self.configuration)
        if self.itemsize is not None:
            config[self.itemsize] = dtype.itemsize
        return {"name": self.compressor, "configuration": config}


_BY_NAME: dict[str | None, Codec] = {
    c.name: c
    for c in (
        Codec("zstd", "zstd", (("level", 3), ("checksum", False))),
        Codec(
            "blosc",
            "blosc",
            (
                ("cname", "lz4"),
                ("clevel", 5),
                ("shuffle", "shuffle"),
                ("typesize", 0),
                ("blocksize", 0),
            ),
            itemsize="typesize",
        ),
        Codec("gzip", "gzip", (("level", 5),)),
        Codec(None),
    )
}


#: every codec the format names, by name, ``create(codec=)``'s default first
#: (docs/format.md#codecs)
CODECS: Mapping[str | None, Codec] = MappingProxyType(_BY_NAME)


def choices() -> str:
    """The registered names as a message lists them: ``'zstd', 'blosc', 'gzip' or None``."""
    names = [repr(name) for name in CODECS]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _lookup(name: Any) -> Codec | None:
    """The codec called ``name`` (a str, or None), or None (an unhashable ``name`` too)."""
    if name is None or isinstance(name, str):
        return _BY_NAME.get(name)
    return None


def named(name: Any) -> Codec:
    """The codec a caller asked for (``create``, ``copy``, the CLI) by ``name``.

    Raises:
        ArgumentError: no codec is called ``name``; the message lists the choices.
    """
    codec = _lookup(name)
    if codec is None:
        raise ArgumentError(f"unknown codec {name!r:.80}; choose {choices()}")
    return codec


def stored(name: Any) -> Codec:
    """The codec a store's schema names, to write new columns with.

    Raises:
        FormatVersionError: this pytreestore knows no codec called ``name`` (a newer one
            wrote the store): its arrays can be read, new ones cannot be made.
    """
    codec = _lookup(name)
    if codec is None:
        raise FormatVersionError(
            f"the store's schema names the codec {name!r:.80}, which this pytreestore does "
            f"not write (it writes {choices()}); a newer pytreestore made the store: upgrade "
            "pytreestore to add columns to it (reading it needs no upgrade)"
        )
    return codec


def chain(
    codec: Codec, dtype: np.dtype, inner: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """The zarr v3 ``codecs`` of a column of ``dtype`` compressed with ``codec``: ``bytes``
    (little-endian), the compressor, ``crc32c``; or, with ``inner`` (an inner chunk's shape),
    one ``sharding_indexed`` codec applying that chain to each inner chunk, whose index (at
    the end of the shard, the zarr v3 default) is checksummed too.

    Example:
        >>> chain(named(None), np.dtype("float32"))
        [{'name': 'bytes', 'configuration': {'endian': 'little'}}, {'name': 'crc32c'}]
    """
    compressor = codec.compressor_json(dtype)
    plain = {"name": "bytes", "configuration": {"endian": "little"}}
    if compressor is None:
        chunk = [plain, {"name": "crc32c"}]
    else:
        chunk = [plain, compressor, {"name": "crc32c"}]
    if inner is None:
        return chunk
    configuration = {
        "chunk_shape": list(inner),
        "codecs": chunk,
        "index_codecs": [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "crc32c"},
        ],
    }
    return [{"name": "sharding_indexed", "configuration": configuration}]


@dataclasses.dataclass(frozen=True)
class Chain:
    """What a column's zarr v3 ``codecs`` say, read back by :func:`parse`.

    Attributes:
        codec: the registered codec whose chain each (inner) chunk has; None: a chain that
            pytreestore does not write (another compressor or configuration, no checksum...).
        sharded: each chunk is a ``sharding_indexed`` shard of inner chunks.
        checksummed: each (inner) chunk ends in a ``crc32c`` checksum.
    """

    codec: Codec | None
    sharded: bool
    checksummed: bool

    @property
    def plain(self) -> bool:
        """Whether each chunk is its elements' little-endian bytes then their ``crc32c``:
        uncompressed, unsharded, checksummed (the direct reader reads such chunks as files)."""
        return self.codec is CODECS[None] and not self.sharded


def parse(codecs: Any, dtype: np.dtype) -> Chain:
    """Reads back the ``codecs`` of a column of ``dtype`` (its ``zarr.json``'s, or what an
    engine reports); never raises, whatever the JSON holds.

    Example:
        >>> parse(chain(named("blosc"), np.dtype("int16"), (4,)), np.dtype("int16")).codec.name
        'blosc'
    """
    if not isinstance(codecs, list) or not all(isinstance(c, dict) for c in codecs):
        return Chain(None, False, False)
    shard = next((c for c in codecs if c.get("name") == "sharding_indexed"), None)
    if shard is not None:  # each inner chunk has its own chain
        configuration = shard.get("configuration")
        inner = parse(
            configuration.get("codecs") if isinstance(configuration, dict) else None, dtype
        )
        ours = len(codecs) == 1 and not inner.sharded
        return Chain(inner.codec if ours else None, True, inner.checksummed)
    checksummed = any(c.get("name") == "crc32c" for c in codecs)
    codec = next((c for c in CODECS.values() if _is_chain(codecs, c, dtype)), None)
    return Chain(codec, False, checksummed)


def _is_chain(chunk: list[dict[str, Any]], codec: Codec, dtype: np.dtype) -> bool:
    """Whether ``chunk`` is ``codec``'s chain: ``bytes`` (little-endian; the endianness may
    be left out, as it is for one-byte types), the compressor as configured, ``crc32c``."""
    compressor = codec.compressor_json(dtype)
    middle = [] if compressor is None else [compressor]
    if len(chunk) != len(middle) + 2 or chunk[1:] != [*middle, {"name": "crc32c"}]:
        return False
    first = chunk[0]
    config = first.get("configuration", {})
    endian = config.get("endian", "little") if isinstance(config, dict) else None
    return first.get("name") == "bytes" and (endian == "little" or dtype.itemsize == 1)


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
    "CODECS",
    "PACK_LEAF_BYTES",
    "Chain",
    "Codec",
    "Pack",
    "chain",
    "check_keys",
    "check_packs",
    "check_threshold",
    "choices",
    "named",
    "pack_tables",
    "packable",
    "packed_keys",
    "parse",
    "plan",
    "rechunked",
    "storage",
    "stored",
]
