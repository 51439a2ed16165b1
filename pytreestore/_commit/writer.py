"""Buffering records into chunk-sized blocks, and the commit protocol.

A writer keeps one row buffer per column covering exactly one chunk of the record axis,
``[start, start + chunk_records)``. Rows below the committed count that share the tail chunk
stay in the buffer, so every chunk is always written whole: a chunk write replaces the chunk's
object in one atomic put, and committed rows in it are rewritten with their own values.

The protocol of one write, for any number of records:

1. resize every column's record axis to the new length (metadata only; a resize that grows
   only grows, so a writer that is behind another fails here);
2. write every column's chunks, all at once, and wait for all of them;
3. write the commit record ``.pytreestore/commit.json`` (one atomic put), on backends that
   can, *conditionally*: only if it is still the version this writer last read or wrote.
   Otherwise another writer has committed, and :class:`CommitConflictError` is raised with
   nothing committed, so two writers can never both commit.

Readers trust only the commit record. A crash before step 3 leaves the previous commit in
force, with harmless bytes past it that the next writer trims and overwrites.

Example:
    >>> import numpy as np
    >>> from pytreestore._open.location import Location
    >>> from pytreestore._format.schema import TreeSchema
    >>> from pytreestore.backends import TensorStoreBackend
    >>> schema = TreeSchema.from_example({"x": 0}, chunk_records=4)
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-write"))
    >>> backend.create_columns(layouts(schema))
    >>> w = Writer(backend, schema, Commit(0, 0))
    >>> for i in range(6):
    ...     w.append([i])
    >>> w.flush(); w.commit.records
    6
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from pytreestore._format import dtypes as _dtypes
from pytreestore._format.names import COMMIT_KEY
from pytreestore._format.schema import FORMAT_VERSION, TreeSchema
from pytreestore._tree.convert import LeafCaster, RecordError, RowFiller, casters
from pytreestore.backends import Backend, ColumnLayout, ConditionalWrites
from pytreestore.errors import (
    ChunkSizeError,
    CommitConflictError,
    CorruptStoreError,
    StorageError,
)

_STORE_ID = re.compile("[0-9a-f]{32}")


@dataclasses.dataclass(frozen=True)
class Commit:
    """The commit record: how many records are durable, how many commits came before, and
    (format 2) the store's identity, a random id chosen by ``create`` that every commit keeps,
    so that a reader notices a store replaced under it (``create(overwrite=True)``)."""

    records: int
    generation: int
    store: str | None = None

    def to_bytes(self) -> bytes:
        obj: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "records": self.records,
            "generation": self.generation,
        }
        if self.store is not None:
            obj["store"] = self.store
        return json.dumps(obj).encode()

    def next(self, records: int) -> Commit:
        """The commit after this one, holding ``records`` records."""
        return Commit(records, self.generation + 1, self.store)

    @classmethod
    def read(cls, backend: Backend, where: str) -> Commit:
        return cls.from_bytes(backend.read_bytes(COMMIT_KEY), where)

    @classmethod
    def from_bytes(cls, raw: bytes | None, where: str) -> Commit:
        if raw is None:
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is missing: the store was never committed"
            )
        try:
            obj = json.loads(raw)
        except ValueError as err:
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: {err}"
            ) from err
        if not isinstance(obj, dict):
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: expected a JSON object, "
                f"got {type(obj).__name__}"
            )
        records, generation = (_count(obj, name, where) for name in ("records", "generation"))
        store = obj.get("store")
        if store is not None and not (isinstance(store, str) and _STORE_ID.fullmatch(store)):
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: its 'store' must be 32 "
                f"lowercase hex digits, got {json.dumps(store)}. The store was damaged outside "
                "pytreestore; restore the file from a backup (nothing was read or written)."
            )
        return cls(records, generation, store)


def _count(obj: dict[str, Any], name: str, where: str) -> int:
    """``obj[name]`` if it is an int (not a bool) in ``[0, 2**63)``, else CorruptStoreError."""
    value = obj.get(name)
    if type(value) is not int or not 0 <= value < 2**63:
        raise CorruptStoreError(
            f"{where}/{COMMIT_KEY} is not a valid commit record: its {name!r} must be an "
            f"integer in [0, 2**63), got {json.dumps(value)}. The store was damaged outside "
            "pytreestore; restore the file from a backup (nothing was read or written)."
        )
    return value


def layouts(schema: TreeSchema) -> list[ColumnLayout]:
    """The on-disk layout of every column of ``schema``."""
    return [
        ColumnLayout(
            key=c.key,
            dtype=c.dtype,
            shape=c.shape,
            chunks=c.chunks,
            codec=schema.codec,
            dimension_names=tuple(c.dimension_names),
            fill_value=_dtypes.fill_value(c.dtype) if c.default is None else c.default,
        )
        for c in schema.columns
    ]


def buffer_nbytes(schema: TreeSchema) -> int:
    """The bytes of a writer's buffers: one chunk of every column."""
    return schema.chunk_records * sum(c.record_nbytes for c in schema.columns)


