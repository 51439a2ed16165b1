"""The commit protocol, in one place: how a store is made, opened for appending and committed.

A store is consistent when its commit record (``.pytreestore/commit.json``,
:mod:`pytreestore._log.commit_record`) says so: readers trust only that record, and every step
below leaves the previous commit in force until one atomic put replaces it.

1. **Clearing** (:func:`clear_for_create`, ``create(..., overwrite=True)``). A location that
   holds a store's root ``zarr.json``, a commit record or the incomplete marker is a store (or
   what a cut-off create or copy left), and so is a local one holding only plain files in
   ``.pytreestore/`` (a create killed before its marker landed: :func:`cut_off_create`);
   anything else there is refused, never deleted. A store
   is deleted only once its writer lock has been taken (and given back): a live writer's
   store is never cleared under it.
2. **The initial commit** (:func:`start_store`). With the writer lock held: the *incomplete
   marker* ``.pytreestore/incomplete`` is written first; then every column's array; then, all
   at once, the ``zarr.json`` of every intermediate group, the schema and the version record
   and the commit record (0 records, generation 0, a new random store id); and last the root
   ``zarr.json`` holding the schema. ``create`` then
   deletes the marker; ``copy`` keeps it until the last record is copied, so a copy cut off
   midway is recognised (and replaced by ``overwrite=True``). If any step fails, everything
   written is deleted and the lock given back.
3. **The lock handshake** (:func:`take_lock`, :mod:`pytreestore._log.locks`). One writer
   per store: ``flock`` on ``.pytreestore/lock`` locally, a set of names in the process for
   ``memory://``, a conditionally written lock object naming its holder on S3 and GCS (a
   provably dead holder is replaced; ``break_lock=True`` takes over from a live one).
   Writers sharing a local OCDBT store through a coordinator hold a shared ``flock`` instead
   and commit one at a time under the commit claim (:mod:`pytreestore._write.coordinated`).
4. **Opening for append** (:func:`attach`). Lock first, then read the commit record, check
   that no column starts past it (:func:`check_starts`), move the chunk rows of an
   unfinished commit of fragments back into them (:mod:`pytreestore._log.placing`), and
   repair what a crashed writer left past the commit (:mod:`pytreestore._log.repair`: partial ``<key>.__lock`` files of
   TensorStore's file kvstore, removed by ``remove_partial_writes`` in
   ``pytreestore/backends/_tensorstore/backend.py``; columns grown past the commit; chunks
   holding no committed record). Opening to read takes no lock and repairs nothing.
5. **The token** (:class:`pytreestore._log.committer.Committer`). On backends with conditional writes (S3, GCS, local
   files and memory through TensorStore) a writer keeps the storage generation of the commit
   record it last read or wrote; ``commit_token`` reads it and refuses a record that has
   changed since.
6. **One write** (:class:`pytreestore._write.writer.Writer`), for any number of records:
   resize every column's record axis to the new length (metadata only; it only grows); write
   every column's chunks and wait for all of them (locally, each chunk is fsynced and renamed
   over the old one and the folders fsynced before the write returns:
   ``pytreestore/backends/_tensorstore/direct.py``); then the **conditional commit**
   (``Committer.advance``): the version record of the new commit is written only if no
   record of that version exists (:mod:`pytreestore._log.versions`), then the commit record
   only if it still has the token's generation. Otherwise another writer has committed and
   :class:`~pytreestore.errors.CommitConflictError` is raised with nothing committed: two
   writers can never both commit, lock or no lock. A crash before the commit leaves harmless
   bytes past it (and at most a version record past it), which step 4 removes.
7. **Evolve** (:mod:`pytreestore._log.evolve`) adds arrays (empty: they read their default)
   and replaces the root ``zarr.json`` in one atomic put (the schema kept in the version log
   first); its added columns start at the committed count, which step 4 checks; then it
   commits a version of the new schema. A ragged store's learning and ``truncate``
   (:mod:`pytreestore._log.prune`) also write their schema into the root before their
   commit record: readers read the schema the commit record names (the root's, or the one
   the version log keeps, :func:`pytreestore._open.root.committed_schema`), and step 4
   puts it back in the root (:func:`restore_root`), so a schema whose commit never came is
   never used.

Example:
    >>> from pytreestore._format.schema import ColumnSpec, TreeSchema
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import TensorStoreBackend
    >>> location = Location.parse("memory://doc-protocol")
    >>> engine = TensorStoreBackend(location)
    >>> schema = TreeSchema.from_example({"x": 0})
    >>> commit, lock = start_store(engine, location, schema, overwrite=False)
    >>> commit.records, commit.generation, engine.read_bytes(INCOMPLETE_KEY) is None
    (0, 0, True)
    >>> lock.release()
"""

