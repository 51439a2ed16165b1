"""One commit sequence for every change of a store, in the shape of Lance's
``Transaction(read_version, operation)`` and one ``commit()``.

An :class:`Operation` says what a change writes (an evolve's arrays and root, a truncate's
root, fragments' rows, a tag); a :class:`Transaction` is an operation planned on the version
``read_version``; :func:`commit` runs it in the sequence every change shares:

1. **check** -- the writer is still at ``read_version`` (no commit of this object since the
   transaction was planned) and no other writer has committed (the commit token,
   :class:`~pytreestore._commit.committer.Committer`);
2. **release** -- if the operation writes rows that older versions still hold (after a
   truncate), a version giving them up is committed first;
3. **the atomic step** -- the operation's writes and the commit (version record, commit
   record, root) in one backend transaction where the backend has them
   (:func:`~pytreestore._commit.atomic.atomic`);
4. **advance** -- the committer's new commit, with the operation's new schema if it has one.

If any step fails the committer keeps its schema (a later commit never names a schema whose
own commit failed) and the operation's :meth:`Operation.abort` undoes what it can. Before
``commit``, the store object checks the operation's arguments and flushes its buffered
records; after it, it renews its writer at the new commit
(:meth:`pytreestore._core.StoreCore.commit`).

Example:
    >>> import numpy as np, pytreestore
    >>> from pytreestore._commit.operations import Tag
    >>> s = pytreestore.create("memory://doc-transaction", {"x": np.int8(0)})
    >>> s.append({"x": np.int8(1)})
    >>> s._core.commit(Tag("one", None, s.path)) is None  # a tag commits no version
    True
    >>> s.versions()[-1].tags
    ('one',)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from pytreestore._commit.atomic import atomic
from pytreestore._commit.committer import Committer
from pytreestore._commit.record import Commit
from pytreestore._format.schema import TreeSchema
from pytreestore.backends import Backend
from pytreestore.errors import CommitConflictError


class Head(Protocol):
    """What :func:`commit` and an operation need of a writer: its commit, its committer, its
    schema and its records (a store's :class:`~pytreestore._commit.records.RecordWriter`, or
    a stand-in that buffers none)."""

    @property
    def commit(self) -> Commit: ...

    @property
    def committer(self) -> Committer: ...

    @property
    def schema(self) -> TreeSchema: ...

    def __len__(self) -> int:
        """The records once what is buffered is committed."""
        ...


@dataclasses.dataclass(frozen=True)
class Change:
    """What an operation's atomic step leaves to commit.

    Attributes:
        records: the records of the new commit.
        tables: the rows of each axis's table (a ragged store), or None (a fixed store).
        schema: the schema the new commit names, if the operation changed it (None: the
            writer's stays).
        schema_id: the id the commit names ``schema`` by (None: computed from it).
        fragments: ids of the fragments the commit appends (kept in its record).
    """

    records: int
    tables: dict[str, int] | None = None
    schema: TreeSchema | None = None
    schema_id: str | None = None
    fragments: tuple[str, ...] = ()


class Operation(Protocol):
    """One kind of change of a store (:mod:`pytreestore._commit.operations` has them).

    Attributes:
        name: the operation its version records (``"evolve"``, ``"truncate"``, ...).
        commits: whether it commits a version (a tag names one and commits none).
        releases: whether it writes rows that older versions hold after a truncate (they
            are given up first).
    """

    name: str
    commits: bool

    @property
    def releases(self) -> bool:
        """Whether it writes rows that older versions hold after a truncate."""
        ...

    def check(self, engine: Backend, writer: Any) -> None:  # Head, or a RecordWriter
        """Refuses bad arguments before anything is written (buffered records included)."""
        ...

    def prepare(self, engine: Backend, writer: Any) -> None:  # Head, or a RecordWriter
        """A step of its own after the checks and before the atomic step (fragments learn
        the structures they show there); most operations have none."""
        ...

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> Change | None:
        """The operation's writes, inside the atomic step, on the store at ``head`` whose
        schema is ``schema``; what to commit (None when it commits nothing)."""
        ...

    def abort(self, engine: Backend, head: Commit, error: BaseException) -> None:
        """Undoes what it can after the atomic step failed at ``head`` with ``error``."""
        ...


@dataclasses.dataclass(frozen=True)
class Transaction:
    """An operation, planned on the store as it was at version ``read_version``."""

    read_version: int
    operation: Operation


def commit(engine: Backend, writer: Head, transaction: Transaction) -> Change | None:
    """Commits ``transaction`` through ``writer`` (nothing buffered: the caller flushed):
    check, release, the atomic step, advance (the module's steps 1 to 4).

    Args:
        engine: the store's backend.
        writer: the store's writer (a
            :class:`~pytreestore._commit.records.RecordWriter`): its ``committer`` commits.
        transaction: the operation and the version it was planned on.

    Returns:
        What was committed, or None if the operation commits no version.

    Raises:
        CommitConflictError: the writer, or another writer, committed since
            ``read_version``; nothing was written.
    """
    operation, head = transaction.operation, writer.commit
    if head.generation != transaction.read_version:
        raise CommitConflictError(
            f"a {operation.name} planned on version {transaction.read_version} cannot commit: "
            f"the store is at version {head.generation} now. Nothing was written; plan it again"
        )
    if not operation.commits:
        with atomic(engine):
            return operation.apply(engine, head, writer.schema)
    committer = writer.committer
    committer.check()  # another writer committed: nothing is written
    if operation.releases:
        committer.release()
    operation.prepare(engine, writer)
    before = committer.tree, committer.schema
    try:
        with atomic(engine):  # on OCDBT one generation: the writes and the commit
            change = operation.apply(engine, committer.commit, writer.schema)
            if change is None:
                return None
            if change.schema is not None:
                committer.use(change.schema, change.schema_id)
            committer.advance(
                change.records, change.tables, operation=operation.name, fragments=change.fragments
            )
    except BaseException as err:
        committer.tree, committer.schema = before  # nothing committed: the schema stays
        operation.abort(engine, head, err)
        raise
    return change


__all__ = ["Change", "Head", "Operation", "Transaction", "commit"]
