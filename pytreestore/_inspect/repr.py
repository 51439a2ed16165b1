"""Describing a store to people: its column tree, sizes and compression, as text, HTML or JSON.

:func:`describe` gathers the facts (one :class:`ColumnInfo` per column, bytes on disk where the
location can tell them cheaply, unless told not to measure); :func:`render_text` draws them as
a tree for a terminal (``pytreestore info``) and :meth:`StoreInfo.to_json` as JSON for scripts.
The notebook view (``_repr_html_``) is :mod:`pytreestore._inspect.notebook`'s.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-repr", {"a": np.zeros(3, np.float32), "b": 0})
    >>> store.extend({"a": np.ones(3, np.float32), "b": i} for i in range(4))
    >>> info = describe(store)
    >>> [(c.path, c.dtype, c.shape, c.nbytes) for c in info.columns]
    [("['a']", 'float32', (3,), 48), ("['b']", 'int32', (), 16)]
    >>> format_bytes(info.nbytes), info.records
    ('64 B', 4)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from pytreestore._format.keys import ROOT_KEY, chunk_prefix
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore._inspect.glance import TreeRow, tree_rows
from pytreestore._inspect.printed import StaticField, static_fields
from pytreestore._log.commit_record import Commit
from pytreestore._read.reader import ReadContext
from pytreestore.backends import TensorStoreKvStore
from pytreestore.errors import PyTreeStoreError

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


class Described(Protocol):
    """What a description needs of a store (a :class:`pytreestore.TreeStore` has it)."""

    @property
    def path(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def schema(self) -> TreeSchema: ...
    def __len__(self) -> int: ...
    def read_context(self) -> ReadContext: ...
    def commit_now(self) -> Commit: ...


def _rows(store: Described, records: int) -> Callable[[ColumnSpec], int]:
    """Each column's rows: the records, or (a ragged axis's table) its committed rows."""
    commit = functools.cache(store.commit_now)  # read once, where an axis table is shown
    return lambda c: records if c.table is None else commit().rows(c.table)


@dataclasses.dataclass(frozen=True)
class ColumnInfo:
    """One column as :func:`describe` reports it.

    Attributes:
        path: the leaf's keypath (``keystr``), e.g. ``.p[0].x``.
        key: the column's storage key, e.g. ``p/0/x``.
        dtype: the dtype's name.
        shape: the per-record shape.
        chunks: the chunk shape, record axis first.
        nbytes: bytes of the column's records, uncompressed.
        stored: bytes of its chunks on disk, or None where the location cannot tell cheaply
            (or a packed leaf, whose bytes are its pack's).
        table: in a ragged store, the ragged axis whose table holds it (None: the record
            table); its rows are that axis's elements.
        role: None for a leaf; ``"offsets"``, ``"presence"`` or ``"pack"`` for the arrays
            that index a ragged store's tables or hold packed leaves.
        pack: the key of the pack holding this leaf, or None (an array of its own).
        leading: whether each record's leaf has a ragged leading axis (``shape`` leaves it
            out; the text shows it as ``*``).
    """

    path: str
    key: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    nbytes: int
    stored: int | None
    table: str | None = None
    role: str | None = None
    pack: str | None = None
    leading: bool = False

    @property
    def own_array(self) -> bool:
        """Whether it is an array on disk (not a leaf packed into another)."""
        return self.pack is None

    @property
    def ratio(self) -> float | None:
        """Compression ratio: uncompressed bytes over stored bytes (above 1 means smaller)."""
        return _ratio(self.nbytes, self.stored)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "key": self.key,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "chunks": list(self.chunks),
            "nbytes": self.nbytes,
            "stored_bytes": self.stored,
            "ratio": self.ratio,
            **({"table": self.table} if self.table is not None else {}),
            **({"role": self.role} if self.role is not None else {}),
            **({"pack": self.pack} if self.pack is not None else {}),
            **({"ragged_leading_axis": True} if self.leading else {}),
        }


@dataclasses.dataclass(frozen=True)
class StoreInfo:
    """A store as :func:`describe` reports it.

    Attributes:
        path: where the store lives.
        records: committed records (for a writer: every record appended so far).
        format_version: the on-disk format version the store was written in.
        chunk_records: records per chunk.
        codec: the compression codec, or None.
        columns: one :class:`ColumnInfo` per leaf, in column order, then one per array
            that holds no leaf of its own (a ragged store's offsets and presence arrays,
            the packs).
        disk_bytes: every byte of the store on disk (chunks and metadata), or None.
        static: the static fields the schema holds (flax ``pytree_node=False``, equinox
            ``static=True``, a registered class's static data), in tree order.
        axes: a ragged store's ragged axes (keypaths, ``[*]`` for list elements).
        optional: a ragged store's optional subtrees (keypaths).
    """

    path: str
    records: int
    format_version: int
    chunk_records: int
    codec: str | None
    columns: tuple[ColumnInfo, ...]
    disk_bytes: int | None
    static: tuple[StaticField, ...] = ()
    axes: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()

    @property
    def leaves(self) -> tuple[ColumnInfo, ...]:
        """The columns that are leaves of the records, in column order."""
        return tuple(c for c in self.columns if c.role is None)

    @property
    def nbytes(self) -> int:
        """Bytes of every array, uncompressed."""
        return sum(c.nbytes for c in self.columns if c.own_array)

    @property
    def stored(self) -> int | None:
        """Bytes of every array's chunks on disk, or None where unknown."""
        sizes = [c.stored for c in self.columns if c.own_array]
        return None if None in sizes else sum(s for s in sizes if s is not None)

    @property
    def ratio(self) -> float | None:
        """Compression ratio over all columns."""
        return _ratio(self.nbytes, self.stored)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "records": self.records,
            "format_version": self.format_version,
            "chunk_records": self.chunk_records,
            "codec": self.codec,
            "nbytes": self.nbytes,
            "stored_bytes": self.stored,
            "disk_bytes": self.disk_bytes,
            "ratio": self.ratio,
            "columns": [c.to_json() for c in self.columns],
            "static_fields": [f.to_json() for f in self.static],
            **({"ragged_axes": list(self.axes)} if self.axes else {}),
            **({"optional": list(self.optional)} if self.optional else {}),
        }


