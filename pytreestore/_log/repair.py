"""Making a store ready for appending when it is opened with ``mode="a"``.

A writer that crashed may have left, past the commit: partial writes (``.__lock`` files),
columns grown past the committed count, and chunks that hold no committed record (possibly
damaged: TensorStore reads such a chunk before rewriting part of it, so a damaged one would
block every later append). All of these are removed. The tail chunk, which holds the last
committed records and which the writer will rewrite with them, must read back whole: if it is
missing or damaged, opening for append is refused, because appending would write zeros (or
nothing) over committed records.

Example:
    >>> import numpy as np, pytreestore
    >>> with pytreestore.create("memory://doc-repair", {"x": np.int32(0)}, chunk_records=2) as s:
    ...     s.extend({"x": np.int32(i)} for i in range(3))
    >>> pytreestore.open("memory://doc-repair", mode="a").committed
    3
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import cast

from pytreestore._format.keys import chunk_key, chunk_prefix
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore._location import Location
from pytreestore._log import versions
from pytreestore._log.commit_record import COMMIT_KEY, Commit
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, KeyListing, LocalFiles, PartialWriteCleanup
from pytreestore.errors import (
    CorruptChunkError,
    CorruptStoreError,
    StorageError,
    StoreReplacedError,
)


def repair(engine: Backend, location: Location, schema: TreeSchema, records: int) -> None:
    """Readies the columns of a store opened for appending (the caller holds the writer lock).

    Raises:
        CorruptStoreError: a column's shape disagrees with the schema or the commit.
        CorruptChunkError: the tail chunk (committed records the next append rewrites) is
            missing or damaged.
    """
    keys = [c.key for c in schema.columns]
    if isinstance(engine, PartialWriteCleanup):
        engine.remove_partial_writes(keys, records // schema.chunk_records)
    shapes = engine.column_shapes(keys)
    _check_shapes(schema.columns, shapes, records)
    grown = max([records, *(s[0] for s in shapes)])
    _remove_chunks_past(engine, location, schema.columns, records, grown)
    trimmed = [k for k, shape in zip(keys, shapes) if shape[0] != records]
    if trimmed:
        engine.resize(trimmed, records)
    _check_tail(engine, location, schema, records)


def _check_shapes(
    columns: Sequence[ColumnSpec], shapes: Sequence[Sequence[int]], records: int
) -> None:
    for c, shape in zip(columns, shapes):
        if tuple(shape[1:]) != c.shape:
            raise CorruptStoreError(
                f"column {c.path} has shape {shape} on disk, expected (records, "
                f"{', '.join(map(str, c.shape))}) per the schema"
            )
        if shape[0] < records:
            raise CorruptStoreError(
                f"column {c.path} holds {shape[0]} records but {records} are committed"
            )


def chunk_keys(column: ColumnSpec, rows: range) -> list[str]:
    """The storage keys of every chunk of ``column`` in chunk rows ``rows`` (record axis)."""
    grid = [range(-(-n // c)) for n, c in zip(column.shape, column.chunks[1:])]
    return [chunk_key(column.key, index) for index in itertools.product(rows, *grid)]


def past_commit(engine: Backend, location: Location, column: ColumnSpec, records: int) -> list[str]:
    """Chunk keys of ``column`` that lie wholly past ``records`` and are stored, as far as a
    listing finds them (local and in-memory stores; object stores are not listed)."""
    if location.kind not in ("file", "memory") or not isinstance(engine, KeyListing):
        return []
    first = -(-records // column.chunks[0])
    prefix = chunk_prefix(column.key)
    found = []
    for key in engine.list_keys(prefix):
        row = key[len(prefix) :].split("/", 1)[0]
        if row.isdigit() and int(row) >= first:
            found.append(key)
    return found


def _remove_chunks_past(
    engine: Backend, location: Location, columns: Sequence[ColumnSpec], records: int, grown: int
) -> None:
    """Deletes every chunk that holds no committed record: those a listing finds, and those
    a crashed writer may have written up to the length it grew the columns to."""
    keys: set[str] = set()
    for c in columns:
        if 0 in c.shape:
            continue
        first = -(-records // c.chunks[0])
        keys.update(chunk_keys(c, range(first, -(-grown // c.chunks[0]))))
        keys.update(past_commit(engine, location, c, records))
    if keys:
        engine.delete_keys(sorted(keys))


def _check_tail(engine: Backend, location: Location, schema: TreeSchema, records: int) -> None:
    start = records - records % schema.chunk_records
    if start == records:
        return
    keys = [c.key for c in schema.columns]
    try:
        engine.read(keys, slice(start, records), records)
    except CorruptChunkError as err:
        path = next((c.path for c in schema.columns if c.key == err.path), err.path)
        state = "missing" if " is missing" in str(err) else f"damaged ({err.__cause__ or err})"
        raise CorruptChunkError(
            f"cannot open {location} for appending: the tail chunk of column "
            f"{path or 'the root'} ({err.key or 'its last chunk'}) holds committed records "
            f"{start}..{records - 1} and is {state}; appending would rewrite it without "
            f"them. To go on appending, restore {err.key or 'the chunk'} from a "
            f"backup, or copy the {start} records before it to a new store "
            f"(new.extend_batch(pytreestore.open(path).load(slice(0, {start}), "
            "as_numpy=True))). Nothing was written.",
            path=path,
            chunk=err.chunk,
            key=err.key,
        ) from err


def check_not_replaced(
    engine: Backend, location: Location, seen: Commit, *, failed: bool = False
) -> Commit:
    """The commit record now, after checking that it belongs to the store a reader opened.

    Commits only ever grow a store: a commit record with fewer records or an older
    generation than ``seen`` (the one the reader last read) means the store was deleted or
    replaced (``create(overwrite=True)``) since, and the reader's records are gone.
    ``failed``: the reader's read failed, so also check that the store still keeps its
    version (``vacuum()`` removes the rows and arrays of versions it no longer keeps).

    Raises:
        StoreReplacedError: the store was replaced or deleted, the reader's records were
            written over, or (``failed``) its version is no longer kept.
    """
    raw = _commit_bytes(engine, location)
    try:
        now = _parsed(raw, str(location))
    except CorruptStoreError as err:
        if raw is not None:
            raise
        raise StoreReplacedError(
            f"the store {location} was deleted since this reader opened it ({err}); open it "
            "again if a new store is there"
        ) from err
    other = None not in (now.store, seen.store) and now.store != seen.store
    shrunk = now.records < seen.records and not now.truncated_since(seen)
    if other or now.generation < seen.generation or shrunk:
        why = (
            f"its store id is now {now.store}, not {seen.store}"
            if other
            else "commits only grow a store, but for truncate"
        )
        raise StoreReplacedError(
            f"the store {location} was replaced since this reader opened it: it now holds "
            f"{now.records} records at commit {now.generation}, this reader saw {seen.records} "
            f"records at commit {seen.generation} ({why}). What it would read belongs to "
            "another store; open it again with pytreestore.open()."
        )
    if now.gone(seen) is not None:
        raise StoreReplacedError(
            f"the records this reader of {location} opened (version {seen.generation}, "
            f"{seen.records} records) were written over: {now.why_gone(seen)}. Open the "
            "store again to read its latest version."
        )
    if failed and now.generation > seen.generation and _dropped(engine, seen, str(location)):
        raise StoreReplacedError(
            f"the version this reader of {location} opened (version {seen.generation}, "
            f"{seen.records} records) was removed: the store no longer keeps it (its log "
            "keeps the last keep_versions versions and the tagged ones), and vacuum() "
            "removed rows or columns only older versions needed. Open the store again to "
            f"read its latest version ({now.generation}, {now.records} records); tag a "
            "version (store.tag) to keep it readable."
        )
    return now


#: per location, the commit record's bytes read last and the commit parsed from them: a read
#: checks the bytes it reads now against them (exact), and parses only bytes that changed
_PARSED: dict[str, tuple[bytes, Commit]] = {}
#: per backend class, whether its keys may be plain files (:class:`LocalFiles`, a runtime
#: Protocol, whose ``isinstance`` costs tens of microseconds a call)
_LOCAL: dict[type, bool] = {}


def _parsed(raw: bytes | None, where: str) -> Commit:
    """The commit record ``raw`` (the bytes of ``where``'s), parsed once while it stays the
    same.

    Raises:
        CorruptStoreError: ``raw`` is missing or not a valid commit record.
    """
    if raw is None:
        return Commit.from_bytes(raw, where)
    hit = _PARSED.get(where)
    if hit is not None and hit[0] == raw:
        return hit[1]
    commit = Commit.from_bytes(raw, where)
    if len(_PARSED) >= RUNTIME.caches.parsed_commits:
        _PARSED.clear()
    _PARSED[where] = (raw, commit)
    return commit


def _local(engine: Backend) -> LocalFiles | None:
    """``engine`` where its class is :class:`LocalFiles` (told once per class), else None."""
    kind = type(engine)
    known = _LOCAL.get(kind)
    if known is None:
        known = _LOCAL[kind] = isinstance(engine, LocalFiles)
    return cast(LocalFiles, engine) if known else None


def _dropped(engine: Backend, seen: Commit, where: str) -> bool:
    """Whether the store's log no longer holds the record of version ``seen``."""
    return versions.read(engine, seen.generation, where) is None


def _commit_bytes(engine: Backend, location: Location) -> bytes | None:
    """The commit record's bytes; where the engine's keys are plain files
    (:class:`~pytreestore.backends.LocalFiles`) read with a plain ``open`` (no engine call),
    which is cheap after every read and safe in a process forked from the reader's; elsewhere
    (object stores, an OCDBT database, whose keys live inside its files) through the engine."""
    local = _local(engine)
    root = None if local is None else local.files_root
    if root is not None:
        try:
            with open(os.path.join(root, COMMIT_KEY), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise StorageError(f"cannot read {location}/{COMMIT_KEY}: {err}") from err
    return engine.read_bytes(COMMIT_KEY)
