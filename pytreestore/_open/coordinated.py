"""Opening a store for a writer that shares it through an OCDBT coordinator:
``pytreestore.open(path, mode="a", backend="ocdbt", coordinator="HOST:PORT")``.

The arguments are checked before anything is touched; the writer is a
:class:`~pytreestore._commit.records.RecordWriter` whose tables are buffered in memory and
committed in turn (:func:`shared_writer`) over a
:class:`~pytreestore.backends._tensorstore.coordinated.CoordinatedOcdbtBackend`.

Example:
    >>> check_coordinated_options("r", "ocdbt", "127.0.0.1:1", generic=False, version=None, break_lock=False)
    Traceback (most recent call last):
    ...
    pytreestore.errors.ArgumentError: coordinator= is for writers (mode='a'); a reader of an OCDBT store needs no coordinator: open it without coordinator=
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytreestore._commit import versions
from pytreestore._commit.coordinated import CoordinatedCommits, attach_coordinated
from pytreestore._commit.model import load_schema
from pytreestore._commit.protocol import detach
from pytreestore._commit.record import Commit
from pytreestore._commit.records import RecordWriter
from pytreestore._format.names import ROOT_KEY
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._open.reader import committed_schema
from pytreestore._runtime import RUNTIME
from pytreestore._spec import StoreSpec
from pytreestore._store import TreeStore
from pytreestore.backends import Backend
from pytreestore.backends._tensorstore.coordinated import CoordinatedOcdbtBackend, check_address
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
    ``address`` (see :mod:`pytreestore._commit.coordinated`).

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
    committed meanwhile (:class:`~pytreestore._commit.coordinated.CoordinatedCommits`; a
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


__all__ = [
    "check_coordinated_options",
    "open_coordinated",
    "shared_writer",
]