from __future__ import annotations

import dataclasses
import errno
import json
import uuid
from collections.abc import Callable
from pathlib import Path

from pytreestore._format import validate as _validate
from pytreestore._format.keys import (
    COMMIT_KEY,
    INCOMPLETE_KEY,
    META_DIR,
    ROOT_KEY,
    schema_key,
)
from pytreestore._format.ragged import tables_entry
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log import metadata as consolidated
from pytreestore._log import placing, versions
from pytreestore._log.commit_record import Commit, now_utc
from pytreestore._log.evolve_tables import table_schemas
from pytreestore._log.locks import WriterLock
from pytreestore._log.metadata import column_layouts, group_document, group_paths, layouts
from pytreestore._log.repair import repair
from pytreestore.backends import Backend, LocalFiles, PartialWriteCleanup, capable
from pytreestore.errors import (
    CorruptStoreError,
    PyTreeStoreError,
    StorageError,
    StoreExistsError,
)

# ---- 1. clearing ---------------------------------------------------------------------------


def clear_for_create(engine: Backend, location: Location, overwrite: bool) -> None:
    """Empties ``location`` for a new store, if it holds a store and ``overwrite`` allows.

    Raises:
        StoreExistsError: something is there and ``overwrite`` is false, or it is not a store.
        StoreLockedError: a writer holds the store there.
    """
    if engine.is_empty():
        return
    is_store = (
        engine.read_bytes(ROOT_KEY) is not None
        or engine.read_bytes(COMMIT_KEY) is not None
        or engine.read_bytes(INCOMPLETE_KEY) is not None  # what a cut-off copy or create left
        or cut_off_create(engine)
    )
    if not overwrite:
        raise StoreExistsError(
            f"{location} already holds "
            + ("a store; pass overwrite=True to replace it" if is_store else "other data")
        )
    if not is_store:
        raise StoreExistsError(
            f"{location} holds data that is not a pytreestore store; refusing to delete it. "
            "Choose an empty or new location."
        )
    take_lock(location, engine).release()
    engine.delete_all()


def cut_off_create(engine: Backend) -> bool:
    """Whether a local location holds only what a create killed before its incomplete marker
    landed leaves: plain files inside ``.pytreestore/`` (its lock, a partial write of the
    marker), nothing else. It counts as a store being made, as a marker does."""
    root = engine.files_root if capable(engine, LocalFiles) else None
    if root is None:
        return False
    try:
        entries = list(Path(root).iterdir())
        inside = list(Path(root, META_DIR).iterdir()) if entries else []
        return [e.name for e in entries] == [META_DIR] and all(
            e.is_file() and not e.is_symlink() for e in inside
        )
    except OSError:  # not a folder, or gone meanwhile: not this case
        return False


# ---- 2. the initial commit -----------------------------------------------------------------


def start_store(
    engine: Backend,
    location: Location,
    schema: TreeSchema,
    *,
    overwrite: bool,
    finished: bool = True,
) -> tuple[Commit, WriterLock]:
    """Clears ``location`` (see :func:`clear_for_create`), takes the writer lock and writes an
    empty store of ``schema``; the first commit and the lock, which the caller then holds.

    With ``finished=False`` the incomplete marker stays, for the caller to remove with
    :func:`finish_store`. A failure after the lock is taken deletes what was written and
    gives the lock back.
    """
    clear_for_create(engine, location, overwrite)
    lock = take_lock(location, engine)
    try:
        commit = initial_commit(engine, schema)
        if finished:
            finish_store(engine)
    except BaseException:
        discard_new_store(engine, lock)
        raise
    return commit, lock


def discard_new_store(engine: Backend, lock: WriterLock) -> None:
    """Deletes a store that failed to be made, and gives back its lock."""
    try:
        engine.delete_all()  # a half-made store must not block the next create
    finally:
        lock.release()


