"""The runtime: every thread pool, cache budget and tuning constant of pytreestore in one object, and what it needs of the operating system.

What pytreestore needs of the operating system, asked for where it is used, not at import.

* ``fcntl.flock`` (POSIX: Linux, macOS, the BSDs) for the writer lock of a local store and
  the zarr backend's commit lock. Where ``fcntl`` is missing (Windows), ``import
  pytreestore`` works, and so do reads of local stores and everything on ``memory://``,
  ``s3://`` and ``gs://`` stores; opening a local store for writing raises
  :class:`~pytreestore.errors.UnsupportedPlatformError`, which says so.
* ``os.register_at_fork`` (POSIX) for the hooks that reset a forked child's threads and
  locks; where there is no ``fork`` there is nothing to reset.
* ``/proc`` (Linux) only to tell that an object store's lock holder on this machine is gone
  (:func:`pytreestore._log.locks.holder_is_dead`); without it no holder is provably gone,
  so no lock is taken over unasked (docs/reliability.md, "Platforms").

Example:
    >>> flock_module("/tmp/store", "taking the writer lock of").LOCK_EX > 0
    True

The runtime: every thread pool, cache budget and tuning constant of pytreestore, in one object.

As TensorStore's ``Context`` holds the resources its operations share (``cache_pool``,
``data_copy_concurrency``, ``file_io_concurrency``), :data:`RUNTIME` holds ours: the knobs,
grouped by the part of the package that reads them (:class:`Threads`, :class:`Caches`,
:class:`Reads`, :class:`Writes`, :class:`Pipelines`, :class:`Waits`), each with the reason for
its value, and the thread pools reads, writes and pipelines share. A module reads a knob when
it uses it (``RUNTIME.reads.slab_bytes``), so a test or a benchmark changes one with
``monkeypatch.setattr(RUNTIME.reads, "slab_bytes", 1 << 20)``. A knob that is the default of a
parameter (a claim's ``wait``, a coordinator's ``lease``) is read once, when its module is
imported, so that the signature shows the number.

Every thread pytreestore starts is made here: the pools kept for the process
(:meth:`Runtime.slab_pool`, :meth:`Runtime.direct_pool`, :meth:`Runtime.pack_pool`, made at
first use and forgotten in a child made by ``os.fork``, which has none of its parent's
threads), the pools of one call
(:meth:`Runtime.call_pool`, shut down, their threads joined, as their ``with`` block ends),
the default executor of zarr-python's event loop (:meth:`Runtime.loop_pool`) and the reused
daemon threads of background jobs (:func:`thread`, for :mod:`pytreestore._threads`, which
stops and waits for its jobs at the interpreter's exit). The pools' threads are joined by
``concurrent.futures``' own exit hook, which runs before every ``atexit`` hook (so before
:mod:`pytreestore._threads`' hook and the writers' last flush of :mod:`pytreestore._threads`):
work handed to a pool after it is refused, except on :class:`ExitSafePool`, which then does the
work on the caller's thread.

Not here: the defaults that decide the layout of a new store on disk (the chunk, inner-chunk
and pack sizes of :mod:`pytreestore._format.columns` and :mod:`pytreestore._format.compression`):
they are part of the format's defaults, not of a running process.

Example:
    >>> RUNTIME.reads.slab_bytes >> 20
    64
    >>> with RUNTIME.call_pool(2) as pool:
    ...     list(pool.map(abs, [-1, -2]))
    [1, 2]
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import Any, TypeVar

from pytreestore.errors import UnsupportedPlatformError


def flock_module(where: object, doing: str) -> ModuleType:
    """The ``fcntl`` module, for ``flock``.

    Args:
        where: the store (or file) that needs the lock, for the message.
        doing: what needs it, completed by ``where``: ``"taking the writer lock of"``.

    Raises:
        UnsupportedPlatformError: this platform has no ``fcntl`` (not POSIX).
    """
    try:
        return importlib.import_module("fcntl")
    except ImportError as err:
        raise UnsupportedPlatformError(
            f"{doing} {where} needs file locks (fcntl.flock), which this platform lacks: "
            "writing a local store needs a POSIX system (Linux, macOS, BSD). Here, local "
            "stores can be read, and memory://, s3:// and gs:// stores read and written."
        ) from err


def at_fork(after_in_child: Callable[[], object]) -> None:
    """Runs ``after_in_child`` in each child ``os.fork`` makes (nothing where there is no
    fork)."""
    register = getattr(os, "register_at_fork", None)
    if register is not None:
        register(after_in_child=after_in_child)


_T = TypeVar("_T")


_MiB = 1 << 20


@dataclasses.dataclass(slots=True)
class Threads:
    """Threads of each pool (how many run side by side)."""

    #: slabs of a device load read side by side (each decodes on TensorStore's own threads too)
    slab_readers: int = 3
    #: the direct reader's piece reads at once: threads that mostly wait on the disk
    direct: int = max(8, min(32, 4 * (os.cpu_count() or 1)))
    #: distinct indexes of a sharded load read at once (backends without ``read_many``)
    sharded_reads: int = 16
    #: fragment manifests read at once by a commit of fragments (storage without ``read_many``)
    fragment_checks: int = 16
    #: fragments' own arrays read at once while their rows are rewritten
    fragment_reads: int = 8
    #: committed fragments' folders deleted at once (a thread's work after the commit)
    fragment_deletes: int = 4
    #: folders linked or fsynced at once (fsyncs wait on the disk; also capped by the cores)
    folder_syncs: int = 16
    #: blocks of pack rows a packed store's long read decodes in one call (side by side, on
    #: the engine's threads), and copies into the leaves' rows at once (on the pack pool)
    pack_blocks: int = max(2, min(8, os.cpu_count() or 1))


@dataclasses.dataclass(slots=True)
class Caches:
    """The bounds of the caches and reused buffers a process keeps."""

    #: the shared chunk cache's bytes unless ``PYTREESTORE_CACHE_BYTES`` says
    chunk_cache_bytes: int = 256 * _MiB
    #: windows a block-shuffled iterator's own cache holds (the one read, the next, and room
    #: for chunks shared at the edges)
    shuffle_windows: float = 2.5
    #: bytes of one read-ahead block of records (its host copy)
    ahead_block_bytes: int = 16 * _MiB
    #: reused host buffers (about one slab each) made before a load waits: 3 read while 3 copy
    host_buffers: int = 6
    #: compiled placement plans kept in a process, at most
    placement_plans: int = 64
    #: locations whose last commit record is kept parsed (then the cache starts again)
    parsed_commits: int = 64
    #: root documents (``zarr.json``) known valid, by digest (then the memo starts again)
    validated_documents: int = 256
    #: schemas kept parsed by their document's digest (then the memo starts again)
    parsed_schemas: int = 32


@dataclasses.dataclass(slots=True)
class Reads:
    """Sizes that shape a read."""

    #: bytes of one slab (a piece of a device load read and copied at once), about
    slab_bytes: int = 64 * _MiB
    #: a smaller device load is read whole (into fresh arrays), not in slabs
    slab_min_bytes: int = 16 * _MiB
    #: a column whose rows take at most this is read whole, in a group of such columns
    whole_column_bytes: int = 8 * _MiB
    #: an array of at most this many bytes may be packed with others of its dtype
    pack_small_bytes: int = 64 << 10
    #: fewer small arrays of one dtype are placed one by one (a pack costs a compile)
    pack_min_arrays: int = 4
    #: each column's rows in a reused host buffer begin on a page
    host_align: int = 4096
    #: records gathered at once by iteration
    iter_block: int = 1024
    #: records of one read-ahead block, at most
    ahead_max_records: int = 4096
    #: a read-ahead block of fewer records is placed record by record (no compile)
    ahead_jit_min: int = 64
    #: scalar rows of a column a placement plan takes, at least (unless the column's max is 1)
    plan_min_rows: int = 4
    #: bytes of chunks ``verify`` decodes in one batch
    verify_batch_bytes: int = 256 * _MiB
    #: bytes of all columns ``copy`` reads and writes per step, about
    copy_slice_bytes: int = 64 * _MiB
    #: local chunk files are read by pytreestore's direct reader (byte ranges, checksums
    #: and decoding in compiled code, every column's pieces at once) where it covers them;
    #: False: every read goes through the engine (TensorStore). Both give the same bytes.
    direct: bool = True
    #: bytes of pack rows (whole rows, decoded) read at once by a packed store's long read:
    #: small enough that the rows are still in cache when each leaf's part is copied out
    pack_block_bytes: int = 4 * _MiB
    #: a block holds at least this many bytes per leaf of its pack, so that each leaf's copy
    #: out of it is long enough to spread its fixed cost (a pack of 4,000 small leaves:
    #: blocks of 125 MiB, where 4 MiB blocks cost 1.3x the CPU of one whole read)
    pack_copy_bytes: int = 32 << 10
    #: files one read keeps open on the zarr backend (beyond, a key's ranged reads read it
    #: whole; a point read of a wide store opens one shard per column)
    open_files: int = 256


@dataclasses.dataclass(slots=True)
class Writes:
    """Sizes that shape a write."""

    #: records flattened at once by a fixed store's ``extend`` (large enough to spread a
    #: block's fixed cost, small enough to stay in cache)
    extend_block: int = 1024
    #: the most bytes of column values an ``extend`` of a list stacks whole before writing
    stacked_bytes: int = 64 * _MiB
    #: rows a ragged table keeps waiting before it converts and buffers them, at most
    table_block_rows: int = 2048
    #: chunks that may wait for their background write besides the one being filled
    chunk_writes_waiting: int = 2
    #: device arrays stacked per call (a fixed count: one compiled stack per leaf shape)
    device_stack: int = 256
    #: up to this many folders are fsynced one by one; more take one ``syncfs``
    few_folders: int = 32
    #: fragments whose rewritten rows are held in memory together
    fragment_window: int = 32
    #: a writer trims the version log once every this many commits
    trim_every: int = 64
    #: version records read at once where storage cannot list them
    version_probe: int = 256


@dataclasses.dataclass(slots=True)
class Pipelines:
    """Sizes of the batch pipelines."""

    #: the decoded bytes of a block shuffle's window unless ``shuffle_window`` says
    shuffle_window_bytes: int = 64 * _MiB
    #: loads a prefetcher runs side by side, at most (a read, a decode, a device copy each)
    prefetch_loaders: int = 8
    #: what ``prefetch=None`` keeps ahead, about
    prefetch_bytes: int = 256 * _MiB


@dataclasses.dataclass(slots=True)
class Waits:
    """Timeouts (seconds), polls and retries."""

    #: how often a waiting prefetch put or get looks whether its job was stopped
    prefetch_poll_s: float = 0.05
    #: how long the exit waits for another thread's append before it gives a store up
    exit_wait_s: float = 10.0
    #: rounds of stopping background jobs at the exit (jobs started meanwhile are stopped too)
    exit_rounds: int = 4
    #: how long a sharing writer waits for one that opened the store alone and repairs it
    share_wait_s: float = 30.0
    #: how long a commit claim stands before another writer may take it over
    claim_s: float = 60.0
    #: how long a writer waits for the claim by default before CommitConflictError
    claim_wait_s: float = 120.0
    #: how long a coordinated writer's leases on B+tree ranges last (TensorStore's default)
    lease_s: float = 10.0
    #: how long one storage call of a coordinated writer waits before StorageError
    coordinator_timeout_s: float = 60.0
    #: times a commit is tried again after a conditional write found the record changed
    commit_retries: int = 5
    #: conditional PUTs of one ``zarr.json`` on S3 before giving up on a store that changes
    document_attempts: int = 5


class ExitSafePool(ThreadPoolExecutor):
    """A thread pool that runs work on the caller's thread once it refuses new work (the
    interpreter exits, or the pool was shut down): the work is done, slower, never dropped."""

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        try:
            return super().submit(fn, *args, **kwargs)
        except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
            done: Future[_T] = Future()
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as err:  # the future carries it
                done.set_exception(err)
            return done


@dataclasses.dataclass(slots=True)
class Runtime:
    """The knobs and thread pools of one process (:data:`RUNTIME`)."""

    threads: Threads = dataclasses.field(default_factory=Threads)
    caches: Caches = dataclasses.field(default_factory=Caches)
    reads: Reads = dataclasses.field(default_factory=Reads)
    writes: Writes = dataclasses.field(default_factory=Writes)
    pipelines: Pipelines = dataclasses.field(default_factory=Pipelines)
    waits: Waits = dataclasses.field(default_factory=Waits)
    _kept: dict[str, ThreadPoolExecutor] = dataclasses.field(default_factory=dict, repr=False)
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def slab_pool(self) -> ThreadPoolExecutor:
        """The slab readers' pool, kept for the process (a new thread gets a new malloc
        arena, so fresh threads per load would keep fresh memory)."""
        return self._kept_pool("pytreestore-slab", self.threads.slab_readers)

    def direct_pool(self) -> ThreadPoolExecutor:
        """The direct reader's pool, kept for the process."""
        return self._kept_pool("pytreestore-direct", self.threads.direct)

    def pack_pool(self) -> ThreadPoolExecutor:
        """The pool that copies a packed store's blocks into its leaves' rows, kept for the
        process (the blocks are read on the caller's thread)."""
        return self._kept_pool("pytreestore-pack", self.threads.pack_blocks, ExitSafePool)

    def call_pool(self, workers: int) -> ThreadPoolExecutor:
        """A pool for one call, to use as a ``with`` block (which joins its threads).

        Raises:
            RuntimeError: the interpreter is exiting and starts no new threads (from
                ``submit``, as ``concurrent.futures`` raises it).
        """
        return ThreadPoolExecutor(workers)

    def loop_pool(self, workers: int | None) -> ExitSafePool:
        """The default executor of zarr-python's event loop (``workers=None``: Python's
        default count)."""
        return ExitSafePool(workers, thread_name_prefix="zarr_pool")

    def forget_pools(self) -> None:
        """In a child made by ``os.fork``: the parent's pool threads are not here, so the
        kept pools are made afresh at their next use."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._kept.clear()

    def _kept_pool(
        self, name: str, workers: int, kind: type[ThreadPoolExecutor] = ThreadPoolExecutor
    ) -> ThreadPoolExecutor:
        with self._lock:
            pool = self._kept.get(name)
            if pool is None:
                pool = self._kept[name] = kind(workers, thread_name_prefix=name)
            return pool


def thread(target: Callable[..., object], args: tuple[Any, ...], name: str) -> threading.Thread:
    """A daemon thread running ``target(*args)``, started (the background jobs' threads of
    :mod:`pytreestore._threads`, which stops and waits for its jobs at the exit; the test
    servers' threads of :mod:`pytreestore.testing`)."""
    started = threading.Thread(target=target, args=args, name=name, daemon=True)
    started.start()
    return started


#: the process's runtime: every module reads its knobs and pools from here
RUNTIME = Runtime()


at_fork(RUNTIME.forget_pools)


__all__ = [
    "RUNTIME",
    "Caches",
    "ExitSafePool",
    "Pipelines",
    "Reads",
    "Runtime",
    "Threads",
    "Waits",
    "Writes",
    "at_fork",
    "flock_module",
    "thread",
]
