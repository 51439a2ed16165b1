"""Work ahead of the caller: prefetched loads, and the out-of-core ``map``.

Loads computed ahead of the caller on background jobs: :class:`Prefetcher`.

:class:`~pytreestore._pipelines.batches.BatchIterator` and
:func:`~pytreestore._pipelines.prefetch.map_records` read their next batches (storage read and
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

Out-of-core map: ``jax.jit(jax.vmap(fn))`` over a store, one batch of records at a time.

Batches are read in the background (see :class:`pytreestore._pipelines.prefetch.Prefetcher`) while the
previous one computes. The last, short batch is padded by repeating its final record, so
``fn`` compiles once; the padding's results are dropped. Results are copied to host as they
come and either concatenated into one batched pytree (placed on the default device at the end)
or appended to another store, so that they never need to fit in memory.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-map", {"x": np.float32(0)})
    >>> store.extend({"x": np.float32(i)} for i in range(5))
    >>> store.map(lambda r: r["x"] * 2, batch_size=2)
    Array([0., 2., 4., 6., 8.], dtype=float32)
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from threading import Event
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from pytreestore import _threads as background
from pytreestore._format.dtypes import is_weak, weaken
from pytreestore._inspect.progress import progress_bar
from pytreestore._runtime import RUNTIME
from pytreestore._tree.stack import is_constant
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


def map_records(
    fn: Callable[[Any], Any],
    load: Callable[[Any], Any],
    *,
    count: int,
    batch_size: int,
    out: Any = None,
    progress: bool = False,
    record_nbytes: int = 0,
    prefetch: int = 2,
    create: Callable[[Any, Any], Any] | None,
) -> Any:
    """Applies ``fn`` to records ``[0, count)`` that ``load(index)`` returns in batches.

    Args:
        fn: a function of one record, traceable by JAX.
        load: loads a batched record for a slice or int-array index.
        count: how many records to map over.
        batch_size: records per call of the compiled ``vmap(fn)``.
        out: None to return the results; a :class:`pytreestore.TreeStore` open for appending,
            or a path where a new store is created from the first result, to append them to.
        progress: show a progress bar (records and MB/s) on standard error.
        record_nbytes: bytes one loaded record takes, for the bar's MB/s figure.
        prefetch: batches read ahead in the background.
        create: ``create(path, like)`` makes the new store when ``out`` is a path
            (:func:`pytreestore.create`).

    Returns:
        The batched results (leaves with a leading record axis), or the ``out`` store.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
    step = _Vmapped(fn)
    sink = _Sink(out, create)
    bar = progress_bar(total=count, desc="map", record_nbytes=record_nbytes, enabled=progress)
    batches = Prefetcher(lambda ix: (ix[0], load(ix[1])), _indices(count, batch_size), prefetch)
    try:
        for valid, batch in batches:
            result = step(batch)
            sink.note_weak(result)
            if valid < batch_size:
                result = jax.tree.map(lambda leaf, n=valid: np.asarray(leaf)[:n], result)
            sink.add(result)
            bar.advance(valid)
    finally:
        batches.close()
        bar.close()
    return sink.finish(lambda: step.eval_shape(load(slice(0, 0))))


#: the compiled steps of functions given already wrapped in ``jax.jit``, kept while the
#: function lives: ``(treedef, mask, const ids) -> (consts, step)`` (the consts kept so their
#: ids stay theirs)
_KEPT: weakref.WeakKeyDictionary[Any, dict[Any, tuple[tuple[Any, ...], Any]]] = (
    weakref.WeakKeyDictionary()
)


_KEPT_LOCK = threading.Lock()


_JITTED = type(jax.jit(lambda x: x))