def describe(store: Described, *, measure: bool = True) -> StoreInfo:
    """Gathers what :func:`render_text` and the notebook view show about ``store``.

    Args:
        store: the store.
        measure: measure the bytes on disk (a walk of every chunk file of a local store, a
            read of every value of an in-memory one); False leaves them unknown (None), as
            the notebook view does: it shows the bytes the commit record implies.
    """
    schema, records, context = store.schema, len(store), store.read_context()
    rows = _rows(store, records)
    keys = [c.key for c in schema.storage_columns]
    stored = _stored_bytes(context, keys) if measure else {}
    packed = {k: p.key for p in schema.packs for k, _, _ in p.members}
    extra = [c for c in schema.storage_columns if c.role is not None]
    columns = tuple(
        ColumnInfo(
            path=c.path,
            key=c.key,
            dtype=c.dtype.name,
            shape=c.shape,
            chunks=c.chunks,
            nbytes=rows(c) * c.record_nbytes,
            stored=None if c.key in packed else stored.get(c.key),
            table=c.table,
            role=c.role,
            pack=packed.get(c.key),
            leading=_leading(c),
        )
        for c in (*schema.columns, *extra)
    )
    info = schema.ragged
    return StoreInfo(
        path=store.path,
        records=records,
        format_version=_format_version(context),
        chunk_records=schema.chunk_records,
        codec=schema.codec,
        columns=columns,
        disk_bytes=stored.get(""),
        static=tuple(static_fields(schema.tree, schema.tables)),
        axes=() if info is None else tuple(a.path for a in info.axes),
        optional=() if info is None else _optional_paths(info),
    )


def _leading(column: ColumnSpec) -> bool:
    """Whether a leaf of an axis's table has that ragged axis as its leading axis (its own,
    or its node's), rather than being an element's leaf of a ragged list."""
    table = column.table
    if column.role is not None or table is None:
        return False
    return column.path == table or not column.path[len(table) :].startswith("[*]")


def _optional_paths(info: Any) -> tuple[str, ...]:
    """The optional subtrees: those seen (with presence arrays) and those declared."""
    return tuple(dict.fromkeys([*(p.path for p in info.presence), *info.optional]))


def summary(store: Described) -> str:
    """The one line ``repr(store)`` prints: path, mode, records, columns, uncompressed bytes."""
    if store.closed:
        return f"TreeStore({store.path!r}, mode={store.mode!r}, closed)"
    records = len(store)
    try:  # a reader parses its schema on first use: a repr must not raise
        schema = store.schema
    except PyTreeStoreError as err:
        return (
            f"TreeStore({store.path!r}, mode={store.mode!r}, records={records}, "
            f"schema unreadable: {type(err).__name__})"
        )
    rows = _rows(store, records)
    nbytes = sum(rows(c) * c.record_nbytes for c in schema.storage_columns)
    return (
        f"TreeStore({store.path!r}, mode={store.mode!r}, records={records}, "
        f"columns={len(schema.columns)}, nbytes={format_bytes(nbytes)})"
    )


# ---- sizes -------------------------------------------------------------------------------------


def format_bytes(n: int | None) -> str:
    """``1536`` -> ``'1.5 KiB'``; None (unknown) -> ``'?'``."""
    if n is None:
        return "?"
    size, unit = float(n), 0
    while size >= 1024 and unit < len(_UNITS) - 1:
        size, unit = size / 1024, unit + 1
    return f"{n} B" if unit == 0 else f"{size:.1f} {_UNITS[unit]}"


