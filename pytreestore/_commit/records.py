"""The record writer of every store: each record's rows go to its tables, one commit for all.

Every table (the record table and one per ragged axis, :mod:`pytreestore._format.ragged`) has
its own :class:`~pytreestore._commit.writer.Writer`, which buffers whole chunks and writes them
as they fill, but commits nothing itself. :class:`RecordWriter` commits: it flushes every
table, then writes one commit record holding the record count and every table's rows (step 6
of :mod:`pytreestore._commit.protocol`). Rows written past the commit are harmless, and
removed by the repair of the next writer.

A fixed store is the case of one table whose rows are the records: its ``append_record``,
``extend``, ``extend_batch`` and ``flush`` are the table writer's own, bound once at
construction (:class:`~pytreestore._commit.rows.FixedTreeRows`), and that writer commits.

A record is walked once along the layout, by closures compiled once per layout
(:mod:`pytreestore._commit.walk`): each ragged list's elements become rows of its table
(their leaves side by side: struct of arrays), each ragged leading axis a block of rows, and
the row of the table holding the list gets the running row count of the list's table, its
offset. Everything is checked before any table holds a row of the record, so a record that
does not fit leaves nothing, and is explained with every differing keypath; a structure no
record had is learnt first (:meth:`RecordWriter.use_schema`). A list of numpy-scalar
elements waits in its table as the values themselves, converted a block at a time
(:mod:`pytreestore._commit.elements`).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ragged-writer", {"p": [np.float32(0)]},
    ...                        ragged=["['p']"])
    >>> s.append({"p": [np.float32(1), np.float32(2)]}); s.append({"p": []}); s.flush()
    >>> s.committed, dict(s._writer.commit.tables)
    (2, {"['p']": 2})
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from pytreestore import _arguments, _exiting
from pytreestore._commit.committer import Committer
from pytreestore._commit.elements import ElementRows
from pytreestore._commit.flat import flat_elements
from pytreestore._commit.model import Model, grow_schema
from pytreestore._commit.protocol import column_layouts, group_json, group_keys, with_info
from pytreestore._commit.record import Commit
from pytreestore._commit.tables import table_schemas
from pytreestore._commit.versions import KEEP_VERSIONS, save_schema
from pytreestore._commit.walk import Mismatch, PendingStructure, Plan
from pytreestore._commit.writer import Writer
from pytreestore._format import validate as _validate
from pytreestore._format.names import ROOT_KEY, array_json
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.device import VALID, refuse_unreadable
from pytreestore._tree.hints import hinted, layout_problems
from pytreestore._tree.layout import Walker
from pytreestore._tree.unpad import unpad_records
from pytreestore.backends import Backend, KeyListing
from pytreestore.errors import SchemaMismatchError


class _TableCommitter:
    """Stands in for a table's committer: the table's committed rows; commits nothing."""

    def __init__(self, owner: RecordWriter, table: str | None) -> None:
        self._owner = owner
        self._table = table

    @property
    def commit(self) -> Commit:
        return Commit(self._owner.commit.rows(self._table), 0)

    def advance(self, records: int, tables: Any = None) -> Commit:
        return self.commit

    def release(self) -> None:
        self._owner.committer.release()

    @property
    def holding(self) -> bool:
        return self._owner.committer.holding

    def check(self) -> None:
        self._owner.check()


class RecordWriter:
    """Appends records to a store's tables; commits them together (every kind of store)."""

    #: how a refused record of :meth:`extend` is reported (``{i}``: its position)
    refusal = "extend() refused record {i} (none of this call's records were appended)"
    batch_refusal = "extend_batch() refused the batch (none of its records were appended)"

    def __init__(
        self,
        backend: Backend,
        schema: TreeSchema,
        commit: Commit,
        committer: Any = None,
    ) -> None:
        """``committer`` replaces the writer's own :class:`Committer` (fragments, which
        commit nothing: :mod:`pytreestore._fragments.rows`)."""
        self._backend = backend
        self._committer = committer or Committer(
            backend, commit, _validate.id_of(schema), tree=schema
        )
        self._open_tables(schema, commit)

    def _table(
        self, table: str | None, schema: TreeSchema, commit: Commit, committer: Any = None
    ) -> Any:
        """The writer of one table (``schema``: its columns) at ``commit``; ``committer``
        commits its rows (a fixed tree's one table), else this writer commits every table."""
        rows = Commit(commit.rows(table), 0)
        if committer is not None:  # a fixed tree's one table, committing: in the background
            return Writer(self._backend, schema, rows, committer, background=True)
        return Writer(self._backend, schema, rows, _TableCommitter(self, table))

    def _open_tables(self, schema: TreeSchema, commit: Commit) -> None:
        self.schema = schema
        self.model: Model = schema.layout
        self.tables: dict[str | None, Any]
        if schema.ragged is None:  # the writer: a fixed tree's fast path, one table
            self.tables = {None: self._table(None, schema, commit, self._committer)}
            self._fast_path(self.tables[None])
            return
        self.tables = {t: self._table(t, sub, commit) for t, sub in table_schemas(schema).items()}
        slots = {
            t: {(c.role or "leaf", c.path): i for i, c in enumerate(w.schema.columns)}
            for t, w in self.tables.items()
        }
        flat = flat_elements(self.model.spec, slots)
        for t, elements in flat.items():
            # a list of numpy-scalar elements waits as tuples, converted per block; only in
            # this writer's own table writers (others' tables are read by their owners)
            if type(self.tables[t]) is Writer and elements.types is not None:
                self.tables[t] = ElementRows(self.tables[t], elements.types)
        self._plan = Plan(self.model.spec, self.tables, slots, flat)

    def _fast_path(self, table: Any) -> None:
        """Binds the calls of a fixed tree's records to ``table``, its one table's writer (a
        :class:`~pytreestore._commit.rows.FixedTreeRows`, which commits): no walk, and no
        cost per call."""
        self.append_record = table.append_record
        self.extend = table.extend
        self.extend_batch = table.extend_batch
        self.flush = table.flush

    # ---- what the store asks of a writer -------------------------------------------------------

    def __len__(self) -> int:
        return len(self.tables[None])

    def rows(self, table: str | None) -> int:
        """The rows of ``table`` once what is buffered is committed (0: a table it has not
        opened, a structure still pending)."""
        return len(self.tables[table]) if table in self.tables else 0

    @property
    def committer(self) -> Any:
        """What commits this writer's records (a :class:`Committer`)."""
        return self._committer

    @property
    def commit(self) -> Commit:
        return self._committer.commit

    @property
    def pending(self) -> int:
        return len(self) - self.commit.records

    def check(self) -> None:
        self._committer.check()

    def append_record(self, record: Any) -> None:
        """Buffers one record; nothing of it is kept if it is refused. A record table whose
        chunk is full is committed first, as a fixed store's writer does."""
        records = self.tables[None]
        if records.fill == records.chunk:
            self.flush()
        plan = self._plan
        plan.push_due()  # before the record: a failed chunk write leaves nothing of it
        try:
            row, stage = plan.stage(record)
            plan.write(row, stage, undo=True)
        except PendingStructure:
            self._learn(record)
            self.append_record(record)
        except Mismatch:
            raise _explain(self.model, record, "record") from None
        except SchemaMismatchError as err:  # a leaf's shape or dtype
            raise SchemaMismatchError(_hinted(self.model, err, record)) from None
        except Exception as err:  # JAX's, reading a jax.Array: deleted, or its computation failed
            refuse_unreadable(err, record, "", whose=f"record {len(self)}'s")
            raise

    def extend(self, records: Iterable[Any]) -> None:
        """Buffers every record of ``records``, all or none."""
        records = _arguments.iterable(records, "extend()", "records")
        if self.model.pending:  # a record may fix a structure: then start again with it
            records = list(records)
        position = self._snapshot()
        plan = self._plan
        i, record = 0, None
        try:
            for i, record in enumerate(records):  # i names the refused one
                if _exiting.STOPPING.is_set():  # an endless extend must not hold the exit
                    raise _exiting.stopped(i)
                plan.push_due()
                row, stage = plan.stage(record)
                plan.write(row, stage, undo=False)
        except PendingStructure:
            self._rollback(position)
            self._learn(record)
            self.extend(records)
            return
        except BaseException as err:
            self._rollback(position)
            if isinstance(err, Mismatch | SchemaMismatchError):
                cause = (
                    _explain(self.model, record, "record")
                    if isinstance(err, Mismatch)
                    else _hinted(self.model, err, record)
                )
                raise SchemaMismatchError(f"{self.refusal.format(i=i)}: {cause}") from None
            refuse_unreadable(err, record, f"{self.refusal.format(i=i)}: ", fix=VALID)
            raise
        self._commit_whole_chunks()

    def extend_batch(self, batch: Any, mask: Any = None, *, where: str = "this store") -> None:
        """Appends the records of a padded ``batch`` whose real values ``mask`` marks (the
        pair ``load`` returns), all or none (``where``: the store, as :class:`Writer`'s)."""
        if mask is None:
            raise SchemaMismatchError(
                "a ragged store's extend_batch takes the padded batch with its mask, "
                "extend_batch(batch, mask=mask) (the pair load() returns): the batch alone "
                "cannot show list lengths or None"
            )
        try:
            self.extend(unpad_records(self.model.spec, batch, mask))
        except Exception as err:  # JAX's, reading a jax.Array of the batch
            refuse_unreadable(err, batch, f"{self.batch_refusal}: ", fix=VALID)
            raise

    def flush(self) -> None:
        """Writes every table's buffered rows, then commits them all in one commit record."""
        if self.pending == 0:
            return
        for writer in self.tables.values():
            writer.flush()
        rows = {t: len(w) for t, w in self.tables.items() if t is not None}
        self._committer.advance(len(self), rows)

    def _learn(self, record: Any) -> None:
        """Fixes the structures ``record`` shows where the schema's were pending: commits what
        is buffered, then :meth:`use_schema` of the schema grown by them."""
        self.flush()
        try:
            grown = grow_schema(self.schema, record, self.commit.rows)
        except SchemaMismatchError:
            raise _explain(self.model, record, "record") from None
        self.use_schema(grown)

    def use_schema(self, grown: TreeSchema) -> None:
        """Takes ``grown``, this writer's schema with pending structures learnt
        (:func:`~pytreestore._commit.model.grow_schema` at the committed rows, nothing
        buffered): creates the new arrays (sized to their tables' rows, which read as zeros
        and empty lists), and replaces the schema in one atomic put."""
        commit = self.commit
        old = {c.key for c in self.schema.storage_columns}
        added = [c for c in grown.storage_columns if c.key not in old]
        self._backend.delete_keys(_leftovers(self._backend, [c.key for c in added]))
        self._backend.create_columns(column_layouts(added, grown.codec, grown.inner_chunk_bytes))
        for table in {c.table for c in added}:
            keys = [c.key for c in added if c.table == table]
            self._backend.resize(keys, commit.rows(table))
        groups = {k: group_json({}) for k in group_keys(grown)}
        self._backend.write_many_bytes(groups)
        info = _validate.stamped(grown.to_json())
        save_schema(self._backend, info)
        self._backend.write_bytes(ROOT_KEY, with_info(self._backend.read_bytes(ROOT_KEY), info))
        self._committer.use(grown, info["digest"])
        self._backend.open_columns(grown.storage_columns)
        self._open_tables(grown, commit)

    def _commit_whole_chunks(self) -> None:
        if self.tables[None].start > self.commit.records:
            self.flush()

    def _snapshot(self) -> dict[str | None, tuple[int, int]]:
        return {t: w.snapshot() for t, w in self.tables.items()}

    def _rollback(self, position: dict[str | None, tuple[int, int]]) -> None:
        for t, w in self.tables.items():
            w.rollback(position[t])


