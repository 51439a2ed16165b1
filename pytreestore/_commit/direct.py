"""The committer of a store's only writer: its tables on storage, committed together.

:class:`DirectCommits` makes one :class:`~pytreestore._commit.writer.Writer` per table (the
record table and one per ragged axis). Every writer's full chunks go to one background queue
(:class:`~pytreestore._commit.chunk_writes.ChunkWrites`), so the caller's loop never waits on
storage whatever the kind of store (issue 45):

- a fixed store's one table hands its full chunks over itself, and commits them (with the
  store's :class:`~pytreestore._commit.committer.Committer`);
- a ragged store's record table is full before a record (:meth:`DirectCommits.full`): every
  table's rows not yet committed are handed over (the record table's chunk, a copy of each
  axis table's partly filled chunk), then one job commits them all (step 6 of
  :mod:`pytreestore._commit.protocol`). An axis table's chunk that fills in between is
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
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from pytreestore._commit.atomic import atomic
from pytreestore._commit.chunk_writes import ChunkWrites
from pytreestore._commit.committer import Committer
from pytreestore._commit.elements import ElementRows
from pytreestore._commit.flat import flat_elements
from pytreestore._commit.protocol import column_layouts, group_json, group_keys, with_info
from pytreestore._commit.record import Commit
from pytreestore._commit.roles import TableBuffer
from pytreestore._commit.tables import table_schemas
from pytreestore._commit.versions import save_schema
from pytreestore._commit.writer import Writer
from pytreestore._format import validate as _validate
from pytreestore._format.names import ROOT_KEY, array_json
from pytreestore._format.schema import TreeSchema
from pytreestore.backends import Backend, KeyListing

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
        return Commit(self._committer.commit.rows(self._table), 0)

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


__all__ = ["DirectCommits", "Slots", "TableCommits", "learn_arrays", "table_slots"]
