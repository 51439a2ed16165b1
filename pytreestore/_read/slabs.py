"""Big loads onto an accelerator in slabs, read into host buffers reused from load to load.

Host buffers reused by big loads onto an accelerator, so that reading a piece writes into
memory already faulted in.

A fresh host array of tens of MiB is new memory (glibc maps allocations over 32 MiB afresh each
time), and on a host without transparent huge pages each of its 4 KiB pages costs a fault the
first time it is written: reading 1 GB into fresh arrays ran at about 2.4 GB/s on a TPU v5e's
host, into reused ones at about 5.5 GB/s (see docs/benchmarks.md). A piece of a load
(:mod:`pytreestore._read.slabs`) takes a buffer here (:meth:`HostBuffers.take`), reads its
columns into it, hands it to ``jax.device_put``, and gives it back with the device arrays made
from it (:meth:`HostBuffers.give`); it is reused only once every one of them is ready, when the
copy to the device is over. At most ``RUNTIME.caches.host_buffers`` buffers are made (the
process keeps them: about 384 MiB after a load of more than that); a piece that finds none
free waits for the copies from the oldest one to end.

A CPU device may keep referring to the host memory it was given (``jax.device_put`` of an
aligned numpy array can alias it), so buffers handed to a CPU device are never reused.

Example:
    >>> pool = HostBuffers(cap=2)
    >>> a = pool.take(1000)
    >>> pool.give(a, [], reuse=True)
    >>> pool.take(900) is a, len(pool.take(5000)) >= 5000
    (True, True)

Loads onto an accelerator in pieces: reading, decoding and copying to the device overlap.

A load of every record of a 1 GB store read whole and then copied would spend its time in
turn: TensorStore decodes into fresh host arrays (on an accelerator's host each new page costs
a fault, about 1 GB/s on one thread), then ``jax.device_put`` copies them. Here a load of at
least ``RUNTIME.reads.slab_min_bytes`` onto one accelerator device is cut into *pieces* of about
``RUNTIME.reads.slab_bytes`` (:func:`plan`), ``RUNTIME.threads.slab_readers`` read side by side
(one piece: in the
calling thread, so that loads run side by side by ``batches`` keep their own threads), each
into a host buffer reused from load to load (:mod:`pytreestore._read.slabs`, where the
backend reads into the caller's arrays), and each is handed to ``jax.device_put`` as soon as
it is read, so the copy of one piece runs while the next are decoded:

* a column whose rows take at most ``RUNTIME.reads.whole_column_bytes`` is read whole, with other
  such
  columns (a wide tree of small leaves: a few pieces, nothing to join);
* a bigger column is read in *slabs* of whole chunks of rows, with the other big columns'
  rows of that slab; its slabs are joined on the device by one compiled concatenation per
  layout (cached by JAX), which costs the device's memory bandwidth, not the host's.

Loads onto the CPU, with a sharding (:mod:`pytreestore._read.sharded` splits those by device
already), as numpy, of an index array, or that the device's free memory could not hold (twice,
for the columns read in slabs) are read whole as before (:func:`planned` says which).

Example:
    >>> plan_slabs(slice(0, 100, 1), chunk=8, record_nbytes=1 << 20, slab_bytes=16 << 20)
    [slice(0, 16, 1), slice(16, 32, 1), slice(32, 48, 1), slice(48, 64, 1), slice(64, 80, 1), slice(80, 96, 1), slice(96, 100, 1)]
    >>> pieces = plan(slice(0, 1000, 1), [4, 4, 40_000], chunk=100, slab_bytes=8 << 20)
    >>> [(p.columns, p.rows) for p in pieces][:2], len(pieces)
    ([((0, 1), slice(0, 1000, 1)), ((2,), slice(0, 200, 1))], 6)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytreestore._runtime import RUNTIME, at_fork

#: platforms whose arrays may refer to the host memory they were made from: never reused
ALIASING = {"cpu"}


class HostBuffers:
    """Byte buffers for pieces of loads, reused once the device arrays made from them are
    ready.

    Args:
        cap: how many buffers it makes before it waits for the copies from one to end
            (more are made only when none is being copied: many loads at once).
    """

    def __init__(self, cap: int | None = None) -> None:
        self._cap = RUNTIME.caches.host_buffers if cap is None else cap
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []
        self._pending: list[tuple[np.ndarray, Sequence[Any]]] = []
        self._out = 0  # handed out by take, not given back yet
        self.made = 0  # buffers allocated (for tests and benchmarks)

    def take(self, nbytes: int) -> np.ndarray:
        """A buffer that holds ``nbytes`` bytes from its first page boundary (uint8): the
        smallest free one that does; else a new one, after waiting for the copies from the
        oldest one given back if :attr:`cap` buffers are made already."""
        while True:
            with self._lock:
                self._reclaim()
                fits = [b for b in self._free if len(b) - _first(b) >= nbytes]
                if fits:
                    buffer = min(fits, key=len)
                    self._free = [b for b in self._free if b is not buffer]
                    self._out += 1
                    return buffer
                if self._free:  # too small: one makes way for a bigger one
                    self._free.remove(min(self._free, key=len))
                if (
                    not self._pending
                    or self._out + len(self._pending) + len(self._free) < self._cap
                ):
                    self._out += 1
                    self.made += 1
                    break
                waiting = self._pending[0][1]
            _wait(waiting)
        try:
            align = RUNTIME.reads.host_align
            return np.empty(-(-nbytes // align) * align + align, np.uint8)
        except BaseException:  # MemoryError: the buffer was never made
            with self._lock:
                self._out -= 1
                self.made -= 1
            raise

    def give(self, buffer: np.ndarray, arrays: Sequence[Any], reuse: bool) -> None:
        """Gives ``buffer`` back; it is reused once every one of ``arrays`` (the device arrays
        made from it) is ready, or never if not ``reuse``."""
        with self._lock:
            self._out -= 1
            if reuse:
                self._pending.append((buffer, tuple(arrays)))
                self._reclaim()

    def free_buffers(self) -> int:
        """How many buffers are free now (their arrays ready)."""
        with self._lock:
            self._reclaim()
            return len(self._free)

    def _reclaim(self) -> None:
        """Moves the pending buffers whose arrays are all ready to the free ones."""
        still = []
        for buffer, arrays in self._pending:
            if all(_ready(a) for a in arrays):
                self._free.append(buffer)
            else:
                still.append((buffer, arrays))
        self._pending = still


def _wait(arrays: Sequence[Any]) -> None:
    """Waits until ``arrays`` are ready (a failed copy is over too)."""
    for array in arrays:
        with contextlib.suppress(Exception):  # a failed copy no longer reads the buffer
            array.block_until_ready()


def _ready(array: Any) -> bool:
    """Whether the copy to ``array`` is over (a failed one too). A deleted array counts as
    over, so that a buffer is never waited for without end: the loads wait for their copies
    before they hand out (or drop) an array (:func:`pytreestore._read.slabs.load`), so none
    is deleted while its copy still reads a buffer."""
    try:
        return bool(array.is_deleted() or array.is_ready())
    except Exception:  # its copy failed: it reads the buffer no more
        return True


def views(
    buffer: np.ndarray, shapes: Sequence[tuple[tuple[int, ...], np.dtype]]
) -> list[np.ndarray]:
    """Arrays of the given ``(shape, dtype)`` laid one after another in ``buffer``, each
    beginning on a page (:func:`nbytes` says how big ``buffer`` must be)."""
    out, offset = [], _first(buffer)
    for shape, dtype in shapes:
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        out.append(buffer[offset : offset + size].view(dtype).reshape(shape))
        offset += -(-size // RUNTIME.reads.host_align) * RUNTIME.reads.host_align
    return out


def nbytes(shapes: Sequence[tuple[tuple[int, ...], np.dtype]]) -> int:
    """The bytes :func:`views` lays ``shapes`` out in, from a page."""
    sizes = (int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in shapes)
    return sum(-(-n // RUNTIME.reads.host_align) * RUNTIME.reads.host_align for n in sizes)


class Arena:
    """Zeroed arrays cut one after another from ``buffer``, each from a page (a piece's
    padded arrays, made where :func:`views` would lay them); fresh ones once it is full."""

    def __init__(self, buffer: np.ndarray) -> None:
        self._buffer = buffer
        self._offset = _first(buffer)

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A zeroed array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._offset + size > len(self._buffer):
            return np.zeros(shape, dtype)
        out = self._buffer[self._offset : self._offset + size].view(dtype).reshape(shape)
        out.fill(0)
        align = RUNTIME.reads.host_align
        self._offset += -(-size // align) * align
        return out


def _first(buffer: np.ndarray) -> int:
    """The offset of the first page boundary in ``buffer``."""
    return -buffer.ctypes.data % RUNTIME.reads.host_align


_POOL: list[HostBuffers] = []


_POOL_LOCK = threading.Lock()


def pool() -> HostBuffers:
    """The process's buffers."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(HostBuffers())
        return _POOL[0]


