"""Writing a commit: one atomic step where the backend can, then the token and the commit record.

One commit, one atomic step, where the backend can: the resizes, the chunks, the version
record, the commit record and the root of a commit inside one backend transaction.

A backend without :class:`~pytreestore.backends.Transactions` (the file kvstore, zarr-python,
a writer sharing an OCDBT store through its coordinator) gets a block that does nothing: its
writes land one by one, in the commit protocol's order, which keeps every crash safe
(:mod:`pytreestore._log.protocol`). :func:`transactional` tells the two apart.

Blocks nest: an inner block joins the outer one, and only the outermost commits. What a block
changed in memory before it committed (a committer's token) is given back with
:func:`on_abort` when the outermost block commits nothing; what may be told only once its
writes are in storage (a committer's commit, which other threads read as the records a crash
keeps) is told by :func:`on_commit` when the outermost block has committed.

Example:
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import TensorStoreBackend
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-atomic"))
    >>> with atomic(backend):  # no transactions on this backend: the writes land one by one
    ...     backend.write_bytes("a", b"1")
    >>> backend.read_bytes("a")
    b'1'

Steps 5 and 6 of the commit protocol (:mod:`pytreestore._log.protocol`): the token and
the conditional commit, each commit a new version record and then the commit record.

Example:
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import TensorStoreBackend
    >>> c = Committer(TensorStoreBackend(Location.parse("memory://doc-committer-module")), Commit(0, 0))
    >>> c.advance(2).records
    2
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import cast

from pytreestore._format import validate as _validate
from pytreestore._format.keys import COMMIT_KEY
from pytreestore._format.schema import TreeSchema
from pytreestore._log import metadata as consolidated
from pytreestore._log import versions
from pytreestore._log.commit_record import Commit
from pytreestore.backends import Backend, ConditionalWrites, Transactions, capable
from pytreestore.errors import CommitConflictError, StorageError

_OPEN = threading.local()  # this thread's outermost blocks: id(backend) -> _Block


@dataclasses.dataclass
class _Block:
    """An outermost block's calls: ``undos`` if it commits nothing, ``landed`` once it has
    committed."""

    undos: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    landed: list[Callable[[], None]] = dataclasses.field(default_factory=list)


def transactions(backend: Backend) -> Transactions | None:
    """``backend`` where it is :class:`~pytreestore.backends.Transactions` (told once per
    chain of classes, :func:`~pytreestore.backends.capable`), else None."""
    return cast(Transactions, backend) if capable(backend, Transactions) else None


def _blocks() -> dict[int, _Block]:
    if not hasattr(_OPEN, "blocks"):
        _OPEN.blocks = {}
    return _OPEN.blocks


@contextlib.contextmanager
def atomic(backend: Backend) -> Iterator[None]:
    """The backend's transaction (:class:`~pytreestore.backends.Transactions`) when it has
    one, else a block that does nothing: writes land one by one, as the commit protocol's
    order makes safe (:mod:`pytreestore._log.protocol`)."""
    txn = transactions(backend)
    if txn is None:
        yield
        return
    blocks = _blocks()
    if id(backend) in blocks:  # joins the outer block
        with txn.transaction():
            yield
        return
    block = blocks[id(backend)] = _Block()
    try:
        with txn.transaction():
            yield
    except BaseException:
        for undo in reversed(block.undos):
            undo()
        raise
    finally:
        del blocks[id(backend)]
    for landed in block.landed:
        landed()


def transactional(backend: Backend) -> bool:
    """Whether this thread is inside an atomic block of ``backend`` that is a real
    transaction (its writes land at the block's end, or none of them)."""
    return id(backend) in _blocks()


def on_abort(backend: Backend, undo: Callable[[], None]) -> None:
    """Calls ``undo`` if the atomic block open on ``backend`` in this thread commits nothing
    (it raised, or its commit failed); nothing when no block is open."""
    block = _blocks().get(id(backend))
    if block is not None:
        block.undos.append(undo)


def on_commit(backend: Backend, landed: Callable[[], None]) -> None:
    """Calls ``landed`` once the atomic block open on ``backend`` in this thread has
    committed (its writes are in storage), or at once when no transaction is open (writes
    land as they are made)."""
    block = _blocks().get(id(backend))
    if block is None:
        landed()
    else:
        block.landed.append(landed)


def commit_token(backend: Backend, commit: Commit, where: str) -> bytes | None:
    """The storage generation of the commit record ``commit`` was read from.

    None for backends without conditional writes (the writer then commits unconditionally).
    Raises :class:`CommitConflictError` if the record changed since ``commit`` was read.
    """
    if not isinstance(backend, ConditionalWrites):
        return None
    raw, token = backend.read_bytes_versioned(COMMIT_KEY)
    if raw is None and (commit.records, commit.generation) == (0, 0):
        return token  # the generation of a missing key: the first commit creates it
    found = Commit.from_bytes(raw, where)
    if (found.records, found.generation) != (commit.records, commit.generation):
        raise CommitConflictError(
            f"another writer committed to {where} since this writer read its commit record "
            f"({found.records} records now, {commit.records} then). Nothing was committed by "
            "this writer; open the store again to append after the other writer's records"
        )
    return token


class Committer:
    """Writes a writer's commits: each one a new version record, then the commit record,
    conditional on the token of the last.

    Its :attr:`commit` acknowledges records: it counts only what is in storage, what a fresh
    process reads after a crash. Inside a backend transaction (OCDBT) a commit is written
    into the transaction and lands when the transaction commits, after the table writer's
    chunks; until then only the thread writing it sees it (its next steps build on it),
    and every other thread (``store.committed``, a reader thread, the writer's own thread
    while the background chunk writer commits) sees the commit before.

    Attributes:
        schema: the id of the schema commits are made with (the writer's; see
            :func:`pytreestore._format.validate.id_of`).
        keep: versions the log keeps besides tagged ones (None: all);
            :func:`pytreestore._log.versions.trim`.
        tree: the schema itself, whose consolidated metadata each commit writes into the
            root ``zarr.json`` after the commit record (:mod:`pytreestore._log.metadata`);
            None: none is written.

    Example:
        >>> from pytreestore._location import Location
        >>> from pytreestore.backends import TensorStoreBackend
        >>> c = Committer(TensorStoreBackend(Location.parse("memory://doc-committer")), Commit(0, 0))
        >>> c.advance(3).generation
        1
    """

    def __init__(
        self,
        backend: Backend,
        commit: Commit,
        schema: str | None = None,
        keep: int | None = versions.KEEP_VERSIONS,
        tree: TreeSchema | None = None,
    ) -> None:
        self._backend = backend
        self._durable = commit  # the last commit in storage
        self._staged: tuple[int, Commit] | None = None  # (thread, commit) of an open transaction
        self.schema = schema
        self.keep = keep
        self.tree = tree
        self._token = commit_token(backend, commit, "this store")
        self._uncertain: Commit | None = None  # a commit whose write failed midway

    @property
    def commit(self) -> Commit:
        """The last commit in storage; to the thread writing a newer one inside a backend
        transaction, that one (see the class)."""
        staged = self._staged
        if staged is not None and staged[0] == threading.get_ident():
            return staged[1]
        return self._durable

    def advance(
        self,
        records: int,
        tables: dict[str, int] | None = None,
        *,
        operation: str = "append",
        fragments: tuple[str, ...] = (),
        first: int | None = None,
    ) -> Commit:
        """Commits ``records`` records (the last commit's successor) and returns the commit;
        in a ragged store, with ``tables``, the committed rows of every axis's table; with
        ``fragments``, the ids of the fragments the commit appends (kept in its record);
        with ``first``, the row of its record 0 (``keep_last``; by default the last's).

        The version record is written first, only if absent, then the commit record, then
        (with :attr:`tree`) the root ``zarr.json``'s consolidated metadata.

        Raises:
            CommitConflictError: another writer committed since; nothing was committed.
            StorageError: the write failed (it may have landed: a retry finds out).
        """
        commit = self.commit.next(
            records,
            tables,
            schema=self.schema,
            operation=operation,
            fragments=fragments,
            first=first,
        )
        if self._uncertain is not None and self._uncertain == commit:
            commit = self._uncertain  # a retry: the same record, byte for byte
        with atomic(self._backend):  # on OCDBT: one generation with the writer's chunks
            on_abort(self._backend, functools.partial(self._undo, self._token, commit))
            self._publish(commit)
            if self._token is None:
                self._backend.write_bytes(COMMIT_KEY, commit.to_bytes())
            else:
                self._token = self._write_if_unchanged(commit)
            self._stage(commit)
            self._consolidate(commit)
            versions.trim(self._backend, commit, self.keep)
        return commit

    def _stage(self, commit: Commit) -> None:
        """``commit`` becomes :attr:`commit`: at once where its write has landed, else to this
        thread now and to every thread once the transaction holding it has committed."""
        if transactional(self._backend):
            self._staged = (threading.get_ident(), commit)
            on_commit(self._backend, self._land)
        else:
            self._durable = commit

    def _land(self) -> None:
        """The transaction holding the staged commit has committed: it is in storage."""
        staged = self._staged
        if staged is not None:
            self._durable, self._staged = staged[1], None

    def _undo(self, token: bytes | None, attempted: Commit) -> None:
        """Back to the commit in storage after the transaction holding ``attempted``
        committed nothing; a retry writes ``attempted`` again, byte for byte."""
        self._staged, self._token, self._uncertain = None, token, attempted

    def _consolidate(self, commit: Commit) -> None:
        """Writes the root's consolidated metadata of ``commit`` (with :attr:`tree`).

        Where the commit is one transaction (:func:`~pytreestore._log.committer.transactional`:
        the OCDBT backend) the root is part of it: a failed write fails the whole commit,
        nothing of it lands, and the records stay buffered for a retry. Elsewhere the commit
        record is written already and the commit stands: a failed write (a full disk) warns,
        and never makes the caller retry records already committed; the next writer rewrites
        the root."""
        if self.tree is None:
            return
        try:
            consolidated.write(self._backend, self.tree, commit)
        except StorageError as err:
            if transactional(self._backend):
                raise
            warnings.warn(
                f"{commit.records} records are committed, but the root zarr.json's consolidated "
                f"metadata was not updated ({err}); zarr-python and xarray see the commit before "
                "until the next writer opens the store",
                RuntimeWarning,
                stacklevel=4,
            )

    def use(self, tree: TreeSchema, schema: str | None = None) -> None:
        """Commits from now on with schema ``tree``, whose id is ``schema`` (by default
        :func:`pytreestore._format.validate.id_of`)."""
        self.schema = schema or _validate.id_of(tree)
        self.tree = tree

    def release(self) -> None:
        """Before a write below the rows older versions hold after a truncate: commits a
        version that gives them up (those versions are gone from then on)."""
        if self.commit.high is not None:
            self.advance(self.commit.records, operation="release")

    @property
    def uncertain(self) -> Commit | None:
        """The commit whose write failed midway (it may have landed), or None."""
        return self._uncertain

    @property
    def holding(self) -> bool:
        """Whether rows past the commit still belong to older versions (after a truncate)."""
        return self.commit.high is not None

    def _publish(self, commit: Commit) -> None:
        try:
            written = versions.publish(self._backend, commit)
        except StorageError:
            self._uncertain = commit  # the write may have landed before the error
            raise
        if not written:
            raise CommitConflictError(
                f"another writer committed to this store while this one was writing: it made "
                f"version {commit.generation} (its version record exists). Nothing was committed by this "
                "writer; its uncommitted records are lost. Reopen the store to append after "
                "the other writer's records."
            )

    def check(self) -> None:
        """Raises :class:`CommitConflictError` if another writer has committed since."""
        if self._token is not None:
            commit_token(self._backend, self.commit, "this store")

    def _write_if_unchanged(self, commit: Commit) -> bytes:
        """Writes the commit record only if nobody else wrote it since this writer did."""
        assert self._token is not None
        backend = self._backend
        assert isinstance(backend, ConditionalWrites)  # a token comes only from such a backend
        try:
            token = backend.write_bytes_if(COMMIT_KEY, commit.to_bytes(), self._token)
        except StorageError:
            self._uncertain = commit  # the write may have landed before the error
            raise
        if token is not None:
            self._uncertain = None
            return token
        raw, token = backend.read_bytes_versioned(COMMIT_KEY)
        if self._uncertain == commit and raw is not None and Commit.from_bytes(raw, "") == commit:
            self._uncertain = None  # our own earlier attempt landed
            return token
        found = Commit.from_bytes(raw, "this store")
        raise CommitConflictError(
            f"another writer committed to this store while this one was writing: the commit "
            f"record holds {found.records} records (commit {found.generation}), this writer "
            f"expected commit {self.commit.generation} and was about to commit "
            f"{commit.records} records. Nothing was committed by this writer; its uncommitted "
            "records are lost. Reopen the store to append after the other writer's records."
        )


__all__ = ["Commit", "Committer", "commit_token"]
