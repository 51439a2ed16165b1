"""Committing fragments: one sequence for every store, run by its writer (a store of one
fixed structure is a store whose only table is the record table, and whose fragments learn
no structure).

1. **Checked**, nothing written: every fragment (:func:`~pytreestore._fragments.check.check`:
   store, schema, not committed, its description there), its schema
   (:func:`~pytreestore._fragments.check.schema_of`) and the structures it teaches the store
   (:func:`~pytreestore._fragments.check.learnt`).
2. **Learnt**: the writer commits its buffered records; if the fragments show structures
   the store has pending, it takes the grown schema (the new arrays created at their
   tables' committed rows, the schema replaced in one atomic put, the step an ``append`` of
   such a record takes; no record is committed).
3. **Placed**, in one :func:`~pytreestore._log.committer.atomic` block with step 4: every
   table grows to its new rows and each fragment's rows are placed after the rows before it
   (:func:`~pytreestore._fragments.write.place`; the fast path first).
4. **Committed**: one commit record with the records and every axis table's rows, listing
   the fragments' ids. Inside a :class:`~pytreestore.backends.Transactions` block (OCDBT)
   the fragments' folders are deleted in the same transaction; elsewhere after it.

A failure in step 3 or 4 moves chunk-row folders renamed into the store back into their
fragments (:func:`~pytreestore._log.placing.settle`, which also runs before the next
writer repairs the store after a crash), and a fragment found incomplete shrinks the tables
back; rows left past the commit are harmless (readers never look past it).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-commit", {"x": np.int32(0)}, chunk_records=2)
    >>> a = pytreestore.write_fragment("memory://doc-commit", [{"x": 1}, {"x": 2}])
    >>> b = pytreestore.write_fragment("memory://doc-commit", {"x": np.arange(3)})
    >>> s.commit_fragments([b, a]); s.load(as_numpy=True)["x"].tolist()
    [0, 1, 2, 1, 2]
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import check
from pytreestore._fragments import check as learn
from pytreestore._fragments import fragment as _remove
from pytreestore._fragments import write as columns
from pytreestore._fragments.fragment import Fragment
from pytreestore._location import Location
from pytreestore._log import placing
from pytreestore._log.commit_record import Commit
from pytreestore._log.committer import transactions
from pytreestore._log.evolve_tables import table_schemas
from pytreestore._log.transaction import Change
from pytreestore._write.records import RecordWriter
from pytreestore.backends import Backend
from pytreestore.errors import FragmentError, PyTreeStoreError


class PlaceFragments:
    """Appending checked fragments, as one operation of the store's commit sequence
    (:func:`pytreestore._log.transaction.commit`): steps 1 to 4 of the module.

    ``removed`` says, after the commit, whether the fragments' folders were deleted in the
    commit's own transaction (else the caller deletes them).
    """

    name = "append"
    commits = True

    def __init__(self, fragments: Sequence[Any], location: Location, like: Any) -> None:
        self.items, self.location, self.like = list(fragments), location, like
        self.found: list[Fragment] = []
        self.own: list[TreeSchema] = []
        self.grown: TreeSchema | None = None
        self.tables: dict[str | None, TreeSchema] = {}
        self.removed = False

    @property
    def releases(self) -> bool:
        """Rows past a truncate are given up first (fragments of no records write none)."""
        return any(f.records for f in self.found)

    def check(self, engine: Backend, writer: RecordWriter) -> None:
        """Step 1: every fragment and the structures it teaches; nothing written (but a
        placement a crash left unfinished is settled first).

        Raises:
            ReadOnlyError: the writer shares the store through an OCDBT coordinator.
            FragmentError: a fragment that cannot be committed here.
        """
        _ = writer.committer  # a writer sharing the store refuses: nothing written
        where = str(self.location)
        placing.settle(engine, where)  # one a crash left unfinished
        self.found = check.check(engine, self.location, self.items, writer.commit, writer.schema)
        self.own = [
            learn.schema_of(engine, f, writer.schema, where, like=self.like) for f in self.found
        ]
        self.grown = learn.learnt(writer.schema, self.found, self.own, writer.rows)

    def prepare(self, engine: Backend, writer: RecordWriter) -> None:
        """Step 2: the structures the fragments show, learnt (its own atomic schema change,
        as an append of such a record makes; no record is committed)."""
        if self.grown is not None and self.grown is not writer.schema:
            writer.use_schema(self.grown)

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> Change | None:
        """Steps 3 and 4 up to the commit record: the tables grown and the rows placed; on
        OCDBT the fragments' folders deleted in the same transaction."""
        if not self.found:
            return None
        self.tables = tables = table_schemas(schema)
        parts, totals = columns.plan(
            list(tables), self.found, self.own, {t: head.rows(t) for t in tables}
        )
        for t, sub in tables.items():
            if totals[t] != head.rows(t):  # no rows: the rows older versions hold stay
                engine.resize([c.key for c in sub.columns], totals[t])
        columns.place(engine, tables, parts, head.generation)
        ids = tuple(f.id for f in self.found)
        if transactions(engine) is not None:  # the fragments go in the commit's transaction
            _remove.remove(engine, ids)
            self.removed = True
        rows = {t: n for t, n in totals.items() if t is not None}
        return Change(totals[None], rows or None, fragments=ids)

    def abort(self, engine: Backend, head: Commit, error: BaseException) -> None:
        """Chunk-row folders renamed into the store go back into their fragments, and a
        fragment found incomplete shrinks the tables back to their committed rows."""
        self.removed = False
        _unplace(engine, self.tables, head.rows, str(self.location), error)


def _unplace(
    engine: Backend,
    tables: dict[str | None, TreeSchema],
    rows: Callable[[str | None], int],
    where: str,
    err: BaseException,
) -> None:
    """After a commit of fragments failed: chunk-row folders renamed into the store go back
    into their fragments (unless the commit landed after all), and a fragment found
    incomplete shrinks the tables back to their committed ``rows``."""
    with contextlib.suppress(PyTreeStoreError):  # else the next settle() does it
        placing.settle(engine, where)
    if isinstance(err, FragmentError):
        with contextlib.suppress(PyTreeStoreError):
            for t, sub in tables.items():
                engine.resize([c.key for c in sub.columns], rows(t))


__all__ = ["PlaceFragments"]