def initial_commit(engine: Backend, schema: TreeSchema) -> Commit:
    """Writes an empty store of ``schema`` behind the incomplete marker; its first commit."""
    engine.write_bytes(INCOMPLETE_KEY, b"")
    engine.create_columns(layouts(schema))
    tables = schema.tables.first_tables()  # None: a fixed store's commits have no tables
    info = _validate.stamped(schema.to_json())  # checked against schema.json, with a digest
    store = uuid.uuid4().hex  # the store's identity, kept by every commit
    commit = Commit(0, 0, store, tables, info["digest"], now_utc(), "create")
    # behind the marker, in any order and all at once: the groups, the schema, the version
    # record (none can exist: the location was just cleared, and the lock is held) and the
    # commit record; the root, which makes the store readable, comes last
    files = {k: group_json({}) for k in group_keys(schema)}
    files.update(versions.schema_file(info))
    files.update(versions.record_file(commit))
    files[COMMIT_KEY] = commit.to_bytes()
    engine.write_many_bytes(files)
    root = group_document({"pytreestore": info})
    engine.write_bytes(ROOT_KEY, consolidated.with_consolidated(root, schema, commit))
    return commit


def finish_store(engine: Backend) -> None:
    """Removes the incomplete marker: the store is whole."""
    engine.delete_keys([INCOMPLETE_KEY])


def group_keys(schema: TreeSchema) -> list[str]:
    """The ``zarr.json`` keys of the groups between the root and ``schema``'s columns."""
    return [f"{path}/{ROOT_KEY}" for path in group_paths(schema)]


def group_json(attributes: dict[str, object]) -> bytes:
    """A zarr v3 group's ``zarr.json`` with ``attributes``."""
    return json.dumps(group_document(attributes), indent=1).encode()


def with_info(raw: bytes | None, info: dict[str, object]) -> bytes:
    """The root ``zarr.json`` ``raw`` with the schema ``info`` in place of the one it holds;
    every other member (the consolidated metadata) is kept."""
    document = _validate.root_document(raw)
    document.setdefault("attributes", {})["pytreestore"] = info
    return json.dumps(document, indent=1).encode()


def taken(engine: Backend, key: str) -> bool:
    """Whether an array already lives at storage key ``key`` (an interrupted evolve's)."""
    return engine.read_bytes(f"{key}/{ROOT_KEY}") is not None


# ---- 3. the lock handshake -----------------------------------------------------------------


def take_lock(location: Location, engine: Backend, *, break_lock: bool = False) -> WriterLock:
    """The writer lock; a file system that refuses it raises a pytreestore error, not a raw one."""
    try:
        return WriterLock.acquire(location, engine, break_lock=break_lock)
    except PyTreeStoreError:
        raise
    except (IsADirectoryError, NotADirectoryError, FileExistsError) as err:
        raise CorruptStoreError(
            f"cannot take the writer lock of {location}: {err}. {location}/.pytreestore must "
            "be a directory and .pytreestore/lock a file; remove whatever is in their place "
            "(they hold no records) and try again."
        ) from err
    except OSError as err:
        read_only = err.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        raise StorageError(
            f"cannot take the writer lock of {location}: {err}. "
            + (
                "The store's directory is not writable (a read-only file system or missing "
                "permissions); open it with mode='r' to read it."
                if read_only
                else "Check the file system and try again."
            )
        ) from err


# ---- 4. opening ----------------------------------------------------------------------------


def attach(
    engine: Backend,
    location: Location,
    schema_of: Callable[[Commit], TreeSchema],
    *,
    append: bool,
    break_lock: bool = False,
) -> tuple[Commit, TreeSchema, WriterLock | None]:
    """The commit record of an opened store and its schema (``schema_of`` the commit: the
    one it names), and with ``append`` its writer lock, taken before the record is read,
    with the store repaired for appending.

    Every failure closes ``engine`` and gives back the lock.
    """
    lock = take_lock(location, engine, break_lock=break_lock) if append else None
    try:
        commit, schema = read_head(engine, location, schema_of)
        if append:
            prepare_append(engine, location, schema, commit)
    except BaseException:
        detach(engine, lock)
        raise
    return commit, schema, lock


