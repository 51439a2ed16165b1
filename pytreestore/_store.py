"""TreeStore, the store object: its lifecycle, appends and reads, each delegated.

Appends go to the commit package (:mod:`pytreestore._commit`), reads to the read path
(:mod:`pytreestore._read.reader`), streaming to :mod:`pytreestore._pipelines`; this module
holds what ties them: one writer thread at a time, reads that ``close()`` waits for, the
process that may write. See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from pytreestore._commit import evolve as _evolve
from pytreestore._commit.lock import WriterLock
from pytreestore._commit.record import Commit
from pytreestore._commit.repair import check_not_replaced
from pytreestore._commit.writer import Writer, forked_writer
from pytreestore._deferred import Deferred
from pytreestore._format.schema import TreeSchema
from pytreestore._fragmenting import Fragmenting
from pytreestore._inspect import progress as _progress
from pytreestore._inspect import repr as _repr
from pytreestore._inspect.verify import VerifyReport, verify_store
from pytreestore._location import Location
from pytreestore._pipelines.methods import Pipelines
from pytreestore._ragged.model import reread_schema
from pytreestore._ragged.writer import RaggedWriter
from pytreestore._read import reader as _reader
from pytreestore._read.ahead import ReadAhead
from pytreestore._read.cache import for_store
from pytreestore._read.reader import ReadContext
from pytreestore._read.request import LoadRequest
from pytreestore._reads import Reads
from pytreestore._spec import StoreSpec, reopen
from pytreestore._versioning import Versioning
from pytreestore.backends import Backend
from pytreestore.errors import (
    ClosedStoreError,
    PyTreeStoreError,
    ReadOnlyError,
    SchemaMismatchError,
    StorageError,
    UnpicklableStoreError,
)


class TreeStore(Pipelines, Reads, Versioning, Fragmenting):
    """A persistent, columnar store of pytree records.

    Create one with :func:`pytreestore.create` or open one with :func:`pytreestore.open`.
    Records are appended with :meth:`append`, :meth:`extend` or :meth:`extend_batch`, buffered
    in memory, and committed in whole chunks and at :meth:`flush`. Indexing (``store[i]``,
    ``store[a:b]``, ``store[[3, 1]]``, ``store[mask]``) and :meth:`load` return records of the
    stored classes whose leaves carry a leading record axis.

    Example:
        >>> import pytreestore
        >>> with pytreestore.create("memory://doc-treestore", {"a": 0, "b": 0.0}) as store:
        ...     store.extend({"a": i, "b": i / 2} for i in range(4))
        >>> reader = pytreestore.open("memory://doc-treestore")
        >>> reader[1:3]["b"]
        Array([0.5, 1. ], dtype=float32)
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
        writer: Writer | RaggedWriter | None,
    ) -> None:
        """Made by :func:`pytreestore.create` / :func:`pytreestore.open` (``writer`` in mode
        ``"a"``; a reader's ``schema`` may be :class:`Deferred`), not by hand."""
        self._location = location
        self._engine = backend  # closed by close(), whether the schema was parsed or not
        self._opened = schema if isinstance(schema, Deferred) else Deferred.ready(schema, backend)
        self._mode = "r" if writer is None else "a"
        self._commit = commit
        self._lock = lock
        self._closed = False
        self._spec = spec  # how to open it again, for pickling a reader
        self._pid = os.getpid()  # a writer serves only the process that opened it
        self._mutex = threading.RLock()  # one append, flush or close at a time
        self._reads = 0  # reads in flight, which close() waits for
        self._reads_done = threading.Condition()
        self._writer = writer
        self._ahead = ReadAhead()  # the block that store[i] in a loop reads from
        self._cache = for_store(location, spec.cache_bytes)
        self._cache_id = uuid.uuid4().hex  # this object's chunks in the cache (see _read/cache)
        self._multihost: Any = None  # a MultiHost (_fragments/multihost.py): open(multihost=True)

    @property
    def _schema(self) -> TreeSchema:
        return self._opened.get()[0]

    @_schema.setter
    def _schema(self, schema: TreeSchema) -> None:
        self._opened = Deferred.ready(schema, self._backend)

    @property
    def _backend(self) -> Backend:
        return self._opened.get()[1]

    # ---- description ---------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """Where the store lives: a directory, or ``memory://NAME``."""
        return str(self._location)

    @property
    def mode(self) -> str:
        """``"r"`` (read only) or ``"a"`` (append)."""
        return self._mode

    @property
    def schema(self) -> TreeSchema:
        """The store's structure and columns (tree path, dtype and per-record shape of each)."""
        return self._schema

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def committed(self) -> int:
        """Records durable in storage (excludes records still buffered)."""
        return self._writer.commit.records if self._writer is not None else self._commit.records

    def __len__(self) -> int:
        self._check_open()
        return len(self._writer) if self._writer is not None else self._commit.records

    def __repr__(self) -> str:
        return _repr.summary(self)

    def _repr_html_(self) -> str | None:
        """The column tree as an HTML table, for notebooks (None once closed: plain repr)."""
        return _repr.html_of(self)

    # ---- writing -------------------------------------------------------------------------------

    def append(self, record: Any) -> None:
        """Appends one record. It is buffered; it becomes durable at the next commit.

        Raises:
            SchemaMismatchError: the record's structure, a shape or a dtype differs from the
                schema. Nothing is appended.
        """
        with self._writing(append=True) as writer:
            writer.append_record(record)

    def extend(self, records: Iterable[Any], *, progress: bool = False) -> None:
        """Appends every record of an iterable (a list, a generator, ...), all or none.

        If any record is refused, none of this call's records are appended and the error
        names the offending record's position.

        Args:
            records: the records to append.
            progress: show a progress bar (records and MB/s) on standard error.
        """
        if _progress.wanted(progress):
            nbytes = sum(c.record_nbytes for c in self._schema.columns)
            records = _progress.track(records, desc="extend", record_nbytes=nbytes)
        with self._writing(append=True) as writer:
            writer.extend(records)

    def extend_batch(self, batch: Any, mask: Any = None) -> None:
        """Appends a batched record: the schema's structure, leaves with a leading record axis.

        A ragged store takes the padded form with its mask, ``extend_batch(batch, mask=mask)``
        (the pair :meth:`load` returns): each list's length is its run of True in the mask.
        With ``multihost=True`` (docs/scaling.md) every process passes the same global batch
        (a ragged store: the global padded batch and its mask) and returns once process 0
        has committed every process's rows.

        Raises:
            SchemaMismatchError: structure, per-record shape or dtype differ, or the leaves
                disagree on the number of records (or a mask gives no length). Nothing is
                appended.
        """
        if self._multihost is not None:  # this process's part of one global batch
            self._multihost.extend_batch(self, self._backend, batch, mask)
            return
        with self._writing(append=True) as writer:
            if isinstance(writer, RaggedWriter):
                writer.extend_batch(batch, mask)
            elif mask is not None:
                raise SchemaMismatchError(
                    f"store {self.path} holds records of one structure: extend_batch takes "
                    "no mask= (that is for stores created with ragged= or optional=)"
                )
            else:
                writer.extend_batch(batch)

    def evolve(
        self,
        *,
        add: Mapping[str, Any] | None = None,
        drop: Sequence[str] | None = None,
        rename: Mapping[str, str] | None = None,
        rename_class: Mapping[str, str] | None = None,
    ) -> None:
        """Changes the store's schema in one atomic, metadata-only step (no column rewritten).

        Buffered records are committed first. Changes apply in the order ``rename_class``,
        ``drop``, ``rename``, ``add``; appends afterwards follow the new schema. A store in
        format 1 or 2 is upgraded to format 3. See docs/migration.md, "When your classes change".

        Args:
            add: keypath -> default, e.g. ``{".agents.age": np.int32(0)}``: a new column
                under an existing dict, NamedTuple or dataclass node. Records already in
                the store read the default (one value, stored once in the schema); records
                appended afterwards hold their own values.
            drop: keypaths of nodes to hide; their columns' data stays on disk.
            rename: old keypath -> new keypath (same parent node); the storage key stays.
            rename_class: ``"old.module:Old"`` -> ``"new.module:New"``, for moved or renamed
                classes.

        Raises:
            ReadOnlyError: the store is open with mode "r".
            SchemaMismatchError: an unknown or existing path, a change the node kind does not
                allow, or a result today's classes do not match. Nothing is changed.
            UnsupportedDtypeError: a default a column cannot hold. Nothing is changed.
        """
        changes = {"add": add, "drop": drop, "rename": rename, "rename_class": rename_class}
        if self._schema.ragged is not None:
            raise SchemaMismatchError(
                f"store {self.path} holds ragged or optional records, whose schema evolve() "
                "cannot change yet; copy the records into a new store created with the new "
                "classes instead"
            )
        with self._writing() as writer:
            _evolve.check(self._backend, writer.commit, self.path, **changes)  # commits nothing
            writer.flush()
            schema = _evolve.apply(self._backend, self._schema, writer.commit, self.path, **changes)
            committer = writer.committer  # the new schema is a version
            committer.advance_to(schema, writer.commit.records, operation="evolve")
            self._schema = schema
            self._writer = Writer(self._backend, schema, committer.commit, committer)

    def flush(self) -> None:
        """Writes every buffered record and commits; afterwards all appended records are durable."""
        if self._writer is None and self._multihost is not None:
            return  # a multi-host store's processes other than 0 buffer nothing
        with self._writing() as writer:
            writer.flush()

    def close(self) -> None:
        """Flushes (in append mode), releases the writer lock and closes. A second call is a no-op.

        If the flush fails on storage (:class:`StorageError`: disk full, server down), the
        store stays open, its buffered records and its writer lock kept, and ``close()`` can
        be called again once storage is back. In a process forked from the writer's, close
        drops this process's copy and leaves the parent's lock and records alone.
        """
        if self._closed:
            return
        if self._writer is not None and os.getpid() != self._pid:
            self._closed = True  # the parent's writer: no flush, no unlock, no cleanup
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

    def _shut(self) -> None:
        self._purged()  # committed fragments' folders, deleted on a thread
        with self._reads_done:
            self._closed = True  # no read starts from now on
            self._reads_done.wait_for(lambda: self._reads == 0)
        self._ahead.clear()
        if self._cache is not None:
            self._cache.drop(self._cache_id)
        if self._lock is not None:
            self._lock.release()
        (self._backend if self._opened.done else self._engine).close()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Backend]:
        """The backend, for one read; ``close()`` waits until the read is done."""
        with self._reads_done:
            self._check_open()
            self._reads += 1
        try:
            yield self._backend
        finally:
            with self._reads_done:
                self._reads -= 1
                self._reads_done.notify_all()

    def __enter__(self) -> TreeStore:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """Closes; after an exception in the block, flushes what it can and lets the block's
        exception through, with a note if the close failed too."""
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as err:
            left = (
                "the store stays open with its buffered records: call close() again once "
                "storage is back"
                if not self._closed
                else "records not yet committed were not written"
            )
            exc.add_note(f"closing store {self.path} failed as well ({err}); {left}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles a reader by its location and options; it reopens where it is unpickled."""
        if self._writer is not None:
            raise UnpicklableStoreError(
                f"store {self.path} is open for appending (mode='a') and cannot be pickled: a "
                "copy would share its writer lock and lose its buffered records. Pickle a "
                "reader instead (pytreestore.open(path), mode='r'), or close() the writer and "
                "open a reader of it"
            )
        self._check_open()
        return (reopen, (self._spec,))

    def use_multihost(self, multihost: Any) -> None:  # open(multihost=True); not a user API
        self._multihost, self._mode = multihost, "a"

    @property
    def spec(self) -> StoreSpec:
        """How to open this store again, read-only: a picklable
        :class:`~pytreestore._spec.StoreSpec` (``spec.open()`` opens it)."""
        return self._spec

    def reopen_options(self) -> dict[str, Any]:
        """The arguments of :func:`open` that open this store again, read-only."""
        return self._spec.options()

    # ---- reading -------------------------------------------------------------------------------

    def refresh(self) -> int:
        """Re-reads the commit record (a reader sees records committed since it opened).

        Returns:
            The number of records now visible.
        """
        self._check_open()
        if self._writer is None:
            with self._reading() as backend:
                now = check_not_replaced(backend, self._location, self._commit)
                if self._spec.version is not None:
                    return len(self)  # opened at a version: it stays there
                if now.records != self._commit.records:
                    self._check_schema(backend, now)
                if now.truncated_since(self._commit):
                    self._follow_truncate(backend, now)  # new values past it, lower starts
                self._commit = now
        return len(self)

    def _check_schema(self, backend: Backend, now: Commit) -> None:
        """A reader's schema, against the store's now: a fixed store's columns must all be
        kept; a ragged store's structures still pending are read again, in case a writer
        has learnt them."""
        if self._schema.ragged is None:
            _reader.check_columns_kept(backend, self._schema, self.path, now)
        elif self._schema.pending:
            options = {"like": self._spec.like, "generic": self._spec.generic}
            self._schema = reread_schema(backend, self.path, now, **options)

    def _check_not_replaced(self, *, always: bool = False, failed: bool = False) -> None:
        """Raises StoreReplacedError if a reader's store was replaced (or, a read ``failed``,
        its version dropped) since it opened; on object stores only when asked."""
        if self._writer is None and (always or failed or not self._location.is_object_store):
            check_not_replaced(self._engine, self._location, self._commit, failed=failed)

    def read_context(self) -> ReadContext:
        """What pytreestore's own read path needs of this store; not a user API.

        Its location, the records a read sees (pending appends committed first), the backend
        lent for one read, and the check that the store was not replaced since it opened.
        """
        return ReadContext(
            self._location,
            self._readable,
            self._reading,
            self._check_not_replaced,
            self._request,
            self._ahead,
            self._cache,
            self._cache_id,
        )

    def _request(self, **options: Any) -> LoadRequest:
        """A read's arguments (those of :meth:`load`), checked and resolved once."""
        self._check_open()
        return LoadRequest.build(self._schema, policy=self._spec.cast, **options)

    def commit_now(self) -> Commit:
        """The commit a read sees (after :meth:`_readable`); not a user API."""
        return self._writer.commit if self._writer is not None else self._commit

    def _readable(self) -> int:
        """The records a read sees: all of them, committed first, unless another thread is
        appending; then those committed so far (a read never waits for an append)."""
        self._check_open()
        if self._writer is None:
            return self._commit.records
        if os.getpid() != self._pid or not self._mutex.acquire(blocking=False):
            return self._writer.commit.records  # a forked child never writes
        try:
            if self._writer.pending:
                self._writer.flush()
            return len(self._writer)
        finally:
            self._mutex.release()

    def verify(self, *, progress: bool = False) -> VerifyReport:
        """Reads back the commit record, every column's metadata and every committed chunk.

        Args:
            progress: show a bar of the chunks checked (and MB/s decoded) on standard error.

        Returns:
            A report whose ``ok`` says whether all is well and whose ``problems`` name each
            damaged or missing object by column (tree path), chunk and storage key.

        Raises:
            StorageError: storage could not be reached.
        """
        request = self._request()
        return verify_store(self.read_context(), request.schema, self.committed, progress=progress)

    # ---- guards --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedStoreError(f"store {self.path} is closed; open it again to use it")

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            raise forked_writer(self.path, self._pid)

    def _appendable(self) -> Writer | RaggedWriter:
        if self._multihost is not None:
            raise self._multihost.refused(append=True)
        writer = self._writable()
        if self._schema.treedef is None:
            raise ReadOnlyError(
                f"store {self.path} is open as a generic view, which can evolve but not append; "
                "open it without generic=True to append"
            )
        return writer

    def _writable(self) -> Writer | RaggedWriter:
        """The writer, unguarded: for a caller that alone holds this store (copy's target)."""
        self._check_open()
        if self._writer is None and self._multihost is not None:
            raise self._multihost.refused()
        if self._writer is None:
            raise ReadOnlyError(
                f"store {self.path} is open read-only; open it with "
                "pytreestore.open(path, mode='a') to append"
            )
        self._check_process()
        return self._writer

    @contextlib.contextmanager
    def _writing(self, *, append: bool = False) -> Iterator[Writer | RaggedWriter]:
        """The writer, held by this thread for one append (``append=True``), flush or close."""
        if self._writer is not None:
            self._check_process()  # before the lock, which a forked child may inherit held
        with self._mutex:  # checked inside: closed by another thread meanwhile?
            try:
                yield self._appendable() if append else self._writable()
            finally:
                if self._writer is not None:  # a ragged store learns pending structures
                    self._schema = self._writer.schema


__all__ = ["TreeStore"]
