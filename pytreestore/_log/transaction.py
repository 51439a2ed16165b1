"""One commit sequence for every change of a store, and the operations it commits.

One commit sequence for every change of a store, in the shape of Lance's
``Transaction(read_version, operation)`` and one ``commit()``.

An :class:`Operation` says what a change writes (an evolve's arrays and root, a truncate's
root, fragments' rows, a tag); a :class:`Transaction` is an operation planned on the version
``read_version``; :func:`commit` runs it in the sequence every change shares:

1. **check** -- the writer is still at ``read_version`` (no commit of this object since the
   transaction was planned) and no other writer has committed (the commit token,
   :class:`~pytreestore._log.committer.Committer`);
2. **release** -- if the operation writes rows that older versions still hold (after a
   truncate), a version giving them up is committed first;
3. **the atomic step** -- the operation's writes and the commit (version record, commit
   record, root) in one backend transaction where the backend has them
   (:func:`~pytreestore._log.committer.atomic`);
4. **advance** -- the committer's new commit, with the operation's new schema if it has one.

If any step fails the committer keeps its schema (a later commit never names a schema whose
own commit failed) and the operation's :meth:`Operation.abort` undoes what it can. Before
``commit``, the store object checks the operation's arguments and flushes its buffered
records; after it, it renews its writer at the new commit
(:meth:`pytreestore._core.StoreCore.commit`).

Example:
    >>> import numpy as np, pytreestore
    >>> from pytreestore._log.transaction import Tag
    >>> s = pytreestore.create("memory://doc-transaction", {"x": np.int8(0)})
    >>> s.append({"x": np.int8(1)})
    >>> s._core.commit(Tag("one", None, s.path)) is None  # a tag commits no version
    True
    >>> s.versions()[-1].tags
    ('one',)

The operations a store commits through :func:`pytreestore._log.transaction.commit`:
:class:`Evolve`, :class:`Truncate`, :class:`KeepLast` and :class:`Tag` (each an
:class:`~pytreestore._log.transaction.Operation`).

Each holds its arguments, checked where they came in; :meth:`check` refuses what needs the
store (nothing is written yet), :meth:`apply` is the operation's part of the atomic step.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-operations", {"x": np.int8(0)})
    >>> s.extend({"x": np.int8(i)} for i in range(3))
    >>> s._core.commit(Truncate(1, s.path)).records, len(s)
    (1, 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol

from pytreestore._format.schema import TreeSchema
from pytreestore._log import evolve as _evolve
from pytreestore._log import prune as _truncate
from pytreestore._log import versions as _versions
from pytreestore._log.commit_record import Commit
from pytreestore._log.committer import Committer, atomic
from pytreestore.backends import Backend
from pytreestore.errors import CommitConflictError, StoreIndexError


class Head(Protocol):
    """What :func:`commit` and an operation need of a writer: its commit, its committer, its
    schema and its records (a store's :class:`~pytreestore._write.records.RecordWriter`, or
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
        first: the row of the new commit's record 0 (None: as before; ``keep_last``).
    """

    records: int
    tables: dict[str, int] | None = None
    schema: TreeSchema | None = None
    schema_id: str | None = None
    fragments: tuple[str, ...] = ()
    first: int | None = None


class Operation(Protocol):
    """One kind of change of a store (:mod:`pytreestore._log.transaction` has them).

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
            :class:`~pytreestore._write.records.RecordWriter`): its ``committer`` commits.
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
                change.records,
                change.tables,
                operation=operation.name,
                fragments=change.fragments,
                first=change.first,
            )
    except BaseException as err:
        committer.tree, committer.schema = before  # nothing committed: the schema stays
        operation.abort(engine, head, err)
        raise
    return change


class _Operation:
    """What the operations share: no check beyond their own, nothing to undo."""

    name = ""
    commits = True
    releases = False

    def check(self, engine: Backend, writer: Head) -> None:
        """Nothing to check against the store."""

    def prepare(self, engine: Backend, writer: Head) -> None:
        """No step of its own before the atomic step."""

    def abort(self, engine: Backend, head: Commit, error: BaseException) -> None:
        """Nothing to undo: what was written is harmless past the commit in force."""


