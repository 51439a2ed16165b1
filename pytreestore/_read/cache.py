"""The decoded-chunk cache: whole chunks (a sharded column's inner chunks: the smallest piece a
read decodes) kept in memory, so that reading a record whose chunk was read recently costs a
copy, not a read and a decode.

A chunk is kept under its store object (a random id each ``TreeStore`` makes when it opens,
so no two open stores share entries, whatever their paths or store ids), its column's storage
key, its index and the number of its rows the read saw (all of them, but in the tail chunk),
and is used only by reads that see the same rows. Committed rows never change while a store is
open: appends rewrite the tail chunk with its committed rows as they were, repair deletes only
chunks past the commit, and ``evolve`` never reuses a column's storage key; a store replaced by
``create(overwrite=True)`` is refused by the read's replaced-store check. So a cached chunk is
used without a look at storage; a reader that sees more records (``refresh``) reads the tail
chunk again. A store object's entries are dropped when it closes.

Every store opened without ``cache_bytes`` shares one cache of the process
(:func:`shared`), bounded by ``PYTREESTORE_CACHE_BYTES`` (default
``RUNTIME.caches.chunk_cache_bytes``;
``0`` turns it off); ``open(cache_bytes=N)`` gives a store a cache of its own.

A read goes through the cache (:func:`read`) when it selects fewer records than a chunk holds
(one record, a short slice) or is a gather, and the chunks it must read in whole fit in half
the cache; bigger reads go to the backend, which reads only what they select. Columns the
backend reads directly (:class:`~pytreestore.backends.DirectReads`: a local store's inner
chunks, read by the direct reader) are never cached: a read decodes only the inner chunks it
needs, which costs about what the cache's bookkeeping and copy would; but a pipeline that
keeps whole chunks (``unit`` None: it reads every record of the chunks it touches, window by
window) keeps them here, so that each is decoded once.

Example:
    >>> import numpy as np
    >>> cache = ChunkCache(1 << 20)
    >>> cache.put(("store", "x", 0, 4), np.arange(4))
    >>> cache.get(("store", "x", 0, 4)).tolist(), cache.nbytes
    ([0, 1, 2, 3], 32)
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pytreestore._format.schema import ColumnSpec
from pytreestore._location import Location
from pytreestore._read.index import rows
from pytreestore._runtime import RUNTIME, at_fork
from pytreestore.backends import Backend, BatchedReads, DirectReads, capable
from pytreestore.errors import PyTreeStoreError

_Key = tuple[str, str, int, int]  # (store object's id, column key, chunk, rows a read sees)


class ChunkCache:
    """Decoded chunks by ``(store object, column key, chunk, rows)``, least recently used
    out first, at most ``limit`` bytes; safe across threads.

    Args:
        limit: the most bytes of chunks kept.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.nbytes = 0
        self._entries: OrderedDict[_Key, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._pending: dict[_Key, threading.Event] = {}  # chunks some thread is reading
        _LIVE.add(self)

    def get(self, key: _Key) -> np.ndarray | None:
        """The chunk at ``key`` (now the most recently used), or None."""
        with self._lock:
            chunk = self._entries.get(key)
            if chunk is not None:
                self._entries.move_to_end(key)
            return chunk

    def put(self, key: _Key, chunk: np.ndarray) -> None:
        """Keeps ``chunk`` (read-only from now on) unless it alone is over the limit."""
        if chunk.nbytes > self.limit:
            return
        chunk.flags.writeable = False  # served rows are copies; the chunk never changes
        with self._lock:
            old = self._entries.pop(key, None)
            self.nbytes -= 0 if old is None else old.nbytes
            self._entries[key] = chunk
            self.nbytes += chunk.nbytes
            while self.nbytes > self.limit:
                _, dropped = self._entries.popitem(last=False)
                self.nbytes -= dropped.nbytes

    def claim(self, keys: Sequence[_Key]) -> tuple[list[_Key], list[tuple[_Key, threading.Event]]]:
        """Of ``keys`` (chunks not cached), those this thread is now to read, and those
        another thread is reading, each with the event set when that read ends: two
        prefetched batches that share a chunk decode it once. The claimer calls
        :meth:`release` when its read ends, whether it succeeded or not."""
        mine, theirs = [], []
        with self._lock:
            for key in dict.fromkeys(keys):
                event = self._pending.get(key)
                if event is None:
                    self._pending[key] = threading.Event()
                    mine.append(key)
                else:
                    theirs.append((key, event))
        return mine, theirs

    def release(self, keys: Sequence[_Key]) -> None:
        """Ends the claims on ``keys``: threads waiting for them look in the cache."""
        with self._lock:
            events = [self._pending.pop(key, None) for key in keys]
        for event in events:
            if event is not None:
                event.set()

    def drop(self, owner: str) -> None:
        """Forgets the chunks of store object ``owner`` (it has closed)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == owner]:
                self.nbytes -= self._entries.pop(key).nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0


_SHARED: list[ChunkCache | None] = []
_SHARED_LOCK = threading.Lock()
_LIVE: weakref.WeakSet[ChunkCache] = weakref.WeakSet()


def _after_fork() -> None:
    """A forked child has one thread: no lock it inherited can be released, so each is new."""
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for cache in list(_LIVE):
        cache._lock = threading.Lock()
        cache._pending = {}  # the threads reading them are not in this process


at_fork(_after_fork)


def shared() -> ChunkCache | None:
    """The cache every store opened without ``cache_bytes`` shares (None: turned off by
    ``PYTREESTORE_CACHE_BYTES=0``), made on first use.

    Raises:
        PyTreeStoreError: ``PYTREESTORE_CACHE_BYTES`` is not a whole number of bytes.
    """
    with _SHARED_LOCK:
        if not _SHARED:
            limit = _env_bytes("PYTREESTORE_CACHE_BYTES", RUNTIME.caches.chunk_cache_bytes)
            _SHARED.append(ChunkCache(limit) if limit else None)
        return _SHARED[0]


def for_store(location: Location, cache_bytes: int | None) -> ChunkCache | None:
    """The cache a store reads through: the shared one (``cache_bytes`` None), one of its
    own, or none (``0``, or a ``memory://`` store, which is in memory already)."""
    if location.kind == "memory" or cache_bytes == 0:
        return None
    return shared() if cache_bytes is None else ChunkCache(cache_bytes)


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = int(raw) if raw.isdigit() else -1
    if value < 0:
        raise PyTreeStoreError(f"{name} must be a whole number of bytes >= 0, got {raw!r}")
    return value


def read(
    cache: ChunkCache,
    owner: str,
    backend: Backend,
    specs: Sequence[ColumnSpec],
    index: Any,
    records: int,
    unit: Callable[[ColumnSpec], int] | None = None,
) -> list[np.ndarray] | None:
    """Rows ``index`` (normalised: a slice or an int array) of every column of ``specs``, from the chunks
    they lie in as store object ``owner`` keeps them in ``cache`` (those missing read whole
    from ``backend``, in one batch, and kept); None when the read is not one the cache
    serves (see the module). ``unit(spec)``: the records of the chunks kept, the smallest
    a read decodes (an inner chunk of a sharded column; default: a chunk)."""
    if unit is not None and _reads_directly(backend, specs):
        return None  # each read decodes only the inner chunks it needs: cheaper than a copy
    selected = rows(index)
    sizes = [spec.chunks[0] if unit is None else unit(spec) for spec in specs]
    if not len(selected) or any(size < 1 for size in sizes):
        return None  # (a chunk of no rows: a damaged schema, which the backend reports)
    if isinstance(index, slice) and any(len(selected) >= size for size in sizes):
        return None  # a chunk or more of a slice: the backend reads just what it selects
    grids: dict[int, _Grid] = {}  # the columns' chunks usually share one size
    plans = []
    for spec, size in zip(specs, sizes):
        if size not in grids:
            grids[size] = _Grid(selected, size, records)
        plans.append(_Plan(spec, grids[size]))
    missing = []
    for p in plans:
        for k, valid in p.grid.chunks_read.items():
            p.chunks[k] = cache.get((owner, p.spec.key, k, valid))
            if p.chunks[k] is None:
                missing.append((p, k, valid))
    if sum(valid * p.spec.record_nbytes for p, _, valid in missing) > cache.limit // 2:
        return None
    by_key = {(owner, p.spec.key, k, valid): (p, k, valid) for p, k, valid in missing}
    mine: list[_Key] = []
    try:
        mine, theirs = cache.claim(list(by_key))
        _fill(cache, backend, [by_key[key] for key in mine], owner, records)
    finally:
        cache.release(mine)
    late = []  # read by another thread: taken from the cache once that read ends
    for key, event in theirs:
        event.wait()
        p, k, _ = by_key[key]
        p.chunks[k] = cache.get(key)
        if p.chunks[k] is None:  # that read failed, or its chunk was dropped since
            late.append(by_key[key])
    _fill(cache, backend, late, owner, records)
    return [p.assemble() for p in plans]


def _reads_directly(backend: Backend, specs: Sequence[ColumnSpec]) -> bool:
    """Whether the backend reads these columns' pieces directly
    (:class:`~pytreestore.backends.DirectReads`): then the cache is left out."""
    return capable(backend, DirectReads) and backend.reads_directly([s.key for s in specs])


def _fill(
    cache: ChunkCache,
    backend: Backend,
    missing: list[tuple[_Plan, int, int]],
    owner: str,
    records: int,
) -> None:
    """Reads the chunks ``missing`` (``(plan, chunk, rows)``) whole, in one batch, into
    their plans and ``cache``."""
    whole = [
        (p.spec.key, slice(k * p.grid.size, k * p.grid.size + valid)) for p, k, valid in missing
    ]
    arrays = _read_whole(backend, whole, records)
    for (p, k, valid), chunk in zip(missing, arrays):
        p.chunks[k] = chunk
        cache.put((owner, p.spec.key, k, valid), chunk)


def _read_whole(
    backend: Backend, requests: list[tuple[str, slice]], records: int
) -> list[np.ndarray]:
    """Every ``(key, slice)`` read at once: in one batch where the backend reads batches,
    else one ``read`` per distinct slice (the columns' chunks usually share it)."""
    if not requests:
        return []
    if capable(backend, BatchedReads):
        return backend.read_many(requests, records)
    by_slice: dict[tuple[int, int], list[int]] = {}
    for i, (_, where) in enumerate(requests):
        by_slice.setdefault((where.start, where.stop), []).append(i)
    out: list[Any] = [None] * len(requests)
    for (start, stop), which in by_slice.items():
        got = backend.read([requests[i][0] for i in which], slice(start, stop), records)
        for i, array in zip(which, got):
            out[i] = array
    return out


def reader(
    cache: ChunkCache | None,
    owner: str | None,
    backend: Backend,
    columns: Sequence[ColumnSpec],
    unit: Callable[[ColumnSpec], int] | None = None,
) -> Callable[[Sequence[str], Any, int], list[np.ndarray]]:
    """``backend.read`` through ``cache`` (when there is one) for the storage columns
    ``columns``: what a ragged store's gathers read with (each table's committed rows as
    ``records``; ``unit`` as for :func:`read`)."""
    if cache is None or owner is None:
        return backend.read
    by_key = {c.key: c for c in columns}

    def read_keys(keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        specs = [by_key[k] for k in keys]
        got = read(cache, owner, backend, specs, index, records, unit)
        return got if got is not None else backend.read(keys, index, records)

    return read_keys


class _Grid:
    """Where selected rows lie in chunks of ``size`` rows: each row's chunk, each chunk's
    positions among the rows, and each chunk's rows a read sees (computed once for all the
    columns whose chunks have that size)."""

    def __init__(self, selected: np.ndarray, size: int, records: int) -> None:
        self.rows = selected
        self.size = size
        chunk_of = selected // size
        touched = sorted(set(chunk_of.tolist()))
        self.chunks_read = {k: min(size, records - k * size) for k in touched}
        self.where = {k: np.flatnonzero(chunk_of == k) for k in touched} if len(touched) > 1 else {}
        n = len(selected)
        #: the rows are consecutive (a slice's): a chunk's share of them is one run
        self.contiguous = (
            bool(n)
            and int(selected[-1]) - int(selected[0]) == n - 1
            and (n < 3 or bool(np.all(np.diff(selected) == 1)))
        )


class _Plan:
    """One column's rows of a :class:`_Grid`, and the chunks they are taken from."""

    def __init__(self, spec: ColumnSpec, grid: _Grid) -> None:
        self.spec = spec
        self.grid = grid
        self.chunks: dict[int, np.ndarray | None] = {}

    def assemble(self) -> np.ndarray:
        """The column's rows, from its chunks (all present by now)."""
        grid = self.grid
        if len(self.chunks) == 1:
            ((k, chunk),) = self.chunks.items()
            assert chunk is not None
            local = grid.rows - k * grid.size
            if grid.contiguous:  # rows of a slice: one copy of a run, not a gather
                return chunk[int(local[0]) : int(local[-1]) + 1].copy()
            return chunk[local]
        out = np.empty((len(grid.rows), *self.spec.shape), self.spec.dtype)
        for k, chunk in self.chunks.items():
            assert chunk is not None
            where = grid.where[k]
            if grid.contiguous:
                low = int(grid.rows[where[0]]) - k * grid.size
                out[where[0] : where[-1] + 1] = chunk[low : low + len(where)]
            else:
                out[where] = chunk[grid.rows[where] - k * grid.size]
        return out


__all__ = ["ChunkCache", "for_store", "read", "reader", "shared"]
