"""The record writer of every store: each record's rows go to its tables, one commit for all.

Every table (the record table and one per ragged axis, :mod:`pytreestore._format.ragged`) has
its buffer, and a committer commits them together: both come from the writer's
:class:`~pytreestore._write.roles.Commits` (the store's only writer:
:class:`~pytreestore._write.commits.DirectCommits`, whose tables write full chunks in the
background and whose commit record holds the record count and every table's rows, step 6 of
:mod:`pytreestore._log.protocol`; a shared writer's; a fragment's). Rows written past the
commit are harmless, and removed by the repair of the next writer.

A fixed store is the case of one table whose rows are the records
(:class:`~pytreestore._write.rows.FixedRecords`: no walk).

A record is walked once along the layout, by closures compiled once per layout
(:mod:`pytreestore._write.walk`): each ragged list's elements become rows of its table
(their leaves side by side: struct of arrays), each ragged leading axis a block of rows, and
the row of the table holding the list gets the running row count of the list's table, its
offset. Everything is checked before any table holds a row of the record, so a record that
does not fit leaves nothing, and is explained with every differing keypath; a structure no
record had is learnt first (:meth:`RecordWriter.use_schema`). A list of numpy-scalar
elements waits in its table as the values themselves, converted a block at a time
(:mod:`pytreestore._write.lists`).

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
import typing
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from jax.tree_util import tree_flatten

from pytreestore import _arguments
from pytreestore import _threads as _exiting
from pytreestore._format import validate as _validate
from pytreestore._format.columns import ColumnSpec
from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._log.committer import Committer
from pytreestore._log.model import Model, grow_schema
from pytreestore._log.versions import KEEP_VERSIONS
from pytreestore._read.index import View, committed, of_writer
from pytreestore._tree.device import VALID, refuse_unreadable
from pytreestore._tree.layout import Walker, hinted, layout_problems
from pytreestore._tree.unpad import unpad_records
from pytreestore._write.commits import DirectCommits, MemoryCommits, TableRows, table_slots
from pytreestore._write.lists import flat_elements
from pytreestore._write.padded import Blocks, PaddedBatch
from pytreestore._write.roles import Commits, Held, Position
from pytreestore._write.rows import MASKED_BATCH, REFUSALS, FixedRecords, batch_hint, stackable
from pytreestore._write.walk import Mismatch, PendingStructure, Plan
from pytreestore.backends import Backend
from pytreestore.errors import SchemaMismatchError


@typing.final
class RecordWriter:
    """Appends records to a store's tables; commits them together (every kind of store).

    The tables and their commits are a :class:`~pytreestore._write.roles.Commits`'s: the
    store's only writer's (:class:`~pytreestore._write.commits.DirectCommits`, the default),
    writers sharing a store's, or a fragment's (nothing committed). A fixed store's records
    go to its one table as rows (:class:`~pytreestore._write.rows.FixedRecords`); any other
    store's are walked (:class:`~pytreestore._write.walk.Plan`).
    """

    def __init__(
        self,
        backend: Backend,
        schema: TreeSchema,
        commit: Commit,
        commits: Commits | None = None,
        *,
        refusals: tuple[str, str, str] = REFUSALS,
    ) -> None:
        """``commits``: the tables' committer (None: the store's only writer's, with a
        :class:`Committer` at ``commit``); ``refusals``: how a refused record of
        :meth:`extend` (``{i}``: its position), a refused batch and a mask given to a store
        of one structure (``{where}``) are reported (:data:`~pytreestore._write.rows.REFUSALS`)."""
        self._backend = backend
        self._commits: Commits = commits or DirectCommits(
            backend, Committer(backend, commit, _validate.id_of(schema), tree=schema)
        )
        self.refusals = refusals
        self.refusal, self.batch_refusal, _ = refusals
        self._open_tables(schema, commit)

    def _open_tables(self, schema: TreeSchema, commit: Commit) -> None:
        self.schema = schema
        self.model: Model = schema.layout
        whole = schema.ragged is None  # the writer: a fixed tree's fast path, one table
        self.tables = self._commits.tables(schema, commit, whole=whole)
        #: each storage key's table and place among its table's columns (for reads)
        self.keys = {
            c.key: (t, i) for t, w in self.tables.items() for i, c in enumerate(w.schema.columns)
        }
        self._fixed: FixedRecords | None = None
        self._padded: PaddedBatch | None = None
        self._stacker: tuple[RecordWriter, MemoryCommits] | None = None
        #: the tables' positions before the records the last walk took, until committed
        self._accepted: dict[str | None, Position] | None = None
        if whole:  # one table, whose rows are the records: no walk
            self._fixed = FixedRecords(self.tables[None], self.refusals, self._first)
            return
        slots = table_slots(self.tables)
        self._padded = PaddedBatch.of(self.model, self.tables, slots)
        self._plan = Plan(
            self.model.spec, self.tables, slots, flat_elements(self.model.spec, slots)
        )

    # ---- what the store asks of a writer -------------------------------------------------------

    def __len__(self) -> int:
        return self._commits.records()

    def rows(self, table: str | None) -> int:
        """The rows of ``table`` once what is buffered is committed (0: a table it has not
        opened, a structure still pending)."""
        return len(self.tables[table]) if table in self.tables else 0

    @property
    def committer(self) -> Committer:
        """The committer of operations (evolve, truncate, fragments); refused by a writer
        that shares its store (:class:`~pytreestore.errors.ReadOnlyError`)."""
        return self._commits.sole()

    @property
    def commit(self) -> Commit:
        return self._commits.commit

    @property
    def pending(self) -> int:
        return len(self) - self.commit.records

    def _first(self) -> int:
        """The row of record 0 (``keep_last``): records are numbered from it in errors."""
        return self.commit.first

    def check(self) -> None:
        self._commits.check()

    def view(self) -> View:
        """What a read of this writer sees (the store's mutex held): every record, buffered
        ones counted, and each table's rows only memory holds; nothing is committed, but by
        a writer sharing its store, whose rows have no place before their commit."""
        held: dict[str | None, Held] = {}
        for t, table in self.tables.items():
            rows = table.buffered_rows()
            if rows is None:  # a shared writer's
                self.flush()
                return committed(self.commit)
            held[t] = rows
        rows_of = {t: len(w) for t, w in self.tables.items()}
        return of_writer(self.commit, len(self), rows_of, held, self.keys)

    def append_record(self, record: object) -> None:
        """Buffers one record; nothing of it is kept if it is refused. A record table whose
        chunk is full is committed first (in the background), as a fixed store's is."""
        if self._fixed is not None:
            self._fixed.append_record(record)
        else:
            self._walk_one(record)
        self._commits.after_call(extended=False)

    def _walk_one(self, record: object) -> None:
        records = self.tables[None]
        if records.fill == records.chunk:
            self._commits.full()
        plan = self._plan
        plan.push_due()  # before the record: a failed chunk write leaves nothing of it
        try:
            row, stage = plan.stage(record)
            plan.write(row, stage, undo=True)
        except PendingStructure:
            self._learn(record)
            self._walk_one(record)
        except Mismatch:
            message = str(_explain(self.model, record, "record"))
            raise SchemaMismatchError(
                message + batch_hint(self.schema, record, MASKED_BATCH)
            ) from None
        except SchemaMismatchError as err:  # a leaf's shape or dtype
            message = _hinted(self.model, err, record)
            raise SchemaMismatchError(
                message + batch_hint(self.schema, record, MASKED_BATCH)
            ) from None
        except Exception as err:  # JAX's, reading a jax.Array: deleted, or its computation failed
            refuse_unreadable(err, record, "", whose=f"record {len(self) - self.commit.first}'s")
            raise

    def extend(self, records: Iterable[object]) -> None:
        """Buffers every record of ``records``, all or none. A list or tuple whose record
        table's columns take at most ``RUNTIME.writes.stacked_bytes`` is
        stacked: walked into tables in memory, then each table's rows taken as one batch."""
        if self._fixed is not None:
            self._fixed.extend(records)
            self._commits.after_call(extended=True)
            return
        self._walk_all(_arguments.iterable(records, "extend()", "records"))
        self._commit_walked()

    def _walk_all(self, records: Iterable[object]) -> None:
        """Walks ``records`` into the tables (stacked in memory first where they fit)."""
        if stackable(records, self.tables[None].schema) is None or not self._stack(records):
            self._walk(records)

    def _commit_walked(self) -> None:
        """Commits the records a walk took (:attr:`_accepted`: the tables' positions before
        them); if that fails before the commit, they are forgotten, as a refused record's
        are (all or none: a caller told of the failure may append them again)."""
        committed = self.commit
        try:
            self._commits.after_call(extended=True)
        except BaseException:
            if self.commit == committed and self._accepted is not None:
                self._rollback(self._accepted)
            raise
        finally:
            self._accepted = None

    def _stack(self, records: Iterable[object]) -> bool:
        """Walks ``records`` into tables in memory (refusing any as :meth:`_walk` does), then
        hands each table's rows to this writer's tables as one batch; False, with nothing
        appended, if they show a structure not learnt yet (learnt here by :meth:`_walk`)."""
        memory, commits = self._stacking()
        try:
            memory._walk(records)
            if memory.schema is not self.schema:
                self._stacker = None
                return False
            self._take(self._blocks(commits.rows))
        finally:
            commits.clear()
        return True

    def _stacking(self) -> tuple[RecordWriter, MemoryCommits]:
        """The walk into memory of this writer's schema (made once per schema)."""
        made = self._stacker
        if made is None or made[0].schema is not self.schema:
            commits = MemoryCommits(self.commit, "this store")
            memory = RecordWriter(
                self._backend, self.schema, Commit(0, 0), commits, refusals=self.refusals
            )
            made = self._stacker = (memory, commits)
        return made

    @staticmethod
    def _blocks(rows: Mapping[str | None, TableRows]) -> dict[str | None, Blocks]:
        return {t: (len(table), table.blocks()) for t, table in rows.items()}

    def extend_rows(self, rows: Mapping[str | None, TableRows]) -> None:
        """Appends each table's rows walked into memory by a writer of this writer's schema
        (a replay buffer's walk, :mod:`pytreestore._pipelines.replay`: the records checked
        and cast there), one batch per table, offsets moved past this writer's rows; all or
        none."""
        self._take(self._blocks(rows))
        self._commit_walked()

    def _take(self, rows: Mapping[str | None, Blocks]) -> None:
        """Appends each table's rows ``rows`` (count, a block per column; walked from row 0)
        as one batch, their offsets moved past the rows each axis table holds; all or none."""
        bases = {t: len(w) for t, w in self.tables.items()}
        position = self._snapshot()
        try:
            for t, (count, blocks) in rows.items():
                if count:
                    table = self.tables[t]
                    table.write_batch(_rebased(table.schema.columns, blocks, bases))
        except BaseException:
            self._rollback(position)
            raise
        self._accepted = position

    def _walk(self, records: Iterable[object]) -> None:
        if self.model.pending:  # a record may fix a structure: then start again with it
            records = list(records)
        position = self._snapshot()
        self._accepted = None
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
            self._walk(records)
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
        self._accepted = position

    def extend_batch(
        self, batch: object, mask: object = None, *, where: str = "this store"
    ) -> None:
        """Appends the records of ``batch`` (leaves with a leading record axis; a ragged or
        optional store's padded, with the ``mask`` of its real values, the pair ``load``
        returns), all or none (``where``: the store, in errors). The mask
        :data:`EVERY_RECORD_REAL` (internal: a recorder's blocks) takes a batch of records of
        one fixed shape into any store: each row one record, every value real."""
        if self._fixed is not None:
            self._fixed.extend_batch(
                batch, None if mask is EVERY_RECORD_REAL else mask, where=where
            )
            self._commits.after_call(extended=True)
        else:
            self._walk_batch(batch, mask)
            self._commit_walked()

    def _walk_batch(self, batch: object, mask: object) -> None:
        if mask is EVERY_RECORD_REAL:  # each row one record of fixed shapes: nothing padded
            self._walk_all(unbatched(batch))
            return
        if mask is None:
            raise SchemaMismatchError(
                "a ragged or optional store's batch is padded, and taken with the mask of "
                "its real values (the pair load() returns): extend_batch(batch, mask=mask), "
                "write_fragment(path, batch, mask=mask); the batch alone cannot show list "
                "lengths or None"
            )
        padded = self._padded
        tables = None if padded is None else padded.tables(batch, mask)
        if tables is not None:  # every table's rows at once: no walk of each record
            self._take(tables)
            return
        try:
            self._walk(unpad_records(self.model.spec, batch, mask))
        except Exception as err:  # JAX's, reading a jax.Array of the batch
            refuse_unreadable(err, batch, f"{self.batch_refusal}: ", fix=VALID)
            raise

    def flush(self) -> None:
        """Writes every table's buffered rows, then commits them all in one commit record."""
        self._commits.flush()

    def _learn(self, record: object) -> None:
        """Fixes the structures ``record`` shows where the schema's were pending: commits what
        is buffered, then :meth:`use_schema` of the schema grown by them."""
        self._commits.may_learn(self.schema)
        self.flush()
        try:
            grown = grow_schema(self.schema, record, self.commit.rows)
        except SchemaMismatchError:
            raise _explain(self.model, record, "record") from None
        self.use_schema(grown)

    def use_schema(self, grown: TreeSchema) -> None:
        """Takes ``grown``, this writer's schema with pending structures learnt
        (:func:`~pytreestore._log.model.grow_schema` at the committed rows, nothing
        buffered): the committer adopts it (the store's writer creates its new arrays and
        replaces the schema in one atomic put), and the tables start again with it."""
        self._open_tables(grown, self._commits.adopt(self.schema, grown))

    def _snapshot(self) -> dict[str | None, Position]:
        return {t: w.snapshot() for t, w in self.tables.items()}

    def _rollback(self, position: dict[str | None, Position]) -> None:
        for t, w in self.tables.items():
            w.rollback(position[t])


class _EveryRecordReal:
    """The type of :data:`EVERY_RECORD_REAL`."""

    def __repr__(self) -> str:
        return "EVERY_RECORD_REAL"


#: the mask of a batch whose rows are whole records of fixed shapes (nothing padded: a
#: recorder's block, :mod:`pytreestore._write.recorder`): ``extend_batch(batch,
#: EVERY_RECORD_REAL)`` appends one record per row to a store of any kind
EVERY_RECORD_REAL = _EveryRecordReal()


def unbatched(batch: object) -> list[object]:
    """The records of ``batch``, one per row of its leaves (views, no copies).

    Example:
        >>> import numpy as np
        >>> unbatched({"a": np.arange(2), "b": [np.zeros((2, 1))]})
        [{'a': np.int64(0), 'b': [array([0.])]}, {'a': np.int64(1), 'b': [array([0.])]}]
    """
    leaves, treedef = tree_flatten(batch)
    count = len(leaves[0]) if leaves else 0
    return [treedef.unflatten([leaf[i] for leaf in leaves]) for i in range(count)]


def new_writer(
    backend: Backend, schema: TreeSchema, commit: Commit, keep: int | None = KEEP_VERSIONS
) -> RecordWriter:
    """The writer of a store of ``schema``; its version log keeps the last ``keep`` versions
    (None: all) besides tagged ones."""
    committer = Committer(backend, commit, _validate.id_of(schema), keep, tree=schema)
    return RecordWriter(backend, schema, commit, DirectCommits(backend, committer))


def _rebased(
    columns: Sequence[ColumnSpec], blocks: Sequence[np.ndarray], bases: Mapping[str | None, int]
) -> list[np.ndarray]:
    """A table's rows (a block per column of ``columns``), each offset moved by ``bases``
    of its axis table."""
    blocks = list(blocks)
    for i, c in enumerate(columns):
        if c.role == "offsets":
            blocks[i] = blocks[i] + np.asarray(bases[c.path], blocks[i].dtype)
    return blocks


def _explain(model: Model, record: object, what: str) -> SchemaMismatchError:
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


def _hinted(model: Model, err: SchemaMismatchError, record: object) -> str:
    """``err`` (a leaf of ``record`` refused) with the ``ragged=``/``optional=`` entry that
    would accept each way ``record`` departs from the layout where nothing was declared."""
    return hinted(str(err), lambda: layout_problems(model.spec, record, model.decl))


__all__ = ["EVERY_RECORD_REAL", "PendingStructure", "RecordWriter", "new_writer", "unbatched"]
