"""Loads computed ahead of the caller on a background job: :class:`Prefetcher`.

:class:`~pytreestore._pipelines.batches.BatchIterator` and
:func:`~pytreestore._pipelines.map.map_records` read their next batches (storage read and
host-to-device copy) while the caller computes on the current one. The loading job is a
:mod:`~pytreestore._threads` job: it is stopped and waited for when the
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
import queue
import weakref
from collections.abc import Callable, Iterator
from threading import Event
from typing import Any, Generic, TypeVar

from pytreestore import _threads as background
from pytreestore.errors import ArgumentError, ForkedIteratorError

T = TypeVar("T")
_END = object()
_ERROR = object()
_POLL_S = 0.05  # how often a waiting put or get looks whether the job was stopped


class Prefetcher(Generic[T]):
    """Yields ``load(item)`` for each of ``items`` in order, computed ``depth`` ahead.

    The loads run as a background job (:mod:`pytreestore._threads`); with
    ``depth == 0`` they run in the caller's thread. An exception raised by ``load`` is re-raised
    by the ``next()`` that would have returned its result. The job holds ``load``, ``items`` and
    the queue, never the prefetcher: when the prefetcher is closed, dropped or the interpreter
    exits, the job is stopped and waited for, so no load is still running inside TensorStore
    or XLA when the process ends.
    """

    def __init__(self, load: Callable[[Any], T], items: Iterator[Any], depth: int) -> None:
        if depth < 0:
            raise ArgumentError(f"prefetch must be >= 0, got {depth}")
        self._load, self._items, self._depth = load, items, depth
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(depth, 1))
        self._closed = False
        self._job: background.Job | None = None
        if depth:
            self._job = background.start(functools.partial(_produce, load, items, self._queue))
            self._finalizer = weakref.finalize(self, _stop, self._job, self._queue)
            self._finalizer.atexit = False  # background's exit hook stops the job

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        if self._job is None:
            return self._load(next(self._items))
        kind, value = self._take(self._job)
        if kind is _END or kind is _ERROR:
            self._closed = True  # later next() calls stop too
        if kind is _END:
            raise StopIteration
        if kind is _ERROR:
            raise value
        return value

    def _take(self, job: background.Job) -> tuple[Any, Any]:
        """The next entry of the queue; the end, once the job has stopped with none left."""
        while True:
            try:
                return self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if job.ended and self._queue.empty():  # stopped by close() or at exit
                    if job.forked:
                        raise _forked() from None
                    return _END, None

    def close(self) -> None:
        """Stops the background loads, waits for the one under way, drops prefetched results."""
        self._closed = True
        if self._job is not None:
            self._finalizer()


def _forked() -> ForkedIteratorError:
    return ForkedIteratorError(
        "this iterator was made before os.fork(): its background loads ran in the parent "
        "process, and the child has yielded all it had loaded by then; the items after them "
        "were never loaded here, so it cannot go on (ending it would silently drop them). "
        "Make the iterator in the child (store.batches(...) again, with state= to resume), "
        "or start workers with the 'spawn' or 'forkserver' method"
    )


def _produce(
    load: Callable[[Any], Any], items: Iterator[Any], out: queue.Queue[Any], stopping: Event
) -> None:
    """The prefetch job: ``load`` each of ``items`` into ``out`` until the end or a stop."""
    try:
        for item in items:
            if stopping.is_set() or not _put(out, (None, load(item)), stopping):
                return
        _put(out, (_END, None), stopping)
    except BaseException as err:  # handed to the consumer, raised there
        _put(out, (_ERROR, err), stopping)


def _put(out: queue.Queue[Any], entry: tuple[Any, Any], stopping: Event) -> bool:
    """Puts ``entry`` in ``out`` once there is room; False if asked to stop first."""
    while not stopping.is_set():
        try:
            out.put(entry, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


def _stop(job: background.Job, out: queue.Queue[Any]) -> None:
    """Stops a prefetch job, waits for it, and drops what it had loaded."""
    job.stop()
    job.join()
    while not out.empty():
        out.get_nowait()


__all__ = ["Prefetcher"]
