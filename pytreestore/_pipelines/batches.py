"""Input pipelines: streaming batches with background prefetch, and a Grain data source.

:class:`BatchIterator` walks a range of records in batches. Background jobs
(:class:`~pytreestore._pipelines.prefetch.Prefetcher`) load the next ``prefetch`` batches side
by side (storage read and host-to-device copy) while the caller computes on the current one, so
at most ``prefetch`` batches beyond the one the caller holds are in memory. The jobs end, and
are waited for, when the iterator is closed, left by its ``with`` block, dropped, or when the
interpreter exits.
A shuffled epoch's order (:mod:`~pytreestore._pipelines.order`: a block shuffle, or an exact
uniform one) is drawn from ``numpy.random.default_rng((seed, epoch))``, so it depends only on
the seed, the epoch number and the settings; :meth:`BatchIterator.state` gives
the position after the last batch handed out, and a new iterator given that state yields
exactly the batches that were still to come.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-batches", {"x": np.int32(0)})
    >>> store.extend({"x": np.int32(i)} for i in range(5))
    >>> [b["x"].tolist() for b in store.batches(2)]
    [[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import gc
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten

from pytreestore import _arguments
from pytreestore._pipelines import order as resume
from pytreestore._pipelines.order import BatchState, Shuffle
from pytreestore._pipelines.prefetch import Prefetcher
from pytreestore._spec import StoreSpec
from pytreestore._tree.stack import split_leaves
from pytreestore.errors import ArgumentError


class BatchIterator:
    """Batches of records ``[start, stop)`` of a store, prefetched in the background.

    Made by :meth:`pytreestore.TreeStore.batches`; see it for the arguments.

    Example:
        >>> import numpy as np, pytreestore
        >>> store = pytreestore.create("memory://doc-batch-iterator", {"x": np.int32(0)})
        >>> store.extend({"x": np.int32(i)} for i in range(6))
        >>> it = store.batches(2, shuffle=True, seed=1)
        >>> first = next(it)
        >>> rest = [b["x"].tolist() for b in store.batches(2, shuffle=True, seed=1, state=it.state())]
        >>> len(rest)
        2
    """

    def __init__(
        self,
        load: Callable[[Any], Any],
        *,
        start: int,
        stop: int,
        batch_size: int,
        shuffle: Shuffle,
        seed: int,
        drop_last: bool,
        prefetch: int,
        epochs: int | None,
        state: dict[str, Any] | None,
    ) -> None:
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
        if epochs is not None and epochs < 0:
            raise ArgumentError(f"epochs must be >= 0 or None (endless), got {epochs}")
        self._plan = _Plan(start, stop - start, batch_size, shuffle, int(seed), drop_last, epochs)
        self._epoch, self._batch = self._plan.resume(state) if state is not None else (0, 0)
        positions = self._plan.positions(self._epoch, self._batch)  # holds the plan, not self
        self._prefetcher = Prefetcher(functools.partial(_load_item, load), positions, prefetch)

    def __len__(self) -> int:
        """Batches per epoch."""
        return self._plan.per_epoch

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Any:
        epoch, batch, records = next(self._prefetcher)
        self._epoch, self._batch = (epoch, batch + 1) if batch + 1 < len(self) else (epoch + 1, 0)
        return records

    def state(self) -> BatchState:
        """The position after the last batch handed out, as a small JSON-able dict.

        Pass it as ``state=`` to :meth:`pytreestore.TreeStore.batches` with the same
        arguments to continue from there. It is a :class:`~pytreestore.BatchState`: a
        store keeps it in a record (a checkpoint beside the train state) as it is, and the
        state loaded back resumes as it is.
        """
        return BatchState(epoch=self._epoch, batch=self._batch, **self._plan.settings())

    def close(self) -> None:
        """Stops prefetching and waits for the load under way; the iterator yields nothing
        more. Dropping the iterator, leaving its ``with`` block and the interpreter's exit
        do the same."""
        self._prefetcher.close()

    def __enter__(self) -> BatchIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Which records each batch of each epoch holds: a batch iterator's settings."""

    start: int
    count: int
    batch_size: int
    shuffle: Shuffle
    seed: int
    drop_last: bool
    epochs: int | None

    @property
    def per_epoch(self) -> int:
        """Batches per epoch."""
        whole, rest = divmod(self.count, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def settings(self) -> dict[str, Any]:
        """The settings a resumed iterator must share (see :meth:`BatchIterator.state`)."""
        return {
            "records": self.count,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle.state,
            "window": self.shuffle.window,
            "seed": self.seed,
            "drop_last": self.drop_last,
        }

    def resume(self, state: dict[str, Any]) -> tuple[int, int]:
        """``(epoch, batch)`` to continue from ``state``: its fields checked
        (:func:`~pytreestore._pipelines.order.checked`), then against these settings.

        Raises:
            ArgumentTypeError, ArgumentError: a field of the wrong type or range, unknown or
                missing; a setting other than this iterator's; a position outside its epochs.
        """
        state = resume.checked(state)
        ours = self.settings()
        if state.get("shuffle") is True and "window" not in state:
            state = {**state, "shuffle": "uniform"}  # saved before block shuffles: uniform
        differ = [k for k in resume.SETTINGS if k in state and state[k] != ours[k]]
        if differ:
            detail = ", ".join(f"{k}: state {state[k]!r}, now {ours[k]!r}" for k in differ)
            raise ArgumentError(
                f"batches(state=...) was saved with other settings ({detail}); resume with "
                "the arguments (and store length) the state was taken with"
            )
        epoch, batch = state["epoch"], state["batch"]
        if batch > self.per_epoch:
            raise ArgumentError(
                f"batches(state=...)['batch'] is {batch}, outside an epoch of "
                f"{self.per_epoch} batches; pass the dict BatchIterator.state() returned"
            )
        if self.epochs is not None and (epoch, batch) > (self.epochs, 0):
            raise ArgumentError(
                f"batches(state=...) is at epoch {epoch}, batch {batch}: past the end of "
                f"epochs={self.epochs}; resume with the epochs the state was taken with, "
                "or more (None: endless)"
            )
        return epoch, batch

    def positions(self, epoch: int, batch: int) -> Iterator[tuple[int, int, Any]]:
        """``(epoch, batch, index)`` of every batch from ``(epoch, batch)`` on."""
        while self.epochs is None or epoch < self.epochs:
            order = self._order(epoch)
            for k in range(batch, self.per_epoch):
                yield epoch, k, self._index(order, k)
            epoch, batch = epoch + 1, 0
            if self.per_epoch == 0:
                return

    def _order(self, epoch: int) -> np.ndarray | None:
        return self.shuffle.order(seed=self.seed, epoch=epoch, start=self.start, count=self.count)

    def _index(self, order: np.ndarray | None, k: int) -> Any:
        lo, hi = k * self.batch_size, min((k + 1) * self.batch_size, self.count)
        if order is None:
            return slice(self.start + lo, self.start + hi)
        return order[lo:hi]


def _load_item(load: Callable[[Any], Any], position: tuple[int, int, Any]) -> tuple[int, int, Any]:
    epoch, k, index = position
    return epoch, k, load(index)


@dataclasses.dataclass(frozen=True)
class GrainPadding:
    """How a :class:`GrainSource` hands out records: exact (``padded=False``), or each as
    ``(record, mask)`` padded to ``pad_to`` along every ragged axis, so that Grain's default
    batch function stacks them into the ``(batch, mask)`` that ``load(index, pad_to=pad_to)``
    gives."""

    padded: bool
    pad_to: int | None = None
    truncate: bool = False
    each: bool = False  # exact records of a ragged store: read one by one, each its own shape
    ones: bool = False  # padded records of a fixed store: nothing padded, a mask of ones

    @classmethod
    def of_fixed(cls, store: Any, padded: Any, pad_to: Any, truncate: Any) -> GrainPadding:
        """The padding of a fixed store's ``grain_source(padded=, pad_to=, trim=)``,
        checked: exact records by default; ``padded=True`` pairs each with a mask of ones.

        Raises:
            ArgumentTypeError: ``padded`` or ``truncate`` is not a bool, ``pad_to`` not an int.
            ArgumentError: ``pad_to`` or ``truncate`` (nothing is padded), or ``pad_to`` < 1.
        """
        padded, pad_to, truncate = _checked(store, False, padded, pad_to, truncate)
        if pad_to is not None or truncate:
            raise ArgumentError(
                f"store {store.path} was created without ragged= or optional=, so nothing "
                "of its records is padded: grain_source(pad_to=, trim=) do not apply"
            )
        return cls(padded, ones=padded)

    @classmethod
    def of_tables(cls, store: Any, padded: Any, pad_to: Any, truncate: Any) -> GrainPadding:
        """The padding of a ragged or optional store's ``grain_source(padded=, pad_to=,
        trim=)``, checked: padded by default, so that Grain's default batching can stack
        the records; ``pad_to=None`` is the longest list (or ragged leading axis) in the
        store now, read from its offsets once (at least 1).

        Raises:
            ArgumentTypeError: ``padded`` or ``truncate`` is not a bool, ``pad_to`` not an int.
            ArgumentError: ``pad_to`` or ``truncate`` without padding, or ``pad_to`` < 1.
        """
        padded, pad_to, truncate = _checked(store, True, padded, pad_to, truncate)
        lengths = store.lengths() if padded and pad_to is None else {}
        if lengths:  # a store with ragged axes (an optional subtree alone pads nothing)
            pad_to = max((int(n.max()) for n in lengths.values() if n.size), default=0) or 1
        return cls(padded, pad_to, truncate, each=not padded)


def _checked(
    store: Any, default: bool, padded: Any, pad_to: Any, truncate: Any
) -> tuple[bool, int | None, bool]:
    """``grain_source``'s ``padded`` (None: ``default``), ``pad_to`` and ``truncate``,
    checked; ``pad_to`` and ``truncate`` only with padding."""
    padded = default if padded is None else _arguments.flag(padded, "padded")
    truncate = _arguments.flag(truncate, "truncate")
    rule = "grain_source(pad_to=...) takes None or an int >= 1: every record is padded to it"
    pad_to = _arguments.optional_count(pad_to, rule, minimum=1)
    if not padded and (pad_to is not None or truncate):
        raise ArgumentError(
            f"grain_source(pad_to=, trim=) apply to padded records; store "
            f"{store.path} gives them with padded=True"
        )
    return padded, pad_to, truncate


class GrainSource:
    """A store as a Grain random-access data source: ``len``, ``[i]`` and batched reads.

    Records come back with numpy leaves, as Grain's transforms expect. Made by
    :meth:`pytreestore.TreeStore.grain_source`. Records of a ragged or optional store come
    padded by default, each the pair ``(record, mask)`` with every ragged axis padded to
    one length (:class:`GrainPadding`), so Grain's default batching stacks them into
    ``(batch, mask)``. Pickling keeps the store's location, the options it was opened with
    (backend, ``storage_options``, ``like``, ``generic``, ``cache_bytes``) and the padding,
    and reopens the store read-only in the process that unpickles it (Grain's worker
    processes); a source of a writer commits its buffered records first, so the workers see
    them. A ``memory://`` store works only with in-process loading (``worker_count=0``).

    Example:
        >>> import numpy as np, pytreestore
        >>> store = pytreestore.create("memory://doc-grain", {"x": np.int32(0)})
        >>> store.extend({"x": np.int32(i)} for i in range(3))
        >>> source = store.grain_source()
        >>> len(source), source[2]["x"]
        (3, array(2, dtype=int32))
    """

    def __init__(
        self,
        store: Any,
        *,
        columns: str | Sequence[str] | Any | None,
        load: Callable[[Any], Any],
        padding: GrainPadding | None = None,
        spec: StoreSpec,
    ) -> None:
        """``load(index)`` loads records of ``store`` with numpy leaves (padded as
        ``padding`` says); pickling keeps ``spec`` (how to open ``store`` again, read-only)
        and opens it again where the source is unpickled."""
        self._store = store
        self._spec = spec
        self._columns = columns
        self._load = load
        self._padding = padding or GrainPadding(padded=False)
        _ready_for_grain()

    def __len__(self) -> int:
        _ready_for_grain()  # grain may have been imported after the source was made
        return len(self._store)

    def __getitem__(self, index: int) -> Any:
        index = _arguments.count(index, "a record index must be an int", minimum=None)
        if self._padding.padded:
            return self._getitems([index])[0]
        return self._load(index)

    def _getitems(self, indices: Sequence[int]) -> list[Any]:
        """The records at ``indices`` from one batched read (Grain's batched-read protocol)."""
        if self._padding.each:  # records of their own structure each
            return [self._load(int(i)) for i in indices]
        batch = self._load(np.asarray(indices, np.int64))
        if self._padding.ones:  # a fixed store's records: nothing padded
            batch = (batch, jax.tree.map(lambda leaf: np.ones(len(leaf), bool), batch))
        leaves, treedef = tree_flatten(batch, is_leaf=lambda x: x is None)
        return [treedef.unflatten(row) for row in zip(*map(split_leaves, leaves))]

    __getitems__ = _getitems

    def __repr__(self) -> str:
        return f"GrainSource({self._store.path!r}, columns={self._columns!r})"

    def __getstate__(self) -> dict[str, Any]:
        if self._store.mode == "a":
            self._store.flush()  # the reopened reader sees what was appended
        return {"spec": self._spec, "columns": self._columns, "padding": self._padding}

    def __setstate__(self, state: dict[str, Any]) -> None:
        store = state["spec"].open()
        padding = state.get("padding") or GrainPadding(padded=False)
        source = store.grain_source(
            columns=state["columns"],
            padded=padding.padded,
            pad_to=padding.pad_to,
            truncate=padding.truncate,
        )
        self.__dict__.update(vars(source))


#: the absl flag Grain 0.2 reads unguarded as a ``DataLoader`` with workers starts its first
#: worker (``grain/_src/core/profiler.py``, ``is_worker_profiling_enabled``)
_GRAIN_PROFILING_FLAG = "grain_enable_multiprocess_worker_profiling"


def _ready_for_grain() -> None:
    """Lets a ``grain.DataLoader(worker_count=N)`` over a :class:`GrainSource` run and end
    cleanly in a program that never parses absl flags (a JAX script, a notebook, pytest).

    Grain reads the flag :data:`_GRAIN_PROFILING_FLAG` as its workers start, and absl refuses
    to read any flag before ``FLAGS(argv)`` (``UnparsedFlagAccessError``). The flag is marked
    as given, at its default (False), as Grain marks its own debug flags in its workers;
    nothing else of absl changes (``FLAGS.is_parsed()`` stays False, and a later
    ``FLAGS(argv)`` or ``app.run`` still parses every flag, this one too). Then
    :func:`_release_grain_shared_memory` runs at the exit. Cheap: a dict lookup once done.

    Example:
        >>> _ready_for_grain()  # nothing to do where Grain is not imported
    """
    flags = getattr(sys.modules.get("absl.flags"), "FLAGS", None)
    if flags is not None and _GRAIN_PROFILING_FLAG in flags and not flags.is_parsed():
        flags[_GRAIN_PROFILING_FLAG].present = True
    _hook_exit()


@functools.cache
def _hook_exit() -> None:
    atexit.register(_release_grain_shared_memory)


def _release_grain_shared_memory() -> None:
    """At the exit, unlinks the shared memory of the Grain batches this process still holds,
    which Grain 0.2 leaks (``resource_tracker: There appear to be 4 leaked shared_memory
    objects``, and ``AttributeError: 'NoneType' object has no attribute 'mmap'`` from arrays
    that outlive Grain's module).

    A ``DataLoader`` with workers hands each batch over in shared memory, which its array
    unlinks when deleted, on a daemon thread pool (``SharedMemoryArray._del_thread_pool``).
    At the exit, that pool is killed before it runs what was queued; the last batch of each
    worker waits in reference cycles of the finished iterators for a garbage collection; and
    a batch still held (a script's global) is deleted only after Grain's module is torn
    down. So: the pool's queue is finished, the garbage collected with deletions unlinking at
    once, the memory of every batch still alive unlinked (its mapping stays valid until the
    process ends), and the class's ``__del__`` retired. Nothing happens in a process where
    no Grain batch came through shared memory.
    """
    module = sys.modules.get("grain._src.python.ipc.shared_memory_array")
    arrays = getattr(module, "SharedMemoryArray", None)
    pool = getattr(arrays, "_del_thread_pool", None)
    if arrays is None or pool is None:
        return
    arrays._del_thread_pool = None  # deletions from now on unlink at once
    pool.close()
    pool.join()
    gc.collect()
    names = set()
    for obj in gc.get_objects():
        if isinstance(obj, arrays) and getattr(obj, "_unlink_on_del", False) and obj.shm:
            obj._unlink_on_del = False
            if obj.shm.name not in names:
                names.add(obj.shm.name)
                with contextlib.suppress(FileNotFoundError):
                    obj.shm.unlink()
    arrays.__del__ = _unmapped_at_exit


def _unmapped_at_exit(array: Any) -> None:
    """Grain's ``SharedMemoryArray.__del__`` after :func:`_release_grain_shared_memory`: the
    memory is unlinked already, and the process's end unmaps it."""
