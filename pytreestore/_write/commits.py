"""Two committers of the record writer: a store's only writer (on storage), and none (tables in memory).

The committer of a store's only writer: its tables on storage, committed together.

:class:`DirectCommits` makes one :class:`~pytreestore._write.writer.Writer` per table (the
record table and one per ragged axis). Every writer's full chunks go to one background queue
(:class:`~pytreestore._write.background.ChunkWrites`), so the caller's loop never waits on
storage whatever the kind of store (issue 45):

- a fixed store's one table hands its full chunks over itself, and commits them (with the
  store's :class:`~pytreestore._log.committer.Committer`);
- a ragged store's record table is full before a record (:meth:`DirectCommits.full`): every
  table's rows not yet committed are handed over (the record table's chunk, a copy of each
  axis table's partly filled chunk), then one job commits them all (step 6 of
  :mod:`pytreestore._log.protocol`). An axis table's chunk that fills in between is
  written after the queue, in order.

A job that fails stays queued and is retried; the next call reports it, and refuses its
record. Rows written past the commit are harmless, and removed by the repair of the next
writer.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-direct", {"p": [np.float32(0)]}, ragged=["['p']"],
    ...                        chunk_records=2)
    >>> for i in range(5):
    ...     s.append({"p": [np.float32(i)] * i})
    >>> s._core.writer.tables[None].writes.drain(); s.committed  # two chunks, in the background
    4

Tables kept whole in memory, and the committer of a walk into them, which commits nothing:
a fragment's records (:mod:`pytreestore._fragments.cast`), and a ragged store's ``extend`` of
a list, stacked into each table's columns before the store's tables take them as blocks
(:meth:`pytreestore._write.records.RecordWriter.extend`).

Example:
    >>> import numpy as np
    >>> from pytreestore._log.commit_record import Commit
    >>> from pytreestore._format.schema import TreeSchema
    >>> commits = MemoryCommits(Commit(0, 0), "doc")
    >>> schema = TreeSchema.from_example({"x": np.int16(0)})
    >>> tables = commits.tables(schema, Commit(0, 0), whole=True)
    >>> tables[None].append([7]); commits.records()
    1
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from pytreestore._format import validate as _validate
from pytreestore._format.keys import ROOT_KEY, array_json
from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._log.committer import Committer, atomic
from pytreestore._log.evolve_tables import table_schemas
from pytreestore._log.protocol import column_layouts, group_json, group_keys, with_info
from pytreestore._log.versions import save_schema
from pytreestore._tree.convert import RowFiller, casters
from pytreestore._write.background import ChunkWrites
from pytreestore._write.lists import ElementRows, flat_elements
from pytreestore._write.roles import Block, Held, Position, Row, TableBuffer
from pytreestore._write.rows import block_rows
from pytreestore._write.writer import Writer
from pytreestore.backends import Backend, KeyListing
from pytreestore.errors import FragmentError

#: each table's columns by ``(role, keypath)``: their places in the table's rows
Slots = dict[str | None, dict[tuple[str, str], int]]


def table_slots(tables: Mapping[str | None, TableBuffer]) -> Slots:
    """Where each column of each table is in its rows."""
    return {
        t: {(c.role or "leaf", c.path): i for i, c in enumerate(w.schema.columns)}
        for t, w in tables.items()
    }


class TableCommits:
    """The committer of one table of a ragged store: the rows ``committer`` committed of
    ``table``; it commits nothing (the record writer commits every table at once)."""

    def __init__(self, committer: Committer, table: str | None) -> None:
        self._committer = committer
        self._table = table

    @property
    def commit(self) -> Commit:
        commit = self._committer.commit  # the record table's: its front too
        first = commit.first if self._table is None else 0
        return Commit(commit.rows(self._table), 0, first=first)

    @property
    def holding(self) -> bool:
        return self._committer.holding

    def advance(self, records: int) -> Commit:
        return self.commit

    def release(self) -> None:
        self._committer.release()

    def check(self) -> None:
        self._committer.check()


class DirectCommits:
    """The tables of the store's only writer, on storage, and their commits through
    ``committer``."""

    def __init__(self, backend: Backend, committer: Committer) -> None:
        self._backend = backend
        self._committer = committer
        self._writes = ChunkWrites()
        self._tables: dict[str | None, Writer | ElementRows] = {}
        self._records: Writer | None = None
        self._whole = True

    @property
    def commit(self) -> Commit:
        return self._committer.commit

    def tables(
        self, schema: TreeSchema, commit: Commit, *, whole: bool
    ) -> dict[str | None, TableBuffer]:
        """A fixed store's one table (``whole``: committing by itself, its chunks handed over
        with its device arrays), or one writer per table of a ragged store, one queue for all."""
        self._whole = whole
        if whole:
            rows = Commit(commit.rows(None), 0)
            self._records = Writer(self._backend, schema, rows, self._committer, background=True)
            self._tables = {None: self._records}
            return dict(self._tables)
        writers = {
            t: Writer(
                self._backend,
                sub,
                Commit(commit.rows(t), 0),
                TableCommits(self._committer, t),
                writes=self._writes,
            )
            for t, sub in table_schemas(schema).items()
        }
        self._records = writers[None]
        tables: dict[str | None, Writer | ElementRows] = dict(writers)
        for t, elements in flat_elements(schema.layout.spec, table_slots(writers)).items():
            if elements.types is not None:  # numpy-scalar elements wait, converted per block
                tables[t] = ElementRows(writers[t], elements.types)
        self._tables = tables
        return dict(tables)

    def records(self) -> int:
        return len(self._record_table())

    def check(self) -> None:
        self._committer.check()

    def full(self) -> None:
        """Hands every table's rows not yet committed to the background writer, then their
        commit (a ragged store's record table is full)."""
        records = self._record_table()
        records.check_writes(refused=True)
        parts: list[Callable[[], None]] = []
        for t, table in self._tables.items():
            part = table.hand_partial() if t is not None else None
            if part is not None:
                parts.append(part)
        rows = {t: len(w) for t, w in self._tables.items() if t is not None}
        records.hand_over()
        self._writes.submit(functools.partial(self._commit_handed, parts, len(records), rows))

    def _commit_handed(
        self, parts: list[Callable[[], None]], records: int, rows: dict[str, int]
    ) -> None:
        """The background job of :meth:`full`: the axis tables' rows, then the commit."""
        with atomic(self._backend):
            for write in parts:
                write()
            self._committer.advance(records, rows)

    def after_call(self, *, extended: bool) -> None:
        """After an ``extend``, commits the whole chunks it wrote."""
        if extended and self._record_table().start > self.commit.records:
            self.flush()

    def flush(self) -> None:
        """Writes every table's rows (after what was handed over), then commits them all."""
        for table in self._tables.values():
            table.flush()  # a fixed store's one table commits its records itself
        records = len(self._record_table())
        if self.commit.records != records:
            rows = {t: len(w) for t, w in self._tables.items() if t is not None}
            self._committer.advance(records, None if self._whole else rows)

    def sole(self) -> Committer:
        return self._committer

    def may_learn(self, schema: TreeSchema) -> None:
        """The store's only writer learns every structure."""

    def adopt(self, old: TreeSchema, grown: TreeSchema) -> Commit:
        """Creates the arrays ``grown`` adds (sized to their tables' rows: they read as zeros
        and empty lists), and replaces the schema in one atomic put."""
        commit = self.commit
        learn_arrays(self._backend, old, grown, commit)
        info = _validate.stamped(grown.to_json())
        save_schema(self._backend, info)
        root = with_info(self._backend.read_bytes(ROOT_KEY), info)
        self._backend.write_bytes(ROOT_KEY, root)
        self._committer.use(grown, info["digest"])
        self._backend.open_columns(grown.storage_columns)
        return commit

    def _record_table(self) -> Writer:
        assert self._records is not None, "tables() opens the record table first"
        return self._records


def learn_arrays(backend: Backend, old: TreeSchema, grown: TreeSchema, commit: Commit) -> None:
    """Creates the arrays of ``grown`` that ``old`` lacks, each sized to its table's rows at
    ``commit``, with the groups above them."""
    before = {c.key for c in old.storage_columns}
    added = [c for c in grown.storage_columns if c.key not in before]
    backend.delete_keys(_leftovers(backend, [c.key for c in added]))
    backend.create_columns(column_layouts(added, grown.codec, grown.inner_chunk_bytes))
    for table in {c.table for c in added}:
        keys = [c.key for c in added if c.table == table]
        backend.resize(keys, commit.rows(table))
    backend.write_many_bytes({k: group_json({}) for k in group_keys(grown)})


def _leftovers(backend: Backend, keys: list[str]) -> list[str]:
    """What a cut-off attempt to learn the arrays ``keys`` left: their metadata and chunks.

    A learning writes its arrays before its commit record, and the next writer puts the
    committed schema back (the commit record is the truth), so such arrays are no column's;
    learning them again must not find their chunks (of another chunk shape, or rows the
    new column would read). Without a key listing only their metadata is known."""
    if not isinstance(backend, KeyListing):
        return [array_json(k) for k in keys]
    return [found for k in keys for found in backend.list_keys(f"{k}/")]


class TableRows:
    """One table's rows kept whole in memory (a fragment's, a stacked ``extend``'s): a table
    buffer that writes nothing.

    Example:
        >>> from pytreestore._format.schema import TreeSchema
        >>> rows = TableRows(TreeSchema.from_example({"x": np.int16(0)}, chunk_records=2))
        >>> rows.append([1]); rows.write_batch([np.array([2, 3], np.int16)])
        >>> len(rows), rows.blocks()[0].tolist()
        (3, [1, 2, 3])
    """

    chunk = sys.maxsize  # never full: a walk never writes a chunk
    start = 0

    def __init__(self, schema: TreeSchema) -> None:
        self.schema = schema
        self.casters = casters(schema.columns)
        self.fill = 0
        self._capacity = 0
        self.buffers: list[np.ndarray] = []
        #: the compiled fill of the buffers, made when rows are first filled in (a table
        #: that only takes batches, a fragment's, never compiles one)
        self._filler: RowFiller | None = None

    def __len__(self) -> int:
        return self.fill

    def _reserve(self, n: int) -> RowFiller:
        """The fill of buffers with room for ``n`` rows more (``n`` > 0)."""
        filler = self._filler
        if self.fill + n <= self._capacity and filler is not None:
            return filler
        capacity = max(2 * self._capacity, self.fill + n, 64)
        grown = [np.empty((capacity, *c.shape), c.dtype) for c in self.schema.columns]
        for new, old in zip(grown, self.buffers):
            new[: self.fill] = old[: self.fill]
        self.buffers, self._capacity = grown, capacity
        if filler is None:
            filler = self._filler = RowFiller(self.casters, grown)
        else:
            filler.use(grown)  # the same compiled fill, on the grown buffers
        return filler

    def append(self, leaves: Row) -> None:
        """One row of already structure-checked leaves, cast as a Writer casts them."""
        self._reserve(1).fill(leaves, self.fill)
        self.fill += 1

    def append_many(self, rows: Iterable[Row]) -> None:
        """Rows of leaves; raises RecordError (its ``index`` from the first) if one is refused."""
        rows = list(rows)
        if rows:
            self._reserve(len(rows)).fill_block(rows, self.fill)
            self.fill += len(rows)

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        """Checked and cast column blocks with one leading length (the first rows of a table
        whose buffers cannot hold them are the blocks themselves, not copied: a row added
        later copies them first)."""
        count = len(blocks[0]) if blocks else 0
        if self.fill == 0 and count > self._capacity:
            self.buffers, self._capacity, self.fill = list(blocks), 0, count
            return
        if count:
            self._reserve(count)
        for buf, block in zip(self.buffers, blocks):
            buf[self.fill : self.fill + count] = block
        self.fill += count

    def append_blocks(self, blocks: Iterator[Block]) -> None:
        """Rows given a block at a time as columns; RecordError as :meth:`append_many`."""
        self.append_many(block_rows(blocks))

    def snapshot(self) -> Position:
        return (0, self.fill)

    def rollback(self, position: Position) -> None:
        self.fill = position[1]

    def buffered_rows(self) -> Held:
        """Every row: all are in memory."""
        return Held(0, self.fill, ((0, self.buffers),))

    def blocks(self) -> list[np.ndarray]:
        """Every column's rows."""
        return [b[: self.fill] for b in self.buffers]


class MemoryCommits:
    """The committer of a walk into tables kept in memory (:class:`TableRows`), which
    commits nothing: a fragment's (:func:`~pytreestore._fragments.write.write` writes the
    tables), a stacked ``extend``'s (the store's writer takes the tables' rows as blocks). Its
    ``commit`` is the store's latest, ``head`` (where the arrays a record teaches the walk
    start); ``where`` names the store."""

    def __init__(self, head: Commit, where: str) -> None:
        self.commit = head
        self._where = where
        self.rows: dict[str | None, TableRows] = {}

    def tables(
        self, schema: TreeSchema, commit: Commit, *, whole: bool
    ) -> dict[str | None, TableBuffer]:
        """Every table of ``schema`` (``whole``: a fixed store's one table) in memory."""
        if whole:
            self.rows = {None: TableRows(schema)}
            return {t: rows for t, rows in self.rows.items()}
        self.rows = {t: TableRows(sub) for t, sub in table_schemas(schema).items()}
        return {t: rows for t, rows in self.rows.items()}  # a dict of the role's type

    def records(self) -> int:
        return len(self.rows[None])

    def check(self) -> None:
        """Nothing: a fragment commits nothing."""

    def full(self) -> None:
        """Nothing: a table in memory is never full."""

    def after_call(self, *, extended: bool) -> None:
        """Nothing: the rows wait for the fragment's write."""

    def flush(self) -> None:
        """Nothing to commit: the tables' owner takes their rows."""

    def clear(self) -> None:
        """Forgets every table's rows (the tables stay, for the next walk)."""
        for rows in self.rows.values():
            rows.fill = 0

    def sole(self) -> Committer:
        raise FragmentError(
            f"a walk into memory for {self._where} commits nothing: it has no committer (internal)"
        )

    def may_learn(self, schema: TreeSchema) -> None:
        """A walk in memory learns every structure, in memory."""

    def adopt(self, old: TreeSchema, grown: TreeSchema) -> Commit:
        """The structures a record showed, learnt in memory: the tables start again."""
        return Commit(0, 0)


__all__ = [
    "DirectCommits",
    "MemoryCommits",
    "Slots",
    "TableCommits",
    "TableRows",
    "learn_arrays",
    "table_slots",
]