class _Vmapped:
    """``jax.jit(jax.vmap(fn))`` of a batched record whose constant leaves (functions, see
    :mod:`pytreestore._format.consts`) are closed over rather than traced, as
    ``eqx.filter_jit`` does. A plain ``fn`` is traced afresh by each ``map`` (what it reads
    from outside its argument may have changed); a ``jax.jit``-wrapped one keeps its compiled
    step from call to call, as ``jax.jit`` keeps its own."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self._fn = fn
        self._compiled: dict[Any, tuple[tuple[Any, ...], Any]] = {}
        if isinstance(fn, _JITTED):
            with _KEPT_LOCK:
                self._compiled = _KEPT.setdefault(fn, {})

    def _split(self, batch: Any) -> tuple[Callable[[list[Any]], Any], list[Any], Any, tuple]:
        leaves, treedef = jax.tree_util.tree_flatten(batch)
        mask = tuple(is_constant(leaf) for leaf in leaves)
        consts = tuple(leaf for leaf, c in zip(leaves, mask) if c)
        arrays = [leaf for leaf, c in zip(leaves, mask) if not c]
        fn = weakref.ref(self._fn) if isinstance(self._fn, _JITTED) else (lambda f=self._fn: f)

        def inner(arrays: list[Any]) -> Any:  # (holds no strong reference to a kept fn)
            a, k = iter(arrays), iter(consts)
            return fn()(treedef.unflatten([next(k) if c else next(a) for c in mask]))  # type: ignore[misc]

        key = (treedef, mask, tuple(id(c) for c in consts))
        return inner, arrays, key, consts

    def __call__(self, batch: Any) -> Any:
        inner, arrays, key, consts = self._split(batch)
        kept = self._compiled.get(key)
        if kept is None or any(a is not b for a, b in zip(kept[0], consts)):
            kept = self._compiled[key] = (consts, jax.jit(jax.vmap(inner)))
        return kept[1](arrays)

    def eval_shape(self, batch: Any) -> Any:
        inner, arrays, _, _ = self._split(batch)
        return jax.eval_shape(jax.vmap(inner), arrays)


def _indices(count: int, batch_size: int) -> Iterator[tuple[int, Any]]:
    """``(records, index)`` of each batch; the last is padded with its final record."""
    for lo in range(0, count, batch_size):
        hi = min(lo + batch_size, count)
        if hi - lo == batch_size:
            yield batch_size, slice(lo, hi)
        else:
            pad = np.full(batch_size - (hi - lo), hi - 1, np.int64)
            yield hi - lo, np.concatenate([np.arange(lo, hi, dtype=np.int64), pad])


class _Sink:
    """Where results go: host arrays to concatenate, or a store to append to.

    Each result is copied to host only when the next one has been dispatched, so the device
    keeps computing while the previous result is copied out.
    """

    def __init__(self, out: Any, create: Callable[[Any, Any], Any] | None) -> None:
        self._out = out
        self._create = create
        self._pending: Any = None
        self._parts: list[Any] = []
        self._weak: list[bool] | None = None  # the results' weak types, from the device

    def note_weak(self, result: Any) -> None:
        """Keeps which leaves of ``fn``'s result are weakly typed (the host copies lose it)."""
        if self._weak is None:
            self._weak = [is_weak(leaf) for leaf in jax.tree.leaves(result)]

    def _weak_like(self, like: Any) -> Any:
        """``like`` (host values) with each weakly typed result leaf as a weak ``jax.Array``,
        so that the out store's column is weak (``weak_type``) as the results were."""
        leaves, treedef = jax.tree.flatten(like)
        weak = self._weak or [False] * len(leaves)
        placed = [jnp.asarray(v) if w else v for v, w in zip(leaves, weak)]
        return treedef.unflatten(weaken(placed, weak) if any(weak) else placed)

    def _weakened(self, tree: Any) -> Any:
        """``tree`` (of ``jax.Array`` leaves) with the results' weak types."""
        leaves, treedef = jax.tree.flatten(tree)
        return treedef.unflatten(weaken(leaves, self._weak if any(self._weak or ()) else None))

    def add(self, result: Any) -> None:
        self._drain()
        self._pending = result

    def _drain(self) -> None:
        if self._pending is None:
            return
        host, self._pending = jax.device_get(self._pending), None
        if self._out is None:
            self._parts.append(host)
            return
        if isinstance(self._out, (str, os.PathLike)):
            like = self._weak_like(jax.tree.map(lambda leaf: leaf[0], host))
            assert self._create is not None, "a store opened by pytreestore has a creator"
            self._out = self._create(self._out, like)
        self._out.extend_batch(host)

    def finish(self, empty_shape: Callable[[], Any]) -> Any:
        self._drain()
        if self._out is not None and not isinstance(self._out, (str, os.PathLike)):
            self._out.flush()
            return self._out
        if self._out is not None:
            raise ArgumentError(
                f"map(out={self._out!r}) over an empty store: no result to build the new "
                "store's schema from; create the out store yourself"
            )
        if not self._parts:
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), empty_shape())
        joined = jax.tree.map(lambda *leaves: np.concatenate(leaves), *self._parts)
        return self._weakened(jax.device_put(joined))


__all__ = ["Prefetcher", "auto_depth"]
