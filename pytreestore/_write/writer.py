"""Buffering records into chunk-sized blocks; each write ends in a commit.

A writer keeps one row buffer per column covering exactly one chunk of the record axis,
``[start, start + chunk_records)``. Rows below the committed count that share the tail chunk
stay in the buffer, so every chunk is always written whole: a chunk write replaces the chunk's
object in one atomic put, and committed rows in it are rewritten with their own values.

Every write follows the commit protocol (:mod:`pytreestore._log.protocol`, step 6): resize
the columns, write their chunks, then commit through a
:class:`~pytreestore._log.committer.Committer`, conditionally where the backend can.

Example:
    >>> import numpy as np
    >>> from pytreestore._log.protocol import layouts
    >>> from pytreestore._location import Location
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
import functools
import itertools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np

from pytreestore import _threads as _exiting
from pytreestore._format import validate as _validate
from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._log.committer import Committer, atomic
from pytreestore._tree.convert import LeafCaster, RecordError, RowFiller, casters
from pytreestore._tree.device import DeviceLeaves, LostLeaf
from pytreestore._write.background import LOST, ChunkWrites, Filling, HandOff
from pytreestore._write.roles import Block, Held, Position, Row
from pytreestore.backends import Backend
from pytreestore.errors import ChunkSizeError, ForkedWriterError, StorageError


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


class TableCommitter(Protocol):
    """What commits a table writer's rows: the store's :class:`Committer` (a fixed store's
    one table), or a ragged store's :class:`~pytreestore._write.commits.TableCommits`."""

    @property
    def commit(self) -> Commit: ...

    @property
    def holding(self) -> bool: ...

    def advance(self, records: int) -> Commit: ...

    def release(self) -> None: ...

    def check(self) -> None: ...


