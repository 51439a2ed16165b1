"""A fixed store's full chunks handed to the background writer, and the device arrays kept
for them: the part of the table writer (:class:`~pytreestore._commit.writer.Writer`) that runs
off the caller's thread (issue 32).

``append`` hands a full chunk over (:meth:`HandOff._full`) and goes on with a spare buffer; the
background job (:mod:`pytreestore._commit.chunk_writes`) fetches the chunk's device arrays
(:mod:`pytreestore._tree.device`), then writes and commits it as the writer's own
``_write_chunk`` would. A failure is reported by the writer's next call
(:meth:`HandOff.check_writes`); a device array that cannot be fetched (its computation
failed, or it was deleted) cuts the records there: it and every record after it are dropped,
those before it kept and committed (:meth:`HandOff._cut_handed`, :meth:`HandOff._lost`); the
error names the record, the keypath and the records dropped. :meth:`HandOff.settle`
waits for everything handed over and fetches the device arrays of the chunk being filled:
every other write of the writer starts with it.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-handoff", {"x": np.int32(0)}, chunk_records=2)
    >>> for i in range(5):
    ...     store.append({"x": np.int32(i)})
    >>> writer = store._core.writer.tables[None]
    >>> writer.settle(); store.committed
    4
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np

from pytreestore._commit.chunk_writes import ChunkWrites
from pytreestore._tree.convert import RowFiller
from pytreestore._tree.device import Kept, LostLeaf, fetch, lost_error
from pytreestore.errors import DeletedArrayError, DeviceFetchError

#: the errors of a record whose device array could not be fetched
LOST = (DeletedArrayError, DeviceFetchError)


@dataclasses.dataclass
class Chunk:
    """A full chunk handed to the background writer: its first row, its buffers, and the
    device arrays still to fetch into them."""

    start: int
    buffers: list[np.ndarray]
    kept: list[Kept]


class HandOff:
    """The background side of a table writer; the writer gives the attributes below."""

    buffers: list[np.ndarray]
    start: int
    fill: int
    chunk: int
    filler: RowFiller
    writes: ChunkWrites
    _background: bool
    _paths: list[str]
    _spares: list[list[np.ndarray]]
    _chunks: dict[int, Chunk]

    new_buffers: Callable[[], list[np.ndarray]]
    _write_chunk: Callable[..., None]
    _put: Callable[..., None]

    def _full(self) -> None:
        """Reports a background write's failure; then, with the chunk full, hands it to the
        background writer (or writes and commits it here)."""
        self.check_writes(refused=True)
        if self.fill < self.chunk:
            return
        if not self._background:
            self._write_chunk(commit=True)
            return
        self.hand_over()

    def hand_over(self) -> None:
        """Hands the full chunk being filled to the background writer and goes on with a
        spare buffer; the job writes the chunk and commits it as the writer's ``_put``."""
        device = self.filler.device
        chunk = Chunk(self.start, self.buffers, device.take() if device is not None else [])
        self._chunks[chunk.start] = chunk
        self.writes.submit(functools.partial(self._write_handed, chunk))
        self.buffers = self._spares.pop() if self._spares else self.new_buffers()
        self.filler.use(self.buffers)
        self.start, self.fill = chunk.start + self.chunk, 0

    def _write_handed(self, chunk: Chunk) -> None:
        """The background job of a chunk handed over: its device arrays fetched, then its
        write and commit (the writer's ``_put``, as its own chunk writes)."""
        if chunk.kept:
            fetch(chunk.buffers, chunk.kept)
            chunk.kept = []
        self._put(chunk.start, chunk.buffers, chunk.start + self.chunk)
        del self._chunks[chunk.start]
        self._spares.append(chunk.buffers)

    def check_writes(self, *, refused: bool = False) -> None:
        """Raises the failure of a background write no call has reported yet (``refused``:
        the caller's record is not appended, and the error says so).

        Raises:
            DeviceFetchError: a chunk's device array could not be fetched (or
                DeletedArrayError: it was deleted): the records from it on are dropped, those
                before it kept.
        """
        try:
            self.writes.check()
        except LostLeaf as err:
            raise self._cut_handed(err, refused=refused) from None

    def settle(self) -> None:
        """Waits until every chunk handed over is written and committed, and fetches the
        device arrays of the chunk being filled: afterwards the buffers hold every record.

        Raises:
            StorageError: a chunk's write failed (kept, retried by the next call).
            DeviceFetchError: a device array could not be fetched (DeletedArrayError: it was
                deleted): the records from it on are dropped, those before it kept.
        """
        try:
            self.writes.drain()
        except LostLeaf as err:
            raise self._cut_handed(err) from None
        self._fetch_kept()

    def _fetch_kept(self) -> None:
        """Fetches the device arrays kept for the chunk being filled into its buffers; one
        that cannot be fetched cuts the chunk there (:meth:`_lost`)."""
        device = self.filler.device
        if device is None or not device.kept:
            return
        kept = device.take()
        try:
            fetch(self.buffers, kept)
        except LostLeaf as err:  # the rows before it are fetched
            raise self._lost(err) from None
        except BaseException:  # interrupted (Ctrl-C): kept again, for the next call to fetch
            device.kept[:0] = kept
            raise

    def _lost(self, err: LostLeaf) -> DeletedArrayError | DeviceFetchError:
        """The error for a device array of row ``err.row`` of the chunk being filled that
        could not be read; a row already appended is dropped with the rows after it."""
        path, record = self._paths[err.column], self.start + err.row
        if err.row >= self.fill:  # this call's own record: nothing to drop
            return lost_error(err, path, record, dropped=range(0))
        dropped = range(record, self.start + self.fill)
        self.fill = err.row
        if self.filler.device is not None:
            self.filler.device.forget(err.row)
        return lost_error(err, path, record, dropped=dropped)

    def _cut_handed(
        self, err: LostLeaf, *, refused: bool = False
    ) -> DeletedArrayError | DeviceFetchError:
        """After a handed-over chunk found a device array it could not fetch: its rows
        before it become the chunk being filled again; every later record is dropped."""
        self.writes.discard()  # the jobs of the chunks below, which are dropped
        failed = min(self._chunks)  # the queue stops at the first failure: the oldest chunk
        chunk = self._chunks.pop(failed)
        dropped = range(chunk.start + err.row, self.start + self.fill)
        self._spares.extend(c.buffers for c in self._chunks.values())
        self._spares.append(self.buffers)
        self._chunks.clear()
        self.buffers, self.start, self.fill = chunk.buffers, chunk.start, err.row
        self.filler.use(self.buffers)
        if self.filler.device is not None:
            self.filler.device.take()
        path = self._paths[err.column]
        return lost_error(err, path, dropped.start, dropped=dropped, refused=refused)


__all__ = ["LOST", "Chunk", "HandOff"]
