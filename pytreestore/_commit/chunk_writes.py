"""A table writer's full chunks, written and committed on a background thread, in order.

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
"""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable

from pytreestore import _threads as background
from pytreestore._runtime import RUNTIME


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


__all__ = ["ChunkWrites"]
