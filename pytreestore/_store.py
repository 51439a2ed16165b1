"""TreeStore, the store object: its lifecycle, appends and reads, each delegated.

Appends go to the commit package (:mod:`pytreestore._commit`), reads to the read path
(:mod:`pytreestore._read.reader`), streaming to :mod:`pytreestore._pipelines`; this module
holds what ties them: one writer thread at a time, reads that ``close()`` waits for, the
process that may write. See docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Generic

from pytreestore._core import AnyWriter, StoreCore
from pytreestore._faces import Reads, T, Versioning
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments.commit import Fragmenting
from pytreestore._inspect import notebook as _notebook
from pytreestore._inspect import progress as _progress
from pytreestore._inspect import repr as _repr
from pytreestore._inspect.verify import VerifyReport, verify_store
from pytreestore._location import Location
from pytreestore._log.commit_record import Commit
from pytreestore._log.locks import WriterLock
from pytreestore._log.transaction import Evolve
from pytreestore._pipelines.methods import Pipelines
from pytreestore._pipelines.replay import ReplayBuffer
from pytreestore._read.cache import ChunkCache
from pytreestore._read.reader import ReadContext
from pytreestore._spec import Deferred, StoreSpec, reopen
from pytreestore._write.recorder import Recorder, flush_recorders
from pytreestore.backends import Backend
from pytreestore.errors import UnpicklableStoreError


class TreeStore(Pipelines, Reads[T], Versioning, Fragmenting, Generic[T]):
    """A persistent, columnar store of pytree records.

    Create one with :func:`pytreestore.create` or open one with :func:`pytreestore.open`.
    Records are appended with :meth:`append`, :meth:`extend` or :meth:`extend_batch`, buffered
    in memory, and committed in whole chunks and at :meth:`flush`. Indexing (``store[i]``,
    ``store[a:b]``, ``store[[3, 1]]``, ``store[mask]``) and :meth:`load` return records of the
    stored classes whose leaves carry a leading record axis.

    ``TreeStore[T]`` holds records of type ``T``, the type of the example it was created
    with: ``store[i]`` for an int ``i`` is a ``T`` (a store :func:`pytreestore.open` opens is
    a ``TreeStore[Any]``).

    Example:
        >>> import pytreestore
        >>> with pytreestore.create("memory://doc-treestore", {"a": 0, "b": 0.0}) as store:
        ...     store.extend({"a": i, "b": i / 2} for i in range(4))
        >>> reader = pytreestore.open("memory://doc-treestore")
        >>> reader[1:3]["b"]
        Array([0.5, 1. ], dtype=float32, weak_type=True)
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
        """Made by :func:`pytreestore.create` / :func:`pytreestore.open` (``writer`` in mode
        ``"a"``; a reader's ``schema`` may be :class:`Deferred`), not by hand."""
        core = StoreCore(
            location=location,
            backend=backend,
            schema=schema,
            commit=commit,
            lock=lock,
            spec=spec,
            writer=writer,
        )
        Reads.__init__(self, core)
        Pipelines.__init__(self, core)
        Versioning.__init__(self, core)
        core.on_close(self._purged)  # committed fragments' folders, deleted on a thread

    # ---- what the fragment face (_fragments/commit.py) and tests read of a store ------------------

    @property
    def _schema(self) -> TreeSchema:
        return self._core.schema

    @_schema.setter
    def _schema(self, schema: TreeSchema) -> None:
        self._core.use_schema(schema)

    @property
    def _backend(self) -> Backend:
        return self._core.backend

    @property
    def _location(self) -> Location:
        return self._core.location

    @property
    def _spec(self) -> StoreSpec:
        return self._core.spec

    @property
    def _writer(self) -> AnyWriter | None:
        return self._core.writer

    @property
    def _lock(self) -> WriterLock | None:
        return self._core.lock

    @property
    def _cache(self) -> ChunkCache | None:
        return self._core.cache

    @property
    def _opened(self) -> Deferred[TreeSchema, Backend]:
        return self._core.opened

    # ---- description ---------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """Where the store lives: a directory, or ``memory://NAME``."""
        return self._core.path

    @property
    def mode(self) -> str:
        """``"r"`` (read only) or ``"a"`` (append)."""
        return self._core.mode

    @property
    def schema(self) -> TreeSchema:
        """The store's structure and columns (tree path, dtype and per-record shape of each)."""
        return self._core.schema

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._core.closed

    @property
    def committed(self) -> int:
        """Records durable in storage (excludes records still buffered, and those released
        from the front by :meth:`keep_last`)."""
        return self._core.head().length

    def __len__(self) -> int:
        return self._core.records()

    def __repr__(self) -> str:
        return _repr.summary(self)

    def _repr_html_(self) -> str | None:
        """The notebook view: the column tree with the first and last records' values, static
        fields, ragged axes, versions (None once closed: the plain repr)."""
        return _notebook.html_of(self)

    # ---- writing -------------------------------------------------------------------------------

    def append(self, record: Any) -> None:
        """Appends one record. It is buffered; it becomes durable at the next commit.

        Raises:
            SchemaMismatchError: the record's structure, a shape or a dtype differs from the
                schema. Nothing is appended.
        """
        self._core.append(record)

    def extend(self, records: Iterable[Any], *, progress: bool = False) -> None:
        """Appends every record of an iterable (a list, a generator, ...), all or none.

        If any record is refused, none of this call's records are appended and the error
        names the offending record's position.

        Args:
            records: the records to append.
            progress: show a progress bar (records and MB/s) on standard error.
        """
        if _progress.wanted(progress):
            nbytes = sum(c.record_nbytes for c in self._core.schema.columns)
            records = _progress.track(records, desc="extend", record_nbytes=nbytes)
        with self._core.writing(append=True) as writer:
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
        core = self._core
        if core.multihost is not None:  # this process's part of one global batch
            core.multihost.extend_batch(self, core.backend, batch, mask)
            return
        with core.writing(append=True) as writer:
            writer.extend_batch(batch, mask, where=self.path)

    def replay(
        self, capacity: int, *, seed: int | None = None, keep_all: bool = False
    ) -> ReplayBuffer[T]:
        """A replay buffer: records added through it are appended to this store, and samples
        are drawn from the last ``capacity`` of them, kept in host memory (docs/replay.md).

        The buffer starts with the store's last ``capacity`` records, so a run reopened with
        ``pytreestore.open(path, mode="a")`` resumes where it stopped. Every ``capacity``
        records added, the store keeps only its last ``capacity`` records
        (:meth:`keep_last`) and :meth:`vacuum` frees the chunks of the others, so an endless
        run keeps bounded disk: the store holds ``capacity`` to ``2 * capacity`` records.
        Pass a small ``keep_versions`` to ``create``/``open``: vacuum frees only what no
        version the log keeps reads.

        Args:
            capacity: the records a sample draws from (the newest ones).
            seed: seeds the buffer's generator (samples drawn without a ``key``).
            keep_all: keep every record in the store (no ``keep_last``): the whole history
                on disk, samples still from the last ``capacity``.

        Returns:
            A :class:`~pytreestore.ReplayBuffer`: ``add(record)``, ``add_batch(batch,
            mask=None)``, ``sample(k, key=None, as_numpy=False)``, ``len()``.

        Raises:
            ArgumentError: ``capacity`` is not an int >= 1, ``seed`` not an int >= 0, or
                ``keep_all`` not a bool.
            ReadOnlyError: the store is open with mode "r" (or as a generic view).

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-store-replay", {"x": np.int32(0)})
            >>> buffer = s.replay(2, seed=0)
            >>> buffer.add_batch({"x": np.arange(5, dtype=np.int32)})
            >>> len(s), s.dropped, len(buffer)
            (2, 3, 2)
            >>> sorted(set(buffer.sample(16, as_numpy=True)["x"].tolist()))
            [3, 4]
        """
        return ReplayBuffer(self, self._core, capacity, seed=seed, keep_all=keep_all)

    def recorder(self, block: int = 256) -> Recorder:
        """A recorder of this store's records from a loop of jitted steps: its ``append``
        dispatches one jitted pack of the record (no wait for the step), and every ``block``
        records one block is stacked on the device and written on a background thread, in
        order. ``close()`` (or this store's ``flush``/``close``) writes the rest and waits;
        a failed write is raised by the next call. See docs/recording.md and
        :func:`pytreestore.record_scan` for a loop compiled whole.

        Example:
            >>> import jax, jax.numpy as jnp, pytreestore
            >>> store = pytreestore.create("memory://doc-store-recorder", {"x": jnp.int32(0)})
            >>> with store.recorder(block=2) as rec:
            ...     for i in range(3):
            ...         rec.append({"x": jnp.int32(i)})
            >>> store.load(as_numpy=True)["x"].tolist()
            [0, 1, 2]
        """
        self._core.appendable()  # refused now, by name, where this store cannot append
        return Recorder(self, id(self._core), block)

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
            CommitConflictError: another writer committed since this one read the commit
                record (one that took the lock over with ``break_lock=True``). Nothing is
                changed; reopen the store.
        """
        changes = {"add": add, "drop": drop, "rename": rename, "rename_class": rename_class}
        flush_recorders(id(self._core))  # records recorded before it take the old schema
        self._core.commit(Evolve(self.path, changes))  # the new schema is a version

    def flush(self) -> None:
        """Writes every buffered record and commits; afterwards all appended records are durable."""
        core = self._core
        flush_recorders(id(core))
        if core.writer is None and core.multihost is not None:
            return  # a multi-host store's processes other than 0 buffer nothing
        with core.writing() as writer:
            writer.flush()

    def close(self) -> None:
        """Flushes (in append mode), releases the writer lock and closes. A second call is a no-op.

        If the flush fails on storage (:class:`StorageError`: disk full, server down), the
        store stays open, its buffered records and its writer lock kept, and ``close()`` can
        be called again once storage is back. In a process forked from the writer's, close
        drops this process's copy and leaves the parent's lock and records alone. Its
        recorders (:meth:`recorder`) are closed first.
        """
        if not self._core.closed:
            flush_recorders(id(self._core), close=True)
        self._core.close()

    def __enter__(self) -> TreeStore[T]:
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
                if not self._core.closed
                else "records not yet committed were not written"
            )
            exc.add_note(f"closing store {self.path} failed as well ({err}); {left}")

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles a reader by its location and options; it reopens where it is unpickled."""
        if self._core.writer is not None:
            raise UnpicklableStoreError(
                f"store {self.path} is open for appending (mode='a') and cannot be pickled: a "
                "copy would share its writer lock and lose its buffered records. Pickle a "
                "reader instead (pytreestore.open(path), mode='r'), or close() the writer and "
                "open a reader of it"
            )
        self._core.check_open()
        return (reopen, (self._core.spec,))

    def _use_multihost(self, multihost: Any) -> None:
        """Appends through ``multihost`` from now on (``open(multihost=True)``)."""
        self._core.use_multihost(multihost)

    def reopen_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`pytreestore.open` that open this store again,
        read-only, in this or another process (what a pickled reader reopens with).

        Returns:
            ``path`` and the options the store was opened with: ``backend``,
            ``storage_options`` (credentials included), ``like``, ``generic``, ``cast``,
            ``cache_bytes``, ...

        Example:
            >>> import pytreestore
            >>> s = pytreestore.create("memory://doc-reopen", {"a": 0}, backend="zarr")
            >>> pytreestore.open(**s.reopen_options()).path
            'memory://doc-reopen'
        """
        return self._core.spec.options()

    # ---- reading -------------------------------------------------------------------------------

    def refresh(self) -> int:
        """Re-reads the commit record (a reader sees records committed since it opened).

        Returns:
            The number of records now visible.
        """
        self._core.refresh()
        return len(self)

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
        request = self._core.request()
        return verify_store(self.read_context(), request.schema, self.committed, progress=progress)

    # ---- the seam of pytreestore's own readers: not a user API ---------------------------------
    # The CLI, copy(), multi-host appends and the notebook view (_inspect/repr.py) read a store
    # through these two. They keep plain names while modules outside this one call them; the
    # API reference hides them by name (docs/api.md, its TreeStore filter), and
    # tests/test_api_docs.py checks that they stay hidden and that nothing else is.

    def read_context(self) -> ReadContext:
        """What pytreestore's own read path needs of this store; not a user API.

        Its location, the records a read sees (pending appends committed first), the backend
        lent for one read, and the check that the store was not replaced since it opened.
        """
        return self._core.read_context()

    def commit_now(self) -> Commit:
        """The commit a read sees (after the records it sees were committed); not a user API."""
        return self._core.head()


__all__ = ["TreeStore"]
