"""A table writer's full chunks, handed off and written on a background thread, in order.

A table writer's full chunks, written and committed on a background thread, in order.

``append`` hands a full chunk to :class:`ChunkWrites` and goes on filling the next one, so the
caller's loop never waits on storage (issue 32). The jobs run one at a time, in the order they
were handed over, on a thread of :mod:`pytreestore._threads` (stopped and waited
for before the interpreter exits, forgotten by a forked child). At most ``limit`` chunks wait:
a hand-off beyond that waits for the oldest (back-pressure, not unbounded memory).

A job that fails keeps its chunk: the queue stops there (:attr:`ChunkWrites.failed`), the
failure is raised by the writer's next call (:meth:`ChunkWrites.check`), and the job is tried
again from then on, once per failure reported. Nothing handed over is
dropped by a failure: a chunk leaves the queue only once its commit is written, so records a
caller was told were appended stay in memory until they are durable.

Example:
    >>> done = []
    >>> writes = ChunkWrites()
    >>> writes.submit(lambda: done.append(1)); writes.submit(lambda: done.append(2))
    >>> writes.drain(); done
    [1, 2]

A table writer's full chunks handed to the background writer, and the device arrays kept
for them: the part of the table writer (:class:`~pytreestore._write.writer.Writer`) that runs
off the caller's thread (issues 32 and 45), composed with it through the chunk both fill
(:class:`Filling`).

``append`` hands a full chunk over (:meth:`HandOff.hand_over`) and goes on with a spare buffer;
the
background job (:mod:`pytreestore._write.background`) fetches the chunk's device arrays
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

import collections
import dataclasses
import functools
import sys
import threading
from collections.abc import Callable

import numpy as np

from pytreestore import _threads as background
from pytreestore._runtime import RUNTIME
from pytreestore._tree.convert import RowFiller
from pytreestore._tree.device import Kept, LostLeaf, fetch, lost_error
from pytreestore._write.roles import Held
from pytreestore.errors import DeletedArrayError, DeviceFetchError


class ChunkWrites:
    """Jobs (a chunk's write and commit each) run in order on one background thread.

    Every method but the worker's own is called by the writer's thread, holding the store's
    lock; the worker changes :attr:`failed` and the queue under :attr:`_cond`.

    Attributes:
        failed: the failure of the job at the head of the queue, until a call reports it
            (:meth:`check`); read without the lock by the writer's hot path.
    """

    def __init__(self, limit: int = RUNTIME.writes.chunk_writes_waiting) -> None:
        self.failed: BaseException | None = None
        self._limit = limit
        self._cond = threading.Condition()
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._held = False  # a failure was found: the head waits for the next call to retry
        self._running = False  # a worker is on a thread (it returns once the queue is empty)

    def __len__(self) -> int:
        """Jobs not yet done (the one running included)."""
        return len(self._jobs)

    def check(self) -> None:
        """Raises the failure of a job that no call has reported yet (once); its chunk stays
        queued and is retried from now on (one attempt per failure reported, so a disk that
        stays full is not hammered)."""
        with self._cond:
            failed, self.failed = self.failed, None
            if failed is not None:
                self._resume()
        if failed is not None:
            raise failed

    def submit(self, job: Callable[[], None]) -> None:
        """Queues ``job`` after the others, retrying a failed head; waits while more than the
        limit wait (a failure meanwhile stops the wait: it is reported by the next call)."""
        with self._cond:
            self._jobs.append(job)
            self._resume()
            while len(self._jobs) > self._limit and self.failed is None:
                self._cond.wait()

    def drain(self) -> None:
        """Runs every queued job (a failed head is retried) and waits for them.

        Raises:
            BaseException: a job's failure (its chunk and those after it stay queued).
        """
        self.check()
        with self._cond:
            if self._jobs:
                self._resume()
                self._cond.wait_for(lambda: not self._jobs or self.failed is not None)
        self.check()

    def wait_idle(self) -> bool:
        """Waits until no job runs (every job is done, or the head failed and waits for a
        call to report it); whether jobs are left. Never raises a job's failure."""
        with self._cond:
            self._cond.wait_for(lambda: not self._running)
            return bool(self._jobs)

    def discard(self) -> list[Callable[[], None]]:
        """Empties the queue, stopped at a failure, and returns its jobs, oldest first (the
        writer takes their rows back)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._running)
            jobs, self._jobs = list(self._jobs), collections.deque()
            self.failed, self._held = None, False
        return jobs

    def _resume(self) -> None:
        """Under the lock: lets the worker retry a failed head, and starts one if none runs."""
        self._held = False
        if not self._running and self._jobs:
            self._running = True
            background.start(self._serve)

    def _serve(self, stopping: threading.Event) -> None:
        """The worker: the head job, again and again, until the queue is empty or a job
        fails. It does not stop early at the interpreter's exit: what is queued was
        acknowledged, and is written first. A failure then is printed: no call of the
        writer may come to report it (the writers still open have had their last flush)."""
        while True:
            with self._cond:
                if not self._jobs or self._held:
                    self._running = False
                    self._cond.notify_all()
                    return
                job = self._jobs[0]
            try:
                job()
            except BaseException as err:  # kept for the writer's next call
                with self._cond:
                    self.failed, self._held = err, True
                if stopping.is_set():
                    _lost_at_exit(err, len(self._jobs))
                continue
            with self._cond:
                self._jobs.popleft()
                self._cond.notify_all()


def _lost_at_exit(err: BaseException, chunks: int) -> None:
    """Says on standard error that ``chunks`` chunks handed over are lost at the exit."""
    print(
        f"pytreestore: at the interpreter's exit, a store's background writer could not write "
        f"the {chunks} full chunk(s) handed to it ({type(err).__name__}: {err}); their "
        "records are lost. close() a store (or flush() it) before the program ends to see "
        "such a failure where it happens.",
        file=sys.stderr,
    )


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
        first: Callable[[], int] = lambda: 0,
    ) -> None:
        """``first``: the row of record 0 (rows before it released by ``keep_last``), to
        name records as their users number them in errors."""
        self.at = at
        self._first = first
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

    def buffered_rows(self) -> Held:
        """The rows only memory holds, for a read (the store's mutex held): the chunks handed
        over and not yet written (the background writer drops a chunk once it is committed;
        one whose device arrays it is still fetching is waited for), then the chunk being
        filled, its device arrays fetched first. Nothing is written or committed.

        Raises:
            DeviceFetchError: (DeletedArrayError) a device array appended could not be
                fetched, as :meth:`settle` reports it.
        """
        self.fetch_kept()
        chunks = sorted(tuple(self._chunks.values()), key=lambda c: c.start)
        if any(c.kept for c in chunks):
            self.writes.wait_idle()  # the background writer fetches them: wait, never write
            self.check_writes()
            chunks = sorted(tuple(self._chunks.values()), key=lambda c: c.start)
        at = self.at
        pieces = (*((c.start, c.buffers) for c in chunks), (at.start, at.buffers))
        return Held(pieces[0][0], at.start + at.fill, pieces)

    def lost(self, err: LostLeaf) -> DeletedArrayError | DeviceFetchError:
        """The error for a device array of row ``err.row`` of the chunk being filled that
        could not be read; a row already appended is dropped with the rows after it."""
        first = self._first()
        path, record = self._paths[err.column], self.at.start + err.row - first
        if err.row >= self.at.fill:  # this call's own record: nothing to drop
            return lost_error(err, path, record, dropped=range(0))
        dropped = range(record, self.at.start + self.at.fill - first)
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
        first = self._first()
        dropped = range(chunk.start + err.row - first, self.at.start + self.at.fill - first)
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


__all__ = ["LOST", "Chunk", "ChunkWrites", "Filling", "HandOff"]
