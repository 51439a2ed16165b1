"""Committing fragments: one sequence for every store, run by its writer (a store of one
fixed structure is a store whose only table is the record table, and whose fragments learn
no structure).

1. **Checked**, nothing written: every fragment (:func:`~pytreestore._fragments.check.check`:
   store, schema, not committed, its description there), its schema
   (:func:`~pytreestore._fragments.learn.schema_of`) and the structures it teaches the store
   (:func:`~pytreestore._fragments.learn.learnt`).
2. **Learnt**: the writer commits its buffered records; if the fragments show structures
   the store has pending, it takes the grown schema (the new arrays created at their
   tables' committed rows, the schema replaced in one atomic put, the step an ``append`` of
   such a record takes; no record is committed).
3. **Placed**, in one :func:`~pytreestore._commit.atomic.atomic` block with step 4: every
   table grows to its new rows and each fragment's rows are placed after the rows before it
   (:func:`~pytreestore._fragments.columns.place`; the fast path first).
4. **Committed**: one commit record with the records and every axis table's rows, listing
   the fragments' ids. Inside a :class:`~pytreestore.backends.Transactions` block (OCDBT)
   the fragments' folders are deleted in the same transaction; elsewhere after it.

A failure in step 3 or 4 moves chunk-row folders renamed into the store back into their
fragments (:func:`~pytreestore._commit.placing.settle`, which also runs before the next
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

from pytreestore._commit import placing
from pytreestore._commit.atomic import atomic
from pytreestore._commit.fragment import Fragment
from pytreestore._commit.tables import table_schemas
from pytreestore._commit.writer import Writer
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import columns, learn
from pytreestore._fragments import remove as _remove
from pytreestore._ragged.writer import RaggedWriter
from pytreestore.backends import Backend, Transactions
from pytreestore.errors import FragmentError, PyTreeStoreError


def commit(
    engine: Backend,
    writer: Writer | RaggedWriter,
    fragments: Sequence[Fragment],
    where: str,
    like: Any,
) -> bool:
    """Steps 1 to 4 of the module: appends ``fragments`` (checked by
    :func:`~pytreestore._fragments.check.check`) through the store's ``writer``; whether
    their folders were deleted in the commit's own transaction.

    Raises:
        FragmentError: a fragment's structure or arrays do not fit the store's, or its files
            are incomplete; nothing of the fragments is committed.
        CommitConflictError: another writer committed meanwhile; nothing is committed.
    """
    own = [learn.schema_of(engine, f, writer.schema, where, like=like) for f in fragments]
    grown = learn.learnt(writer.schema, fragments, own, _rows_of(writer))
    writer.flush()
    committer = writer.committer
    committer.check()  # another writer committed: nothing is placed
    if any(f.records for f in fragments):  # rows past a truncate: its older versions
        committer.release()  # give them up (fragments of no records write none)
    if grown is not writer.schema:
        assert isinstance(writer, RaggedWriter), "a fixed store's fragments learn nothing"
        writer.use_schema(grown)
    schema, head = writer.schema, committer.commit
    tables = table_schemas(schema)
    parts, totals = columns.plan(list(tables), fragments, own, {t: head.rows(t) for t in tables})
    ids = tuple(f.id for f in fragments)
    inside = isinstance(engine, Transactions)
    try:
        with atomic(engine):
            for t, sub in tables.items():
                if totals[t] != head.rows(t):  # no rows: the rows older versions hold stay
                    engine.resize([c.key for c in sub.columns], totals[t])
            columns.place(engine, tables, parts, head.generation)
            rows = {t: n for t, n in totals.items() if t is not None}
            committer.advance(totals[None], rows or None, fragments=ids)
            if inside:  # the fragments go in the commit's own transaction
                _remove.remove(engine, ids)
    except BaseException as err:
        _unplace(engine, tables, head.rows, where, err)
        raise
    return inside


def _rows_of(writer: Writer | RaggedWriter) -> Callable[[str | None], int]:
    """Each table's rows once the writer has committed what it buffers (where the arrays a
    fragment teaches the store start)."""
    if isinstance(writer, RaggedWriter):
        return lambda t: len(writer.tables[t]) if t in writer.tables else 0
    return lambda t: len(writer)


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


__all__ = ["commit"]
