"""Copying a store: to another place, with other chunks, another codec or another backend.

The copy reads the source in slices of whole destination chunks (host numpy, exact dtypes),
each slice's rows of every table (the record table, and a ragged or optional store's axis
tables: :func:`~pytreestore._read.tables.table_rows`, the read engine's gather), and appends
each table's rows as one batch to a new store created with the source's schema: every kind of
store the same way, and the classes named in the schema never need to be importable (a
ragged or optional store is opened with stand-ins for them:
:mod:`pytreestore._open.standins`). It commits once the rows are written: a copy that is
interrupted leaves the marker ``.pytreestore/incomplete`` in the destination until the copy
ends, so that ``copy(..., overwrite=True)`` and ``create(..., overwrite=True)`` recognise what an
interrupted copy left and replace it. A destination that overlaps the source (the same place,
or one inside the other) is refused before anything is written.

Example:
    >>> import pytreestore
    >>> with pytreestore.create("memory://doc-copy-src", {"x": 0, "y": 0.0}) as src:
    ...     src.extend({"x": i, "y": i / 4} for i in range(10))
    >>> pytreestore.copy("memory://doc-copy-src", "memory://doc-copy-dst", chunk_records=4, codec=None)
    10
    >>> dst = pytreestore.open("memory://doc-copy-dst")
    >>> dst.schema.chunk_records, dst.schema.codec, dst[9]["y"]
    (4, None, Array(2.25, dtype=float32, weak_type=True))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from pytreestore import _arguments
from pytreestore._format import compression as _compression
from pytreestore._format import compression as _packs
from pytreestore._format.columns import ColumnSpec, leaf_chunks
from pytreestore._format.compression import Pack
from pytreestore._format.ragged import OFFSETS, slot
from pytreestore._format.schema import TreeSchema
from pytreestore._inspect import progress as _progress
from pytreestore._location import Location
from pytreestore._open import schemas as _schemas
from pytreestore._open.open import create_from_schema
from pytreestore._open.standins import open_without_classes
from pytreestore._read.gather import Rows
from pytreestore._read.request import LoadRequest
from pytreestore._read.tables import table_rows
from pytreestore._runtime import RUNTIME
from pytreestore._store import TreeStore
from pytreestore._write.records import RecordWriter
from pytreestore.errors import BadLocationError

KEEP = "keep"


def copy(
    src: str | os.PathLike[str] | TreeStore,
    dst: str | os.PathLike[str],
    *,
    chunk_records: int | None = None,
    codec: str | None = KEEP,
    backend: str = "tensorstore",
    overwrite: bool = False,
    progress: bool = False,
    src_storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    pack: bool | int | str = KEEP,
    inner_chunk_bytes: int | str | None = KEEP,
) -> int:
    """Copies every record of store ``src`` into a new store at ``dst``.

    Args:
        src: the source store's path, or an open store (a writer's buffered records included).
        dst: where to create the copy.
        chunk_records: records per chunk of the copy (default: the source's).
        codec: the copy's codec, as :func:`pytreestore.create`'s (``"zstd"``, ``"blosc"``,
            ``"gzip"`` or None); ``"keep"`` (the default) keeps the source's.
        backend: the copy's storage engine.
        overwrite: replace a store already at ``dst``.
        progress: show a progress bar (records and MB/s) on standard error.
        src_storage_options: ``storage_options`` to open an ``s3://`` or ``gs://`` source
            with (see :func:`pytreestore.open`).
        dst_storage_options: ``storage_options`` to create an ``s3://`` or ``gs://`` copy with.
        pack: ``"keep"`` (the default) packs the copy's leaves as the source's are packed;
            False gives every leaf its own array (what plain zarr readers expect); True or
            an int packs small leaves as :func:`pytreestore.create`'s ``pack=`` does.
        inner_chunk_bytes: as :func:`pytreestore.create`'s; ``"keep"`` (the default): the
            source's (with a new ``codec``: plain chunks for None, else the source's).

    Returns:
        The number of records copied.

    Raises:
        ArgumentError: ``chunk_records`` or ``codec`` is invalid.
        BadLocationError: ``dst`` and ``src`` overlap: the same place, or one inside the other.
        StoreExistsError: something is at ``dst`` and ``overwrite`` is false.
    """
    progress = _progress.wanted(progress)
    if not (isinstance(codec, str) and codec == KEEP):
        codec = _compression.named(codec).name
    location = Location.parse(dst, dst_storage_options)
    location.check_writable("copy a store")
    if isinstance(src, TreeStore):
        source = src
    else:
        source = open_without_classes(src, storage_options=src_storage_options)
    try:
        options = (backend, overwrite, progress, pack, inner_chunk_bytes)
        return _copy(source, location, chunk_records, codec, *options)
    finally:
        if source is not src:
            source.close()


def _copy(
    source: TreeStore,
    location: Location,
    chunk_records: int | None,
    codec: str | None,
    backend: str,
    overwrite: bool,
    progress: bool,
    pack: bool | int | str = KEEP,
    inner: int | str | None = KEEP,
) -> int:
    context = source.read_context()
    if location.overlaps(context.location):
        raise BadLocationError(
            f"cannot copy {source.path} to {location}: the two overlap (the same place, or "
            "one inside the other), so writing the copy would delete or overwrite the "
            "source. Nothing was written; choose a destination outside the source."
        )
    schema = rechunked(
        source.schema, chunk_records, source.schema.codec if codec == KEEP else codec
    )
    schema = repacked(schema, source.schema.packs, pack)
    if inner == KEEP and codec is None:
        schema = dataclasses.replace(schema, inner_chunk_bytes=None)
    elif inner != KEEP:
        schema = dataclasses.replace(
            schema, inner_chunk_bytes=_schemas.inner_chunk_bytes(inner, schema.codec)
        )
    total = len(source)
    row_bytes = sum(c.record_nbytes for c in schema.columns)
    step = _step(schema.chunk_records, source.schema.chunk_records, row_bytes)
    request = LoadRequest.build(source.schema, policy=False, as_numpy=True)

    def fill(writer: RecordWriter) -> None:
        with _progress.progress_bar(
            total=total, desc="copy", record_nbytes=row_bytes, enabled=progress
        ) as bar:
            for start in range(0, total, step):
                stop = min(start + step, total)
                _append_rows(writer, table_rows(context, source.commit_now, request, start, stop))
                bar.advance(stop - start)

    create_from_schema(location, schema, backend=backend, overwrite=overwrite, fill=fill)
    return total


def _append_rows(writer: RecordWriter, rows: dict[str | None, Rows]) -> None:
    """Appends each table's rows read from the source (:func:`~pytreestore._read.tables.
    table_rows`) to the copy's table as one batch: leaves and presence as read, offsets as
    their ends moved to the copy's rows (a copy writes every row from row 0; the source's
    first kept record's elements may start further on, after a ``keep_last``)."""
    written = {t: len(table) for t, table in writer.tables.items()}  # before this batch
    for t, table in writer.tables.items():
        got = rows[t]
        if got.count:
            values = got.values
            table.write_batch(
                [
                    _ends(values[slot(c)], written[c.path])
                    if c.role == OFFSETS
                    else values[slot(c)]
                    for c in table.schema.columns
                ]
            )


def _ends(offsets: np.ndarray, written: int) -> np.ndarray:
    """The copy's end offsets of gathered ``(starts, ends)`` whose first row's elements go
    after the ``written`` rows of its axis's table."""
    return offsets[1] - (offsets[0][0] - written)


def _unstarted(schema: TreeSchema) -> TreeSchema:
    """``schema`` with every array (evolved or learnt) starting at row 0: a copy writes
    every row."""
    info = schema.tables
    columns = tuple(dataclasses.replace(c, start=0, default=None) for c in schema.columns)
    info = dataclasses.replace(
        info,
        axes=tuple(dataclasses.replace(a, start=0) for a in info.axes),
        presence=tuple(dataclasses.replace(p, start=0) for p in info.presence),
    )
    return dataclasses.replace(schema.with_tables(info), columns=columns)


def rechunked(schema: TreeSchema, chunk_records: int | None, codec: str | None) -> TreeSchema:
    """``schema`` with ``chunk_records`` records per chunk (None: unchanged) and ``codec``;
    in a ragged store, the record table's chunks only."""
    schema = _unstarted(schema)
    if chunk_records is None:  # a copy has no dropped columns: their data is not copied
        return dataclasses.replace(schema, codec=codec, dropped=())
    chunk_records = _arguments.count(
        chunk_records, "chunk_records must be a positive int", minimum=1
    )
    columns = tuple(
        dataclasses.replace(
            c, chunks=(chunk_records, *leaf_chunks(c.dtype, c.shape, chunk_records))
        )
        if c.table is None
        else c
        for c in schema.columns
    )
    return dataclasses.replace(
        schema, columns=columns, chunk_records=chunk_records, codec=codec, dropped=()
    )


def repacked(schema: TreeSchema, packs: tuple[Pack, ...], pack: bool | int | str) -> TreeSchema:
    """``schema`` (a copy's) packed as ``pack`` says: ``"keep"`` as ``packs`` (the source's),
    less the columns the copy lacks; False: unpacked; True or an int: packed afresh."""
    if pack == KEEP:
        kept = keep_packs(packs, schema.columns)
    else:
        limit = _packs.check_threshold(pack)
        kept = () if limit is None else _packs.plan(schema.columns, limit)
    _packs.check_keys(schema.columns, kept)
    return dataclasses.replace(schema, packs=kept)


def keep_packs(packs: tuple[Pack, ...], columns: tuple[ColumnSpec, ...]) -> tuple[Pack, ...]:
    """``packs`` holding only ``columns`` (offsets closed up; a pack of fewer than two
    columns is given up), chunked by the rows per chunk of their columns' table."""
    live = {c.key: c for c in columns}
    out = []
    for p in packs:
        members, at = [], 0
        for key, _, count in p.members:
            if key in live:
                members.append((key, at, count))
                at += count
        if len(members) >= 2:
            rows = live[members[0][0]].chunks[0]
            chunks = (rows, *leaf_chunks(p.dtype, (at,), rows))
            out.append(Pack(p.key, p.dtype, chunks, tuple(members)))
    return tuple(out)


def _step(dst_chunk: int, src_chunk: int, row_bytes: int) -> int:
    """Records per step: whole destination chunks, at least one source chunk, about 64 MiB."""
    want = max(src_chunk, RUNTIME.reads.copy_slice_bytes // max(row_bytes, 1), 1)
    return -(-want // dst_chunk) * dst_chunk


__all__ = ["KEEP", "copy", "keep_packs", "rechunked", "repacked"]
