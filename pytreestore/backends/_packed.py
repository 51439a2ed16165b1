"""Packed columns over any backend: the logical columns of a store created with ``pack=``,
read and written as slices of the shared pack arrays that hold them.

:class:`PackedColumns` wraps a store's backend and keeps its contract. Calls that name a
packed column (the writer's ``resize`` and ``write``, every ``read``) are turned into calls on
the packs: a write of all of a pack's columns becomes one write of the pack (each block
reshaped to ``(rows, elements)`` and set side by side), a read of any of them one read of the
pack's rows (only the span of elements of the columns asked for, where the backend has
:class:`~pytreestore.backends.PartialReads`), split and reshaped. Every other key, the packs'
own included, goes to the wrapped backend unchanged, and so does every optional capability it
has but :class:`~pytreestore.backends.PartialReads`, which it uses itself.

Example:
    >>> import numpy as np, pytreestore
    >>> like = {"a": np.zeros(2, np.float32), "b": np.float32(0)}
    >>> s = pytreestore.create("memory://doc-packed", like, pack=True)
    >>> s.extend({"a": np.full(2, i, np.float32), "b": np.float32(-i)} for i in range(3))
    >>> s.flush(); [c.key for c in s.schema.storage_columns]
    ['_pack_float32_0']
    >>> s._backend.read(["b"], slice(0, 3), 3)[0].tolist()
    [0.0, -1.0, -2.0]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent import futures
from concurrent.futures import Future
from typing import Any, NamedTuple

import numpy as np

from pytreestore._runtime import RUNTIME
from pytreestore.backends._base import (
    Backend,
    BatchedReads,
    MissingChunkError,
    PartialReads,
    ReadsInto,
)
from pytreestore.backends._registry import capable
from pytreestore.errors import CorruptChunkError


class Member(NamedTuple):
    """Where one packed column lives: its pack, element range and per-record shape."""

    pack: str
    offset: int
    count: int
    shape: tuple[int, ...]


class PackedColumns:
    """A backend whose packed columns are slices of pack arrays (see the module).

    Args:
        inner: the store's backend, which holds the pack arrays.
        members: every packed column's key -> :class:`Member`.
        packs: every pack's key -> (its dtype, its elements per record, its members' keys in
            offset order).
        chunk_rows: every pack's key -> its records per chunk.
    """

    def __init__(
        self,
        inner: Backend,
        members: dict[str, Member],
        packs: dict[str, tuple[np.dtype, int, tuple[str, ...]]],
        chunk_rows: dict[str, int],
    ) -> None:
        self._inner = inner
        self._members = members
        self._packs = packs
        self._chunk_rows = chunk_rows

    @property
    def inner(self) -> Backend:
        """The wrapped backend."""
        return self._inner

    def __getattr__(self, name: str) -> Any:  # every other method and capability: the inner's
        if name == "read_parts":  # of the packs' keys only, not of the packed columns' keys
            raise AttributeError(name)
        if name == "at_generation":  # (Snapshots) a pinned backend still reads the packs
            return self._at_generation(self._inner.at_generation)  # type: ignore[attr-defined]
        return getattr(self._inner, name)

    def _at_generation(self, pin: Callable[[int], Backend]) -> Callable[[int], Backend]:
        """The inner's ``at_generation`` whose backends are packed as this one."""

        def at_generation(generation: int, /) -> Backend:
            inner = pin(generation)
            return PackedColumns(inner, self._members, self._packs, self._chunk_rows)  # type: ignore[return-value]

        return at_generation

    # ---- the contract's column calls -------------------------------------------------------

    def _storage_keys(self, keys: Sequence[str]) -> list[str]:
        """``keys`` with each packed column replaced by its pack, once."""
        out = (self._members[k].pack if k in self._members else k for k in keys)
        return list(dict.fromkeys(out))

    def resize(self, keys: Sequence[str], records: int) -> None:
        self._inner.resize(self._storage_keys(keys), records)

    def column_shapes(self, keys: Sequence[str]) -> list[tuple[int, ...]]:
        shapes = dict(zip(stored := self._storage_keys(keys), self._inner.column_shapes(stored)))
        return [
            (shapes[m.pack][0], *m.shape) if (m := self._members.get(k)) else shapes[k]
            for k in keys
        ]

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> None:
        given = dict(zip(keys, blocks))
        out_keys, out_blocks = [], []
        for key in self._storage_keys(keys):
            if key in self._packs:
                out_blocks.append(self._pack_block(key, start, given))
            else:
                out_blocks.append(given[key])
            out_keys.append(key)
        self._inner.write(out_keys, start, out_blocks)

    def _pack_block(self, pack: str, start: int, given: dict[str, np.ndarray]) -> np.ndarray:
        """One block of the pack from its columns' blocks. A column not given (dropped by
        evolve) keeps what the pack holds there: older versions still read it."""
        dtype, elements, keys = self._packs[pack]
        rows = next(len(given[k]) for k in keys if k in given)
        out = np.zeros((rows, elements), dtype)
        if not all(k in given for k in keys):
            self._read_old(pack, start, out)
        for key in keys:
            if key in given:
                m = self._members[key]
                out[:, m.offset : m.offset + m.count] = given[key].reshape(rows, m.count)
        return out

    def _read_old(self, pack: str, start: int, out: np.ndarray) -> None:
        """Copies into ``out`` what the pack holds at rows ``start...``: committed rows live
        only in the chunk ``start`` falls in (a writer starts at its tail chunk); a chunk
        never written reads as zeros, a damaged one raises."""
        chunk = self._chunk_rows[pack]
        stop = min(start + len(out), (start // chunk + 1) * chunk)
        try:  # the writer resized the pack first, so these rows exist
            old = self._inner.read([pack], slice(start, stop), stop)[0]
        except CorruptChunkError as err:
            if err.key is None:
                raise
            if self._inner.read_bytes(err.key) is None:
                return
            if not isinstance(err, MissingChunkError):
                raise
            old = self._read_written(pack, start, stop)  # a shard's absent inner chunks
        out[: len(old)] = old

    def _read_written(self, pack: str, start: int, stop: int) -> np.ndarray:
        """The pack's rows ``[start, w)`` for the largest ``w < stop`` it holds: the inner
        chunks of a shard past its last write are absent (a damaged one raises)."""
        low, high = start, stop - 1  # rows [start, low) are held; rows from high + 1 not all
        while low < high:
            mid = (low + high + 1) // 2
            try:
                self._inner.read([pack], slice(start, mid), mid)
                low = mid
            except MissingChunkError:
                high = mid - 1
        if low == start:
            return np.empty((0,))
        return self._inner.read([pack], slice(start, low), low)[0]

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        return self.read_many([(k, index) for k in keys], records)

    def read_into(
        self, keys: Sequence[str], index: slice, records: int, outs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """(:class:`ReadsInto`) the inner's, for columns that are not packed; a packed column
        read in blocks (see :meth:`read_many`) is copied into its ``outs[i]``, block by
        block, and any other is read as :meth:`read` reads it."""
        if any(k in self._members for k in keys):
            return self._read([(k, index) for k in keys], records, outs)
        if not capable(self._inner, ReadsInto):
            return self.read(keys, index, records)
        return self._inner.read_into(keys, index, records, outs)

    def read_many(self, requests: Sequence[tuple[str, Any]], records: int) -> list[np.ndarray]:
        """Each ``(key, index)``; the requests of one pack at one index read it once, and
        where the backend reads parts (:class:`PartialReads`) only the span of elements of
        the columns asked for: one leaf of a wide pack costs the leaf's rows in memory, not
        the pack's. A slice of more rows than one block (:meth:`_block_rows`) is read in
        blocks (:meth:`_read_blocks`)."""
        return self._read(requests, records, None)

    def _read(
        self,
        requests: Sequence[tuple[str, Any]],
        records: int,
        outs: Sequence[np.ndarray] | None,
    ) -> list[np.ndarray]:
        """:meth:`read_many`, a packed column read in blocks copied into ``outs[i]`` (where
        given, and C-ordered)."""
        spans: dict[tuple[str, Any], tuple[Any, int, int]] = {}
        for key, index in requests:
            m = self._members.get(key)
            k, low, high = (m.pack, m.offset, m.offset + m.count) if m else (key, 0, 0)
            _, was_low, was_high = spans.get((k, _same(index)), (index, low, high))
            spans[(k, _same(index))] = (index, min(low, was_low), max(high, was_high))
        long = {g: rows for g in spans if (rows := self._long(g[0], spans[g][0], records))}
        order = [g for g in spans if g not in long]
        arrays = self._read_stored([(k, *spans[(k, i)]) for k, i in order], records)
        out: list[Any] = [None] * len(requests)
        for group, rows in long.items():
            _, low, high = spans[group]
            wanted = []  # (member, its rows as (rows, count)) of each request of the group
            for i, (key, index) in enumerate(requests):
                m = self._members.get(key)
                if m is not None and (m.pack, _same(index)) == group:
                    given = None if outs is None else outs[i]
                    out[i], flat = _output(given, len(rows), m, self._packs[m.pack][0])
                    wanted.append((m, flat))
            self._read_blocks(group[0], rows, low, high, wanted, records)
        got = dict(zip(order, arrays))
        for i, (key, index) in enumerate(requests):
            if out[i] is not None:
                continue
            m = self._members.get(key)
            if m is None:
                out[i] = got[(key, _same(index))][0]
                continue
            rows, low = got[(m.pack, _same(index))]
            part = rows[..., m.offset - low : m.offset - low + m.count]
            out[i] = np.ascontiguousarray(part).reshape(*rows.shape[:-1], *m.shape)
        return out

    def _long(self, key: str, index: Any, records: int) -> range | None:
        """The rows of ``index`` where it reads pack ``key`` in blocks: a slice of step 1
        over more rows than one block; else None."""
        if key not in self._packs or not isinstance(index, slice):
            return None
        rows = range(*index.indices(records))
        if rows.step != 1 or len(rows) <= self._block_rows(key):
            return None
        return rows

    def _block_rows(self, pack: str) -> int:
        """Rows of one block of ``pack``: whole chunks (the engine decodes a chunk at once,
        so a block never shares one with another), as many as fit in
        ``RUNTIME.reads.pack_block_bytes`` of decoded rows, or in
        ``RUNTIME.reads.pack_copy_bytes`` per column of the pack where that is more; one
        chunk at least."""
        dtype, elements, keys = self._packs[pack]
        chunk = self._chunk_rows[pack]
        reads = RUNTIME.reads
        target = max(reads.pack_block_bytes, len(keys) * reads.pack_copy_bytes)
        return chunk * max(1, target // max(1, chunk * elements * dtype.itemsize))

    def _read_blocks(
        self,
        pack: str,
        rows: range,
        low: int,
        high: int,
        wanted: list[tuple[Member, np.ndarray]],
        records: int,
    ) -> None:
        """Reads ``pack``'s ``rows`` (elements ``[low, high)``) and copies each block's part
        of every ``(member, rows)`` of ``wanted`` into those rows (:func:`_scatter`).

        The backend is called on this thread only (a transaction or handle bound to it
        stays so), for ``RUNTIME.threads.pack_blocks`` blocks a call, so that the engine
        decodes their chunks side by side; the pack pool copies the blocks out while the
        next call decodes. Whole rows are read into two buffers in turn (where the backend
        has :class:`ReadsInto`), so no memory is faulted in per call."""
        size = self._block_rows(pack)
        span = size * RUNTIME.threads.pack_blocks
        edges = [rows.start, *range((rows.start // span + 1) * span, rows.stop, span), rows.stop]
        dtype, elements, _ = self._packs[pack]
        into = (low, high) == (0, elements) and capable(self._inner, ReadsInto)
        shape = (min(span, len(rows)), elements)
        buffers = [np.empty(shape, dtype), np.empty(shape, dtype)] if into else []
        turns = [_Jobs(), _Jobs()]  # the copies out of each buffer
        try:
            for n, (start, stop) in enumerate(itertools.pairwise(edges)):
                jobs = turns[n % 2]
                jobs.wait()  # its buffer is free again
                index = slice(start, stop, 1)
                if into:
                    buffer = buffers[n % 2][: stop - start]
                    got = self._inner.read_into([pack], index, records, [buffer])[0]  # type: ignore[attr-defined]
                    first = 0
                else:
                    got, first = self._read_stored([(pack, index, low, high)], records)[0]
                for at in range(0, stop - start, size):
                    where = start - rows.start + at
                    jobs.submit(_scatter, got[at : at + size], first, wanted, where)
            for jobs in turns:
                jobs.wait()
        finally:
            for jobs in turns:
                jobs.stop()

    def _read_stored(
        self, requests: list[tuple[str, Any, int, int]], records: int
    ) -> list[tuple[np.ndarray, int]]:
        """Each ``(key, index, low, high)``: a pack's elements ``[low, high)`` where the
        backend reads parts, else whole rows; with the first element read."""
        inner = self._inner
        if capable(inner, PartialReads):
            parts = [(k, index, self._part(k, low, high)) for k, index, low, high in requests]
            arrays = inner.read_parts(parts, records)
            return [
                (a, 0 if p is None else low)
                for a, (_, _, p), (_, _, low, _) in zip(arrays, parts, requests)
            ]
        whole = [(k, index) for k, index, _, _ in requests]
        if capable(inner, BatchedReads):
            arrays = inner.read_many(whole, records)
        else:
            arrays = [inner.read([k], index, records)[0] for k, index in whole]
        return [(a, 0) for a in arrays]

    def _part(self, key: str, low: int, high: int) -> slice | None:
        """The elements ``[low, high)`` of pack ``key``; None for a column that is not a pack,
        or for all of a pack's elements."""
        if key not in self._packs or (low, high) == (0, self._packs[key][1]):
            return None
        return slice(low, high)


class _Jobs:
    """Jobs of one read on the pack pool (:meth:`~pytreestore._runtime.Runtime.pack_pool`),
    waited for together."""

    def __init__(self) -> None:
        self._futures: list[Future[None]] = []

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._futures.append(RUNTIME.pack_pool().submit(fn, *args))

    def wait(self) -> None:
        """Waits for every job submitted since the last wait; the first (in order) that
        failed raises its error, once the others have ended."""
        futures.wait(self._futures, return_when=futures.FIRST_EXCEPTION)
        self.stop()
        done, self._futures = self._futures, []
        for future in done:
            future.result()

    def stop(self) -> None:
        """Cancels the jobs not started and waits for the others to end (so nothing writes
        into a caller's arrays once the read has returned or raised)."""
        for future in self._futures:
            future.cancel()
        futures.wait(self._futures)


def _output(
    given: np.ndarray | None, rows: int, m: Member, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """The array that receives ``rows`` rows of member ``m`` (``given`` where it is C-ordered
    and of the right dtype and shape, else a new one), and its view as ``(rows, count)``."""
    shape = (rows, *m.shape)
    fits = given is not None and given.shape == shape and given.dtype == dtype
    if given is not None and fits and given.flags.c_contiguous:
        out = given
    else:
        out = np.empty(shape, dtype)
    return out, out.reshape(rows, m.count)


def _scatter(
    block: np.ndarray, first: int, wanted: list[tuple[Member, np.ndarray]], at: int
) -> None:
    """Copies each member's part of ``block`` (pack rows holding elements from ``first``)
    into its rows ``(rows, count)`` of ``wanted``, from row ``at``."""
    stop = at + len(block)
    for m, flat in wanted:
        flat[at:stop] = block[:, m.offset - first : m.offset - first + m.count]


def _same(index: Any) -> Any:
    """What makes requests of one pack one read: an equal slice (the cache asks for each
    leaf's chunk with a slice of its own), or the same index array."""
    if isinstance(index, slice):
        return ("slice", index.start, index.stop, index.step)
    return ("array", id(index))


def packed(inner: Backend, packs: Sequence[Any], columns: Sequence[Any]) -> Backend:
    """``inner`` wrapped for ``packs`` (:class:`pytreestore._format.compression.Pack`) of a schema
    whose columns (and dropped ones) are ``columns``; ``inner`` itself without packs."""
    if not packs:
        return inner
    shapes = {c.key: tuple(c.shape) for c in columns}
    members = {
        key: Member(p.key, offset, count, shapes[key])
        for p in packs
        for key, offset, count in p.members
    }
    table = {p.key: (p.dtype, p.elements, tuple(k for k, _, _ in p.members)) for p in packs}
    if isinstance(inner, PackedColumns):
        inner = inner.inner
    chunk_rows = {p.key: p.chunks[0] for p in packs}
    return PackedColumns(inner, members, table, chunk_rows)  # type: ignore[return-value]


__all__ = ["Member", "PackedColumns", "packed"]
