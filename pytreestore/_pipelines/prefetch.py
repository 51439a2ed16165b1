"""Loads computed ahead of the caller on background jobs: :class:`Prefetcher`.

:class:`~pytreestore._pipelines.batches.BatchIterator` and
:func:`~pytreestore._pipelines.map.map_records` read their next batches (storage read and
host-to-device copy) while the caller computes on the current one, several side by side so
that one batch's decode does not wait for the previous one's copy. The loading jobs are
:mod:`~pytreestore._threads` jobs: they are stopped and waited for when the
prefetcher is closed, when it is dropped (a ``break`` out of a loop over it, an exception),
and when the interpreter exits, so that no load is still inside TensorStore or XLA as the
process ends.

Example:
    >>> from pytreestore._pipelines.prefetch import Prefetcher
    >>> ahead = Prefetcher(lambda i: i * i, iter(range(4)), depth=2)
    >>> list(ahead)
    [0, 1, 4, 9]
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from threading import Event
from typing import Any, Generic, TypeVar

from pytreestore import _threads as background
from pytreestore._runtime import RUNTIME
from pytreestore.errors import ArgumentError, ForkedIteratorError

T = TypeVar("T")
_END = object()
_ERROR = object()


def auto_depth(batch_nbytes: int, cores: int | None = None) -> int:
    """The depth ``prefetch=None`` reads ahead for batches of ``batch_nbytes``: as many as
    keep about ``RUNTIME.pipelines.prefetch_bytes`` ahead, at most
    ``RUNTIME.pipelines.prefetch_loaders`` and one per core
    (``cores``: this machine's by default), at least 2 (a small batch lies in one chunk per
    column, which one core decodes, so several batches are decoded side by side).

    Example:
        >>> [auto_depth(n, cores=16) for n in (4 << 20, 64 << 20, 1 << 30)]
        [8, 4, 2]
        >>> auto_depth(4 << 20, cores=2)
        2
    """
    cores = cores if cores is not None else (os.cpu_count() or 1)
    return max(
        2,
        min(
            RUNTIME.pipelines.prefetch_loaders,
            cores,
            RUNTIME.pipelines.prefetch_bytes // max(batch_nbytes, 1),
        ),
    )


class Prefetcher(Generic[T]):
    """Yields ``load(item)`` for each of ``items`` in order, computed ``depth`` ahead.

    The loads run as background jobs (:mod:`pytreestore._threads`), up to
    ``min(depth, RUNTIME.pipelines.prefetch_loaders)`` of them side by side, so that reading,
    decoding and copying
    one batch to the device overlaps those of the next and the caller's computation; with
    ``depth == 0`` they run in the caller's thread. At most ``depth`` results are loaded or
    being loaded beyond those handed out. An exception raised by ``load`` is re-raised by the
    ``next()`` that would have returned its result. The jobs hold ``load``, ``items`` and the
    results, never the prefetcher: when the prefetcher is closed, dropped or the interpreter
    exits, they are stopped and waited for, so no load is still running inside TensorStore or
    XLA when the process ends.
    """

    def __init__(self, load: Callable[[Any], T], items: Iterator[Any], depth: int) -> None:
        if depth < 0:
            raise ArgumentError(f"prefetch must be >= 0, got {depth}")
        self._load, self._items, self._depth = load, items, depth
        self._closed = False
        self._next = 0  # the position of the next result to hand out
        self._jobs: list[background.Job] = []
        self._shared = _Shared(load, items, depth)
        if depth:
            work = functools.partial(_produce, self._shared)
            self._jobs = [
                background.start(work)
                for _ in range(min(depth, RUNTIME.pipelines.prefetch_loaders))
            ]
            self._finalizer = weakref.finalize(self, _stop, self._jobs, self._shared)
            self._finalizer.atexit = False  # background's exit hook stops the jobs

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        if not self._jobs:
            return self._load(next(self._items))
        kind, value = self._take()
        if kind is _END or kind is _ERROR:
            self._closed = True  # later next() calls stop too
        if kind is _END:
            raise StopIteration
        if kind is _ERROR:
            raise value
        return value

    def _take(self) -> tuple[Any, Any]:
        """The next result in order; the end, once the jobs have stopped without it."""
        shared, position = self._shared, self._next
        with shared.ready:
            while position not in shared.results:
                if all(job.ended for job in self._jobs):  # stopped by close() or at exit
                    if any(job.forked for job in self._jobs):
                        raise _forked()
                    return _END, None
                shared.ready.wait(RUNTIME.waits.prefetch_poll_s)
            entry = shared.results.pop(position)
        self._next += 1
        shared.slots.release()
        return entry

    def close(self) -> None:
        """Stops the background loads, waits for those under way, drops prefetched results."""
        self._closed = True
        if self._jobs:
            self._finalizer()


class _Shared:
    """What the loading jobs share: the items (taken in turn under ``taking``, so each
    gets the next position, and never under ``ready``, which the consumer waits on), the
    results by position, and ``slots``, one per result that may be loaded or waiting beyond
    those handed out."""

    def __init__(self, load: Callable[[Any], Any], items: Iterator[Any], depth: int) -> None:
        self.load, self.items = load, items
        self.taking = threading.RLock()
        self.ready = threading.Condition(threading.RLock())
        self.results: dict[int, tuple[Any, Any]] = {}
        self.slots = threading.Semaphore(max(depth, 1))
        self.taken = 0  # positions given to jobs so far
        self.done = False  # the items ran out, or a load failed: no job takes another

    def file(self, position: int, entry: tuple[Any, Any]) -> None:
        """Files ``entry`` at ``position`` for the consumer."""
        with self.ready:
            self.results[position] = entry
            self.ready.notify_all()


def _forked() -> ForkedIteratorError:
    return ForkedIteratorError(
        "this iterator was made before os.fork(): its background loads ran in the parent "
        "process, and the child has yielded all it had loaded by then; the items after them "
        "were never loaded here, so it cannot go on (ending it would silently drop them). "
        "Make the iterator in the child (store.batches(...) again, with state= to resume), "
        "or start workers with the 'spawn' or 'forkserver' method"
    )


def _produce(shared: _Shared, stopping: Event) -> None:
    """A loading job: takes the next item, loads it and files the result at its position,
    until the items run out, a load fails, or it is asked to stop."""
    while not stopping.is_set():
        if not shared.slots.acquire(timeout=RUNTIME.waits.prefetch_poll_s):
            continue
        with shared.taking:
            if shared.done:
                shared.slots.release()
                return
            position = shared.taken
            shared.taken += 1
            try:
                item = next(shared.items)
            except StopIteration:
                shared.done = True
                shared.file(position, (_END, None))
                return
            except BaseException as err:  # handed to the consumer, raised there
                shared.done = True
                shared.file(position, (_ERROR, err))
                return
        try:
            entry: tuple[Any, Any] = (None, shared.load(item))
        except BaseException as err:  # handed to the consumer, raised there
            entry = (_ERROR, err)
            with shared.taking:
                shared.done = True
        shared.file(position, entry)
        del entry, item


def _stop(jobs: list[background.Job], shared: _Shared) -> None:
    """Stops the prefetch jobs, waits for them, and drops what they had loaded.

    Run on one of the jobs' own threads (a garbage collection there dropped the
    prefetcher), it asks them to stop and returns: that thread may hold ``taking``, which
    the others would wait for, so waiting for them there would never end.
    """
    for job in jobs:
        job.stop()
    if not any(job.here for job in jobs):
        for job in jobs:
            job.join()
    with shared.ready:
        shared.results.clear()


__all__ = ["Prefetcher", "auto_depth"]
