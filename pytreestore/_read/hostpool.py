"""Host buffers reused by big loads onto an accelerator, so that reading a piece writes into
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
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from pytreestore._platform import at_fork
from pytreestore._runtime import RUNTIME

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


__all__ = ["ALIASING", "Arena", "HostBuffers", "nbytes", "pool", "views"]
