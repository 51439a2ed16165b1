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

``store.commit_fragments``: appending fragments written by other processes in one commit.

Any process writes records under a store with :func:`pytreestore.write_fragment`, without
the writer lock; the store's one writer appends them with :meth:`Fragmenting.commit_fragments`
(the steps below). See docs/scaling.md.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-fragmenting", {"x": np.int8(0)})
    >>> f = pytreestore.write_fragment("memory://doc-fragmenting", [{"x": 5}, {"x": 6}])
    >>> s.commit_fragments([f]); len(s), s.versions()[-1].operation
    (2, 'append')
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pytreestore import _arguments
from pytreestore import _threads as background
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


if TYPE_CHECKING:
    from pytreestore._core import StoreCore


class Fragmenting:
    """The fragment methods of :class:`~pytreestore.TreeStore` (a mixin)."""

    _core: StoreCore
    _purging: background.Job | None = None  # deleting committed fragments' folders

    def commit_fragments(self, fragments: Iterable[Fragment]) -> None:
        """Appends fragments (:func:`pytreestore.write_fragment`) in the given order, as one
        commit: one version, whose record lists the fragments' ids.

        Buffered records are committed first, so the order is: this writer's records, then
        the fragments'. A fragment that starts at a chunk boundary of the store (every
        fragment, when each holds a multiple of ``chunk_records`` records and the store did
        before them) has its chunks placed without copying data where the backend can (on
        local disk its chunk files hard-linked and its chunk-row folders renamed into the
        store; in an OCDBT database its keys copied; elsewhere the raw chunk bytes); any
        other is read and written again. When this returns, the commit is durable. The
        fragments' folders are deleted once the commit is made: on OCDBT in the commit's own
        transaction, locally on a background thread (:meth:`close` waits for it). An empty
        list commits nothing.

        A ragged or optional store's fragments hold every table's rows: each table's are
        placed after its committed rows (offsets rebased; every other array's chunks placed
        without copying, as above, where the table's rows start at a chunk boundary of
        the table), and structures that the
        fragments' records show and the store had pending (``store.schema.pending``) are
        learnt first, as an append of such a record would learn them (docs/ragged.md).

        Raises:
            ReadOnlyError: the store is open with mode "r", or shares its writes through an
                OCDBT coordinator (``coordinator=``): commit fragments from its only writer.
            FragmentError: a fragment of another store or of another schema, one committed
                already (or listed twice), one written before a version the log no longer
                keeps (``keep_versions``), one whose files are gone; in a ragged store, one
                whose structure departs from the store's (a leaf of another dtype than the
                store learnt meanwhile). Checked before anything is written: nothing is
                committed.
            CommitConflictError: another writer committed meanwhile (one that took the lock
                over with ``break_lock=True``); nothing of this call was committed, and the
                fragments are intact (but on local disk one whose chunk rows were renamed
                into the store before the other commit landed, which must be written
                again): reopen the store and call this again.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-commit-fragments", {"x": np.int8(0)})
            >>> s.append({"x": np.int8(1)})
            >>> f = pytreestore.write_fragment("memory://doc-commit-fragments", {"x": np.arange(2)})
            >>> s.commit_fragments([f]); s.load(as_numpy=True)["x"].tolist()
            [1, 0, 1]
        """
        items = list(
            _arguments.iterable(fragments, "commit_fragments()", "pytreestore.Fragment objects")
        )
        if not items:  # nothing to commit (a writer sharing the store still refuses)
            with self._core.writing() as writer:
                _ = writer.committer
            return
        operation = PlaceFragments(items, self._core.location, self._core.spec.like)
        self._core.commit(operation)  # the one commit sequence (_log/transaction.py)
        self._retire([] if operation.removed else [f.id for f in operation.found])

    def _retire(self, ids: list[str]) -> None:
        """Deletes committed fragments' folders (one left, if storage failed, is vacuum's):
        locally as a background job (:meth:`close` and the interpreter's exit wait for it),
        elsewhere now; none when the commit's own transaction deleted them."""
        if not ids:
            return
        root = placing.local_root(self._core.backend)
        if root is None:
            with contextlib.suppress(PyTreeStoreError):
                _remove.remove(self._core.backend, ids)
            return
        placing.done(root)  # the placement's intent record: the commit is made
        self._purged()
        self._purging = background.start(functools.partial(_purge, root, ids))

    def _purged(self) -> None:
        """Waits for the deletion of committed fragments' folders (close, vacuum)."""
        if self._purging is not None:
            self._purging.join()
            self._purging = None


def _purge(root: str, ids: list[str], stopping: object) -> None:
    """The background job of :meth:`Fragmenting._retire`: runs to the end (a few folder
    deletions), even when asked to stop."""
    _remove.purge(root, ids)


__all__ = ["Fragmenting", "PlaceFragments"]
