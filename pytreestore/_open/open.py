"""Creating and opening stores: ``pytreestore.create``, ``pytreestore.open`` and
``pytreestore.evolve``.

Arguments are checked here, before anything is written; the steps that touch storage (clearing,
the initial commit, the writer lock, repair) are the commit protocol's,
:mod:`pytreestore._log.protocol`.

Example:
    >>> import pytreestore
    >>> pytreestore.create("memory://doc-open-module", {"x": 0}).close()
    >>> pytreestore.open("memory://doc-open-module").mode
    'r'
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

from pytreestore import _arguments
from pytreestore._format import compression as _compression
from pytreestore._format import compression as _packs
from pytreestore._format import validate as _validate
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import multihost as _multihost
from pytreestore._fragments.multihost import write_rows
from pytreestore._location import Location
from pytreestore._log import commit_record as snapshots
from pytreestore._log import protocol, versions
from pytreestore._log.model import GenericViewError, build_schema
from pytreestore._log.versions import KEEP_VERSIONS
from pytreestore._open.root import (
    committed_schema,
    deferred_reader,
    parse_schema,
    read_root,
    version_schema,
)
from pytreestore._open.schemas import inner_chunk_bytes as inner_chunk_bytes_of
from pytreestore._open.schemas import new_schema, packed_schema
from pytreestore._open.sharing import check_coordinated_options, open_coordinated
from pytreestore._read.request import check_cast
from pytreestore._spec import StoreSpec
from pytreestore._store import TreeStore
from pytreestore._write.records import new_writer
from pytreestore._write.writer import check_buffer
from pytreestore.backends import Backend, default_backend
from pytreestore.backends._packed import packed
from pytreestore.backends._registry import backend_at
from pytreestore.errors import ArgumentError, ArgumentTypeError

#: the record type of a store created from an example of it (``TreeStore[T]``)
T = TypeVar("T")

# ---- create --------------------------------------------------------------------------------


def create(
    path: str | os.PathLike[str],
    like: T,
    *,
    chunk_records: int | None = None,
    codec: str | None = "zstd",
    backend: str = "tensorstore",
    overwrite: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    cast: bool = False,
    ragged: bool | Sequence[str] | None = None,
    optional: Sequence[str] | None = None,
    keep_versions: int | None = KEEP_VERSIONS,
    multihost: bool = False,
    pack: bool | int = False,
    inner_chunk_bytes: int | str | None = "auto",
) -> TreeStore[T]:
    """Creates an empty store for records shaped like ``like`` and opens it for appending.

    Args:
        path: a directory (or ``file://`` URL), ``memory://NAME``, ``s3://`` or ``gs://``.
        like: an example record; its structure, static fields, leaf dtypes and shapes become
            the schema. Its values are not stored.
        chunk_records: records per chunk; by default chosen so chunks hold about 4 MiB.
        codec: the compression of every column: ``"zstd"`` (default), ``"blosc"``,
            ``"gzip"``, or None for uncompressed (docs/format.md#codecs).
        backend: the storage engine: ``"tensorstore"`` (default), ``"zarr"`` (zarr-python;
            local directories, ``memory://`` and ``s3://``), or a name registered with
            :func:`pytreestore.backends.register_backend`. Either reads what the other wrote.
        overwrite: replace an existing store at ``path``.
        storage_options: for ``s3://`` and ``gs://`` stores: endpoint, region, credentials,
            retries; each key is listed in docs/reliability.md,
            [S3 and GCS](reliability.md#s3-and-gcs).
        cast: the store's dtype policy for device reads: True loads 64-bit columns as 32 bits
            while x64 is disabled (values that do not fit raise), in ``store[...]``,
            iteration, :meth:`~TreeStore.records`, :meth:`~TreeStore.load`,
            :meth:`~TreeStore.batches` and :meth:`~TreeStore.map`; each read's own
            ``cast=`` overrides it.
        ragged: where records may vary in length (docs/ragged.md): True (every list, and
            the leading axis of every array leaf) or keypaths (``".p"``,
            ``".regions[*].events"``; a node that is not a list: its array leaves share one
            ragged leading axis). A list empty in ``like`` takes its element structure from
            the first record that has one. None, False or an empty list: a fixed store.
        optional: keypaths of subtrees that may be None (None in ``like``: the structure
            comes from the first record that has one); None or an empty list: none.
        keep_versions: the versions the log keeps besides tagged ones (the last this many;
            None: all); every commit is a version (:meth:`~TreeStore.versions`).
        multihost: under ``jax.distributed``, called on every process with the same
            arguments: process 0 creates the store and holds its writer lock, the others
            attach to it without one, and :meth:`~TreeStore.extend_batch` then takes global
            batches, called on every process (docs/scaling.md, "Multi-host JAX"). The store
            must live where every process reaches it. With ``ragged=`` or ``optional=``,
            ``extend_batch(batch, mask=mask)`` takes the global padded batch and its mask.
        pack: store small leaves side by side in shared arrays (docs/scaling.md#wide-trees):
            True packs every leaf of at most 4096 bytes per record, an int N those of at
            most N bytes; leaves of one dtype share a pack array ``_pack_<dtype>_<n>`` at
            the store root. A wide tree of small leaves then writes and opens many times
            faster and makes few files, but zarr readers see the packs, not one array per
            leaf (``pytreestore.copy(..., pack=False)`` unpacks). Default False: one array
            per leaf. With ``ragged=`` or ``optional=``, each table's leaves are packed
            within their table (a ragged axis's leaves in packs of its elements); a structure
            learnt later gets arrays of its own.
        inner_chunk_bytes: the decoded bytes of an inner chunk: each chunk of a column is a
            zarr v3 shard of inner chunks of at most this many bytes (a power of two of
            records), each compressed on its own, so that reading one record decodes an
            inner chunk per column instead of a whole chunk (docs/concepts.md, "What
            reading one record costs"). ``"auto"`` (the default): 8 KiB for a compressed
            store, plain chunks for an uncompressed one; None or 0: plain chunks (a full
            load of a local store is then about 1.3-2x faster, a single record or a
            scattered gather several times slower: docs/benchmarks.md, "Direct reads").

    Raises:
        ArgumentError: an unknown ``codec`` (the message lists the choices).
        UnsupportedTreeError: ``like`` holds a node or leaf a store cannot represent.
        SchemaMismatchError: a leaf whose storage key a pack array would use.
        StoreExistsError: a store (or other data) is at ``path`` and ``overwrite`` is false.
        ReadOnlyError: ``path`` is an ``http(s)://`` URL (web servers take no writes).

    Example:
        >>> import pytreestore
        >>> store = pytreestore.create("memory://doc-create", {"x": 0.0}, overwrite=True)
        >>> [c.path for c in store.schema.columns]
        ["['x']"]
    """
    check_cast(cast)
    _arguments.backend_name(backend)
    overwrite = _arguments.flag(overwrite, "overwrite")
    multihost = _arguments.flag(multihost, "multihost")
    keep_versions = _check_version_options("a", None, keep_versions)[1]
    location = Location.parse(path, storage_options)
    ragged, optional = _declared(ragged), _declared(optional)
    limit = _packs.check_threshold(pack)
    codec = _compression.named(codec).name
    inner = inner_chunk_bytes_of(inner_chunk_bytes, codec)
    if multihost:
        options = {"backend": backend, "storage_options": storage_options, "cast": cast}
        return _multihost.open_everywhere(
            lambda: create(
                path,
                like,
                chunk_records=chunk_records,
                codec=codec,
                overwrite=overwrite,
                keep_versions=keep_versions,
                pack=pack,
                ragged=ragged,
                optional=optional,
                inner_chunk_bytes=inner_chunk_bytes,
                **options,
            ),
            lambda: open(path, like=like, **options),
            str(location),
            location,
            write_rows,
        )
    if ragged is None and optional is None:
        schema = new_schema(like, chunk_records=chunk_records, codec=codec)
        if limit is not None:
            schema = packed_schema(schema, limit, chunk_records)
    else:
        schema = build_schema(like, ragged, optional, chunk_records=chunk_records, codec=codec)
        if limit is not None:  # each table's leaves packed, in the table's chunking
            schema = packed_schema(schema, limit, schema.chunk_records)
    schema = dataclasses.replace(schema, inner_chunk_bytes=inner)
    return create_from_schema(
        location, schema, backend=backend, overwrite=overwrite, cast=cast, keep=keep_versions
    )


def create_from_schema(
    location: Location,
    schema: TreeSchema,
    *,
    backend: str,
    overwrite: bool,
    cast: bool = False,
    fill: Callable[[Any], None] | None = None,
    keep: int | None = KEEP_VERSIONS,
) -> TreeStore:
    """Creates an empty store with a ready-made ``schema`` (``create`` and ``copy`` share it).

    Everything that can be checked is checked before anything is written; a failure after
    the writer lock is taken deletes what was made and releases the lock. With ``fill``
    (``copy``), ``fill(writer)`` writes the new store's records while it holds its
    incomplete marker (:func:`pytreestore._log.protocol.finish_store` removes it once they
    are committed), and the store comes back closed.
    """
    location.check_writable("create a store")
    check_buffer(schema, str(location))
    engine = _engine(backend, location, schema)
    commit, lock = protocol.start_store(
        engine, location, schema, overwrite=overwrite, finished=fill is None
    )
    schema = dataclasses.replace(schema, digest=commit.schema)  # commits name the root's
    spec = StoreSpec.of(location, backend, cast=cast, opener=open, creator=create)
    try:
        writer = new_writer(engine, schema, commit, keep)
        store = TreeStore(
            location=location,
            backend=engine,
            schema=schema,
            commit=commit,
            lock=lock,
            spec=spec,
            writer=writer,
        )
    except BaseException:
        protocol.discard_new_store(engine, lock)
        raise
    if fill is not None:
        with store:
            fill(writer)
            store.flush()
            protocol.finish_store(engine)
    return store


# ---- open ----------------------------------------------------------------------------------


def open(
    path: str | os.PathLike[str],
    mode: Literal["r", "a"] = "r",
    *,
    like: Any = None,
    generic: bool = False,
    backend: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    break_lock: bool = False,
    cache_bytes: int | None = None,
    cast: bool = False,
    version: int | str | None = None,
    keep_versions: int | None = KEEP_VERSIONS,
    multihost: bool = False,
    coordinator: str | None = None,
) -> TreeStore[Any]:
    """Opens an existing store, at its latest version or (``version=``) at an older one.

    Args:
        path: a directory (or ``file://`` URL), ``memory://NAME``, ``s3://``, ``gs://``, ``http(s)://``.
        mode: ``"r"`` to read, ``"a"`` to append (takes the store's writer lock).
        like: an example record whose classes to use instead of importing the classes the
            schema names (for classes defined in ``__main__`` or since moved).
        generic: return dicts, lists and tuples instead of the stored classes, without
            importing them (with mode "a": the store can :meth:`~TreeStore.evolve`, not append).
        backend: the storage engine: ``"tensorstore"``, ``"ocdbt"``, ``"zarr"``, or a name
            registered with :func:`pytreestore.backends.register_backend`. By default
            ``"ocdbt"`` for a store in an OCDBT database (its ``manifest.ocdbt`` at the
            root), else ``"tensorstore"``.
        storage_options: for ``s3://`` and ``gs://`` stores: endpoint, region, credentials,
            retries, each listed in [S3 and GCS](reliability.md#s3-and-gcs); for
            ``http(s)://`` stores: headers, retries, timeouts ([web servers](interop.md)).
        break_lock: S3 and GCS, ``mode="a"`` only: take the writer lock over even from a
            holder that may be alive (a writer on a host that crashed). A holder on this host
            that has died is detected and replaced without it.
        cache_bytes: decoded chunks kept in memory for this store alone, at most this many
            bytes (least recently used out first), so that reads touching the same chunks
            again skip the disk and the decoder; ``0``: no cache. Default None: the cache all
            stores of the process share, of ``PYTREESTORE_CACHE_BYTES`` bytes (256 MiB
            unless set; ``0`` turns it off). A chunk is kept with the rows the read saw, and
            committed rows never change while the store is open (see docs/concepts.md).
        cast: the store's dtype policy for device reads (see :func:`create`): True loads
            64-bit columns as 32 bits while x64 is disabled, in every read that does not pass
            its own ``cast=``.
        version: mode "r" only: read the store as it was at this version (a number from
            :meth:`~TreeStore.versions`) or tag (:meth:`~TreeStore.tag`), with that
            version's records and schema, whatever is committed later.
        keep_versions: mode "a": the versions the log keeps besides tagged ones (the last
            this many; None: all). Older version records are deleted as commits go by.
        multihost: mode "a", under ``jax.distributed``, called on every process: process 0
            opens the store for appending (the writer lock), the others attach without it,
            and :meth:`~TreeStore.extend_batch` takes global batches, called on every process
            (see :func:`create`).
        coordinator: mode "a" on a local OCDBT store (``backend="ocdbt"``): the address
            ``"HOST:PORT"`` of an OCDBT coordinator (:func:`pytreestore.backends.ocdbt_coordinator`
            starts one). Any number of processes may then write to the store at once, each
            commit placed after the records committed before it (docs/scaling.md). Without
            it a second writer gets :class:`StoreLockedError`.

    A reader (``mode="r"``) reads two objects whatever the store's width, the root
    ``zarr.json`` and the commit record, and parses its schema on first use (the first read,
    ``store.schema``, ``repr``): errors marked *on first use* below are raised there. A
    writer, and a reader of an older ``version=``, parse it at once.

    Raises:
        StoreNotFoundError: nothing is at ``path``.
        NotAStoreError: ``path`` holds something that is not a store, or its root metadata
            is not JSON (on first use where the document starts as pytreestore writes it).
        FormatVersionError: the store's format is newer than this pytreestore.
        CorruptStoreError: the commit record is damaged; on first use, the root metadata
            breaks the format's JSON Schema (``pytreestore/schema.json``) or disagrees with
            the commit record; when a column is first read, its array disagrees with the
            schema.
        ClassResolutionError: on first use, a class the schema names cannot be imported.
        SchemaMismatchError: on first use, ``like`` does not have the stored structure.
        StoreLockedError: ``mode="a"`` and another writer holds the store.
        ReadOnlyError: ``mode="a"`` at an ``http(s)://`` URL (web servers take no writes).
        VersionNotFoundError: ``version`` names no version the store keeps, or one whose
            records were written over after a truncate.

    Example:
        >>> import pytreestore
        >>> pytreestore.create("memory://doc-open", {"x": 0}).close()
        >>> pytreestore.open("memory://doc-open")
        TreeStore('memory://doc-open', mode='r', records=0, columns=1, nbytes=0 B)
    """
    cache_bytes = _check_open_options(
        mode, backend, break_lock=break_lock, cache_bytes=cache_bytes, cast=cast
    )
    version, keep_versions = _check_version_options(mode, version, keep_versions)
    generic = _arguments.flag(generic, "generic")
    multihost = _arguments.flag(multihost, "multihost")
    location = Location.parse(path, storage_options)
    if mode == "a":
        location.check_writable("open a store for appending (mode='a')")
    if multihost and coordinator is not None:
        raise ArgumentError(
            "multihost=True and coordinator= are two ways of writing from many processes; "
            "pass one of them (docs/scaling.md)"
        )
    if multihost:
        if mode != "a":
            raise ArgumentError(
                "multihost=True opens a store for appending from every process; open it with "
                "mode='a' (readers need no multihost=True)"
            )
        options = {"like": like, "generic": generic, "backend": backend, "cast": cast}
        options.update(storage_options=storage_options, cache_bytes=cache_bytes)
        return _multihost.open_everywhere(
            lambda: open(path, "a", break_lock=break_lock, keep_versions=keep_versions, **options),
            lambda: open(path, **options),
            str(location),
            location,
            write_rows,
        )
    if coordinator is not None:
        address = check_coordinated_options(
            mode, backend, coordinator, generic=generic, version=version, break_lock=break_lock
        )
        options = {"like": like, "cache_bytes": cache_bytes, "cast": cast, "keep": keep_versions}
        return open_coordinated(location, address, opener=open, creator=create, **options)
    backend = default_backend(location) if backend is None else backend
    engine = backend_at(backend, location)
    raw = read_root(engine, location)
    options = {"like": like, "generic": generic, "cache_bytes": cache_bytes, "cast": cast}
    if mode == "r" and version is None and _validate.deferrable(raw, str(location)):
        spec = StoreSpec.of(location, backend, opener=open, creator=create, **options)
        return deferred_reader(engine, location, raw, spec)
    root = parse_schema(raw, location, like=like, generic=generic)
    engine.open_columns(root.storage_columns)
    engine = packed(engine, root.packs, (*root.columns, *root.dropped))  # packs never change
    commit, schema, lock = protocol.attach(
        engine,
        location,
        lambda c: committed_schema(engine, location, root, c, like=like, generic=generic),
        append=mode == "a",
        break_lock=break_lock,
    )
    try:
        if version is not None:
            commit = versions.resolve(engine, commit, version, str(location))
            engine = snapshots.pinned(engine, commit)
            schema = version_schema(engine, location, schema, commit, like=like, generic=generic)
        pinned = None if version is None else commit.generation
        spec = StoreSpec.of(
            location, backend, opener=open, creator=create, version=pinned, **options
        )
        return TreeStore(
            location=location,
            backend=engine,
            schema=schema,
            commit=commit,
            lock=lock,
            spec=spec,
            writer=new_writer(engine, schema, commit, keep_versions) if mode == "a" else None,
        )
    except BaseException:
        protocol.detach(engine, lock)
        raise


def _engine(backend: str, location: Location, schema: TreeSchema) -> Backend:
    """The backend of a new store of ``schema``: its packed columns live in the packs."""
    return packed(backend_at(backend, location), schema.packs, schema.columns)


def _declared(value: Any) -> Any:
    """``ragged=`` or ``optional=`` with "nothing declared" (False, an empty list) as None:
    such a store is a fixed one, whose loads return a batch, not ``(batch, mask)``."""
    return None if value is False or (isinstance(value, list | tuple) and not value) else value


def _check_version_options(mode: str, version: Any, keep: Any) -> tuple[Any, int | None]:
    """``version`` and ``keep_versions``, checked; integers as Python ints."""
    if version is not None:
        if mode != "r":
            raise ArgumentError(
                "version= opens a store as it was, read-only; open it with mode='r' (to append "
                "after an older version, truncate() the store instead)"
            )
        version = versions.check_wanted(version)
    rule = "keep_versions must be None (keep all) or an int >= 1"
    return version, _arguments.optional_count(keep, rule, minimum=1)


def open_any(path: str | os.PathLike[str], **options: Any) -> TreeStore:
    """A reader of any store without its classes where it can: the generic view, or for a
    ragged store (which has none yet) its classes (the CLI and ``copy`` use it)."""
    try:
        store = open(path, generic=True, **options)
        store.schema  # noqa: B018 (a reader parses its schema on first use)
        return store
    except GenericViewError:
        return open(path, **options)


def _check_open_options(
    mode: str, backend: str | None, *, break_lock: bool, cache_bytes: Any, cast: Any
) -> int | None:
    """Refuses options that are not valid or do not go together; ``cache_bytes`` as an int."""
    if not isinstance(mode, str) or mode not in ("r", "a"):
        error = ArgumentError if isinstance(mode, str) else ArgumentTypeError
        advice = (
            "; to write a new store (or replace one), use pytreestore.create(path, like, "
            "overwrite=True)"
            if mode in ("w", "w+", "w-", "x")
            else ""
        )
        raise error(f"mode must be 'r' (read) or 'a' (append), got {mode!r:.80}{advice}")
    check_cast(cast)
    _arguments.backend_name(backend)
    _arguments.flag(break_lock, "break_lock")
    if break_lock and mode != "a":
        raise ArgumentError("break_lock=True takes the writer lock; open with mode='a'")
    rule = "cache_bytes must be None (the shared cache) or an int >= 0 (bytes)"
    return _arguments.optional_count(cache_bytes, rule)


# ---- evolve by path ------------------------------------------------------------------------


__all__ = [
    "create",
    "create_from_schema",
    "open",
    "open_any",
]
