"""A store's schema as a reader finds it: the root ``zarr.json`` read, parsed and checked;
a reader whose schema waits for its first use (:class:`~pytreestore._spec.Deferred`);
the schema of an older version.

Example:
    >>> import pytreestore
    >>> from pytreestore._location import Location
    >>> pytreestore.create("memory://doc-reader", {"x": 0}).close()
    >>> engine = pytreestore.backends.get_backend("tensorstore")(Location.parse("memory://doc-reader"))
    >>> parse_schema(read_root(engine, Location.parse("memory://doc-reader")),
    ...              Location.parse("memory://doc-reader"), like=None, generic=False).paths
    ("['x']",)
"""

from __future__ import annotations

from typing import Any

from pytreestore._format.keys import ROOT_KEY
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log import protocol, versions
from pytreestore._log.commit_record import Commit
from pytreestore._log.model import load_schema
from pytreestore._spec import Deferred, StoreSpec
from pytreestore._store import TreeStore
from pytreestore.backends import Backend, OcdbtDatabase, is_ocdbt
from pytreestore.backends._packed import packed
from pytreestore.backends._registry import ReadOnly
from pytreestore.errors import NotAStoreError, StoreNotFoundError


def deferred_reader(engine: Backend, location: Location, raw: bytes, spec: StoreSpec) -> TreeStore:
    """A reader of the store behind ``engine`` whose root ``zarr.json`` is ``raw``: the
    commit record is read now, the schema parsed and checked on first use (``_deferred``)."""
    try:
        commit = Commit.read(engine, str(location))
    except BaseException:
        engine.close()
        raise

    def make() -> tuple[TreeSchema, Backend]:
        root = parse_schema(raw, location, like=spec.like, generic=spec.generic)
        options = {"like": spec.like, "generic": spec.generic}
        schema = committed_schema(engine, location, root, commit, **options)
        protocol.check_commit(schema, commit, location)
        engine.open_columns(schema.storage_columns)
        return schema, packed(engine, schema.packs, (*schema.columns, *schema.dropped))

    return TreeStore(
        location=location,
        backend=engine,
        schema=Deferred(make),
        commit=commit,
        lock=None,
        spec=spec,
        writer=None,
    )


def committed_schema(
    engine: Backend,
    location: Location,
    root: TreeSchema,
    commit: Commit,
    *,
    like: Any,
    generic: bool,
) -> TreeSchema:
    """The schema the latest ``commit`` names: ``root`` (the root ``zarr.json``'s), unless it
    is another the version log keeps.

    The commit record is the one object readers trust, and a truncate, an evolve or a ragged
    store's learning writes the root before it: a reader between the two, or after a writer
    was cut off there, reads with the schema the commit record names."""
    info = versions.other_schema(engine, commit, root.digest)
    if info is None:
        return root
    return _kept_schema(engine, location, info, commit, like=like, generic=generic)


def version_schema(
    engine: Backend,
    location: Location,
    latest: TreeSchema,
    commit: Any,
    *,
    like: Any,
    generic: bool,
) -> TreeSchema:
    """The schema of an older version: the latest one if it is the same, else the one the
    version log kept."""
    if commit.schema is None or commit.schema == latest.digest:
        return latest
    info = versions.schema_info(engine, commit.schema, str(location))
    return _kept_schema(engine, location, info, commit, like=like, generic=generic)


def _kept_schema(
    engine: Backend, location: Location, info: dict[str, Any], commit: Any, **options: Any
) -> TreeSchema:
    """The schema document ``info`` of the log, checked against ``commit``; the backend told
    of its columns."""
    raw = protocol.group_json({"pytreestore": info})
    schema = load_schema(raw, str(location), **options)
    engine.open_columns(schema.storage_columns)
    protocol.check_starts(schema, commit.records, location, commit.rows)
    return schema


def read_schema(engine: Backend, location: Location, *, like: Any, generic: bool) -> TreeSchema:
    """The schema in the root ``zarr.json`` of the store behind ``engine``."""
    return parse_schema(read_root(engine, location), location, like=like, generic=generic)


def parse_schema(raw: bytes, location: Location, *, like: Any, generic: bool) -> TreeSchema:
    """The schema in ``raw``, the root ``zarr.json`` of the store at ``location``."""
    return load_schema(raw, str(location), like=like, generic=generic)


def read_root(engine: Backend, location: Location) -> bytes:
    """The root ``zarr.json`` of the store behind ``engine``.

    Raises:
        StoreNotFoundError: nothing is there.
        NotAStoreError: something else is (an OCDBT store this backend cannot read included).
    """
    raw = engine.read_bytes(ROOT_KEY)
    if raw is None:
        reader = engine.inner if isinstance(engine, ReadOnly) else engine  # over HTTP
        if not isinstance(reader, OcdbtDatabase) and is_ocdbt(location):
            raise NotAStoreError(
                f"{location} is a store in an OCDBT database, which this backend "
                f"({type(reader).__name__}) cannot read: open it with backend='ocdbt' (or "
                "without backend=). zarr-python cannot read OCDBT; for a plain zarr copy run "
                f"pytreestore.copy({str(location)!r}, DEST, backend='tensorstore') (or "
                "`pytreestore copy SRC DEST --backend tensorstore`)"
            )
        if engine.is_empty():
            raise StoreNotFoundError(f"no store at {location}")
        raise NotAStoreError(f"{location} is not a pytreestore store: {ROOT_KEY} is missing")
    return raw


__all__ = [
    "committed_schema",
    "deferred_reader",
    "parse_schema",
    "read_root",
    "read_schema",
    "version_schema",
]