def _after_fork() -> None:
    """A forked child starts with no buffers of its own (its copies of the parent's are not
    its to hand out while the parent's threads are gone mid-read)."""
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()
    _POOL.clear()


at_fork(_after_fork)


#: platforms the slab pipeline serves; tests add "cpu" to run it without an accelerator
PLATFORMS = {"tpu", "gpu", "cuda", "rocm"}


def plan_slabs(index: slice, chunk: int, record_nbytes: int, slab_bytes: int) -> list[slice]:
    """``index`` (a slice of step 1) cut at chunk boundaries into slabs of about
    ``slab_bytes``, each a whole number of ``chunk``-record chunks (the first and last may
    be cut by ``index``)."""
    per = max(chunk, slab_bytes // max(record_nbytes, 1) // chunk * chunk)
    start, stop = index.start, index.stop
    cuts = [start, *range((start // per + 1) * per, stop, per), stop]
    return [slice(lo, hi, 1) for lo, hi in itertools.pairwise(cuts) if hi > lo]


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows ``rows`` of the chosen columns at positions ``columns`` (among the chosen)."""

    columns: tuple[int, ...]
    rows: slice


def plan(index: slice, column_nbytes: Sequence[int], chunk: int, slab_bytes: int) -> list[Piece]:
    """The pieces of a load of rows ``index`` of columns taking ``column_nbytes`` bytes a
    record: the columns whose rows take at most ``RUNTIME.reads.whole_column_bytes`` in groups of
    about
    ``slab_bytes``, whole; the others together in slabs of rows (:func:`plan_slabs`)."""
    count = index.stop - index.start
    small = [
        i for i, b in enumerate(column_nbytes) if b * count <= RUNTIME.reads.whole_column_bytes
    ]
    big = [i for i, b in enumerate(column_nbytes) if b * count > RUNTIME.reads.whole_column_bytes]
    pieces: list[Piece] = []
    group: list[int] = []
    size = 0
    for i in small:
        if group and size + column_nbytes[i] * count > slab_bytes:
            pieces.append(Piece(tuple(group), index))
            group, size = [], 0
        group.append(i)
        size += column_nbytes[i] * count
    if group:
        pieces.append(Piece(tuple(group), index))
    if big:
        per = sum(column_nbytes[i] for i in big)
        pieces += [Piece(tuple(big), r) for r in plan_slabs(index, chunk, per, slab_bytes)]
    return pieces


def device_of(device: Any) -> Any:
    """The one device a load with ``device=`` places on, or None if it is a sharding (or
    something else this module does not take)."""
    if device is None:  # JAX's default device: jax_default_device if set, else the first
        default = getattr(jax.config, "jax_default_device", None)
        if isinstance(default, str):
            return jax.devices(default)[0]
        return default if isinstance(default, jax.Device) else jax.devices()[0]
    return device if isinstance(device, jax.Device) else None


def planned(index: Any, nbytes: int, device: Any) -> Any:
    """The device to load ``index`` (``nbytes`` of host arrays) onto in pieces, or None to
    read it whole: an index array, a small load, a sharding, a CPU device, or too little
    free device memory for the pieces and their concatenation."""
    if not isinstance(index, slice) or index.step != 1 or nbytes < RUNTIME.reads.slab_min_bytes:
        return None
    target = device_of(device)
    if target is None or target.platform not in PLATFORMS:
        return None
    stats = _memory_stats(target)
    if stats and "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
        if 2 * nbytes + RUNTIME.reads.slab_bytes > free:
            return None
    return target


def _memory_stats(device: Any) -> dict[str, int] | None:
    try:
        return device.memory_stats()
    except Exception:  # a platform without memory statistics
        return None


def load(
    read: Callable[[Piece, Callable[[int], np.ndarray]], Sequence[np.ndarray]],
    pieces: Sequence[Piece],
    columns: int,
    device: Any,
) -> list[jax.Array]:
    """Every piece of ``pieces`` read by ``read`` (host arrays of its columns' rows, in a
    dtype JAX holds), ``RUNTIME.threads.slab_readers`` at a time, each copied to ``device`` as soon
    as it is
    read; the ``columns`` chosen columns, each joined on the device from its slabs. ``device``
    is as the load was given it: None places on the default device uncommitted, as
    ``jax.device_put`` does, so the arrays may join computations on other devices.

    ``read(piece, buffer)`` may call ``buffer(nbytes)`` once for a host buffer to read into
    (:mod:`pytreestore._read.slabs`): it is reused once the device arrays copied from the
    piece are ready (never for a CPU device, which may keep referring to it, nor after a
    failed piece, whose reads may still be writing into it). The load returns, or raises,
    only once every copy it started is over, so no array it made is handed out (or dropped)
    while its copy still reads a buffer, and the pool holds no device array afterwards.

    Raises:
        Whatever ``read`` raised for the first piece that failed (the others are waited for).
    """
    futures: list[Future[list[jax.Array]]] = []
    window = threading.BoundedSemaphore(RUNTIME.threads.slab_readers)
    failed = threading.Event()  # a piece failed: the others are not read

    buffers = pool()
    reuse = device_of(device).platform not in ALIASING

    def task(piece: Piece) -> list[jax.Array]:
        taken: list[np.ndarray] = []

        def buffer(nbytes: int) -> np.ndarray:
            taken.append(buffers.take(nbytes))
            return taken[-1]

        placed: list[jax.Array] = []
        ok = False
        try:
            if failed.is_set():
                return []
            placed = _put(read(piece, buffer), device)
            ok = True
            return placed
        except BaseException:
            failed.set()
            raise
        finally:
            for b in taken:  # reused once placed's copies are over; a failed piece's never
                buffers.give(b, placed, reuse and ok)
            window.release()

    slab_pool = RUNTIME.slab_pool() if len(pieces) > 1 else None  # one piece is read here
    try:
        for piece in pieces:
            window.acquire()
            if failed.is_set():
                window.release()
                break
            try:
                if slab_pool is None:
                    futures.append(_done(task, piece))
                else:
                    futures.append(slab_pool.submit(task, piece))
            except RuntimeError:  # the interpreter is exiting: no new threads; read here
                futures.append(_done(task, piece))
        placed = [f.result() for f in futures]
    except BaseException:
        failed.set()
        for f in futures:
            f.cancel()
        for f in futures:
            if not f.cancelled():
                f.exception()  # waits: nothing is still reading when this returns
        done = [f for f in futures if not f.cancelled() and not f.exception()]
        _settle([a for f in done for a in f.result()], buffers)
        raise
    slabs: list[list[jax.Array]] = [[] for _ in range(columns)]
    for piece, arrays in zip(pieces, placed):
        for i, array in zip(piece.columns, arrays):
            slabs[i].append(array)
    joined = _join(slabs)
    _settle([a for arrays in placed for a in arrays], buffers)
    return joined


def _settle(arrays: Sequence[jax.Array], buffers: HostBuffers) -> None:
    """Waits for the copies to ``arrays`` to end (a failed one too), then frees their host
    buffers for the next pieces."""
    for array in arrays:
        with contextlib.suppress(Exception):
            array.block_until_ready()
    buffers.free_buffers()


def _put(arrays: Sequence[np.ndarray], device: Any) -> list[jax.Array]:
    """``arrays`` copied to ``device`` (None: the default device, uncommitted)."""
    return list(jax.device_put(list(arrays), device))


def _done(task: Callable[[Piece], list[jax.Array]], piece: Piece) -> Future[list[jax.Array]]:
    """``task(piece)`` run in this thread, as a finished future."""
    future: Future[list[jax.Array]] = Future()
    try:
        future.set_result(task(piece))
    except BaseException as err:
        future.set_exception(err)
    return future


def _join(slabs: list[list[jax.Array]]) -> list[jax.Array]:
    """Each column from its slabs, concatenated along the record axis (one: as it is)."""
    many = [i for i, s in enumerate(slabs) if len(s) > 1]
    out = [s[0] for s in slabs]
    if many:
        for i, joined in zip(many, _concatenate(tuple(tuple(slabs[i]) for i in many))):
            out[i] = joined
    return out


@functools.partial(jax.jit)
def _concatenate(columns: tuple[tuple[jax.Array, ...], ...]) -> list[jax.Array]:
    return [jnp.concatenate(slabs) for slabs in columns]


__all__ = ["ALIASING", "Arena", "HostBuffers", "nbytes", "pool", "views"]
