"""Writers sharing one store: ``pytreestore.open(path, mode="a", backend="ocdbt",
coordinator=ADDRESS)`` in any number of processes at once.

A shared writer takes no exclusive lock (a shared ``flock`` instead: an exclusive writer is
kept out, and keeps shared ones out) and owns no tail: it buffers its records in memory and
commits them as one block, every commit in turn under the commit claim
(:mod:`pytreestore._log.locks`):

1. take the claim (waiting while another writer commits);
2. read the commit record again: ``n`` records are committed now, by anyone;
3. drop a version record a writer killed mid-commit left past it, and give up rows older
   versions hold past a truncate (:meth:`Committer.release`);
4. rebase: the rows go after the ``n`` committed ones; the tail chunk they share is read and
   written again with the committed rows plus the new ones, then every column is resized to
   ``n + k`` and the rest written;
5. commit ``n + k`` through a :class:`~pytreestore._log.committer.Committer` (the version
   record only if absent, the commit record conditional on the generation read in step 2,
   the root's consolidated metadata), and give the claim back.

A writer's records therefore land in the order it appended them, each commit's rows together,
after every record committed before it; none is lost or duplicated. A conditional write that
still fails (a claim taken over from a writer presumed dead) is retried from step 1, up to
``RUNTIME.waits.commit_retries`` times, then :class:`~pytreestore.errors.CommitConflictError`.

A call that fails (a storage failure, :class:`~pytreestore.errors.StorageError`: the
coordinator gone; or that conflict) keeps nothing of its own records, as a refused record
leaves nothing: the caller may append them again, and they are then written once. The records
of earlier calls stay buffered (``flush()`` commits them). Whether a failed commit landed is
found out at once, under the claim: a failure of the commit record's write (the only step
after which it may have landed) is followed by reading the commit record and the version
record back (byte for byte). One that landed is a commit like any other (the call does not
fail); one that did not is the failure above. Only when that read fails as well is the
outcome unknown: then the failed call's records stay buffered (the error says so: do not
append them again), and the next commit first finds out whether they landed and writes them
only if not. Only a writer that opens the store alone repairs it (as an exclusive writer
does, then shares its lock); with others open, rows past the commit may be a commit in
flight.

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

from pytreestore._format import validate as _validate
from pytreestore._format.keys import version_key
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log import versions
from pytreestore._log.commit_record import Commit
from pytreestore._log.committer import Committer
from pytreestore._log.evolve_tables import table_schemas
from pytreestore._log.locks import CommitClaim, WriterLock
from pytreestore._log.protocol import detach, prepare_append, read_head
from pytreestore._runtime import RUNTIME
from pytreestore._tree.convert import RecordError, RowFiller, casters
from pytreestore._write.roles import Block, Position, Row, TableBuffer
from pytreestore._write.rows import block_rows
from pytreestore.backends import Backend, ConditionalWrites
from pytreestore.errors import (
    CommitConflictError,
    ReadOnlyError,
    StorageError,
    StoreLockedError,
    StoreReplacedError,
    UnsupportedTreeError,
)

#: what a close() whose flush conflicts does with the records (said in such errors)
GIVEN_UP = " (a close() that fails so gives them up)"


def attach_coordinated(
    engine: Backend, location: Location, schema_of: Callable[[Commit], TreeSchema]
) -> tuple[Commit, TreeSchema, WriterLock]:
    """The commit record of a store opened by a shared writer, its schema (``schema_of`` the
    commit: the one it names, as for readers), and its shared lock.

    A writer that finds no other writer (it gets the lock exclusively) repairs the store as
    an exclusive writer does (:func:`pytreestore._log.protocol.prepare_append`), then
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
        commit, schema = read_head(engine, location, schema_of)
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
    :class:`~pytreestore._write.records.RecordWriter` does (``append``, ``append_many``,
    ``write_batch``, ``snapshot``, ``rollback``: a
    :class:`~pytreestore._write.roles.TableBuffer`); it writes nothing by itself.
    """

    def __init__(self, schema: TreeSchema) -> None:
        self.schema = schema
        self.keys = [c.key for c in schema.columns]
        self.chunk = schema.chunk_records
        self.casters = casters(schema.columns)
        self.axes = {i: c.path for i, c in enumerate(schema.columns) if c.role == "offsets"}
        self.count = 0  # rows buffered
        self.held = 0  # the first rows, of a commit whose outcome is unknown (kept until known)
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
        """Back to ``position``'s rows; never below the rows :attr:`held` (they may be in
        storage: the next commit finds out) nor above the rows buffered (a commit found to
        have landed took them out)."""
        self.count = min(self.count, max(position[0], self.held))

    def buffered_rows(self) -> None:
        """None: the rows' places are known only at their commit (other writers commit
        between), so a read of a shared writer commits them first."""
        return None

    def drop(self, counts: dict[str | None, int], table: str | None) -> None:
        """Forgets the first ``counts[table]`` buffered rows (a commit that landed), and the
        rows of the axis tables they counted from the offsets of the rows kept."""
        rows = counts[table]
        for buf in self.buffers:
            buf[: self.count - rows] = buf[rows : self.count]
        self.count -= rows
        self.held = 0
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
        #: a commit whose outcome is unknown (its write and the read back failed), with the
        #: rows it took of each table (held in the buffers until the next commit finds out)
        self._uncertain: tuple[Commit, dict[str | None, int]] | None = None
        self._left: bytes | None = None  # this writer's claim that could not be given back
        self._ended: dict[str | None, int] = {}  # each table's rows when the last call ended

    def tables(
        self, schema: TreeSchema, commit: Commit, *, whole: bool
    ) -> dict[str | None, TableBuffer]:
        """Every table's rows, in memory (``whole``: a fixed store's one table)."""
        if whole:
            self._rows = {None: CoordinatedRows(schema)}
        else:
            self._rows = {t: CoordinatedRows(sub) for t, sub in table_schemas(schema).items()}
        self._end_call()
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
        middle of a call: each call's records are committed together). If that fails, the
        call's own records are taken back (unless held: see the module)."""
        try:
            if self.pending >= self._schema.chunk_records:
                self._commit_call()
        finally:
            self._end_call()

    def _commit_call(self) -> None:
        """Commits every buffered row; on a failure, forgets the rows the call buffered."""
        mine = {t: len(b) - self._ended.get(t, 0) for t, b in self._rows.items()}
        try:
            self.commit_all(call=mine[None])
        except BaseException:
            for t, buffered in self._rows.items():  # from the end: a landed commit took rows
                buffered.rollback((len(buffered) - mine[t], 0))
            raise

    def _end_call(self) -> None:
        """A call ended: the rows buffered now are earlier calls' to the next one."""
        self._ended = {t: len(b) for t, b in self._rows.items()}

    def flush(self) -> None:
        """Commits every buffered record (one commit)."""
        try:
            if self.pending:
                self.commit_all()
        finally:
            self._end_call()

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

    def commit_all(self, *, call: int = 0) -> None:
        """Commits every buffered row (one commit), retrying a commit that found the commit
        record changed under the claim; ``call``: the last records buffered, of the call
        that commits them (taken back by :meth:`after_call` if it fails), named in errors.

        Raises:
            StorageError: storage (or the coordinator) failed; the commit did not land, or
                its outcome is unknown (its rows held, the next commit finds out).
            CommitConflictError: the commit record changed under the claim every time, or
                another writer held the claim too long; nothing was committed.
        """
        for _ in range(RUNTIME.waits.commit_retries):
            try:
                if self._commit_claimed():
                    return
            except StorageError as err:
                raise StorageError(
                    f"committing {self.pending} records to {self._where} through the OCDBT "
                    f"coordinator at {self._via} failed (is it running?): "
                    f"{str(err).rstrip('.')}. "
                    f"{self._kept(call)}"
                ) from err
            except CommitConflictError as err:  # the claim held by another writer too long
                said = str(err).rstrip(".")
                raise CommitConflictError(f"{said}. {self._kept(call)}{GIVEN_UP}") from err
        raise CommitConflictError(
            f"{RUNTIME.waits.commit_retries} commits to {self._where} in a row found the commit "
            "record changed under this writer's commit claim (a claim taken over from a writer "
            f"presumed dead). Nothing was committed by this writer. {self._kept(call)}{GIVEN_UP}"
        )

    def _commit_claimed(self) -> bool:
        """One try under the commit claim (:meth:`_commit_once`)."""
        claim = CommitClaim.take(self._backend, self._where, wait=self._wait, leftover=self._left)
        self._left = None
        try:
            return self._commit_once()
        finally:
            claim.release()
            self._left = claim.left

    def _kept(self, call: int) -> str:
        """What a failed commit leaves buffered, for its error; ``call``: the last records
        buffered, the failing call's (taken back unless held)."""
        held = self._rows[None].held
        dropped = min(call, self.pending - held)
        kept = self.pending - dropped
        said = []
        if dropped:
            said.append(f"This call's records ({dropped}) were not appended: append them again.")
        if held:
            said.append(
                f"{kept} records stay buffered; whether the commit of {held} of them landed "
                "could not be read back (they may be in storage): do not append them again. "
                "The next commit (flush()) first finds out, and writes them only if they did "
                "not land"
            )
        elif kept:
            said.append(f"{kept} records appended before stay buffered: flush() commits them")
        return " ".join(said) or "Nothing is buffered"

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
        made: Commit | None
        try:
            made = committer.advance(records, rows or None)  # a fixed store's has no tables
        except CommitConflictError:
            return False
        except StorageError:
            made = self._made(committer, records)
            if made is None:
                raise
        self.commit = made
        for buffered in tables.values():
            buffered.count = buffered.held = 0
        return True

    def _made(self, committer: Committer, records: int) -> Commit | None:
        """The commit of ``records`` records that ``committer`` made although its
        :meth:`~Committer.advance` failed, or None if it did not land.

        It landed when what failed came after the commit record (the version log's trim);
        when the commit record's write failed (:attr:`Committer.uncertain`), whether it
        landed is read back at once, under the claim. If that read fails too, its rows are
        held for the next commit to find out (:meth:`_landed`)."""
        attempt = committer.uncertain
        if committer.commit.records == records:
            return committer.commit
        if attempt is None:
            return None  # failed before its version record
        try:
            return (
                attempt if self._stored(Commit.read(self._backend, self._where), attempt) else None
            )
        except StorageError:
            self._uncertain = (attempt, {t: len(b) for t, b in self._rows.items()})
            for buffered in self._rows.values():
                buffered.held = len(buffered)
            return None

    def _stored(self, head: Commit, attempt: Commit) -> bool:
        """Whether ``attempt`` is committed at ``head``: its version record, byte for byte."""
        if head.generation < attempt.generation:
            return False  # not committed (a version record it left is an orphan)
        return self._backend.read_bytes(version_key(attempt.generation)) == attempt.to_bytes()

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
        """Whether the commit of unknown outcome landed (then its rows are committed and
        leave the buffers, and the rest is committed after them); found by its version
        record, byte for byte. Either way its rows are no longer held."""
        assert self._uncertain is not None
        attempt, counts = self._uncertain
        landed = self._stored(head, attempt)  # a failure keeps it unknown
        self._uncertain = None
        for table, buffered in self._rows.items():
            buffered.held = 0
            if landed:
                buffered.drop(counts, table)
        if not landed:
            return False
        self.commit = head
        return self.pending == 0 or self._commit_once()


def shared_only(where: str) -> ReadOnlyError:
    """The refusal of what needs the store's only writer."""
    return ReadOnlyError(
        f"store {where} is shared by writers committing through an OCDBT coordinator: "
        "evolve(), truncate(), keep_last(), vacuum() and commit_fragments() need its only "
        "writer. Close every shared writer and open it with mode='a' and no coordinator"
    )


__all__ = [
    "CoordinatedCommits",
    "CoordinatedRows",
    "attach_coordinated",
]
