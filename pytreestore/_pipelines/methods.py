"""The streaming methods of a store: ``batches``, ``map`` and ``grain_source``.

:class:`Pipelines` is a face of :class:`~pytreestore.TreeStore` using only its
:class:`~pytreestore._core.StoreCore`: each method builds one
:class:`~pytreestore._read.request.LoadRequest` through the store's
:class:`~pytreestore._read.reader.ReadContext`, checks it once against the batch size, and
hands the pipeline (:mod:`~pytreestore._pipelines.batches`, :mod:`~pytreestore._pipelines.prefetch`)
a load function bound to it.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-pipelines", {"x": np.int32(0)})
    >>> store.extend({"x": np.int32(i)} for i in range(4))
    >>> [b["x"].tolist() for b in store.batches(2)]
    [[0, 1], [2, 3]]
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from pytreestore import _arguments
from pytreestore._core import StoreCore
from pytreestore._pipelines import order as _resume
from pytreestore._pipelines import order as _shuffle
from pytreestore._pipelines import prefetch as _map
from pytreestore._pipelines.batches import BatchIterator, GrainPadding, GrainSource
from pytreestore._pipelines.prefetch import auto_depth
from pytreestore._read.cache import ChunkCache
from pytreestore._read.engine import record_reads
from pytreestore._read.reader import ReadContext
from pytreestore._read.request import LoadRequest
from pytreestore.errors import ArgumentTypeError


class Pipelines:
    """``batches``, ``map`` and ``grain_source``: a face of ``TreeStore``."""

    _core: StoreCore

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def batches(
        self,
        batch_size: int,
        *,
        shuffle: bool | str = False,
        seed: int = 0,
        drop_last: bool = False,
        prefetch: int | None = None,
        columns: str | Sequence[str] | Any | None = None,
        sharding: Any = None,
        start: int = 0,
        stop: int | None = None,
        epochs: int | None = 1,
        state: dict[str, Any] | None = None,
        cast: bool | None = None,
        ragged: str = "pad",
        pad_to: int | str | Sequence[int] | None = None,
        trim: bool = False,
        truncate: bool | None = None,
        shuffle_window: int | None = None,
    ) -> BatchIterator:
        """Iterates over records ``[start, stop)`` in batches on device, read ahead in the background.

        Args:
            batch_size: records per batch.
            shuffle: visit records in an order drawn from ``(seed, epoch)`` each epoch:
                ``True`` or ``"block"`` is a block shuffle (chunks in a random order, records
                shuffled within windows of several chunks, each chunk read once per epoch),
                ``"uniform"`` an exact uniform shuffle (each batch reads from all over the
                store). See docs/sharding.md, "Shuffling", for what each costs.
            seed: the shuffle seed.
            drop_last: skip the last batch of an epoch when it is short.
            prefetch: batches read (and copied to device) ahead while the caller computes,
                that many loads side by side (up to 8); 0 reads each batch when it is asked
                for. None (default): as many as keep about 256 MiB ahead, 2 to 8 and at most
                one per core (a small batch decodes on one core per column, so several are
                read at once). See docs/sharding.md, "Feeding an accelerator".
            columns: columns to load, as for :meth:`load`.
            sharding: as for :meth:`load`; each batch becomes global arrays split this way.
            start: first record (negative counts from the end).
            stop: end of the records (default: the store's length now).
            epochs: passes over the records; None repeats without end.
            state: a dict from :meth:`BatchIterator.state` to continue from.
            cast: as for :meth:`load`.
            ragged: for a ragged store, as for :meth:`load`: each batch is the pair
                ``(batch, mask)`` (or ``(values, segments)``).
            pad_to: as for :meth:`load`; give buckets so that a jitted step compiles once
                per bucket.
            trim: as for :meth:`load`.
            truncate: the old name of ``trim`` (an alias).
            shuffle_window: records a block shuffle shuffles together, rounded up to whole
                chunks (default: about 64 MiB of decoded records); the iterator keeps about
                2.5 windows of decoded chunks in a cache of its own.

        Returns:
            A :class:`~pytreestore.BatchIterator` of batched records; its ``state()``
            reports the position to resume from.

        Raises:
            ShardingError: ``sharding`` cannot split ``batch_size`` (or, without
                ``drop_last``, the last short batch).
            ArgumentError: a ``state`` field of the wrong type or range, unknown or missing,
                or one that does not fit these arguments or the store's length (the
                message names the field); ``columns`` that select no column.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-store-batches", {"x": np.int32(0)})
            >>> s.extend({"x": np.int32(i)} for i in range(5))
            >>> it = s.batches(2, drop_last=True)
            >>> [b["x"].tolist() for b in it], it.state()["epoch"]
            ([[0, 1], [2, 3]], 1)
        """
        batch_size, start, stop, seed, prefetch, epochs = _batch_arguments(
            batch_size, start, stop, seed, prefetch, epochs
        )
        drop_last = _arguments.flag(drop_last, "drop_last")
        if state is not None:
            state = _resume.checked(state)  # before anything is read
        context = self._core.read_context()
        request = context.request(columns=columns, sharding=sharding, cast=cast)
        lo, hi, _ = slice(start, stop).indices(context.readable())
        hi = max(lo, hi)
        request.check_batches(batch_size, hi - lo, drop_last=drop_last)
        if prefetch is None:
            prefetch = auto_depth(batch_size * request.record_nbytes)
        order, context = _shuffled(
            self._core,
            context,
            request,
            (shuffle, shuffle_window),
            (batch_size, prefetch),
            lo,
            hi,
            state,
        )
        return BatchIterator(
            _loader(
                self._core, context, request, ragged, pad_to, _arguments.trimmed(trim, truncate)
            ),
            start=lo,
            stop=hi,
            batch_size=batch_size,
            shuffle=order,
            seed=seed,
            drop_last=drop_last,
            prefetch=prefetch,
            epochs=epochs,
            state=state,
        )

    def map(
        self,
        fn: Callable[[Any], Any],
        *,
        batch_size: int | None = None,
        out: Any = None,
        columns: str | Sequence[str] | Any | None = None,
        sharding: Any = None,
        progress: bool = False,
        prefetch: int | None = None,
        cast: bool | None = None,
        pad_to: int | str | Sequence[int] | None = None,
        trim: bool = False,
        truncate: bool | None = None,
    ) -> Any:
        """Applies ``jax.jit(jax.vmap(fn))`` to every record, one batch at a time.

        Args:
            fn: a function of one record (leaves without the record axis). Each call traces
                and compiles it afresh, so what it reads from outside its argument is read
                now; a function wrapped in ``jax.jit`` keeps its compiled step from call to
                call instead, as ``jax.jit`` keeps its own (what it read at its first trace
                stays), which saves the compile of each call; ``jax.clear_caches()`` drops
                those steps too (``fn.clear_cache()`` clears only ``fn``'s own). With
                ``pad_to`` on a ragged store ``fn`` is called through a wrapper, so it is
                traced by each call.
            batch_size: records per compiled call (default: the store's ``chunk_records``).
            out: None to return the stacked results; a store open for appending (or a path
                for a new store, created from the first result) to append them to instead.
            columns: columns to load, as for :meth:`load`; ``fn`` sees None for the others.
            sharding: as for :meth:`load`; each batch is split this way.
            progress: show a progress bar (records and MB/s) on standard error.
            prefetch: batches read ahead while the previous one computes, as for
                :meth:`batches` (None: 2 to 8, about 256 MiB ahead, one per core at most).
            cast: as for :meth:`load`.
            pad_to: for a ragged store, as for :meth:`load`: ``fn`` is then a function of
                ``(record, mask)``, one padded record and its mask; with ``pad_to`` fixed
                every batch has one shape (one compile).
            trim: as for :meth:`load`.
            truncate: the old name of ``trim`` (an alias).

        Returns:
            The results with a leading record axis, or the ``out`` store.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-store-map", {"x": np.float32(0)})
            >>> s.extend({"x": np.float32(i)} for i in range(3))
            >>> s.map(lambda r: {"y": r["x"] + 1}, batch_size=2)["y"]
            Array([1., 2., 3.], dtype=float32)
        """
        if not callable(fn):
            raise ArgumentTypeError(f"map() takes a function of a record, got {fn!r:.80}")
        rule = "batch_size must be a positive int (of at most 2**31 - 1 records)"
        batch_size = _arguments.optional_count(batch_size, rule, minimum=1, maximum=_MAP_BATCH)
        prefetch = _arguments.optional_count(prefetch, "prefetch must be None or an int >= 0")
        progress = _arguments.flag(progress, "progress")
        _check_out(out)
        core = self._core
        context = core.read_context()
        size = batch_size if batch_size is not None else core.schema.chunk_records
        request = context.request(columns=columns, sharding=sharding, cast=cast)
        request.check_batches(size, size, drop_last=True)
        if prefetch is None:
            prefetch = auto_depth(size * request.record_nbytes)
        return _map.map_records(
            record_reads(request.schema).on_batch(fn),
            _loader(core, context, request, "pad", pad_to, _arguments.trimmed(trim, truncate)),
            count=context.readable(),
            batch_size=size,
            out=out,
            progress=progress,
            record_nbytes=request.record_nbytes,
            prefetch=prefetch,
            create=core.spec.creator,
        )

    def grain_source(
        self,
        *,
        columns: str | Sequence[str] | Any | None = None,
        padded: bool | None = None,
        pad_to: int | None = None,
        trim: bool = False,
        truncate: bool | None = None,
    ) -> GrainSource:
        """This store as a Grain random-access data source (records with numpy leaves).

        Args:
            columns: columns to load, as for :meth:`load`.
            padded: give each record as ``(record, mask)``, padded along every ragged axis
                to ``pad_to``, so that Grain's default batching stacks them into the
                ``(batch, mask)`` of ``load(index, pad_to=pad_to)``; None (the default):
                padded for a ragged or optional store, exact records for a fixed one.
            pad_to: the padded length of every ragged axis (an int); None: the longest in
                the store when the source is made.
            trim: cut longer lists to ``pad_to`` instead of refusing them.
            truncate: the old name of ``trim`` (an alias).

        Raises:
            ArgumentError: ``pad_to`` or ``trim`` without padding, or on a fixed store.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-store-grain", {"x": np.int32(0)})
            >>> s.extend({"x": np.int32(i)} for i in range(3))
            >>> src = s.grain_source()
            >>> len(src), int(src[1]["x"])
            (3, 1)
        """
        context = self._core.read_context()
        request = context.request(columns=columns, as_numpy=True)  # before lengths are read
        reads = record_reads(request.schema)
        trim = _arguments.trimmed(trim, truncate)
        padding = reads.grain_padding(GrainPadding, self, padded, pad_to, trim)
        load = _loader(self._core, context, request, "pad", padding.pad_to, padding.truncate)
        return GrainSource(self, columns=columns, load=load, padding=padding, spec=self._core.spec)


#: the largest batch map() compiles a call of (its last batch is padded to it)
_MAP_BATCH = 2**31 - 1


def _batch_arguments(*values: Any) -> tuple[Any, ...]:
    """``batches()``'s counts, checked: numpy integers taken, bools and floats refused."""
    batch_size, start, stop, seed, prefetch, epochs = values
    return (
        _arguments.count(batch_size, "batch_size must be a positive int", minimum=1),
        _arguments.count(start, "start must be an int (a record index)", minimum=None),
        _arguments.optional_count(
            stop, "stop must be None or an int (a record index)", minimum=None
        ),
        _arguments.count(seed, "seed must be an int >= 0"),
        _arguments.optional_count(prefetch, "prefetch must be None or an int >= 0"),
        _arguments.optional_count(epochs, "epochs must be >= 0 or None (endless)"),
    )


def _shuffled(
    core: StoreCore,
    context: ReadContext,
    request: LoadRequest,
    asked: tuple[Any, Any],
    batching: tuple[int, int],
    lo: int,
    hi: int,
    state: dict[str, Any] | None,
) -> tuple[_shuffle.Shuffle, ReadContext]:
    """The order of ``batches(shuffle=, shuffle_window=)`` (``batching``: its batch size and
    prefetch depth) over records ``[lo, hi)``, and
    the context to read with: in order or block-shuffled, the batches read through a cache
    of their own, which keeps the chunks (or windows) they are reading decoded, so that each
    is decoded once per epoch whatever the store's cache holds (a store in memory needs
    none; a uniform shuffle reads from all over the store, through the store's cache)."""
    head = core.head()  # bytes a record holds on average: every table's rows over the
    # record table's, both counted from row 0 (released rows too, after a keep_last)
    nbytes = sum(head.rows(c.table) * c.record_nbytes for c in request.specs)
    nbytes /= max(head.records, 1)
    chunk = core.schema.chunk_records
    order = _shuffle.resolve(
        *asked, chunk=chunk, record_nbytes=nbytes, start=lo, count=hi - lo, resumed=state
    )
    if order.mode == "uniform" or context.location.kind == "memory":
        return order, context
    cache = ChunkCache(_shuffle.cache_bytes(order, nbytes, *batching))
    private = {"cache": cache, "cache_id": uuid.uuid4().hex, "whole_chunks": True}
    return order, dataclasses.replace(context, **private)


def _check_out(out: Any) -> None:
    """Refuses a ``map(out=)`` that is neither None, a path nor a store open for appending."""
    if (
        out is None
        or isinstance(out, str | os.PathLike)
        or callable(getattr(out, "extend_batch", None))
    ):
        return
    raise ArgumentTypeError(
        f"map(out=...) takes None, a path for a new store, or a store open with mode='a', "
        f"got {type(out).__name__} {out!r:.80}"
    )


def _loader(
    core: StoreCore,
    context: ReadContext,
    request: LoadRequest,
    ragged: str,
    pad_to: Any,
    truncate: bool,
) -> Callable[[Any], Any]:
    """The load function of a pipeline: records of a fixed store, ``(batch, mask)`` (or
    ``(values, segments)``) of a ragged one."""
    reads = record_reads(request.schema)
    return reads.loader(context, core.head, request, (ragged, pad_to, truncate))


__all__ = ["Pipelines"]
