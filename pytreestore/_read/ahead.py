"""Reading one record at a time at the speed of a block read: read-ahead blocks, fixed and ragged.

Reading one record at a time at the speed of a block read: read-ahead blocks.

A chunk of a column holds thousands of records, and reading one record costs decoding its
whole chunk, so a loop of ``store[i]`` over consecutive ``i`` would decode each chunk once
per record. Instead, record iteration and ``store[i]`` in such a loop read a *block* of
consecutive records at once (:func:`block_size` records, about
``RUNTIME.caches.ahead_block_bytes``), and
serve each record from it:

* as numpy, a record is a copy of its rows in the block (the caller may write to it);
* as ``jax.Array`` leaves, the block is placed on the device once and each record is taken
  from it by one compiled call (:func:`take`) for the whole tree: one dispatch per record,
  not one per leaf. Blocks of fewer than ``RUNTIME.reads.ahead_jit_min`` records (and reads with a
  sharding
  for ``device``) place each record's rows from the host instead, which compiles nothing.

:class:`ReadAhead` keeps a store's last block: ``store[i]`` reads one when ``i`` follows the
record it read last (the loop ``for i in range(n): store[i]``), and serves later records from
it while they fall inside. Committed records never change in place, so a block stays exact
while the store is the one opened (each hit still checks that it was not replaced); a new
schema (``evolve``, ``refresh``) or other read options miss.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ahead", {"x": np.int32(0)})
    >>> s.extend({"x": np.int32(i)} for i in range(100))
    >>> [s.load(i, as_numpy=True)["x"].item() for i in (3, 4, 5)]  # 4 reads a block; 5 hits
    [3, 4, 5]

The record blocks of a ragged store's ``store[i]`` loops and iteration: a block's
gathered rows seen as leaf columns, each record's structure told by its offsets and presence
rows, and its records built by the layout of their structure, on the host
(:func:`host_block`) or placed on the device once (:func:`on_device`).

A block's records share a few structures (list lengths, optional subtrees held); the
layouts of :mod:`pytreestore._read.placed` are made once per structure and reused by every
block of the read, so a record costs what a fixed record costs: views of its rows (or one
compiled take on the device) and one unflatten.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from pytreestore._format import dtypes as _prng
from pytreestore._format.ragged import LEAF, OFFSETS, PRESENCE
from pytreestore._format.schema import TreeSchema
from pytreestore._read import place as _device
from pytreestore._read.build import exact
from pytreestore._read.gather import Rows, record_of
from pytreestore._read.placed import Placed, host_records, layouts_of, structure_keys, tags
from pytreestore._read.request import LoadRequest
from pytreestore._runtime import RUNTIME
from pytreestore._tree.layout import LayoutNode
from pytreestore.errors import CorruptChunkError, X64DisabledError


def block_size(record_nbytes: int) -> int:
    """Records per block for records of ``record_nbytes``: a power of two of about
    ``RUNTIME.caches.ahead_block_bytes``, at least 1 and at most
    ``RUNTIME.reads.ahead_max_records``.

    Example:
        >>> block_size(4), block_size(14_500), block_size(1 << 30)
        (4096, 1024, 1)
    """
    n = max(
        1,
        min(
            RUNTIME.reads.ahead_max_records,
            RUNTIME.caches.ahead_block_bytes // max(record_nbytes, 1),
        ),
    )
    return 1 << (n.bit_length() - 1)


@jax.jit
def take(leaves: list[jax.Array], i: jax.Array) -> list[jax.Array]:
    """Row ``i`` of every leaf, in one compiled call."""
    return [leaf[i] for leaf in leaves]


@dataclasses.dataclass(frozen=True)
class Block:
    """Consecutive records ``start .. start + count`` of one read, ready to serve one by one.

    Attributes:
        request: the read the block was read for (its schema, columns and placement).
        start: the first record's index.
        count: how many records.
        host: each column's rows (None for columns not chosen).
        device: for jax leaves, the chosen columns' rows on the device, padded to a power of
            two (None: each record is placed from ``host``).
        impls: each column's PRNG key implementation, or None when no column holds keys.
    """

    request: LoadRequest
    start: int
    count: int
    host: list[np.ndarray | None]
    device: list[jax.Array] | None
    impls: tuple[str | None, ...] | None = None

    @classmethod
    def of(cls, request: LoadRequest, start: int, host: list[np.ndarray | None]) -> Block:
        """The block of ``host`` rows read from record ``start``, placed if worth it."""
        count = next((len(a) for a in host if a is not None), 0)
        impls = tuple(c.key_impl for c in request.schema.columns)
        placed = _place(request, host, count)
        return cls(request, start, count, host, placed, impls if any(impls) else None)

    def holds(self, request: LoadRequest, i: int) -> bool:
        """Whether record ``i`` is here, read the way ``request`` asks."""
        return same_read(self.request, request) and self.start <= i < self.start + self.count

    def leaves(self, j: int, *, copy: bool = True) -> list[Any]:
        """The leaves of the block's ``j``-th record, in column order (None: not chosen);
        as numpy, copies of the block's rows, or views of them without ``copy``."""
        request = self.request
        if self.device is not None:
            placed = iter(take(self.device, j))
            leaves = [None if a is None else next(placed) for a in self.host]
        else:
            if copy:
                rows = [None if a is None else a[j, ...].copy() for a in self.host]
            else:
                rows = [None if a is None else a[j, ...] for a in self.host]
            if request.as_numpy:
                return rows
            paths = request.schema.paths
            leaves = _device.to_jax(
                rows, paths, device=request.device, cast=request.cast, weak=request.schema.weak
            )
        return leaves if self.impls is None else _prng.wrap_columns(leaves, self.impls)

    def record(self, j: int, *, copy: bool = True) -> Any:
        """The block's ``j``-th record, as the store's classes (numpy leaves: see
        :meth:`leaves`)."""
        return self.request.schema.unflatten(self.leaves(j, copy=copy))


