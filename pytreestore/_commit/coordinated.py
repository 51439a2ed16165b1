"""Writers sharing one store: ``pytreestore.open(path, mode="a", backend="ocdbt",
coordinator=ADDRESS)`` in any number of processes at once.

A shared writer takes no exclusive lock (a shared ``flock`` instead: an exclusive writer is
kept out, and keeps shared ones out) and owns no tail: it buffers its records in memory and
commits them as one block, every commit in turn under the commit claim
(:mod:`pytreestore._commit.claim`):

1. take the claim (waiting while another writer commits);
2. read the commit record again: ``n`` records are committed now, by anyone;
3. drop a version record a writer killed mid-commit left past it, and give up rows older
   versions hold past a truncate (:meth:`Committer.release`);
4. rebase: the rows go after the ``n`` committed ones; the tail chunk they share is read and
   written again with the committed rows plus the new ones, then every column is resized to
   ``n + k`` and the rest written;
5. commit ``n + k`` through a :class:`~pytreestore._commit.committer.Committer` (the version
   record only if absent, the commit record conditional on the generation read in step 2,
   the root's consolidated metadata), and give the claim back.

A writer's records therefore land in the order it appended them, each commit's rows together,
after every record committed before it; none is lost or duplicated. A conditional write that
still fails (a claim taken over from a writer presumed dead) is retried from step 1, up to
``RUNTIME.waits.commit_retries`` times, then :class:`~pytreestore.errors.CommitConflictError`; the
records stay
buffered. A storage failure (the coordinator gone) raises
:class:`~pytreestore.errors.StorageError` with the records kept; the next commit first finds
out whether the failed one landed (its version record, byte for byte) so nothing is written
twice. Only a writer that opens the store alone repairs it (as an exclusive writer does,
then shares its lock); with others open, rows past the commit may be a commit in flight.

Example:
    >>> import tempfile, pytreestore
    >>> from pytreestore.backends import ocdbt_coordinator
    >>> path = tempfile.mkdtemp() + "/shared-doc"
    >>> pytreestore.create(path, {"x": 0}, backend="ocdbt").close()
    >>> with ocdbt_coordinator() as address:
    ...     a = pytreestore.open(path, "a", backend="ocdbt", coordinator=address)
    ...     b = pytreestore.open(path, "a", backend="ocdbt", coordinator=address)
    ...     a.append({"x": 1}); b.append({"x": 2}); b.flush(); a.close(); b.close()
    >>> [int(r["x"]) for r in pytreestore.open(path, backend="ocdbt")]
    [2, 1]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from pytreestore._commit import versions
from pytreestore._commit.claim import CommitClaim
from pytreestore._commit.committer import Committer
from pytreestore._commit.lock import WriterLock
from pytreestore._commit.protocol import check_starts, check_tables, detach, prepare_append
from pytreestore._commit.record import Commit
from pytreestore._commit.roles import Block, Position, Row, TableBuffer
from pytreestore._commit.rows import block_rows
from pytreestore._commit.tables import table_schemas
from pytreestore._format import validate as _validate
from pytreestore._format.names import version_key
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._runtime import RUNTIME
from pytreestore._tree.convert import RecordError, RowFiller, casters
from pytreestore.backends import Backend, ConditionalWrites
from pytreestore.errors import (
    CommitConflictError,
    ReadOnlyError,
    StorageError,
    StoreLockedError,
    StoreReplacedError,
    UnsupportedTreeError,
)


def attach_coordinated(
    engine: Backend, location: Location, schema_of: Callable[[Commit], TreeSchema]
) -> tuple[Commit, TreeSchema, WriterLock]:
    """The commit record of a store opened by a shared writer, its schema (``schema_of`` the
    commit: the one it names, as for readers), and its shared lock.

    A writer that finds no other writer (it gets the lock exclusively) repairs the store as
    an exclusive writer does (:func:`pytreestore._commit.protocol.prepare_append`), then
    shares the lock; one that finds other shared writers repairs nothing (rows past the
    commit may be a commit in flight). Every failure closes ``engine`` and gives the lock
    back.

    Raises:
        StoreLockedError: an exclusive writer holds the store.
    """
    try:
        lock, alone = WriterLock.acquire(location, sharing=True), True
    except StoreLockedError:
        lock, alone = WriterLock.acquire(location, shared=True), False
    try:
        commit = Commit.read(engine, str(location))
        schema = schema_of(commit)
        check_tables(schema, commit, location)
        check_starts(schema, commit.records, location, commit.rows)
        if alone:
            prepare_append(engine, location, schema, commit)
            lock.share()
    except BaseException:
        detach(engine, lock)
        raise
    return commit, schema, lock


class CoordinatedRows:
    """One table's rows a shared writer buffers in memory until its commit.

    Its row count starts at 0 at every commit: the offsets a ragged record writes count the
    rows of their axis's table buffered before them, and :meth:`write` rebases them onto that
    table's committed rows. It buffers as a table writer of
    :class:`~pytreestore._commit.records.RecordWriter` does (``append``, ``append_many``,
    ``write_batch``, ``snapshot``, ``rollback``: a
    :class:`~pytreestore._commit.roles.TableBuffer`); it writes nothing by itself.
    """

    def __init__(self, schema: TreeSchema) -> None:
        self.schema = schema
        self.keys = [c.key for c in schema.columns]
        self.chunk = schema.chunk_records
        self.casters = casters(schema.columns)
        self.axes = {i: c.path for i, c in enumerate(schema.columns) if c.role == "offsets"}
        self.count = 0  # rows buffered
        self.buffers: list[np.ndarray] = []
        self._grow(self.chunk)

    def __len__(self) -> int:
        return self.count

    @property
    def fill(self) -> int:
        """Rows buffered (a table writer's name for it)."""
        return self.count

    start = 0  # a table writer's first buffered row: every row is buffered here

    def append(self, leaves: Row) -> None:
        self._grow(self.count + 1)
        self.filler.fill(leaves, self.count)
        self.count += 1

    def append_many(self, leaves_iter: Iterator[Row]) -> None:
        done = 0
        while rows := [row for _, row in zip(range(self.chunk), leaves_iter)]:
            self._grow(self.count + len(rows))
            try:
                self.filler.fill_block(rows, self.count)
            except RecordError as err:
                raise RecordError(done + err.index, err.error) from err.error
            self.count += len(rows)
            done += len(rows)

    def append_blocks(self, blocks: Iterator[Block]) -> None:
        self.append_many(block_rows(blocks))

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        count = len(blocks[0]) if blocks else 0
        self._grow(self.count + count)
        for buf, block in zip(self.buffers, blocks):
            buf[self.count : self.count + count] = block
        self.count += count

    def snapshot(self) -> Position:
        return (self.count, 0)

    def rollback(self, position: Position) -> None:
        self.count = position[0]

    def drop(self, counts: dict[str | None, int], table: str | None) -> None:
        """Forgets the first ``counts[table]`` buffered rows (a commit that landed), and the
        rows of the axis tables they counted from the offsets of the rows kept."""
        rows = counts[table]
        for buf in self.buffers:
            buf[: self.count - rows] = buf[rows : self.count]
        self.count -= rows
        for i, axis in self.axes.items():
            self.buffers[i][: self.count] -= counts[axis]

    def write(self, backend: Backend, head: Commit, table: str | None) -> int:
        """Writes the buffered rows after ``table``'s rows committed at ``head``, offsets
        rebased onto their axis tables' committed rows, and returns the table's rows then.

        The tail chunk the rows share with committed ones is read and written again whole."""
        n, k = head.rows(table), self.count
        start = n - n % self.chunk
        blocks = [b[:k] for b in self.buffers]
        for i, axis in self.axes.items():  # a new array: a retry rebases the buffer again
            blocks[i] = blocks[i] + np.asarray(head.rows(axis), blocks[i].dtype)
        if start < n:
            tail = backend.read(self.keys, slice(start, n), n)
            blocks = [np.concatenate([t, b]) for t, b in zip(tail, blocks)]
        backend.column_shapes(self.keys)  # fresh handles: others resized the arrays
        backend.resize(self.keys, n + k)
        backend.write(self.keys, start, blocks)
        return n + k

    def _grow(self, rows: int) -> None:
        """Makes the buffers hold at least ``rows`` rows, keeping those buffered."""
        have = len(self.buffers[0]) if self.buffers else 0
        if rows <= have and self.buffers:
            return
        size = max(rows, 2 * have, self.chunk)
        old = self.buffers
        self.buffers = [np.empty((size, *c.shape), c.dtype) for c in self.schema.columns]
        for new, buf in zip(self.buffers, old):
            new[: self.count] = buf[: self.count]
        self.filler = RowFiller(self.casters, self.buffers)


class CoordinatedCommits:
    """The commits of a shared writer: every table's buffered rows, in turn under the
    commit claim (the steps of this module's docstring)."""

    def __init__(
        self,
        backend: Backend,
        schema: TreeSchema,
        commit: Commit,
        *,
        where: str,
        keep: int | None,
        wait: float,
        via: str,
    ) -> None:
        if not isinstance(backend, ConditionalWrites):
            raise TypeError("writers share a store only on a backend with conditional writes")
        self._backend = backend
        self._schema = schema
        self._rows: dict[str | None, CoordinatedRows] = {}
        self._where, self._keep, self._wait, self._via = where, keep, wait, via
        self._schema_id = _validate.id_of(schema)
        self.commit = commit  # the last commit this writer read or made
        self._uncertain: tuple[Commit, dict[str | None, int]] | None = None  # failed midway
        self._left: bytes | None = None  # this writer's claim that could not be given back

    def tables(
        self, schema: TreeSchema, commit: Commit, *, whole: bool
    ) -> dict[str | None, TableBuffer]:
        """Every table's rows, in memory (``whole``: a fixed store's one table)."""
        if whole:
            self._rows = {None: CoordinatedRows(schema)}
        else:
            self._rows = {t: CoordinatedRows(sub) for t, sub in table_schemas(schema).items()}
        return dict(self._rows)

    @property
    def pending(self) -> int:
        """Records buffered."""
        return self._rows[None].count

    def records(self) -> int:
        return self.commit.records + self.pending

    def full(self) -> None:
        self.flush()

    def after_call(self, *, extended: bool) -> None:
        """A call that leaves a chunk's worth of records buffered commits them (never in the
        middle of a call: each call's records are committed together)."""
        if self.pending >= self._schema.chunk_records:
            self.commit_all()

    def flush(self) -> None:
        """Commits every buffered record (one commit)."""
        if self.pending:
            self.commit_all()

    def sole(self) -> Committer:
        """Refused: evolve, truncate, vacuum and commit_fragments need the store's only
        writer."""
        raise shared_only(self._where)

    def may_learn(self, schema: TreeSchema) -> None:
        """Refused: learning a structure changes the schema, which needs the only writer."""
        raise self._unlearnable(schema)

    def adopt(self, old: TreeSchema, grown: TreeSchema) -> Commit:
        raise self._unlearnable(old)

    def _unlearnable(self, schema: TreeSchema) -> UnsupportedTreeError:
        return UnsupportedTreeError(
            f"a record shows the structure of {', '.join(schema.pending)} in store "
            f"{self._where}, which no record had; a writer sharing the store through an OCDBT "
            "coordinator cannot learn it (the schema changes). Append one such record with "
            "mode='a' and no coordinator first"
        )

    def check(self) -> None:
        """Nothing to check: a shared writer owns no tail that a fork could share."""

    def commit_all(self) -> None:
        """Commits every buffered row (one commit), retrying a commit that found the commit
        record changed under the claim."""
        for _ in range(RUNTIME.waits.commit_retries):
            try:
                claim = CommitClaim.take(
                    self._backend, self._where, wait=self._wait, leftover=self._left
                )
                self._left = None
                try:
                    if self._commit_once():
                        return
                finally:
                    claim.release()
                    self._left = claim.left
            except StorageError as err:
                raise StorageError(
                    f"committing {self.pending} records to {self._where} through the OCDBT "
                    f"coordinator at {self._via} failed (is it running?): {err}"
                ) from err
        raise CommitConflictError(
            f"{RUNTIME.waits.commit_retries} commits to {self._where} in a row found the commit "
            "record changed under this writer's commit claim (a claim taken over from a writer presumed "
            f"dead). Nothing was committed by this writer; its {self.pending} records are "
            "still buffered: flush() tries again (a close() that fails so gives them up)"
        )

    def _commit_once(self) -> bool:
        """One try under the claim; False when the commit record changed under it."""
        head = self._head()
        if self._uncertain is not None and self._landed(head):
            return True
        versions.discard_orphan(self._backend, head)
        committer = Committer(self._backend, head, self._schema_id, self._keep, tree=self._schema)
        committer.release()  # rows older versions hold past a truncate are written over
        tables = self._rows
        records = tables[None].write(self._backend, head, None)
        rows = {t: b.write(self._backend, head, t) for t, b in tables.items() if t is not None}
        try:
            committer.advance(records, rows or None)  # a fixed store's commit has no tables
        except CommitConflictError:
            return False
        except StorageError:
            if committer.commit.records != records:  # not committed, or perhaps: find out next
                uncertain = committer.uncertain
                counts = {t: len(b) for t, b in tables.items()}
                self._uncertain = None if uncertain is None else (uncertain, counts)
                raise
            # committed: what failed came after the commit record (the version log's trim)
        self.commit = committer.commit
        for buffered in tables.values():
            buffered.count = 0
        return True

    def _head(self) -> Commit:
        """The commit record now, checked to be this store's."""
        head = Commit.read(self._backend, self._where)
        seen = self.commit
        other = None not in (head.store, seen.store) and head.store != seen.store
        if other or head.generation < seen.generation:
            raise StoreReplacedError(
                f"the store {self._where} was replaced since this writer opened it (it holds "
                f"commit {head.generation} of store {head.store}, this writer saw commit "
                f"{seen.generation} of store {seen.store}); its {self.pending} buffered "
                "records were not written. Open the new store to append to it"
            )
        return head

    def _landed(self, head: Commit) -> bool:
        """Whether the commit that failed midway landed (then its rows are committed and
        leave the buffers); found by its version record, byte for byte."""
        assert self._uncertain is not None
        attempt, counts = self._uncertain
        self._uncertain = None
        if head.generation < attempt.generation:
            return False  # not committed (a version record it left is an orphan)
        if self._backend.read_bytes(version_key(attempt.generation)) != attempt.to_bytes():
            return False
        for table, buffered in self._rows.items():
            buffered.drop(counts, table)
        self.commit = head
        return self.pending == 0 or self._commit_once()


def shared_only(where: str) -> ReadOnlyError:
    """The refusal of what needs the store's only writer."""
    return ReadOnlyError(
        f"store {where} is shared by writers committing through an OCDBT coordinator: "
        "evolve(), truncate(), vacuum() and commit_fragments() need its only writer. Close "
        "every shared writer and open it with mode='a' and no coordinator"
    )


__all__ = [
    "CoordinatedCommits",
    "CoordinatedRows",
    "attach_coordinated",
]