class Evolve(_Operation):
    """Changes the schema (:mod:`pytreestore._log.evolve`): added columns' arrays and the
    new root, then a version naming the new schema."""

    name = "evolve"

    def __init__(self, where: str, changes: Mapping[str, object]) -> None:
        """``changes``: the keyword arguments of ``TreeStore.evolve``."""
        self.where = where
        self.changes = dict(changes)

    def check(self, engine: Backend, writer: Head) -> None:
        """Plans the change on the writer's schema; refuses what cannot be done."""
        _evolve.check(engine, writer.schema, **self.changes)

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> Change:
        """Creates the added columns' arrays and writes the new root."""
        new = _evolve.apply(engine, schema, head, self.where, **self.changes)
        return Change(head.records, schema=new)


class Truncate(_Operation):
    """A version holding the first ``records`` records only (:mod:`pytreestore._log.prune`):
    the root's metadata of those rows and, where a column started past them, the schema with
    its start lowered."""

    name = "truncate"

    def __init__(self, records: int, where: str) -> None:
        self.records = records
        self.where = where

    def check(self, engine: Backend, writer: Head) -> None:
        """Refuses a count past the records appended (buffered ones included).

        Raises:
            StoreIndexError: ``records`` is negative or more than the store holds.
        """
        holds = len(writer) - writer.commit.first  # the writer counts rows from row 0
        if not 0 <= self.records <= holds:
            raise StoreIndexError(
                f"cannot truncate {self.where} to {self.records} records: it holds {holds}; "
                f"give a count from 0 to {holds}. Nothing was changed."
            )

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> Change:
        """Writes the root of the first ``records`` records (and the lowered schema)."""
        end = head.first + self.records  # rows before the front stay released
        rows = _truncate.rows_at(engine, schema, head, end, self.where)
        lowered = _truncate.lower_starts(schema, rows)
        root = _truncate.shrink_root(
            engine, lowered or schema, rows, self.where, lowered=lowered is not None
        )
        new = root if lowered is not None else None
        return Change(
            end,
            _truncate.tables_of(rows),
            schema=new,
            schema_id=None if new is None else new.digest,
        )


class KeepLast(_Operation):
    """A version holding only the last ``count`` records: its record 0 is the row of the
    first of them (:attr:`~pytreestore._log.commit_record.Commit.first`). Nothing is
    written but the commit: the rows before it stay where they are, for older versions,
    until ``vacuum`` removes the chunks no version it keeps reads
    (:func:`pytreestore._log.prune.vacuum`).

    Attributes:
        released: the records the commit released (0 until it is applied, and when the
            store holds ``count`` records or fewer: then it commits no version).

    Example:
        >>> import numpy as np, pytreestore
        >>> s = pytreestore.create("memory://doc-keep-last-op", {"x": np.int8(0)})
        >>> s.extend({"x": np.int8(i)} for i in range(5))
        >>> op = KeepLast(2, s.path); s._core.commit(op).first, op.released, len(s)
        (3, 3, 2)
    """

    name = "keep_last"

    def __init__(self, count: int, where: str) -> None:
        self.count = count
        self.where = where
        self.released = 0

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> Change | None:
        """The commit of the new front, or None when nothing is released."""
        first = max(head.first, head.records - self.count)
        self.released = first - head.first
        return Change(head.records, first=first) if self.released else None


class Tag(_Operation):
    """Names a version (``version``, or the latest commit's); commits none."""

    name = "tag"
    commits = False

    def __init__(self, name: str, version: int | None, where: str) -> None:
        self.tag = name
        self.version = version
        self.where = where

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> None:
        """Writes the tag, once the version is found to be one the store keeps."""
        number = head.generation if self.version is None else self.version
        if self.version is not None:
            _versions.resolve(engine, head, number, self.where)
        _versions.add_tag(engine, self.tag, number, self.where)


__all__ = [
    "Change",
    "Evolve",
    "Head",
    "KeepLast",
    "Operation",
    "Tag",
    "Transaction",
    "Truncate",
    "commit",
]