@dataclasses.dataclass(frozen=True)
class RecordsBlock:
    """Consecutive records of a ragged store, for ``store[i]`` in a loop; a record is
    served from the device copy of the block's rows, or as a copy of its host tree, placed by
    ``place``.

    Attributes:
        request: the read the block was read for.
        start: the first record's index.
        count: how many records.
        build: builds the records exactly as read (numpy trees); called once, when a
            record is first served from the host.
        place: puts a record's arrays where the request asks (the device, or nowhere).
        placed: the records' rows on the device, to take each record from in one compiled
            call (:mod:`pytreestore._read.placed`); None: each is placed by ``place``.
    """

    request: LoadRequest
    start: int
    count: int
    build: Callable[[], list[Any]]
    place: Callable[[Any], Any]
    placed: Placed | None = None

    @functools.cached_property
    def records(self) -> list[Any]:
        """The records, as numpy trees (built on first use)."""
        return self.build()

    def holds(self, request: LoadRequest, i: int) -> bool:
        """Whether record ``i`` is here, read the way ``request`` asks."""
        return same_read(self.request, request) and self.start <= i < self.start + self.count

    def record(self, j: int) -> Any:
        """A copy of the block's ``j``-th record, placed."""
        if self.placed is not None:
            record = self.placed.record(j)
            if record is not None:
                return record
        copy = jax.tree.map(
            lambda x: np.array(x) if isinstance(x, np.ndarray | np.generic) else x,
            self.records[j],
            is_leaf=lambda x: x is None,
        )
        return self.place(copy)


def same_read(a: LoadRequest, b: LoadRequest) -> bool:
    """Whether two requests read the same columns the same way from the same schema."""
    return a.schema is b.schema and (a.chosen, a.as_numpy, a.cast, a.device) == (
        b.chosen,
        b.as_numpy,
        b.cast,
        b.device,
    )


def _place(request: LoadRequest, host: Sequence[np.ndarray | None], count: int) -> Any:
    """The chosen rows on the device, padded to a power of two, or None when the block is
    small, read as numpy, placed by a sharding, or holds a value the dtype policy refuses
    (then each record is placed alone, and only a record holding such a value raises)."""
    device = request.device
    if (
        request.as_numpy
        or count < RUNTIME.reads.ahead_jit_min
        or not (device is None or isinstance(device, jax.Device))
    ):
        return None
    size = 1 << (count - 1).bit_length()
    weak = request.schema.weak or (False,) * len(host)
    chosen = [(a, p, w) for a, p, w in zip(host, request.schema.paths, weak) if a is not None]
    padded = [
        np.concatenate([a, np.zeros((size - count, *a.shape[1:]), a.dtype)]) if size > count else a
        for a, _, _ in chosen
    ]
    paths, flags = [p for _, p, _ in chosen], [w for _, _, w in chosen]
    try:  # weak columns are made weak here, once a block: take() keeps the weak type
        return _device.to_jax(padded, paths, device=device, cast=request.cast, weak=flags)
    except X64DisabledError:
        return None