class Writer:
    """Appends rows to a store's columns through ``backend``, committing as it goes."""

    def __init__(
        self,
        backend: Backend,
        schema: TreeSchema,
        commit: Commit,
        committer: TableCommitter | None = None,
        *,
        background: bool = False,
        writes: ChunkWrites | None = None,
    ) -> None:
        """``committer`` replaces the writer's own :class:`Committer` (the tables of a
        :class:`~pytreestore._write.records.RecordWriter` commit together); ``background``:
        full chunks are written and committed on a background thread
        (:mod:`pytreestore._write.background`), and device arrays appended are fetched there
        (:mod:`pytreestore._tree.device`); ``writes``: the queue of background jobs, shared by
        the tables of one record writer (chunks it hands over with :meth:`hand_over` and
        :meth:`hand_partial`; every write of this writer waits for the queue first)."""
        self._backend = backend
        self.schema = schema
        self._keys = [c.key for c in schema.columns]
        self.chunk = schema.chunk_records
        self.casters: list[LeafCaster] = casters(schema.columns)
        self._background = background
        self._committer: TableCommitter = committer or Committer(
            backend, commit, _validate.id_of(schema), tree=schema
        )
        start = commit.records - commit.records % self.chunk
        buffers = _buffers(schema)
        filler = RowFiller(self.casters, buffers, DeviceLeaves() if background else None)
        self.at = Filling(buffers, start, commit.records - start, filler)
        self._handoff = HandOff(
            self.at,
            self.chunk,
            [c.path for c in schema.columns],
            writes if writes is not None else ChunkWrites(),
            put=self._put,
            new_buffers=self.new_buffers,
            first=self._first,
        )
        self.writes = self._handoff.writes
        self._snap: Position | None = None  # the position of the last snapshot
        self._saved: list[np.ndarray] | None = None  # its buffered rows, once overwritten
        self._stored = -1  # the rows on storage as buffered (written past the commit), if all
        if self.fill:
            tail = backend.read(self._keys, slice(start, commit.records), commit.records)
            for buf, rows in zip(self.buffers, tail):
                buf[: self.fill] = rows

    # ---- the chunk being filled (shared with the hand-off) -------------------------------------

    @property
    def buffers(self) -> list[np.ndarray]:
        """One chunk of every column: the rows from :attr:`start`."""
        return self.at.buffers

    @property
    def start(self) -> int:
        """The first row of the chunk being filled."""
        return self.at.start

    @start.setter
    def start(self, row: int) -> None:
        self.at.start = row

    @property
    def fill(self) -> int:
        """The rows filled of the chunk."""
        return self.at.fill

    @fill.setter
    def fill(self, rows: int) -> None:
        self.at.fill = rows

    @property
    def filler(self) -> RowFiller:
        return self.at.filler

    # ---- what runs in the background (:mod:`pytreestore._write.background`) ----------------------

    def settle(self) -> None:
        """Waits for every chunk handed over (:meth:`HandOff.settle`)."""
        self._handoff.settle()

    def check_writes(self, *, refused: bool = False) -> None:
        """Raises a background write's failure no call has reported yet."""
        self._handoff.check_writes(refused=refused)

    def hand_over(self) -> None:
        """Hands the full chunk to the background writer (:meth:`HandOff.hand_over`)."""
        self._handoff.hand_over()

    def buffered_rows(self) -> Held:
        """The rows only memory holds, for a read (:meth:`HandOff.buffered_rows`)."""
        return self._handoff.buffered_rows()

    def _full(self) -> None:
        """Reports a background write's failure; then, with the chunk full, hands it to the
        background writer (or writes and commits it here)."""
        self.check_writes(refused=True)
        if self.fill < self.chunk:
            return
        if self._background:
            self.hand_over()
        else:
            self._write_chunk(commit=True)

    def _fetch_kept(self) -> None:
        self._handoff.fetch_kept()

    def __len__(self) -> int:
        return self.start + self.fill

    def new_buffers(self) -> list[np.ndarray]:
        """Fresh buffers of one chunk of every column."""
        return _buffers(self.schema)

    def _first(self) -> int:
        """The row of record 0 in this writer's table (0 but in a record table whose front
        ``keep_last`` released)."""
        return self.commit.first

    @property
    def committer(self) -> TableCommitter:
        """What commits this writer's rows."""
        return self._committer

    @property
    def commit(self) -> Commit:
        """The last commit (of this writer, or the one it was opened at)."""
        return self._committer.commit

    @property
    def pending(self) -> int:
        """Records appended but not yet committed."""
        return len(self) - self.commit.records

    def append(self, leaves: Row) -> None:
        """Buffers one record's (already structure-checked) leaves.

        Raises:
            StorageError: (and any failure of a chunk's write on the background thread) a
                chunk could not be written; this record is not appended, every record before
                it is kept, and the next call retries the write.
            DeviceFetchError: a device array of this record, or of a chunk written in the
                background, could not be fetched (DeletedArrayError: this record's is
                deleted); the records from that one on are dropped, and this one too.
        """
        at = self.at
        if at.fill == self.chunk or self.writes.failed is not None:
            self._full()
        try:
            at.filler.fill(leaves, at.fill)
        except LostLeaf as err:
            raise self._handoff.lost(err) from None
        at.fill += 1

    def append_many(self, leaves_iter: Iterator[Row]) -> None:
        """Buffers records from an iterator of leaf lists, committing once at the end.

        Records are taken a buffer's worth at a time and copied column by column.

        Raises:
            RecordError: a record was refused; ``index`` counts from the iterator's start.
        """
        self.settle()
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

    def append_blocks(self, blocks: Iterator[Block]) -> None:
        """Buffers records given a block at a time as columns (``(columns, count)``: per
        column, each record's value), committing once at the end.

        Raises:
            RecordError: a record was refused; ``index`` counts from the first block's start.
        """
        self.settle()
        done = 0
        for columns, count in blocks:
            taken = 0
            while taken < count:
                if self.fill == self.chunk:
                    if _exiting.STOPPING.is_set():  # an endless extend must not hold the exit
                        raise _exiting.stopped(done + taken)
                    self._write_chunk(commit=False)
                take = min(self.chunk - self.fill, count - taken)
                part = columns if take == count else [c[taken : taken + take] for c in columns]
                try:
                    self.filler.fill_columns(part, self.fill, take)
                except RecordError as err:
                    raise RecordError(done + err.index, err.error) from err.error
                self.fill, taken, done = self.fill + take, taken + take, done + take
        if self.fill == self.chunk:  # a full last chunk is written too, as append_many does
            self._write_chunk(commit=False)
        if self.start > self.commit.records:
            self._commit(self.start)

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        """Appends already-checked column blocks with a common leading length (on a backend
        with transactions, as one atomic step: the caller rolls back if it fails)."""
        count = len(blocks[0]) if blocks else 0
        if self.fill + count < self.chunk:  # rows that stay buffered: nothing to make atomic,
            self.check_writes(refused=True)  # nothing written, nothing to commit, no waiting
            self._fetch_kept()
            for buf, block in zip(self.buffers, blocks):  # nothing written, nothing to commit
                buf[self.fill : self.fill + count] = block
            self.fill += count
            return
        self.settle()
        with atomic(self._backend):
            self._write_all(blocks)

    def _write_all(self, blocks: Sequence[np.ndarray]) -> None:
        """Writes the buffered rows and every row of ``blocks``, the partial tail chunk with
        the whole ones, and advances the committer to them: one resize, one round of chunk
        writes, one commit (the store's :class:`Committer`; a table of several, whose
        record writer commits them together, :class:`~pytreestore._write.commits.TableCommits`,
        commits nothing here), and nothing left for ``flush``/``close`` to write.

        The tail rows stay buffered (chunks are always written whole: the next write of the
        tail chunk rewrites them), so a later flush or chunk write is unchanged; until a row
        is appended or rolled back, a flush commits them without writing them again."""
        count, start, fill = len(blocks[0]), self.start, self.fill
        end = start + fill + count
        head = min(self.chunk - fill, count) if fill else 0  # rows topping up the buffer
        for buf, block in zip(self.buffers, blocks):
            buf[fill : fill + head] = block[:head]
        self._committer.release()
        self._backend.resize(self._keys, end)
        if fill:
            self._backend.write(self._keys, start, [b[: fill + head] for b in self.buffers])
        if count > head:
            self._backend.write(self._keys, start + fill + head, [b[head:] for b in blocks])
        new_start = end - (end - start) % self.chunk if end - start >= self.chunk else start
        if new_start != start:  # the buffer now covers the tail chunk: its rows from blocks
            snap = self._snap
            if snap and snap[1] and snap[0] == start and self._saved is None:
                self._saved = [b[: snap[1]].copy() for b in self.buffers]  # for a rollback
            for buf, block in zip(self.buffers, blocks):
                buf[: end - new_start] = block[count - (end - new_start) :]
        self.start, self.fill = new_start, end - new_start
        self._stored = end
        self._commit(end)

    def flush(self) -> None:
        """Writes every buffered record and commits them.

        Raises:
            DeviceFetchError: a device array appended could not be fetched (its computation
                failed; DeletedArrayError: it was deleted); the records before it are
                committed first, it and those after it dropped.
        """
        try:
            self.settle()
        except LOST as err:
            self._flush()  # what is kept is acknowledged: committed before the error
            raise err from None
        self._flush()

    def _flush(self) -> None:
        if self.pending == 0:
            return
        end = len(self)
        if end == self._stored:  # written by write_batch, as buffered: commit them only
            self._commit(end)
            return
        self._put(self.start, [b[: self.fill] for b in self.buffers], end)
        if self.fill == self.chunk:
            self.start, self.fill = end, 0

    def snapshot(self) -> Position:
        """The position to :meth:`rollback` to if a multi-record append fails (the chunks
        handed over stay in flight: a rollback waits for them)."""
        if self.filler.device is not None:  # a cut at a device array moves the position
            self.settle()
        else:
            self.check_writes()
        self._snap, self._saved = (self.start, self.fill), None
        return self._snap

    def rollback(self, position: Position) -> None:
        """Forgets every uncommitted record appended since ``position`` was taken.

        Rows buffered before ``position`` survive: if their chunk was written since, they are
        read back from it.
        """
        left = self.writes.wait_idle()  # rows handed over: written, or failed and kept
        start, fill = position
        if start != self.start and fill:
            rows = self._saved if position == self._snap and self._saved else None
            if rows is None:
                rows = self._backend.read(self._keys, slice(start, start + fill), start + fill)
            for buf, block in zip(self.buffers, rows):
                buf[:fill] = block
        self.start, self.fill = start, fill
        self._snap, self._saved, self._stored = None, None, -1
        self._committer.check()  # never trim records another writer has committed
        if self._committer.holding or left:
            return  # rows past the commit are older versions', or a failed job's to retry
        with contextlib.suppress(StorageError):  # rows past the commit are harmless
            self._backend.resize(self._keys, self.commit.records)

    def hand_partial(self) -> Callable[[], None] | None:
        """A job writing a copy of the rows buffered and not yet committed (their chunk is
        rewritten whole when it fills), for the background writer; None when there are none.
        """
        if self.fill == 0 or self.pending == 0:
            return None
        blocks = [b[: self.fill].copy() for b in self.buffers]
        return functools.partial(self._put, self.start, blocks, len(self), commit=False)

    def _write_chunk(self, *, commit: bool) -> None:
        if len(self.writes):
            self.settle()  # after the chunks handed over, in order
        self._fetch_kept()
        snap = self._snap
        if not commit and snap and snap[1] and snap[0] == self.start and self._saved is None:
            # the rows buffered before an extend are about to be overwritten: keep them, so
            # a rollback needs no read (which fails when storage is what failed)
            self._saved = [b[: snap[1]].copy() for b in self.buffers]
        end = self.start + self.chunk
        self._put(self.start, self.buffers, end, commit=commit)
        self.start, self.fill = end, 0

    def _put(
        self, start: int, blocks: Sequence[np.ndarray], end: int, *, commit: bool = True
    ) -> None:
        """Step 6 of the commit protocol for rows ``[start, end)`` of ``blocks``: the rows of
        older versions released if held, the columns grown to ``end``, the rows written, then
        (``commit``) ``end`` records committed; one atomic step where the backend can."""
        with atomic(self._backend):
            self._committer.release()
            self._backend.resize(self._keys, end)
            self._backend.write(self._keys, start, blocks)
            if commit:
                self._commit(end)

    def _commit(self, records: int) -> None:
        self._committer.advance(records)


def forked_writer(path: str, pid: int) -> ForkedWriterError:
    """The error for a writer used in a process forked from ``pid``, the one that opened it."""
    return ForkedWriterError(
        f"store {path} was opened for appending by process {pid}, and this process "
        f"({os.getpid()}) was forked from it: only the process that opened a writer may "
        "append to it (here it reads the records committed before the fork). Open the store "
        "again here (pytreestore.open(path) to read; mode='a' once the parent has closed it)"
    )
