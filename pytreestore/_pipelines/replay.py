"""Replay buffers: a store's last ``capacity`` records kept in host memory and sampled there.

A :class:`ReplayBuffer` (:meth:`pytreestore.TreeStore.replay`) appends every record to its
store, where it is durable, and keeps the rows the last ``capacity`` records hold in each of
the store's tables (:mod:`pytreestore._format.ragged`: a fixed store's one row per record; a
ragged or optional store's element rows of each axis table, offsets and presence arrays too)
in host memory: a ring per column (:class:`TableRing`), rows numbered as the store numbers
them. The rows of an add come from the store's own record writer walking the records into
tables in memory (:class:`~pytreestore._write.commits.MemoryCommits`: the checks and casts
of ``append`` and ``extend_batch``). A sample draws record numbers uniformly, with
replacement, gathers their rows from the rings with the read engine's gather
(:func:`~pytreestore._read.gather.gather`, given the rings to read instead of storage) and
builds the batch as ``load`` builds one
(:meth:`~pytreestore._read.engine.RecordReads.from_rows`): a sample is what
``store.load(index)`` gives for the same index, without a read or a commit.

The window is read again from the store (:meth:`Window.fill`) when the store changed under
it: when the buffer is made (a resumed run), when a record taught the store a structure, after
``evolve``, ``truncate`` or ``keep_last`` (however many records were appended since), and
after records appended to the store by another route.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-replay", {"x": np.int32(0)})
    >>> buffer = store.replay(3, seed=0)
    >>> buffer.add_batch({"x": np.arange(5, dtype=np.int32)})
    >>> len(buffer), sorted(set(buffer.sample(20, as_numpy=True)["x"].tolist()))
    (3, [2, 3, 4])
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

import jax
import numpy as np

from pytreestore import _arguments
from pytreestore._core import StoreCore
from pytreestore._format.columns import ColumnSpec
from pytreestore._format.dtypes import is_key
from pytreestore._format.ragged import OFFSETS, slot
from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._log.evolve_tables import table_schemas
from pytreestore._read.engine import record_reads
from pytreestore._read.gather import Rows, gather
from pytreestore._read.place import RepeatedShapes
from pytreestore._read.request import LoadRequest
from pytreestore._read.tables import table_rows
from pytreestore._write.commits import MemoryCommits
from pytreestore._write.records import RecordWriter
from pytreestore.errors import ArgumentTypeError, StoreIndexError, UnpicklableStoreError

T = TypeVar("T")
#: each table's rows of an add: their count and one array per column (offsets from 0)
Added = Mapping[str | None, tuple[int, Sequence[np.ndarray]]]


class TableRing:
    """One table's rows in host memory: a ring per column, rows numbered as the store's.

    Rows ``first .. end`` are the window's; row ``first - 1`` is kept too (when ``first``
    > 0), since the gather reads each row's offsets at the row before it. ``limit`` caps the
    slots (the record table's: ``capacity + 1``); other tables grow as their rows need.

    Example:
        >>> ring = TableRing((ColumnSpec(".x", "x", np.dtype("int8"), (), (4,)),), limit=3)
        >>> ring.add([np.arange(5, dtype=np.int8)], 5, first=3)
        >>> ring.take([0], np.array([2, 3, 4]))[0].tolist(), ring.size
        ([2, 3, 4], 3)
    """

    def __init__(self, columns: Sequence[ColumnSpec], limit: int | None) -> None:
        self.columns = tuple(columns)
        self.limit = limit
        self.arrays = [np.empty((0, *c.shape), c.dtype) for c in self.columns]
        self.size = 0  # slots of each ring
        self.first = self.end = self.low = 0  # low: the oldest row kept (first - 1 or 0)

    def reset(self, start: int, before: Mapping[int, int]) -> None:
        """No rows, the next one numbered ``start``; row ``start - 1`` (when ``start`` > 0)
        holds the offsets ``before`` (column index -> the start of its axis table's rows)."""
        self.first = self.end = self.low = start
        if start > 0:
            row = [np.zeros((1, *c.shape), c.dtype) for c in self.columns]
            for i, value in before.items():
                row[i][0] = value
            self.end = self.low = start - 1
            self.add(row, 1, start)

    def value(self, column: int, row: int, added: Sequence[np.ndarray]) -> int:
        """Column ``column``'s value at ``row``: a row kept, or one of ``added`` (rows from
        ``end``)."""
        if row < self.end:
            return int(self.arrays[column][row % self.size])
        return int(added[column][row - self.end])

    def add(self, blocks: Sequence[np.ndarray], count: int, first: int) -> None:
        """Appends ``count`` rows (a block per column), then keeps rows from ``first - 1``."""
        low = max(first - 1, 0)
        skip = min(max(low - self.end, 0), count)  # added rows already out of the window
        self._reserve(low, self.end + count)
        at = self.end + skip
        for ring, block in zip(self.arrays, blocks):
            _put(ring, block[skip:], at)
        self.end += count
        self.first, self.low = first, max(low, self.low)

    def _reserve(self, low: int, stop: int) -> None:
        """Room for rows ``low .. stop``, the rows kept there moved into grown rings."""
        need = stop - max(low, self.low)
        if need <= self.size:
            return
        size = max(need, 2 * self.size, 8)
        size = size if self.limit is None else max(need, min(size, self.limit))
        kept = np.arange(max(low, self.low), self.end)
        grown = []
        for ring in self.arrays:
            new = np.empty((size, *ring.shape[1:]), ring.dtype)
            if len(kept):
                new[kept % size] = ring[kept % self.size]
            grown.append(new)
        self.arrays, self.size = grown, size

    def take(self, columns: Sequence[int], index: Any) -> list[np.ndarray]:
        """Columns ``columns`` at rows ``index`` (a slice or an array of row numbers)."""
        if isinstance(index, slice):
            index = np.arange(index.start, index.stop)
        slots = np.asarray(index) % max(self.size, 1)
        return [self.arrays[i].take(slots, axis=0) for i in columns]


def _put(ring: np.ndarray, block: np.ndarray, at: int) -> None:
    """``block``'s rows into ``ring`` from row number ``at`` on, wrapping around."""
    count, size = len(block), len(ring)
    if not count:
        return
    start = at % size
    head = min(count, size - start)
    ring[start : start + head] = block[:head]
    ring[: count - head] = block[head:]


class Window:
    """The rows of a store's last ``capacity`` records, in every table (a
    :class:`TableRing` each), and what a sample needs of them.

    Example:
        >>> schema = TreeSchema.from_example({"x": np.int16(0)})
        >>> window = Window(schema, capacity=2)
        >>> window.add({None: (3, [np.array([5, 6, 7], np.int16)])})
        >>> window.count, window.gather(np.array([2, 1, 2]), schema.columns)[None].values
        (2, {('leaf', "['x']"): array([7, 6, 7], dtype=int16)})
    """

    def __init__(self, schema: TreeSchema, capacity: int) -> None:
        self.schema, self.capacity = schema, capacity
        tables = table_schemas(schema)  # the record table first, then the axes, parents first
        self.rings = {
            t: TableRing(sub.columns, capacity + 1 if t is None else None)
            for t, sub in tables.items()
        }
        self._keys = {c.key: (t, i) for t, r in self.rings.items() for i, c in enumerate(r.columns)}
        #: each axis: its parent table and where its offsets are among that table's columns
        self._axes = {
            c.path: (t, i)
            for t, r in self.rings.items()
            for i, c in enumerate(r.columns)
            if c.role == OFFSETS
        }
        self.requests: dict[bool, LoadRequest] = {}  # by as_numpy, made on first use
        self.token = ""  # the store's cache id it was read at (renewed by truncate, keep_last)

    @property
    def first(self) -> int:
        """The number of the oldest record a sample draws from."""
        return self.rings[None].first

    @property
    def end(self) -> int:
        """The store's records (the number after the newest record)."""
        return self.rings[None].end

    @property
    def count(self) -> int:
        """The records a sample draws from."""
        return self.end - self.first

    def add(self, added: Added) -> None:
        """Appends each table's rows (walked from row 0: each offset counts from the start of
        its axis's added rows), and leaves out the rows of records older than the last
        ``capacity``."""
        blocks = {
            t: self._rebased(r, added[t][1]) if t in added else [] for t, r in self.rings.items()
        }
        firsts = self._firsts(added[None][0], blocks)
        for t, ring in self.rings.items():
            ring.add(blocks[t], added[t][0] if t in added else 0, firsts[t])

    def _rebased(self, ring: TableRing, blocks: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``blocks`` with each offset moved past the rows its axis table holds."""
        out = list(blocks)
        for i, c in enumerate(ring.columns):
            if c.role == OFFSETS:
                out[i] = np.asarray(out[i], np.int64) + self.rings[c.path].end
        return out

    def _firsts(self, records: int, blocks: Mapping[str | None, Sequence[np.ndarray]]) -> dict:
        """Each table's oldest row once ``records`` more are added: the record table's last
        ``capacity``, each axis table's from where the oldest record's elements start."""
        ring = self.rings[None]
        firsts: dict[str | None, int] = {None: max(ring.first, ring.end + records - self.capacity)}
        for axis, (parent, column) in self._axes.items():
            above = self.rings[parent]
            if firsts[parent] == above.first:  # nothing above left the window
                firsts[axis] = self.rings[axis].first
            else:
                firsts[axis] = above.value(column, firsts[parent] - 1, blocks[parent])
        return firsts

    def fill(self, gathered: Mapping[str | None, Rows], first: int) -> None:
        """The rows of records ``first ..`` read from the store (each table's a run of
        consecutive rows, :func:`~pytreestore._read.tables.table_rows`)."""
        starts: dict[str | None, int] = {None: first}
        for t, ring in self.rings.items():
            rows = gathered[t]
            blocks, before = [], {}
            for i, c in enumerate(ring.columns):
                values = rows.values[slot(c)]
                if c.role == OFFSETS:  # (starts, ends): the ends are stored
                    starts[c.path] = before[i] = int(values[0][0]) if rows.count else 0
                    values = values[1]
                blocks.append(values)
            ring.reset(starts[t], before)
            ring.add(blocks, rows.count, starts[t])

    def gather(self, records: np.ndarray, leaves: Sequence[ColumnSpec]) -> dict[str | None, Rows]:
        """The rows of every table that ``records`` (record numbers) hold, as a read of the
        store gathers them (``leaves``: the leaf columns wanted)."""
        tables = tuple((a, self.rings[a].end) for a in self._axes)
        commit = Commit(self.end, 0, tables=tables or None)
        return gather(self.schema, commit, records, self._read, leaves=leaves, distinct=False)

    def _read(self, keys: Sequence[str], index: Any, rows: int) -> list[np.ndarray]:
        """The read function :func:`~pytreestore._read.gather.gather` calls: one table's
        columns ``keys`` at ``index``, from its rings."""
        table = self._keys[keys[0]][0]
        return self.rings[table].take([self._keys[k][1] for k in keys], index)


class Store(Protocol):
    """What a buffer asks of its store beyond its core (:meth:`ReplayBuffer._retain`)."""

    def keep_last(self, n: int) -> int: ...

    def vacuum(self) -> Any: ...


class ReplayBuffer(Generic[T]):
    """A replay buffer over a store: records added to the store, samples drawn from the last
    ``capacity`` of them kept in host memory.

    Made by :meth:`pytreestore.TreeStore.replay`, which documents the arguments.
    ``len(buffer)`` is the records a sample draws from (at most ``capacity``).

    Example:
        >>> import numpy as np, pytreestore
        >>> store = pytreestore.create("memory://doc-replay-buffer", {"r": np.float32(0)})
        >>> buffer = store.replay(100, seed=1)
        >>> for i in range(4):
        ...     buffer.add({"r": np.float32(i)})
        >>> batch = buffer.sample(8, as_numpy=True)
        >>> len(buffer), batch["r"].shape, set(batch["r"].tolist()) <= {0.0, 1.0, 2.0, 3.0}
        (4, (8,), True)
    """

    def __init__(
        self,
        store: Store,
        core: StoreCore,
        capacity: int,
        *,
        seed: int | None = None,
        keep_all: bool = False,
    ) -> None:
        """Made by :meth:`pytreestore.TreeStore.replay` (see it), not by hand."""
        self.capacity = _arguments.count(
            capacity,
            "replay() takes capacity, the records a sample draws from (an int >= 1)",
            minimum=1,
        )
        seed = _arguments.optional_count(seed, "replay() takes seed, an int >= 0 or None")
        self._keep_all = _arguments.flag(keep_all, "replay()'s keep_all")
        with core.writing(append=True):  # a reader, a generic view, a closed store: refused
            pass
        self._store, self._core = store, core
        self._rng = np.random.default_rng(seed)
        self._placement = RepeatedShapes()  # a sample's shapes repeat: placed by one call
        self._lock = threading.Lock()
        self._added = 0  # records added since the last retention
        self._walker: tuple[RecordWriter, MemoryCommits] | None = None
        self._window = Window(core.schema, self.capacity)
        self._refill()

    @property
    def store(self) -> Any:
        """The store the records are appended to."""
        return self._store

    def __len__(self) -> int:
        with self._lock:
            return self._synced().count

    def __repr__(self) -> str:
        return f"ReplayBuffer({self._core.path}, capacity={self.capacity}, records={len(self)})"

    def __reduce__(self) -> Any:
        raise UnpicklableStoreError(
            f"the replay buffer of store {self._core.path} cannot be pickled: it appends "
            "through the store's writer, which one process holds. Pickle a reader of the store "
            "(pytreestore.open(path)) and, in the process that writes, make the buffer with "
            "store.replay(capacity), which reads the last records back"
        )

    # ---- adding ------------------------------------------------------------------------------

    def add(self, record: Any) -> None:
        """Appends one record to the store (as ``store.append``) and to the window.

        Raises:
            SchemaMismatchError: the record does not fit the store; nothing is added.
        """
        with self._lock:
            self._took(lambda w: w.append_record(record), lambda: self._core.append(record))

    def add_batch(self, batch: Any, mask: Any = None) -> None:
        """Appends a batch of records to the store (as ``store.extend_batch``: leaves with a
        leading record axis; a ragged or optional store's padded batch with its ``mask``, the
        pair a sample gives) and to the window.

        Raises:
            SchemaMismatchError: the batch does not fit the store; nothing is added.
        """
        where = self._core.path

        def store() -> None:
            with self._core.writing(append=True) as writer:
                writer.extend_batch(batch, mask, where=where)

        with self._lock:
            self._took(lambda w: w.extend_batch(batch, mask, where=where), store)

    def _took(self, walk: Callable[[RecordWriter], None], store: Callable[[], None]) -> None:
        """Adds records to the store and the window: walked once into tables in memory
        (``walk``, which checks and casts them as the store's writer does), whose rows the
        store's writer and the window both take. Records that teach the store a structure
        are appended the store's way (``store``), and the window read back from it."""
        window = self._synced()
        before = window.end
        walker, commits = self._walking()
        try:
            walk(walker)
            if walker.schema is window.schema and self._extend_rows(commits, window.schema):
                window.add({t: (len(r), r.blocks()) for t, r in commits.rows.items()})
            else:  # the walk learnt a structure, in memory: the store must learn it itself
                self._walker = None
                store()
                self._refill()
        finally:
            commits.clear()
        self._added += self._window.end - before
        if self._added >= self.capacity:
            self._added = 0
            self._retain()

    def _extend_rows(self, commits: MemoryCommits, schema: TreeSchema) -> bool:
        """The store's writer takes the rows walked into ``commits`` (False, with nothing
        taken, where its schema is no longer ``schema``: the store changed meanwhile)."""
        with self._core.writing(append=True) as writer:
            if writer.schema is not schema:
                return False
            writer.extend_rows(commits.rows)
            return True

    def _walking(self) -> tuple[RecordWriter, MemoryCommits]:
        """The walk into memory of the window's schema (made once per schema)."""
        made, schema = self._walker, self._window.schema
        if made is None or made[0].schema is not schema:
            commits = MemoryCommits(Commit(0, 0), self._core.path)
            made = (RecordWriter(self._core.backend, schema, Commit(0, 0), commits), commits)
            self._walker = made
        return made

    def _retain(self) -> None:
        """THE ONE PLACE of retention: every ``capacity`` records added, the store keeps its
        last ``capacity`` records (``keep_last``) and ``vacuum`` deletes the chunks that only
        older records held, so an endless run keeps bounded disk (none with ``keep_all``)."""
        if self._keep_all:
            return
        self._store.keep_last(self.capacity)
        self._store.vacuum()
        if self._core.span()[1] == self._window.end:  # the window holds the records kept
            self._window.token = self._core.cache_id

    def _synced(self) -> Window:
        """The window, read again from the store if the store changed under it."""
        core = self._core
        window = self._window  # a truncate or keep_last since: rows rewritten or released
        if (
            core.schema is not window.schema
            or core.span()[1] != window.end
            or core.cache_id != window.token
        ):
            self._refill()
        return self._window

    def _refill(self) -> None:
        """The window read from the store's last ``capacity`` records."""
        core = self._core
        window = Window(core.schema, self.capacity)
        window.token = core.cache_id
        front, end = core.span()  # rows: record i is row front + i (a released front)
        first = max(end - self.capacity, front)
        if end > first:
            request = core.request(as_numpy=True)
            rows = table_rows(core.read_context(), core.head, request, first - front, end - front)
            window.fill(rows, first)
        self._window = window

    # ---- sampling ----------------------------------------------------------------------------

    def _request(self, window: Window, as_numpy: bool) -> LoadRequest:
        """The load request of the window's samples (made once per window): placed on the
        default device for shapes that repeat (:class:`~pytreestore._read.place.RepeatedShapes`)."""
        request = self._core.request(as_numpy=as_numpy)
        if not as_numpy:
            request = dataclasses.replace(request, device=self._placement)
        window.requests[as_numpy] = request
        return request

    def sample(self, k: int, key: Any = None, *, as_numpy: bool = False) -> Any:
        """Draws ``k`` records uniformly at random, with replacement, from the last
        ``capacity`` records.

        Args:
            k: the records to draw.
            key: a ``jax.random`` key (``jax.random.key(0)``, or a raw ``PRNGKey``) the draw
                is a function of (the same key, the same records); None: the buffer's own
                generator, seeded by ``replay(seed=)``.
            as_numpy: numpy leaves (no copy to the device), dtypes exactly as stored.

        Returns:
            The batch ``store.load(index)`` gives for the drawn records: a batched record
            of the stored classes, or for a store created with ``ragged=`` or ``optional=``
            the padded pair ``(batch, mask)``.

        Raises:
            StoreIndexError: the buffer holds no record yet.
        """
        k = _arguments.count(k, "sample() takes k, the records to draw (an int >= 1)", minimum=1)
        as_numpy = _arguments.flag(as_numpy, "as_numpy")
        rng = self._rng if key is None else _generator(key)
        with self._lock:
            window = self._synced()
            if not window.count:
                raise StoreIndexError(
                    f"the replay buffer of store {self._core.path} holds no record yet: add "
                    "records (buffer.add, buffer.add_batch) before sampling"
                )
            records = window.first + rng.integers(0, window.count, k)
            request = window.requests.get(as_numpy) or self._request(window, as_numpy)
            gathered = window.gather(records, request.specs)
        return record_reads(request.schema).from_rows(request, gathered)


def _generator(key: Any) -> np.random.Generator:
    """The generator of a sample drawn with ``key``: seeded by the key's bits."""
    try:
        bits = np.asarray(jax.random.key_data(key) if is_key(key) else key)
    except (TypeError, ValueError):
        bits = np.asarray(None)
    if bits.dtype != np.uint32 or bits.ndim != 1:
        raise ArgumentTypeError(
            "sample() takes key, a jax.random key (jax.random.key(0), or a raw "
            f"jax.random.PRNGKey(0)) or None, got {key!r:.80}"
        )
    return np.random.default_rng(bits)


__all__ = ["ReplayBuffer", "TableRing", "Window"]