class ReadAhead:
    """A store's last read-ahead block, for ``store[i]`` in a loop; safe across threads.

    :meth:`record` serves record ``i`` from the block when it holds it; when it does not but
    ``i`` follows the last record asked for, it reads a new block from ``i`` first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._block: Block | RecordsBlock | None = None
        self._last: tuple[LoadRequest, int] | None = None

    def record(
        self, request: LoadRequest, i: int, read: Callable[[int], Block | RecordsBlock]
    ) -> tuple[bool, Any]:
        """``(True, record i)`` from a block (``read(i)`` reads a new one from ``i`` when
        ``i`` follows the last record asked for), or ``(False, None)``: read it alone."""
        with self._lock:
            block, last = self._block, self._last
            self._last = (request, i)
        if block is None or not block.holds(request, i):
            if last is None or last[1] != i - 1 or not same_read(last[0], request):
                return False, None
            try:
                block = read(i)
            except CorruptChunkError:  # damage ahead of i: read i alone (damaged or not)
                return False, None
            with self._lock:
                self._block = block
        return True, block.record(i - block.start)

    def clear(self) -> None:
        """Forgets the block (the store closes, or its schema changes)."""
        with self._lock:
            self._block = None
            self._last = None


@dataclasses.dataclass(frozen=True)
class BlockRows:
    """A block's leaf columns (each table's rows of each leaf, numbered as the tags number
    them), where each record's rows start in each, and each record's structure key."""

    host: list[np.ndarray]
    paths: list[str]
    tables: list[str | None]
    starts: np.ndarray
    keys: list[Any]

    @classmethod
    def of(cls, schema: TreeSchema, gathered: dict[str | None, Rows], count: int) -> BlockRows:
        host, paths, tables = [], [], []
        for table, table_rows in gathered.items():
            for key, array in table_rows.values.items():
                if key[0] == LEAF:
                    host.append(array)
                    paths.append(key[1])
                    tables.append(table)
        first = _first_rows(schema, gathered, count)
        starts = np.stack([first[t] for t in tables], axis=1) if tables else np.zeros((count, 0))
        parts = _structure(gathered, first, count)
        keys = structure_keys(parts) if parts else [()] * count
        return cls(host, paths, tables, starts, keys)

    @property
    def single(self) -> frozenset[int]:
        """The columns of the record table (a record holds one row of each)."""
        return frozenset(c for c, t in enumerate(self.tables) if t is None)

    def layouts(self, schema: TreeSchema, use: str) -> dict[Any, Any]:
        """The layouts the read's blocks share for ``use`` ("device" or "host")."""
        return layouts_of(schema, (use, tuple(self.paths), tuple(self.tables)))


def host_block(
    request: LoadRequest,
    spec: LayoutNode,
    gathered: dict[str | None, Rows],
    count: int,
    fallback: Callable[[], list[Any]],
) -> list[Any]:
    """The block's records exactly, as numpy trees whose leaves are views of the gathered
    rows, each built by its structure's layout (:func:`~pytreestore._read.placed.host_records`)."""
    rows = BlockRows.of(request.schema, gathered, count)
    if not rows.host:
        return fallback()
    return host_records(
        rows.host,
        rows.starts,
        rows.keys,
        lambda: _tags(spec, gathered, count),
        rows.single,
        rows.layouts(request.schema, "host"),
        fallback,
    )


def on_device(
    request: LoadRequest, spec: LayoutNode, gathered: dict[str | None, Rows], count: int
) -> Placed | None:
    """The gathered leaf columns on the device, with where each record's rows start in
    them, and each record's tags (its structure, with each leaf's column and rows for
    values), built only when a record's structure is new to the read."""
    rows = BlockRows.of(request.schema, gathered, count)
    if not rows.host:
        return None
    weak = {c.path for c in request.schema.columns if c.weak_type}
    return Placed.of(
        rows.host,
        rows.paths,
        rows.starts,
        lambda: _tags(spec, gathered, count),
        rows.single,
        device=request.device,
        cast=request.cast,
        layouts=rows.layouts(request.schema, "device"),
        weak=[p in weak for p in rows.paths] if weak else None,
        keys=rows.keys,
    )


def _structure(
    gathered: dict[str | None, Rows], first: dict[str | None, np.ndarray], count: int
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Per table with offsets or presence arrays, each row's lengths and presence flags,
    and the bounds of each record's rows there (None: the record table): what
    :func:`~pytreestore._read.placed.structure_keys` tells records' structures by."""
    parts = []
    for table, table_rows in gathered.items():
        codes = []
        for key, array in table_rows.values.items():
            if key[0] == OFFSETS:
                codes.append(array[1] - array[0])  # (starts, ends): each row's length
            elif key[0] == PRESENCE:
                codes.append(array)
        if codes:
            bounds = None if table is None else np.append(first[table], table_rows.count)
            parts.append((np.stack(codes, axis=1).astype(np.int64), bounds))
    return parts


def _first_rows(
    schema: TreeSchema, gathered: dict[str | None, Rows], count: int
) -> dict[str | None, np.ndarray]:
    """Per table, the row where each record's rows start (a record's rows are consecutive:
    gathered in record order)."""
    records = np.arange(count)
    return {t: np.searchsorted(r, records) for t, r in record_of(schema, gathered).items()}


def _tags(spec: LayoutNode, gathered: dict[str | None, Rows], count: int) -> list[Any]:
    """Each record built with each leaf's values replaced by their tags (column, row)."""
    column = 0
    tagged: dict[str | None, Rows] = {}
    for table, table_rows in gathered.items():
        values = dict(table_rows.values)
        for key, array in table_rows.values.items():
            if key[0] == LEAF:
                values[key] = tags(column, len(array))
                column += 1
        tagged[table] = dataclasses.replace(table_rows, values=values)
    return exact(spec, tagged, None, count)


__all__ = [
    "Block",
    "BlockRows",
    "ReadAhead",
    "RecordsBlock",
    "block_size",
    "host_block",
    "on_device",
    "take",
]
