"""Big loads onto an accelerator in slabs: reading, decoding and copying to the device overlap.

A load of every record of a 1 GB store read whole and then copied would spend its time in
turn: TensorStore decodes into fresh host arrays (on an accelerator's host each new page costs
a fault, about 1 GB/s on one thread), then ``jax.device_put`` copies them. Here a load of at
least :data:`MIN_BYTES` onto one accelerator device is read in slabs of whole chunks of about
:data:`SLAB_BYTES`, :data:`READERS` slabs side by side, and each slab is handed to
``jax.device_put`` as soon as it is read, so the copy of one slab runs while the next ones are
decoded; the slabs' arrays are small enough for the allocator to reuse their memory. The
slabs are joined on the device by one compiled concatenation per column layout (cached by
JAX), which costs the device's memory bandwidth, not the host's.

Loads onto the CPU, with a sharding (:mod:`pytreestore._read.sharded` splits those by device
already), as numpy, of an index array, or that the device's free memory could not hold twice
are read whole as before (:func:`planned` says which).

Example:
    >>> plan_slabs(slice(0, 100, 1), chunk=8, record_nbytes=1 << 20, slab_bytes=16 << 20)
    [slice(0, 16, 1), slice(16, 32, 1), slice(32, 48, 1), slice(48, 64, 1), slice(64, 80, 1), slice(80, 96, 1), slice(96, 100, 1)]
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytreestore._platform import at_fork

SLAB_BYTES = 64 << 20  # bytes of one slab (every chosen column's rows of it), about
MIN_BYTES = 2 * SLAB_BYTES  # a smaller load is read whole
READERS = 3  # slabs read side by side (each decodes on TensorStore's own threads too)

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


def device_of(device: Any) -> Any:
    """The one device a load with ``device=`` places on, or None if it is a sharding (or
    something else this module does not take)."""
    if device is None:
        return jax.devices()[0]
    return device if isinstance(device, jax.Device) else None


def planned(index: Any, nbytes: int, device: Any) -> Any:
    """The device to load ``index`` (``nbytes`` of host arrays) onto in slabs, or None to
    read it whole: an index array, a small load, a sharding, a CPU device, or too little
    free device memory for the slabs and their concatenation."""
    if not isinstance(index, slice) or index.step != 1 or nbytes < MIN_BYTES:
        return None
    target = device_of(device)
    if target is None or target.platform not in PLATFORMS:
        return None
    stats = _memory_stats(target)
    if stats and "bytes_limit" in stats:
        free = stats["bytes_limit"] - stats.get("bytes_in_use", 0)
        if 2 * nbytes + SLAB_BYTES > free:
            return None
    return target


def _memory_stats(device: Any) -> dict[str, int] | None:
    try:
        return device.memory_stats()
    except Exception:  # a platform without memory statistics
        return None


def load(
    read: Callable[[slice], Sequence[np.ndarray]],
    slabs: Sequence[slice],
    device: Any,
) -> list[jax.Array]:
    """Every slab of ``slabs`` read by ``read`` (host arrays of its rows, one per column, in
    a dtype JAX holds), :data:`READERS` at a time, each copied to ``device`` as soon as it
    is read; the columns joined on the device.

    Raises:
        Whatever ``read`` raised for the first slab that failed (the others are waited for).
    """
    pool = _pool()
    futures: list[Future[list[jax.Array]]] = []
    pending = list(slabs)
    window = threading.BoundedSemaphore(READERS)

    def task(where: slice) -> list[jax.Array]:
        try:
            arrays = read(where)
            return list(jax.device_put(list(arrays), device))
        finally:
            window.release()

    try:
        for where in pending:
            window.acquire()
            futures.append(pool.submit(task, where))
        parts = [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        for f in futures:
            if not f.cancelled():
                f.exception()  # waits: nothing is still reading when this returns
        raise
    return _join(parts)


def _join(parts: list[list[jax.Array]]) -> list[jax.Array]:
    """Each column's slabs concatenated along the record axis (one slab: as it is)."""
    if len(parts) == 1:
        return parts[0]
    return _concatenate(tuple(tuple(column) for column in zip(*parts)))


@functools.partial(jax.jit)
def _concatenate(columns: tuple[tuple[jax.Array, ...], ...]) -> list[jax.Array]:
    return [jnp.concatenate(slabs) for slabs in columns]


_POOL: list[ThreadPoolExecutor] = []
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The readers' threads, kept for the process (a new thread gets a new malloc arena, so
    fresh threads per load would keep fresh memory)."""
    with _POOL_LOCK:
        if not _POOL:
            _POOL.append(ThreadPoolExecutor(READERS, thread_name_prefix="pytreestore-slab"))
        return _POOL[0]


def _after_fork() -> None:
    """A forked child has none of its parent's threads: it makes a pool of its own."""
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()
    _POOL.clear()


at_fork(_after_fork)