def new_writer(
    backend: Backend, schema: TreeSchema, commit: Commit, keep: int | None = KEEP_VERSIONS
) -> RecordWriter:
    """The writer of a store of ``schema``; its version log keeps the last ``keep`` versions
    (None: all) besides tagged ones."""
    committer = Committer(backend, commit, _validate.id_of(schema), keep, tree=schema)
    return RecordWriter(backend, schema, commit, committer)


def _explain(model: Model, record: Any, what: str) -> SchemaMismatchError:
    """Every keypath where ``record`` departs from the layout, with the declaration that
    would accept each."""
    walker = Walker(model.decl)
    try:
        walker.merge(copy.deepcopy(model.spec), record, ())
    except SchemaMismatchError as err:
        return err
    lines = "\n".join(f"  {line}" for line, _ in walker.problems) or (
        "  a leaf that is no array (a function) differs from the stored one"
    )
    return SchemaMismatchError(
        f"{what} does not match the store schema:\n{lines}\n"
        "A ragged store's records may differ only where ragged= and optional= allow."
    )


def _hinted(model: Model, err: SchemaMismatchError, record: Any) -> str:
    """``err`` (a leaf of ``record`` refused) with the ``ragged=``/``optional=`` entry that
    would accept each way ``record`` departs from the layout where nothing was declared."""
    return hinted(str(err), lambda: layout_problems(model.spec, record, model.decl))


def _leftovers(backend: Backend, keys: list[str]) -> list[str]:
    """What a cut-off attempt to learn the arrays ``keys`` left: their metadata and chunks.

    A learning writes its arrays before its commit record, and the next writer puts the
    committed schema back (the commit record is the truth), so such arrays are no column's;
    learning them again must not find their chunks (of another chunk shape, or rows the
    new column would read). Without a key listing only their metadata is known."""
    if not isinstance(backend, KeyListing):
        return [array_json(k) for k in keys]
    return [found for k in keys for found in backend.list_keys(f"{k}/")]


__all__ = ["PendingStructure", "RecordWriter", "new_writer"]
