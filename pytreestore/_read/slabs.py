"""Loads onto an accelerator in pieces: reading, decoding and copying to the device overlap.

A load of every record of a 1 GB store read whole and then copied would spend its time in
turn: TensorStore decodes into fresh host arrays (on an accelerator's host each new page costs
a fault, about 1 GB/s on one thread), then ``jax.device_put`` copies them. Here a load of at
least ``RUNTIME.reads.slab_min_bytes`` onto one accelerator device is cut into *pieces* of about
``RUNTIME.reads.slab_bytes`` (:func:`plan`), ``RUNTIME.threads.slab_readers`` read side by side
(one piece: in the
calling thread, so that loads run side by side by ``batches`` keep their own threads), each
into a host buffer reused from load to load (:mod:`pytreestore._read.hostpool`, where the
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

from pytreestore._read import hostpool as _hostpool
from pytreestore._runtime import RUNTIME

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
    (:mod:`pytreestore._read.hostpool`): it is reused once the device arrays copied from the
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

    buffers = _hostpool.pool()
    reuse = device_of(device).platform not in _hostpool.ALIASING

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

    pool = RUNTIME.slab_pool() if len(pieces) > 1 else None  # one piece is read here
    try:
        for piece in pieces:
            window.acquire()
            if failed.is_set():
                window.release()
                break
            try:
                if pool is None:
                    futures.append(_done(task, piece))
                else:
                    futures.append(pool.submit(task, piece))
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


def _settle(arrays: Sequence[jax.Array], buffers: _hostpool.HostBuffers) -> None:
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
