"""A table writer's full chunks handed to the background writer, and the device arrays kept
for them: the part of the table writer (:class:`~pytreestore._commit.writer.Writer`) that runs
off the caller's thread (issues 32 and 45), composed with it through the chunk both fill
(:class:`Filling`).

``append`` hands a full chunk over (:meth:`HandOff.hand_over`) and goes on with a spare buffer;
the
background job (:mod:`pytreestore._commit.chunk_writes`) fetches the chunk's device arrays
(:mod:`pytreestore._tree.device`), then writes and commits it as the writer's own
``_write_chunk`` would. A failure is reported by the writer's next call
(:meth:`HandOff.check_writes`); a device array that cannot be fetched (its computation
failed, or it was deleted) cuts the records there: it and every record after it are dropped,
those before it kept and committed (:meth:`HandOff.lost`); the
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


@dataclasses.dataclass
class Filling:
    """The chunk a table writer is filling: its buffers, its first row, the rows filled, and
    the filler that casts rows into the buffers. The writer and its :class:`HandOff` share it.
    """

    buffers: list[np.ndarray]
    start: int
    fill: int
    filler: RowFiller


class HandOff:
    """The background side of a table writer: the chunks it hands over from ``at`` (chunks
    of ``chunk`` rows of the columns ``paths``) to the queue ``writes``; each job writes and
    commits its chunk with ``put`` (the writer's step 6); ``new_buffers`` makes buffers of a
    chunk when no spare ones are left."""

    def __init__(
        self,
        at: Filling,
        chunk: int,
        paths: list[str],
        writes: ChunkWrites,
        *,
        put: Callable[[int, list[np.ndarray], int], None],
        new_buffers: Callable[[], list[np.ndarray]],
    ) -> None:
        self.at = at
        self.chunk = chunk
        self.writes = writes
        self._paths = paths
        self._put = put
        self._new_buffers = new_buffers
        self._spares: list[list[np.ndarray]] = []  # buffers of chunks written, for reuse
        self._chunks: dict[int, Chunk] = {}  # chunks handed over, by start, until committed

    def hand_over(self) -> None:
        """Hands the full chunk being filled to the background writer and goes on with a
        spare buffer; the job writes the chunk and commits it (``put``)."""
        at = self.at
        device = at.filler.device
        chunk = Chunk(at.start, at.buffers, device.take() if device is not None else [])
        self._chunks[chunk.start] = chunk
        self.writes.submit(functools.partial(self._write_handed, chunk))
        at.buffers = self._spares.pop() if self._spares else self._new_buffers()
        at.filler.use(at.buffers)
        at.start, at.fill = chunk.start + self.chunk, 0

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
        self.fetch_kept()

    def fetch_kept(self) -> None:
        """Fetches the device arrays kept for the chunk being filled into its buffers; one
        that cannot be fetched cuts the chunk there (:meth:`lost`)."""
        device = self.at.filler.device
        if device is None or not device.kept:
            return
        kept = device.take()
        try:
            fetch(self.at.buffers, kept)
        except LostLeaf as err:  # the rows before it are fetched
            raise self.lost(err) from None
        except BaseException:  # interrupted (Ctrl-C): kept again, for the next call to fetch
            device.kept[:0] = kept
            raise

    def lost(self, err: LostLeaf) -> DeletedArrayError | DeviceFetchError:
        """The error for a device array of row ``err.row`` of the chunk being filled that
        could not be read; a row already appended is dropped with the rows after it."""
        path, record = self._paths[err.column], self.at.start + err.row
        if err.row >= self.at.fill:  # this call's own record: nothing to drop
            return lost_error(err, path, record, dropped=range(0))
        dropped = range(record, self.at.start + self.at.fill)
        self.at.fill = err.row
        if self.at.filler.device is not None:
            self.at.filler.device.forget(err.row)
        return lost_error(err, path, record, dropped=dropped)

    def _cut_handed(
        self, err: LostLeaf, *, refused: bool = False
    ) -> DeletedArrayError | DeviceFetchError:
        """After a handed-over chunk found a device array it could not fetch: its rows
        before it become the chunk being filled again; every later record is dropped."""
        self.writes.discard()  # the jobs of the chunks below, which are dropped
        failed = min(self._chunks)  # the queue stops at the first failure: the oldest chunk
        chunk = self._chunks.pop(failed)
        dropped = range(chunk.start + err.row, self.at.start + self.at.fill)
        self._spares.extend(c.buffers for c in self._chunks.values())
        self._spares.append(self.at.buffers)
        self._chunks.clear()
        at = self.at
        at.buffers, at.start, at.fill = chunk.buffers, chunk.start, err.row
        at.filler.use(at.buffers)
        if self.at.filler.device is not None:
            self.at.filler.device.take()
        path = self._paths[err.column]
        return lost_error(err, path, dropped.start, dropped=dropped, refused=refused)


__all__ = ["LOST", "Chunk", "Filling", "HandOff"]
