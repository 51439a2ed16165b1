"""The state of one store object, owned in one place: its lifecycle, its guards, its writer and
the accounting of its reads.

:class:`StoreCore` is what :class:`~pytreestore.TreeStore` is made of: the public class holds
one and its faces (the reads and versions of :mod:`pytreestore._faces`, the pipelines of
:mod:`pytreestore._pipelines.methods`) use only its public interface below. It holds

- the **lifecycle**: open, closing (a flush that may fail and be retried), closed; the jobs
  ``close()`` waits for (:meth:`StoreCore.on_close`); the last flush of a writer never closed,
  at the interpreter's exit (:meth:`StoreCore.hold_at_exit`);
- the **guards**: one append, flush or close at a time (:meth:`StoreCore.writing`), the
  process that may write, read-only and generic views;
- the **writer** and the one commit sequence every change of a store goes through
  (:meth:`StoreCore.commit`, :mod:`pytreestore._log.transaction`);
- the **read accounting**: reads in flight that ``close()`` waits for
  (:meth:`StoreCore.reading`), the read-ahead block and the decoded-chunk cache, and a
  reader's view of the commit record (:meth:`StoreCore.refresh`).

Example:
    >>> import pytreestore
    >>> store = pytreestore.create("memory://doc-core", {"a": 0})
    >>> core = store._core
    >>> with core.writing(append=True) as writer:
    ...     writer.append_record({"a": 1})
    >>> core.readable(), core.head().records, core.mode  # the read saw it, committed nothing
    (1, 0, 'a')
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from pytreestore import _threads as _exiting
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log import prune as _truncate
from pytreestore._log import transaction as _transaction
from pytreestore._log.commit_record import Commit
from pytreestore._log.locks import WriterLock
from pytreestore._log.model import reread_schema
from pytreestore._log.repair import check_not_replaced
from pytreestore._log.transaction import Change, Operation, Transaction
from pytreestore._read import index as _index
from pytreestore._read import reader as _reader
from pytreestore._read.ahead import ReadAhead
from pytreestore._read.cache import ChunkCache, for_store
from pytreestore._read.reader import ReadContext
from pytreestore._read.request import LoadRequest
from pytreestore._spec import Deferred, StoreSpec
from pytreestore._write.records import RecordWriter, new_writer
from pytreestore._write.writer import forked_writer
from pytreestore.backends import Backend
from pytreestore.errors import ClosedStoreError, PyTreeStoreError, ReadOnlyError, StorageError

#: the writer of a store: one writer per table, one commit for all (a fixed store: one table)
AnyWriter = RecordWriter


class StoreCore:
    """Lifecycle, guards, the writer and read accounting of one store object.

    Made by :class:`~pytreestore.TreeStore`'s constructor (from what
    :func:`pytreestore.create` / :func:`pytreestore.open` hand it), never by hand. Every
    method is safe to call from several threads: appends, flushes, commits and ``close()``
    take one lock (:meth:`writing`); a read commits nothing (:meth:`viewing`).

    Attributes:
        location: where the store lives.
        spec: how to open the store again, read-only (what a pickled reader reopens).
        engine: the backend the store was opened with, whether its schema was parsed or not
            (``close()`` closes it).
        ahead: the block that ``store[i]`` in a loop reads from.
        cache: the decoded-chunk cache the store reads through (None: none).
        multihost: a :class:`~pytreestore._fragments.multihost.MultiHost` once
            ``open(multihost=True)`` made one (:meth:`use_multihost`), else None.
    """

    def __init__(
        self,
        *,
        location: Location,
        backend: Backend,
        schema: TreeSchema | Deferred[TreeSchema, Backend],
        commit: Commit,
        lock: WriterLock | None,
        spec: StoreSpec,
        writer: AnyWriter | None,
    ) -> None:
        """Takes what :class:`~pytreestore.TreeStore`'s constructor takes (a reader's
        ``schema`` may be :class:`Deferred`, parsed on first use)."""
        self.location = location
        self.spec = spec
        self.engine = backend
        self.ahead = ReadAhead()
        self.cache: ChunkCache | None = for_store(location, spec.cache_bytes)
        self.multihost: Any = None
        self._opened = schema if isinstance(schema, Deferred) else Deferred.ready(schema, backend)
        self._mode = "r" if writer is None else "a"
        self._commit = commit  # a reader's view of the commit record (a writer: its writer's)
        self._lock = lock
        self._writer = writer
        self._closed = False
        self._pid = os.getpid()  # a writer serves only the process that opened it
        self._forked = False  # set in a child made by os.fork (_after_fork)
        self._mutex = threading.RLock()  # one append, flush, commit or close at a time
        #: the writer's append_record once an append found the store appendable (None: ask
        #: appendable() again); dropped by whatever changes that answer
        self._append: Callable[[Any], None] | None = None
        self._used: TreeSchema | None = None  # the schema use_schema was last given
        if writer is not None:
            _exiting.track(self)
        self._seen = 0  # the most records a read has seen (a later read sees as many)
        self._reads = 0  # reads in flight, which close() waits for
        self._reads_done = threading.Condition()
        self._cache_id = uuid.uuid4().hex  # this object's chunks in the cache
        self._on_close: list[Callable[[], None]] = []

    # ---- what the store is ---------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The location as a string (a directory, or ``memory://NAME``)."""
        return str(self.location)

    @property
    def mode(self) -> str:
        """``"r"`` (read only) or ``"a"`` (append)."""
        return self._mode

    @property
    def closed(self) -> bool:
        """Whether the store was closed (no read starts any more)."""
        return self._closed

    @property
    def opened(self) -> Deferred[TreeSchema, Backend]:
        """The schema and backend, parsed on first use (a reader's) or ready."""
        return self._opened

    @property
    def schema(self) -> TreeSchema:
        """The schema the store reads and appends with (parsed on first use)."""
        return self._opened.get()[0]

    @property
    def backend(self) -> Backend:
        """The backend, once the schema is parsed (the columns it declares are open)."""
        return self._opened.get()[1]

    @property
    def writer(self) -> AnyWriter | None:
        """The writer (mode ``"a"``), or None; unguarded: use :meth:`writing` to append."""
        return self._writer

    @property
    def lock(self) -> WriterLock | None:
        """The writer lock this object holds (mode ``"a"``), or None; ``close()`` releases it."""
        return self._lock

    @property
    def cache_id(self) -> str:
        """This object's own key in the chunk cache (renewed by :meth:`forget_reads`)."""
        return self._cache_id

    def use_schema(self, schema: TreeSchema) -> None:
        """Reads and appends with ``schema`` from now on (a refresh, a commit's new schema)."""
        self._opened = Deferred.ready(schema, self.backend)
        self._used, self._append = schema, None

    def use_multihost(self, multihost: Any) -> None:
        """Appends through ``multihost`` (``open(multihost=True)``): every process appends."""
        self.multihost, self._mode, self._append = multihost, "a", None

    def head(self) -> Commit:
        """The latest commit this object knows: its writer's, or the one a reader sees."""
        return self._writer.commit if self._writer is not None else self._commit

    def records(self) -> int:
        """Records appended, buffered ones included (a reader: those it sees); the records
        released from the front (``keep_last``) are no longer counted."""
        self.check_open()
        if self._writer is None:
            return self._commit.length
        self._seen = max(self._seen, len(self._writer))  # a read after it sees as many
        return len(self._writer) - self._writer.commit.first  # the writer counts rows

    # ---- guards --------------------------------------------------------------------------------

    def check_open(self) -> None:
        """Raises :class:`ClosedStoreError` once the store is closed."""
        if self._closed:
            raise ClosedStoreError(f"store {self.path} is closed; open it again to use it")

    def check_process(self) -> None:
        """Raises :class:`ForkedWriterError` in a process forked from the writer's."""
        if os.getpid() != self._pid:
            raise forked_writer(self.path, self._pid)

    def writable(self) -> AnyWriter:
        """The writer, unguarded: for a caller that alone holds this store (copy's target).

        Raises:
            ClosedStoreError, ReadOnlyError, MultiHostError, ForkedWriterError: the store
                cannot write here.
        """
        self.check_open()
        if self._writer is None and self.multihost is not None:
            raise self.multihost.refused()
        if self._writer is None:
            raise ReadOnlyError(
                f"store {self.path} is open read-only; open it with "
                "pytreestore.open(path, mode='a') to append"
            )
        self.check_process()
        return self._writer

    def appendable(self) -> AnyWriter:
        """The writer, for an append: as :meth:`writable`, and refused for a generic view
        and a multi-host store (whose appends are ``extend_batch`` on every process)."""
        if self.multihost is not None:
            raise self.multihost.refused(append=True)
        writer = self.writable()
        if self.schema.treedef is None:
            raise ReadOnlyError(
                f"store {self.path} is open as a generic view, which can evolve but not append; "
                "open it without generic=True to append"
            )
        return writer

    def append(self, record: Any) -> None:
        """Appends one record: the hot path of ``TreeStore.append``, which costs what a lock
        and two attribute lookups cost. The guards of :meth:`writing` (the writing process,
        closed, read-only, generic, multi-host) are asked once and their answer kept until
        something changes it (a fork, close, a new writer or schema); afterwards the store
        reads with the writer's schema (a ragged store learns)."""
        if self._forked:
            raise forked_writer(self.path, self._pid)
        with self._mutex:
            append = self._append
            if append is None:
                writer = self.appendable()
                append = self._append = writer.append_record
            append(record)
            writer = self._writer
            if writer is not None and writer.schema is not self._used:
                self.use_schema(writer.schema)

    @contextlib.contextmanager
    def writing(self, *, append: bool = False) -> Iterator[AnyWriter]:
        """The writer, held by this thread for one append (``append=True``), flush or commit;
        afterwards the store reads with the writer's schema (a ragged store learns)."""
        if self._writer is not None:
            self.check_process()  # before the lock, which a forked child may inherit held
        with self._mutex:  # checked inside: closed by another thread meanwhile?
            try:
                yield self.appendable() if append else self.writable()
            finally:
                if self._writer is not None and self._writer.schema is not self._used:
                    self.use_schema(self._writer.schema)  # only where it changed: no cost

    # ---- the one commit sequence ---------------------------------------------------------------

    def commit(self, operation: Operation) -> Change | None:
        """Commits ``operation`` (:mod:`pytreestore._log.transaction`) in the one sequence
        of every change: check its arguments (nothing written), flush, check for another
        writer, release the rows older versions hold if it writes over them, its atomic step
        and the commit, then renew the writer at the new commit.

        Returns:
            What was committed (None: the operation commits no version, e.g. a tag).
        """
        with self.writing() as writer:
            operation.check(self.backend, writer)
            writer.flush()
            transaction = Transaction(writer.commit.generation, operation)
            change = _transaction.commit(self.backend, writer, transaction)
            if change is not None:
                self.renew_writer(change.schema or writer.schema)
            return change

    def renew_writer(self, schema: TreeSchema) -> None:
        """A new writer of ``schema`` at the writer's commit, and none of this object's cached
        reads (rows past a truncate may be written again, with other values)."""
        writer = self.writable()
        committer = writer.committer
        if schema is not writer.schema:
            self.backend.open_columns(schema.storage_columns)  # added, or starts lowered
            self.use_schema(schema)
        self._writer = new_writer(self.backend, schema, committer.commit, committer.keep)
        self._append = None
        self.forget_reads()

    # ---- lifecycle -----------------------------------------------------------------------------

    def on_close(self, wait: Callable[[], None]) -> None:
        """Registers ``wait``: work on other threads that :meth:`close` (and vacuum, through
        :meth:`settle`) waits for, e.g. the deletion of committed fragments' folders."""
        self._on_close.append(wait)

    def settle(self) -> None:
        """Waits for the work registered with :meth:`on_close`."""
        for wait in self._on_close:
            wait()

    def close(self) -> None:
        """Flushes (a writer), waits for reads in flight, releases the lock and the backend.

        A flush failing on storage (:class:`StorageError`) leaves the store open with its
        buffered records and lock, for another call; in a forked child only this process's
        copy is dropped. A second call is a no-op.
        """
        if self._closed:
            return
        if self._writer is not None and os.getpid() != self._pid:
            self._closed, self._append = True, None  # the parent's writer: no flush, no unlock
            if self._lock is not None:
                self._lock.release()
            return
        with self._mutex:
            if self._closed:
                return
            try:
                if self._writer is not None:
                    self._writer.flush()
            except PyTreeStoreError as err:
                if not isinstance(err, StorageError):  # a retry cannot fix it
                    self._shut()
                raise
            self._shut()

    def hold_at_exit(self, wait: float) -> bool | None:
        """At the interpreter's exit (:mod:`pytreestore._threads`): takes the writer for good
        (a thread still appending waits, and ends with the process); False if another thread
        held it ``wait`` seconds, None if there is none here."""
        if self._closed or self._forked or self._writer is None or os.getpid() != self._pid:
            return None
        return self._mutex.acquire(timeout=wait)

    def forked(self) -> None:
        """In a child made by ``os.fork``: this writer is the parent's (``append`` refuses it
        without asking for the process id each time)."""
        self._forked = True

    def committed_records(self) -> int:
        """The records committed (:meth:`head`'s), for the exit's report."""
        return self.head().length

    def flush_at_exit(self) -> str | None:
        """The last flush of a writer held at the exit, twice if need be (the first may raise
        a background write's earlier failure); what went wrong, or None."""
        if self._writer is None or self.location.kind == "memory":
            return None  # a memory store's records end with the process
        try:
            try:
                self._writer.flush()
            except StorageError:
                self._writer.flush()
        except Exception as err:  # said on standard error; the exit goes on
            return f"{type(err).__name__}: {err}"
        return None

    def _shut(self) -> None:
        self._append = None
        self.settle()
        with self._reads_done:
            self._closed = True  # no read starts from now on
            self._reads_done.wait_for(lambda: self._reads == 0)
        self.ahead.clear()
        if self.cache is not None:
            self.cache.drop(self._cache_id)
        if self._lock is not None:
            self._lock.release()
        (self.backend if self._opened.done else self.engine).close()

    # ---- reads ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def reading(self) -> Iterator[Backend]:
        """The backend, for one read; :meth:`close` waits until the read is done."""
        with self._reads_done:
            self.check_open()
            self._reads += 1
        try:
            yield self.backend
        finally:
            with self._reads_done:
                self._reads -= 1
                self._reads_done.notify_all()

    def readable(self) -> int:
        """The records a read sees now (:meth:`viewing`); nothing is committed."""
        first, end = self.span()
        return end - first

    def span(self) -> tuple[int, int]:
        """The rows of the record table a read sees now, ``(first, end)``, both of one view:
        record ``i`` is row ``first + i`` (``first``: the rows released from the front by
        ``keep_last``)."""
        with self.viewing() as view:
            return view.commit.first, view.records

    @contextlib.contextmanager
    def viewing(self) -> Iterator[_index.View]:
        """What one read sees (:class:`pytreestore._read.index.View`), for the read's duration: a
        reader its commit; a writer every record, committing nothing, its mutex held until
        the read ends. While another thread holds it, the read sees the records committed,
        unless an earlier read saw more (then it waits: no read sees fewer records than one
        before it); never a record half appended. A forked child sees those committed."""
        self.check_open()
        writer = self._writer
        if writer is None or os.getpid() != self._pid:  # a forked child never writes
            yield _index.committed(self.head())
            return
        if not self._mutex.acquire(blocking=False):
            if writer.commit.records >= self._seen:
                yield _index.committed(writer.commit)
                return
            self._mutex.acquire()
        try:
            view = self.writable().view()  # (closed while this read waited: refused)
            self._seen = max(self._seen, view.records)
            yield view
        finally:
            self._mutex.release()

    def request(self, **options: Any) -> LoadRequest:
        """A read's arguments (those of ``TreeStore.load``), checked and resolved once."""
        self.check_open()
        return LoadRequest.build(self.schema, policy=self.spec.cast, **options)

    def check_not_replaced(self, *, always: bool = False, failed: bool = False) -> None:
        """Raises StoreReplacedError if a reader's store was replaced (or, a read ``failed``,
        its version dropped) since it opened; on object stores only when asked."""
        if self._writer is None and (always or failed or not self.location.is_object_store):
            check_not_replaced(self.engine, self.location, self._commit, failed=failed)

    def read_context(self) -> ReadContext:
        """What the read path (:mod:`pytreestore._read`) needs of this store."""
        return ReadContext(
            self.location,
            self.readable,
            self.reading,
            self.check_not_replaced,
            self.request,
            self.ahead,
            self.cache,
            self._cache_id,
            viewing=self.viewing,
        )

    def forget_reads(self) -> None:
        """Drops this object's read-ahead block and cached chunks (their rows may change)."""
        self._seen = 0  # a truncate leaves fewer records
        self.ahead.clear()
        if self.cache is not None:
            self.cache.drop(self._cache_id)
        self._cache_id = uuid.uuid4().hex

    def refresh(self) -> None:
        """A reader re-reads the commit record (a writer, or a reader opened at a version,
        stays where it is)."""
        self.check_open()
        if self._writer is not None:
            return
        with self.reading() as backend:
            now = check_not_replaced(backend, self.location, self._commit)
            if self.spec.version is not None:
                return  # opened at a version: it stays there
            if now.records != self._commit.records:
                self._check_schema(backend, now)
            if now.truncated_since(self._commit):
                self._follow_truncate(backend, now)  # new values past it, lower starts
            self._commit = now

    def _check_schema(self, backend: Backend, now: Commit) -> None:
        """A reader's schema, against the store's now: its columns must all be kept; a ragged
        store's structures still pending are read again, in case a writer has learnt them."""
        _reader.check_columns_kept(backend, self.schema, self.path, now)
        if self.schema.pending:
            like, generic = self.spec.like, self.spec.generic
            self.use_schema(reread_schema(backend, self.path, now, like=like, generic=generic))

    def _follow_truncate(self, backend: Backend, now: Commit) -> None:
        """Past a truncate since the reader's commit: none of its cached reads, and its
        columns lowered to the rows the truncate left (:func:`~pytreestore._log.prune.
        after_truncate`)."""
        self.forget_reads()
        lowered = _truncate.after_truncate(backend, self.schema, self._commit, now, self.path)
        if lowered is not None:
            backend.open_columns(lowered.storage_columns)
            self.use_schema(lowered)


__all__ = ["AnyWriter", "StoreCore"]
