"""Sharded and pmap loads: each device's rows read once, all reads at once, then assembled.

A load with ``sharding=`` builds one global ``jax.Array`` per column, shaped
``(count, *leaf_shape)``. For each column, ``sharding.addressable_devices_indices_map`` says
which rows (and leaf-axis slices) each of this process's devices holds. Identical row ranges
(replicated mesh axes, splits of leaf axes) are read once; the reads of every column for every
device go to the backend in one batch; the blocks go to their devices in one
``jax.device_put`` and each column is assembled with
``jax.make_array_from_single_device_arrays``. Under ``jax.distributed`` a process therefore
reads only the rows of its own devices. A pmap load is the same with a global shape
``(n_devices, count // n_devices, *leaf_shape)`` split along its first axis.

Example:
    >>> import jax, numpy as np, pytreestore
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> store = pytreestore.create("memory://doc-sharded", {"x": np.float32(0)})
    >>> store.extend({"x": np.float32(i)} for i in range(4))
    >>> mesh = jax.make_mesh((1,), ("data",))
    >>> store.load(sharding=NamedSharding(mesh, P("data")))["x"].sharding.spec
    P('data',)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from pytreestore._format.schema import ColumnSpec
from pytreestore._read import place as _device
from pytreestore._read.index import Selection
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, BatchedReads, capable
from pytreestore.errors import ShardingError

#: an array's column path, dtype and per-record shape (what a split count checks)
Column = tuple[str, np.dtype, tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class Piece:
    """One device's block of one column: rows ``[start, stop)`` of the padded selection."""

    column: int
    device: Any  # a jax.Device
    rows: tuple[int, int]
    leaf: tuple[slice, ...]


def resolve(sharding: Any, pmap_devices: Any, paths: Sequence[str]) -> list[Sharding]:
    """One sharding per column path, from ``sharding=`` or ``pmap_devices=``."""
    if pmap_devices is not None:
        return [_device.pmap_sharding(pmap_devices)] * len(paths)
    return _device.column_shardings(sharding, paths)


def check_batches(
    specs: Sequence[ColumnSpec],
    shardings: Sequence[Sharding],
    batch_size: int,
    count: int,
    *,
    drop_last: bool,
) -> None:
    """Checks up front that every batch of ``batch_size`` (and the short last one) splits.

    Raises:
        ShardingError: naming the batch size to use instead.
    """
    sizes = [batch_size] + ([count % batch_size] if count % batch_size and not drop_last else [])
    for size in sizes:
        try:
            padded_count(specs, size, shardings, pad=False)
        except ShardingError as err:
            step = padded_count(specs, 1, shardings, pad=True)
            last = "the last batch of " if size != batch_size else ""
            raise ShardingError(
                f"{last}{size} records cannot be split by the sharding: batches need a "
                f"multiple of {step} records. Choose batch_size as a multiple of {step}"
                + ("" if size == batch_size else ", or pass drop_last=True")
                + f". ({err})"
            ) from err


def load(
    backend: Backend,
    specs: Sequence[ColumnSpec],
    selection: Selection,
    records: int,
    shardings: Sequence[Sharding],
    *,
    pad: bool,
    cast: bool,
    pmap: bool = False,
) -> tuple[list[jax.Array], jax.Array | None]:
    """Loads ``selection`` of every column of ``specs`` as global arrays.

    Args:
        backend: the store's storage engine.
        specs: the columns to load.
        selection: the normalised record index.
        records: the store's committed record count.
        shardings: one per column; for ``pmap``, the :func:`_device.pmap_sharding`.
        pad: pad the selection up to a count every sharding splits, instead of raising.
        cast: cast 64-bit columns to 32 bits while x64 is disabled.
        pmap: lay every column out as ``(n_devices, per_device, *leaf_shape)``.

    Returns:
        The global arrays, and the padding mask (None unless ``pad``): a bool array over the
        padded records, True for real records, laid out like the columns' record axis.

    Raises:
        ShardingError: a sharding cannot split the count (without ``pad``) or a leaf shape.
    """
    total = padded_count(specs, selection.count, shardings, pad=pad, pmap=pmap)
    shapes = [_global_shape(total, c, s, pmap) for c, s in zip(specs, shardings)]
    pieces = [p for i, s in enumerate(shardings) for p in _pieces(i, s, shapes[i], pmap)]
    blocks = _read_blocks(backend, specs, selection, records, pieces, cast)
    data = [blocks[p.column, p.rows][(slice(None), *p.leaf)] for p in pieces]
    if pmap:
        data = [d.reshape(1, *d.shape) for d in data]
    placed = jax.device_put(data, [p.device for p in pieces])
    by_column: list[list[jax.Array]] = [[] for _ in specs]
    for piece, array in zip(pieces, placed):
        by_column[piece.column].append(array)
    arrays: list[jax.Array] = [
        jax.make_array_from_single_device_arrays(shape, sharding, parts)
        for shape, sharding, parts in zip(shapes, shardings, by_column)
    ]
    mask = (
        _mask(selection.count, shapes[0][: 2 if pmap else 1], shardings[0], pmap) if pad else None
    )
    return arrays, mask