def format_ratio(ratio: float | None) -> str:
    """``2.345`` -> ``'2.35x'``; None -> ``'-'``."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def _ratio(nbytes: int, stored: int | None) -> float | None:
    return None if not stored or not nbytes else nbytes / stored


def _stored_bytes(context: ReadContext, keys: list[str]) -> dict[str, int]:
    """Chunk bytes per column key, and every byte of the store under ``""``, where cheap.

    Local stores are measured with ``os.stat``; in-memory stores by reading their values.
    Other locations (object stores) give an empty dict: listing them could mean downloading.
    """
    location = context.location
    if location.kind == "file":
        root = Path(location.root)
        out = {key: _tree_size(root / key / "c") for key in keys}
        out[""] = _tree_size(root)
        return out
    if location.kind != "memory":
        return {}
    with context.reading() as backend:
        if not isinstance(backend, TensorStoreKvStore):
            return {}
        kvstore = backend.kvstore
        sizes = {
            bytes(k).decode(): len(kvstore.read(k).result().value) for k in kvstore.list().result()
        }
    out = {key: sum(n for k, n in sizes.items() if k.startswith(chunk_prefix(key))) for key in keys}
    out[""] = sum(sizes.values())
    return out


def _tree_size(root: Path) -> int:
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            try:
                total += os.stat(os.path.join(folder, name)).st_size
            except FileNotFoundError:  # a writer replaced it meanwhile
                continue
    return total


def _format_version(context: ReadContext) -> int:
    with context.reading() as backend:
        raw = backend.read_bytes(ROOT_KEY)
    try:
        return int(json.loads(raw)["attributes"]["pytreestore"]["format_version"])  # type: ignore[arg-type]
    except (TypeError, KeyError, ValueError) as err:
        raise PyTreeStoreError(f"cannot read the format version of {context.path}") from err


# ---- text and HTML -----------------------------------------------------------------------------

_HEADERS = ("column", "dtype", "shape", "chunks", "data", "stored", "ratio")


def _cells(c: ColumnInfo) -> tuple[str, ...]:
    return (
        c.dtype,
        _shape(("*", *c.shape) if c.leading else c.shape),
        _shape(c.chunks),
        format_bytes(c.nbytes),
        format_bytes(c.stored) if c.own_array else f"in {c.pack}",
        format_ratio(c.ratio) if c.own_array else "",
    )


def _shape(shape: Sequence[int | str]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _array_label(c: ColumnInfo) -> str:
    """An array that holds no leaf of its own, as the text and HTML tables list it."""
    table = "the record table" if c.table is None else f"the table of {c.table}"
    what = {"offsets": f"offsets of {c.path}", "presence": f"presence of {c.path}"}
    return f"{c.key}  ({what.get(c.role or '', 'pack')}, in {table})"


def _table_rows(info: StoreInfo, tree: dict[str, Any]) -> list[tuple[str, ...] | None]:
    """The rows of the column table: the tree (its leaves with their cells), then, after a
    None, the arrays that hold no leaf of their own."""
    rows: list[tuple[str, ...] | None] = [
        (r.prefix + r.label, *(_cells(info.columns[r.column]) if r.column is not None else ()))
        for r in tree_rows(tree, info.axes, info.optional)
    ]
    arrays = [c for c in info.columns if c.role is not None]
    if arrays:
        rows.append(None)
        rows += [(_array_label(c), *_cells(c)) for c in arrays]
    return rows


def _headline(info: StoreInfo) -> list[str]:
    codec = info.codec or "uncompressed"
    return [
        info.path,
        f"  {info.records:,} records · {len(info.leaves)} columns · format {info.format_version}"
        f" · {info.chunk_records:,} records per chunk · {codec}",
        f"  data {format_bytes(info.nbytes)} · stored {format_bytes(info.stored)}"
        f" ({format_ratio(info.ratio)}) · on disk {format_bytes(info.disk_bytes)}",
    ]


def render_text(info: StoreInfo, tree: dict[str, Any]) -> str:
    """The store as ``pytreestore info`` prints it: a headline, then the column tree as a
    table, then (a ragged or packed store) the arrays that hold no leaf of their own."""
    rows = _table_rows(info, tree)
    cut = rows.index(None) if None in rows else len(rows)
    tree_part = [r for r in rows[:cut] if r is not None]
    lines = [*_headline(info), "", *_aligned([_HEADERS, *tree_part])]
    arrays = [r for r in rows[cut + 1 :] if r is not None]
    if arrays:
        lines += ["", "  arrays that index the tables or hold packed leaves", *_aligned(arrays)]
    if info.static:
        lines += ["", "  static fields", *(f"    {f.text}" for f in info.static)]
    return "\n".join(lines)


def _aligned(table: list[tuple[str, ...]]) -> list[str]:
    """``table``'s rows as lines, each column padded to its widest cell (text on the left,
    numbers on the right)."""
    widths = [max(len(row[i]) for row in table if len(row) > i) for i in range(len(_HEADERS))]
    return [
        "  "
        + "  ".join(
            cell.ljust(widths[i]) if i < 4 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in table
    ]


__all__ = [
    "ColumnInfo",
    "StoreInfo",
    "TreeRow",
    "describe",
    "format_bytes",
    "format_ratio",
    "render_text",
    "summary",
    "tree_rows",
]