def check_buffer(schema: TreeSchema, where: str) -> None:
    """Refuses a ``chunk_records`` whose writer buffer would not fit in half this machine's
    memory, before anything is written.

    Raises:
        ChunkSizeError: the buffer is too large; the message gives the sizes and the fix.
    """
    need, memory = buffer_nbytes(schema), physical_memory()
    if need <= memory // 2:
        return
    per_record = sum(c.record_nbytes for c in schema.columns)
    fits = max(1, memory // 2 // max(per_record, 1))
    raise ChunkSizeError(
        f"chunk_records={schema.chunk_records} for {where} needs a writer buffer of "
        f"{_gib(need)} (one chunk of every column, {per_record} bytes per record), more than "
        f"half of this machine's memory ({_gib(memory)}). Nothing was written. Pass a smaller "
        f"chunk_records (at most {fits} here), or leave it out for chunks of about 4 MiB."
    )


def physical_memory() -> int:
    """This machine's memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.3g} GiB"


def _buffers(schema: TreeSchema) -> list[np.ndarray]:
    try:
        return [np.empty((schema.chunk_records, *c.shape), c.dtype) for c in schema.columns]
    except MemoryError as err:
        raise ChunkSizeError(
            f"cannot allocate the writer buffer of {_gib(buffer_nbytes(schema))} (one chunk "
            f"of every column at chunk_records={schema.chunk_records}): out of memory. Free "
            "memory, or open the store read-only."
        ) from err


class Writer:
    """Appends rows to a store's columns through ``backend``, committing as it goes."""

    def __init__(self, backend: Backend, schema: TreeSchema, commit: Commit) -> None:
        self._backend = backend
        self._keys = [c.key for c in schema.columns]
        self.chunk = schema.chunk_records
        self.casters: list[LeafCaster] = casters(schema.columns)
        self.buffers = _buffers(schema)
        self.filler = RowFiller(self.casters, self.buffers)
        self.commit = commit
        self.start = commit.records - commit.records % self.chunk
        self._token = commit_token(backend, commit, "this store")
        self._uncertain: Commit | None = None  # a commit whose write failed midway
        self._snap: tuple[int, int] | None = None  # the position of the last snapshot
        self._saved: list[np.ndarray] | None = None  # its buffered rows, once overwritten
        self.fill = commit.records - self.start
        if self.fill:
            tail = backend.read(self._keys, slice(self.start, commit.records), commit.records)
            for buf, rows in zip(self.buffers, tail):
                buf[: self.fill] = rows

    def __len__(self) -> int:
        return self.start + self.fill

    @property
    def pending(self) -> int:
        """Records appended but not yet committed."""
        return len(self) - self.commit.records

    def append(self, leaves: Sequence[Any]) -> None:
        """Buffers one record's (already structure-checked) leaves."""
        if self.fill == self.chunk:
            self._write_chunk(commit=True)
        self.filler.fill(leaves, self.fill)
        self.fill += 1

    def append_many(self, leaves_iter: Iterator[Sequence[Any]]) -> None:
        """Buffers records from an iterator of leaf lists, committing once at the end.

        Records are taken a buffer's worth at a time and copied column by column.

        Raises:
            RecordError: a record was refused; ``index`` counts from the iterator's start.
        """
        done = 0
        while True:
            if self.fill == self.chunk:
                self._write_chunk(commit=False)
            rows = list(itertools.islice(leaves_iter, self.chunk - self.fill))
            if not rows:
                break
            try:
                self.filler.fill_block(rows, self.fill)
            except RecordError as err:
                raise RecordError(done + err.index, err.error) from err.error
            self.fill += len(rows)
            done += len(rows)
        if self.start > self.commit.records:
            self._commit(self.start)

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        """Appends already-checked column blocks with a common leading length."""
        count = len(blocks[0]) if blocks else 0
        done = 0
        while done < count:
            if self.fill == self.chunk:
                self._write_chunk(commit=False)
            if self.fill == 0 and count - done >= self.chunk:
                whole = (count - done) // self.chunk * self.chunk
                end = self.start + whole
                self._backend.resize(self._keys, end)
                self._backend.write(
                    self._keys, self.start, [b[done : done + whole] for b in blocks]
                )
                self.start, done = end, done + whole
                continue
            take = min(self.chunk - self.fill, count - done)
            for buf, block in zip(self.buffers, blocks):
                buf[self.fill : self.fill + take] = block[done : done + take]
            self.fill, done = self.fill + take, done + take
        if self.fill == self.chunk:
            self._write_chunk(commit=False)
        if self.start > self.commit.records:
            self._commit(self.start)

    def flush(self) -> None:
        """Writes every buffered record and commits them."""
        if self.pending == 0:
            return
        end = len(self)
        self._backend.resize(self._keys, end)
        self._backend.write(self._keys, self.start, [b[: self.fill] for b in self.buffers])
        self._commit(end)
        if self.fill == self.chunk:
            self.start, self.fill = end, 0

    def snapshot(self) -> tuple[int, int]:
        """The position to :meth:`rollback` to if a multi-record append fails."""
        self._snap, self._saved = (self.start, self.fill), None
        return self._snap

    def rollback(self, position: tuple[int, int]) -> None:
        """Forgets every uncommitted record appended since ``position`` was taken.

        Rows buffered before ``position`` survive: if their chunk was written since, they are
        read back from it.
        """
        start, fill = position
        if start != self.start and fill:
            rows = self._saved if position == self._snap and self._saved else None
            if rows is None:
                rows = self._backend.read(self._keys, slice(start, start + fill), start + fill)
            for buf, block in zip(self.buffers, rows):
                buf[:fill] = block
        self.start, self.fill = start, fill
        self._snap, self._saved = None, None
        if self._token is not None:  # never trim records another writer has committed
            commit_token(self._backend, self.commit, "this store")
        with contextlib.suppress(StorageError):  # rows past the commit are harmless
            self._backend.resize(self._keys, self.commit.records)

    def _write_chunk(self, *, commit: bool) -> None:
        snap = self._snap
        if not commit and snap and snap[1] and snap[0] == self.start and self._saved is None:
            # the rows buffered before an extend are about to be overwritten: keep them, so
            # a rollback needs no read (which fails when storage is what failed)
            self._saved = [b[: snap[1]].copy() for b in self.buffers]
        end = self.start + self.chunk
        self._backend.resize(self._keys, end)
        self._backend.write(self._keys, self.start, self.buffers)
        if commit:
            self._commit(end)
        self.start, self.fill = end, 0

    def _commit(self, records: int) -> None:
        commit = self.commit.next(records)
        if self._token is None:
            self._backend.write_bytes(COMMIT_KEY, commit.to_bytes())
        else:
            self._token = self._commit_if_unchanged(commit)
        self.commit = commit

    def _commit_if_unchanged(self, commit: Commit) -> bytes:
        """Writes the commit record only if nobody else wrote it since this writer did."""
        assert self._token is not None
        backend = self._backend
        assert isinstance(backend, ConditionalWrites)  # a token comes only from such a backend
        try:
            token = backend.write_bytes_if(COMMIT_KEY, commit.to_bytes(), self._token)
        except StorageError:
            self._uncertain = commit  # the write may have landed before the error
            raise
        if token is not None:
            self._uncertain = None
            return token
        raw, token = backend.read_bytes_versioned(COMMIT_KEY)
        if self._uncertain == commit and raw is not None and Commit.from_bytes(raw, "") == commit:
            self._uncertain = None  # our own earlier attempt landed
            return token
        found = Commit.from_bytes(raw, "this store")
        raise CommitConflictError(
            f"another writer committed to this store while this one was writing: the commit "
            f"record holds {found.records} records (commit {found.generation}), this writer "
            f"expected commit {self.commit.generation} and was about to commit "
            f"{commit.records} records. Nothing was committed by this writer; its uncommitted "
            "records are lost. Reopen the store to append after the other writer's records."
        )


def commit_token(backend: Backend, commit: Commit, where: str) -> bytes | None:
    """The storage generation of the commit record ``commit`` was read from.

    None for backends without conditional writes (the writer then commits unconditionally).
    Raises :class:`CommitConflictError` if the record changed since ``commit`` was read.
    """
    if not isinstance(backend, ConditionalWrites):
        return None
    raw, token = backend.read_bytes_versioned(COMMIT_KEY)
    if raw is None and (commit.records, commit.generation) == (0, 0):
        return token  # the generation of a missing key: the first commit creates it
    found = Commit.from_bytes(raw, where)
    if (found.records, found.generation) != (commit.records, commit.generation):
        raise CommitConflictError(
            f"another writer committed to {where} since this writer read its commit record "
            f"({found.records} records now, {commit.records} then). Nothing was committed by "
            "this writer; open the store again to append after the other writer's records"
        )
    return token