def place(
    arrays: Sequence[np.ndarray],
    columns: Sequence[Column],
    shardings: Sequence[Sharding],
    *,
    pad: bool,
    pmap: bool = False,
) -> list[jax.Array]:
    """Host arrays of one record count (a ragged load's padded leaves and masks), each placed
    as a global array split along the record axis by its sharding, as a sharded load places
    columns: with ``pad``, padded with zeros (``False`` in a mask) to a count that every
    sharding splits; for ``pmap``, laid out as ``(n_devices, per_device, ...)``.

    Args:
        arrays: the host arrays, records first, in a dtype JAX holds.
        columns: each array's ``(path, dtype, per-record shape)``, for the split check.
        shardings: one per array (the pmap sharding for every array of a ``pmap`` load).
        pad: pad a count the shardings cannot split instead of raising.
        pmap: lay the records out for ``jax.pmap``.

    Raises:
        ShardingError: as :func:`split_count`.
    """
    count = len(arrays[0]) if arrays else 0
    total = split_count(columns, count, shardings, pad=pad, pmap=pmap)
    shaped = [_laid_out(_rows(a, total), s, pmap) for a, s in zip(arrays, shardings)]
    if all(s.is_fully_addressable for s in shardings):  # one process: JAX cuts the blocks
        return list(jax.device_put(shaped, list(shardings)))
    return assemble(shaped, shardings)


def _rows(array: np.ndarray, total: int) -> np.ndarray:
    """``array`` with zero rows added up to ``total`` records."""
    if len(array) == total:
        return array
    out = np.zeros((total, *array.shape[1:]), array.dtype)
    out[: len(array)] = array
    return out


