"""Opening a store for writers that share it: a writer through an OCDBT coordinator, and ``write_fragment``.

Opening a store for a writer that shares it through an OCDBT coordinator:
``pytreestore.open(path, mode="a", backend="ocdbt", coordinator="HOST:PORT")``.

The arguments are checked before anything is touched; the writer is a
:class:`~pytreestore._write.records.RecordWriter` whose tables are buffered in memory and
committed in turn (:func:`shared_writer`) over a
:class:`~pytreestore.backends._tensorstore.database.CoordinatedOcdbtBackend`.

Example:
    >>> check_coordinated_options("r", "ocdbt", "127.0.0.1:1", generic=False, version=None, break_lock=False)
    Traceback (most recent call last):
    ...
    pytreestore.errors.ArgumentError: coordinator= is for writers (mode='a'); a reader of an OCDBT store needs no coordinator: open it without coordinator=

``pytreestore.write_fragment``: opens the store's storage and writes records under it as
a fragment (:mod:`pytreestore._fragments.write`), for its writer to commit with
``store.commit_fragments`` (:mod:`pytreestore._fragments.commit`).

Example:
    >>> import numpy as np, pytreestore
    >>> pytreestore.create("memory://doc-write-fragment", {"x": np.float32(0)}).close()
    >>> f = write_fragment("memory://doc-write-fragment", [{"x": 1.5}, {"x": 2.5}])
    >>> f.records, len(pytreestore.open("memory://doc-write-fragment"))
    (2, 0)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from pytreestore._format.keys import ROOT_KEY
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments.fragment import Fragment
from pytreestore._fragments.write import write
from pytreestore._location import Location
from pytreestore._log import versions
from pytreestore._log.commit_record import Commit
from pytreestore._log.model import load_schema
from pytreestore._log.protocol import detach
from pytreestore._open.root import committed_schema, read_schema
from pytreestore._runtime import RUNTIME
from pytreestore._spec import StoreSpec
from pytreestore._store import TreeStore
from pytreestore._write.coordinated import CoordinatedCommits, attach_coordinated
from pytreestore._write.records import RecordWriter
from pytreestore.backends import Backend, default_backend
from pytreestore.backends._registry import backend_at
from pytreestore.backends._tensorstore.database import CoordinatedOcdbtBackend, check_address
from pytreestore.errors import ArgumentError, NotAStoreError, StoreNotFoundError


def check_coordinated_options(
    mode: str,
    backend: str | None,
    coordinator: object,
    *,
    generic: bool,
    version: object,
    break_lock: bool,
) -> str:
    """The coordinator's address, after refusing what a shared writer cannot be.

    Raises:
        ArgumentError: not mode ``"a"``, another backend than ``"ocdbt"``, a version, a generic
            view, ``break_lock``, or an address that is not ``"HOST:PORT"``.
    """
    if mode != "a":
        raise ArgumentError(
            "coordinator= is for writers (mode='a'); a reader of an OCDBT store needs no "
            "coordinator: open it without coordinator="
        )
    if backend not in (None, "ocdbt"):
        raise ArgumentError(
            f"coordinator= shares a store of the OCDBT backend; pass backend='ocdbt', not "
            f"{backend!r} (a store of another backend has one writer at a time)"
        )
    for name, given in (("version", version), ("generic", generic), ("break_lock", break_lock)):
        if given:
            raise ArgumentError(
                f"{name}= cannot be used with coordinator=: a shared writer appends to the "
                "latest version, with the stored classes, and takes no exclusive lock"
            )
    return check_address(coordinator)


def open_coordinated(
    location: Location,
    address: str,
    *,
    like: Any,
    cache_bytes: int | None,
    cast: bool,
    keep: int | None = versions.KEEP_VERSIONS,
    opener: Callable[..., TreeStore],
    creator: Callable[..., TreeStore],
) -> TreeStore:
    """A :class:`TreeStore` whose writer shares the store through the coordinator at
    ``address`` (see :mod:`pytreestore._write.coordinated`).

    Raises:
        StoreNotFoundError: nothing is at ``location``.
        StoreLockedError: a writer without a coordinator holds the store.
        StorageError: the coordinator cannot be reached (at the first commit).
    """
    engine = CoordinatedOcdbtBackend(location, address)
    raw = engine.read_bytes(ROOT_KEY)
    if raw is None:
        engine.close()
        if engine.is_empty():
            raise StoreNotFoundError(f"no store at {location}")
        raise NotAStoreError(
            f"{location} holds no OCDBT store ({ROOT_KEY} is missing in its database); "
            "create one with pytreestore.create(path, like, backend='ocdbt') first"
        )
    root = load_schema(raw, str(location), like=like, generic=False)
    engine.open_columns(root.storage_columns)
    commit, schema, lock = attach_coordinated(
        engine,
        location,
        lambda c: committed_schema(engine, location, root, c, like=like, generic=False),
    )
    try:
        options = {"like": like, "generic": False, "cache_bytes": cache_bytes, "cast": cast}
        spec = StoreSpec.of(location, "ocdbt", opener=opener, creator=creator, **options)
        writer = shared_writer(engine, schema, commit, where=str(location), keep=keep, via=address)
        return TreeStore(
            location=location,
            backend=engine,
            schema=schema,
            commit=commit,
            lock=lock,
            spec=spec,
            writer=writer,
        )
    except BaseException:
        detach(engine, lock)
        raise


def shared_writer(
    backend: Backend,
    schema: TreeSchema,
    commit: Commit,
    *,
    where: str,
    keep: int | None = versions.KEEP_VERSIONS,
    wait: float = RUNTIME.waits.claim_wait_s,
    via: str = "",
) -> RecordWriter:
    """A writer that shares its store with others: each table's rows buffered in memory,
    every table committed together in turn, the offsets rebased onto the rows others
    committed meanwhile (:class:`~pytreestore._write.coordinated.CoordinatedCommits`; a
    fixed store: its one table).

    ``append``, ``extend`` and ``extend_batch`` buffer; a call that leaves a chunk's worth of
    records (``chunk_records``) or more buffered commits them all, and so does ``flush``.
    Each call's records are committed together (they are buffered whole, in memory); a
    call whose commit fails keeps none of them (append them again), unless the error says
    that the commit's outcome could not be read back (then they stay buffered, and the next
    commit writes them only if they did not land). A record showing a structure the store
    has not learnt (``schema.pending``) is refused: learning it changes the schema, which
    needs the store's only writer. ``where`` names the store in errors, ``via`` the
    coordinator's address.
    """
    commits = CoordinatedCommits(
        backend, schema, commit, where=where, keep=keep, wait=wait, via=via
    )
    return RecordWriter(backend, schema, commit, commits)


def write_fragment(
    path: str | os.PathLike[str],
    records_or_batch: Any,
    *,
    mask: Any = None,
    backend: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    like: Any = None,
) -> Fragment:
    """Writes records under the store at ``path`` without committing them; any process may,
    without the writer lock, while the store's writer appends.

    Readers never see a fragment; the store's writer appends it with
    :meth:`~pytreestore.TreeStore.commit_fragments`, in one commit with others. The returned
    :class:`Fragment` is small (no data), pickles, and travels as text with
    :meth:`Fragment.to_json` / :meth:`Fragment.from_json`.

    Args:
        path: the store (a local directory, ``memory://NAME``, ``s3://...``).
        records_or_batch: an iterable of records, or one batch: the schema's structure with
            leaves carrying a leading record axis (told apart by the schema's treedef). In
            a ragged or optional store, records, or the padded batch whose ``mask`` is given.
        mask: a ragged or optional store's padded batch's mask, as in
            :meth:`~pytreestore.TreeStore.extend_batch` (``write_fragment(path, batch,
            mask=mask)`` with the pair ``store.load()`` returns); None for records.
        backend: the storage engine, as in :func:`pytreestore.open` (by default the one
            the store was made with: ``"ocdbt"`` for an OCDBT database, else TensorStore).
        storage_options: for ``s3://`` and ``gs://`` stores, as in :func:`pytreestore.open`.
        like: an example record whose classes to use, as in :func:`pytreestore.open`.

    Returns:
        The fragment's description. A fragment of a multiple of ``chunk_records`` records
        (``store.schema.chunk_records``) commits without copying data after a store and
        fragments of such lengths.

    Raises:
        SchemaMismatchError: a record or the batch does not match the store's schema (the
            same checks and casts as :meth:`~pytreestore.TreeStore.extend` and
            ``extend_batch``); ``mask`` given for a store of one fixed structure. Nothing is
            written.
        StoreNotFoundError: no store at ``path``.

    A ragged or optional store's fragment holds the rows of every table (element arrays,
    offsets, presence). Records showing a structure the store has not learnt yet (an
    element of a list empty so far, a subtree None so far) are taken: the commit teaches
    the store that structure (docs/ragged.md).

    Example:
        >>> import numpy as np, pytreestore
        >>> pytreestore.create("memory://doc-write-fragment-fn", {"x": np.int8(0)}).close()
        >>> f = pytreestore.write_fragment("memory://doc-write-fragment-fn", {"x": np.arange(4)})
        >>> pytreestore.Fragment.from_json(f.to_json()).records
        4
    """
    location = Location.parse(path, storage_options)
    location.check_writable("write a fragment of a store")
    engine: Backend = backend_at(
        default_backend(location) if backend is None else backend, location
    )
    try:
        schema = read_schema(engine, location, like=like, generic=False)
        head = Commit.read(engine, str(location))
        return write(engine, schema, head, records_or_batch, mask, str(location))
    finally:
        engine.close()


__all__ = [
    "Fragment",
    "check_coordinated_options",
    "open_coordinated",
    "shared_writer",
    "write_fragment",
]