def prepare_append(engine: Backend, location: Location, schema: TreeSchema, commit: Commit) -> None:
    """Readies a store for its writer: moves back into their fragments the chunk rows of a
    commit of fragments that never came (:mod:`pytreestore._log.placing`), repairs what a
    crashed writer left past the commit (nothing while a truncate holds rows for older
    versions: no write touched them), drops a version record it left, and keeps the schema
    in the version log."""
    if isinstance(engine, PartialWriteCleanup):  # a write cut short must not be reused
        engine.remove_partial_writes([], 0)
    placing.settle(engine, str(location))  # fragments' chunk rows back, before repair
    versions.discard_orphan(engine, commit)
    restore_root(engine, location, commit)
    schema_id = _validate.id_of(schema)
    if engine.read_bytes(schema_key(schema_id)) is None:  # a store of an older pytreestore
        info = _validate.root_schema(engine.read_bytes(ROOT_KEY), str(location))
        versions.save_schema(engine, {**info, "digest": schema_id})
    if commit.schema is None:  # its head, committed before versions: the log's first
        versions.publish(engine, dataclasses.replace(commit, schema=schema_id))
    if commit.high is not None:  # rows past the commit are older versions': only locks go
        if isinstance(engine, PartialWriteCleanup):
            keys = [c.key for c in schema.storage_columns]
            engine.remove_partial_writes(keys, commit.records // schema.chunk_records)
    else:
        for table, sub in table_schemas(schema).items():
            repair(engine, location, sub, commit.rows(table))
    # a writer cut off after its commit record, or a store of an older pytreestore
    consolidated.write(engine, schema, commit)


def restore_root(engine: Backend, location: Location, commit: Commit) -> None:
    """Puts back in the root ``zarr.json`` the schema the commit record names, where a writer
    cut off between its root and its commit record (a truncate, an evolve, a ragged
    structure learnt) left one no commit names: the commit record is the truth."""
    raw = engine.read_bytes(ROOT_KEY)
    info = _validate.root_schema(raw, str(location))
    kept = versions.other_schema(engine, commit, _validate.schema_id(info))
    if kept is not None:
        engine.write_bytes(ROOT_KEY, with_info(raw, kept))


def detach(engine: Backend, lock: WriterLock | None) -> None:
    """Closes a store that failed to open, and gives back its lock if it took one."""
    try:
        engine.close()
    finally:
        if lock is not None:  # every failure after the lock was taken gives it back
            lock.release()


def read_head(
    engine: Backend, location: Location, schema_of: Callable[[Commit], TreeSchema]
) -> tuple[Commit, TreeSchema]:
    """The commit record of a store and its schema (``schema_of`` the commit: the one it
    names), checked against each other (:func:`check_commit`)."""
    commit = Commit.read(engine, str(location))
    schema = schema_of(commit)
    check_commit(schema, commit, location)
    return commit, schema


def check_commit(schema: TreeSchema, commit: Commit, location: Location) -> None:
    """Raises CorruptStoreError if ``commit`` and ``schema`` disagree: on the tables
    (:func:`check_tables`) or on where a column starts (:func:`check_starts`)."""
    check_tables(schema, commit, location)
    check_starts(schema, commit.records, location, commit.rows)


def check_tables(schema: TreeSchema, commit: Commit, location: Location) -> None:
    """Raises CorruptStoreError if the commit record and the schema disagree on whether the
    store is ragged (one of them edited or damaged: the other would be read wrongly)."""
    if not schema.tables.fits(commit.tables):
        axes = sorted(schema.tables.axis_paths() or ()) or "no ragged tables"
        listed = tables_entry(commit.tables).get("tables", "none")
        raise CorruptStoreError(
            f"{location}: the schema and the commit record disagree on the store's ragged "
            f"tables (the schema's axes: {axes}; the commit record's tables: {listed}); the "
            f"store's {ROOT_KEY} or {COMMIT_KEY} was edited or damaged outside pytreestore. "
            "Restore it from a backup"
        )


def check_starts(
    schema: TreeSchema,
    records: int,
    location: Location,
    rows: Callable[[str | None], int] | None = None,
) -> None:
    """Raises CorruptStoreError if a column added by evolve (or, in a ragged store, by a
    structure learnt) starts past the committed records, or past its table's committed rows
    (``rows``); the schema is read before the commit record, and columns start at a commit."""
    for column in schema.storage_columns:
        count = records if column.table is None or rows is None else rows(column.table)
        if column.start > count:
            unit = "record" if column.table is None else "row"
            raise CorruptStoreError(
                f"{location}/{ROOT_KEY}: column {column.path} starts at {unit} {column.start}, "
                f"but only {count} are committed; the schema was edited or damaged outside "
                f"pytreestore ({unit}s before 'start' would read its default)"
            )


__all__ = [
    "Commit",
    "attach",
    "check_commit",
    "check_starts",
    "check_tables",
    "clear_for_create",
    "column_layouts",
    "cut_off_create",
    "detach",
    "discard_new_store",
    "finish_store",
    "group_json",
    "group_keys",
    "initial_commit",
    "layouts",
    "prepare_append",
    "read_head",
    "restore_root",
    "start_store",
    "take_lock",
    "taken",
]