def _laid_out(array: np.ndarray, sharding: Sharding, pmap: bool) -> np.ndarray:
    """``array`` shaped ``(n_devices, per_device, ...)`` for a pmap load; else as it is."""
    if not pmap:
        return array
    devices = len(sharding.device_set)
    return array.reshape(devices, len(array) // devices, *array.shape[1:])


def assemble(arrays: Sequence[np.ndarray], shardings: Sequence[Sharding]) -> list[jax.Array]:
    """Each host array as the global array of its sharding: every block this process's
    devices hold cut from it, all placed by one ``jax.device_put``, then joined (under
    ``jax.distributed`` each process places only its own devices' blocks)."""
    pieces = [
        (i, device, tuple(index) if index is not None else ())
        for i, (array, sharding) in enumerate(zip(arrays, shardings))
        for device, index in sharding.addressable_devices_indices_map(array.shape).items()
    ]
    placed = jax.device_put([arrays[i][index] for i, _, index in pieces], [d for _, d, _ in pieces])
    parts: list[list[jax.Array]] = [[] for _ in arrays]
    for (i, _, _), block in zip(pieces, placed):
        parts[i].append(block)
    return [
        jax.make_array_from_single_device_arrays(a.shape, s, p)
        for a, s, p in zip(arrays, shardings, parts)
    ]


def padded_count(
    specs: Sequence[ColumnSpec],
    count: int,
    shardings: Sequence[Sharding],
    *,
    pad: bool,
    pmap: bool = False,
) -> int:
    """``count``, or with ``pad`` the next count that every column's sharding splits.

    Raises:
        ShardingError: the shardings cannot split ``count`` and ``pad`` is false, or a
            sharding cannot split a column's leaf axes.
    """
    columns = [(c.path, np.dtype(c.dtype), c.shape) for c in specs]
    return split_count(columns, count, shardings, pad=pad, pmap=pmap)


def split_count(
    columns: Sequence[Column],
    count: int,
    shardings: Sequence[Sharding],
    *,
    pad: bool,
    pmap: bool = False,
) -> int:
    """``count``, or with ``pad`` the next count that splits over every sharding, for arrays
    ``(count, *shape)`` of the ``(path, dtype, shape)`` of ``columns`` (a fixed column's
    leaf shape, or a ragged leaf's padded one).

    Raises:
        ShardingError: as :func:`padded_count`.
    """
    parts = [_record_parts(c, s, pmap) for c, s in zip(columns, shardings)]
    step = math.lcm(*parts) if parts else 1
    if count % step == 0:
        return count
    if pad:
        return -(-count // step) * step
    worst = next(i for i, p in enumerate(parts) if count % p)
    what = "devices" if pmap else "record-axis shards"
    raise ShardingError(
        f"cannot split {count} records over {step} {what} (column {columns[worst][0]}, "
        f"sharding {shardings[worst]}): the record count must be a multiple of {step}. "
        f"Load {count // step * step} records (e.g. index 0:{count // step * step}), or pass "
        f"pad=True to pad to {-(-count // step) * step} with fill values and get a mask."
    )


def _record_parts(column: Column, sharding: Sharding, pmap: bool) -> int:
    """Into how many parts ``sharding`` splits the record axis of ``column``'s arrays."""
    path, dtype, shape = column
    if pmap:
        return len(sharding.device_set)
    probe = len(sharding.device_set)
    try:
        return probe // sharding.shard_shape((probe, *shape))[0]
    except ValueError as err:
        raise ShardingError(
            f"sharding {sharding} cannot split column {path} "
            f"({dtype.name}[{','.join(map(str, shape))}] per record): {err}"
        ) from err


def _global_shape(total: int, spec: ColumnSpec, sharding: Sharding, pmap: bool) -> tuple[int, ...]:
    if not pmap:
        return (total, *spec.shape)
    devices = len(sharding.device_set)
    return (devices, total // devices, *spec.shape)


def _pieces(column: int, sharding: Sharding, shape: tuple[int, ...], pmap: bool) -> list[Piece]:
    pieces = []
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        given = tuple(index) if index is not None else ()
        index = given + (slice(None),) * (len(shape) - len(given))
        start, stop, _ = index[0].indices(shape[0])
        if pmap:
            per = shape[1]
            start, stop = start * per, stop * per
        leaf = index[2:] if pmap else index[1:]
        pieces.append(Piece(column, device, (start, stop), leaf))
    return pieces


def _read_blocks(
    backend: Backend,
    specs: Sequence[ColumnSpec],
    selection: Selection,
    records: int,
    pieces: Sequence[Piece],
    cast: bool,
) -> dict[tuple[int, tuple[int, int]], np.ndarray]:
    """Every distinct (column, row range) of ``pieces``, read at once, padded and cast."""
    wanted = list(dict.fromkeys((p.column, p.rows) for p in pieces))
    reads = [(column, rows) for column, rows in wanted if min(rows[1], selection.count) > rows[0]]
    requests = [
        (specs[c].key, _compose(selection, rows[0], min(rows[1], selection.count)))
        for c, rows in reads
    ]
    got = dict(zip(reads, read_many(backend, requests, records)))
    blocks = {}
    for column, rows in wanted:
        spec = specs[column]
        data = got.get((column, rows))
        block = _padded(data, rows[1] - rows[0], spec)
        blocks[column, rows] = _device.jax_ready(block, spec.path, cast)
    return blocks


def _compose(selection: Selection, start: int, stop: int) -> Any:
    """The storage index of positions ``[start, stop)`` of ``selection``."""
    index = selection.index
    if isinstance(index, slice):
        step = index.step or 1
        return slice(index.start + start * step, index.start + stop * step, step)
    return index[start:stop]


def _padded(data: np.ndarray | None, rows: int, spec: ColumnSpec) -> np.ndarray:
    if data is not None and len(data) == rows:
        return data
    block = np.zeros((rows, *spec.shape), spec.dtype)  # zero is every column's fill value
    if data is not None:
        block[: len(data)] = data
    return block


def read_many(
    backend: Backend, requests: Sequence[tuple[str, Any]], records: int
) -> list[np.ndarray]:
    """Reads ``index`` of column ``key`` for every ``(key, index)`` request, all at once.

    Uses the backend's ``read_many`` where it has one; otherwise one ``read`` per distinct
    index (each covering all its columns), issued from threads so they overlap.
    """
    if not requests:
        return []
    if capable(backend, BatchedReads):
        return backend.read_many(requests, records)
    groups: dict[Any, list[int]] = {}
    for i, (_, index) in enumerate(requests):
        groups.setdefault(_hashable(index), []).append(i)
    out: list[Any] = [None] * len(requests)
    with RUNTIME.call_pool(min(len(groups), RUNTIME.threads.sharded_reads)) as pool:
        futures = {
            pool.submit(
                backend.read, [requests[i][0] for i in ids], requests[ids[0]][1], records
            ): ids
            for ids in groups.values()
        }
        for future, ids in futures.items():
            for i, array in zip(ids, future.result()):
                out[i] = array
    return out


def _hashable(index: Any) -> Any:
    if isinstance(index, slice):
        return (index.start, index.stop, index.step)
    return (np.asarray(index).tobytes(),)


def _mask(count: int, shape: tuple[int, ...], like: Sharding, pmap: bool) -> jax.Array:
    valid = (np.arange(math.prod(shape)) < count).reshape(shape)
    sharding = like if pmap else _device.record_axis_sharding(like)
    return jax.make_array_from_callback(shape, sharding, lambda index: valid[index])
