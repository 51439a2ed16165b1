"""Writing fragments, and placing them in a store in one commit.

**Writing** (:func:`write`, any process, no writer lock): the records are checked and cast
against the store's schema in memory first (nothing is written for bad input), then written
under ``.pytreestore/fragments/<id>/``: first ``begun.json`` (the time, for vacuum), then one
array per column laid out exactly like the store's (same chunks, codec, fill value), then
``fragment.json``, the fragment's description. A folder without ``fragment.json`` is a
fragment still being written or abandoned by a killed writer.

**Committing** (:func:`commit`, the store's writer): every fragment is checked (store, schema,
not committed before, its description still there) before anything is written; then, inside
one :func:`~pytreestore._commit.atomic.atomic` block, the columns grow, each fragment's rows
are placed past the committed records, and one commit through the writer's
:class:`~pytreestore._commit.committer.Committer` appends them all (its record lists the
fragments' ids). A fragment that starts at a chunk boundary of the store has its encoded
chunks placed at the store's chunk keys as they are (:class:`~pytreestore.backends.ChunkCopies`:
hard links locally, raw bytes elsewhere; no chunk is decoded); one that does not (the
records before it are not a multiple of ``chunk_records``) is read and written again. Only
after the commit are the fragments' folders deleted: a crash before it leaves them whole
(links never move the fragment's own files), and chunks past the commit, which repair on the
next open for appending removes.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-fragments", {"x": np.int32(0)}, chunk_records=2)
    >>> a = pytreestore.write_fragment("memory://doc-fragments", [{"x": 1}, {"x": 2}])
    >>> b = pytreestore.write_fragment("memory://doc-fragments", {"x": np.arange(3)})
    >>> s.commit_fragments([b, a]); s.load(as_numpy=True)["x"].tolist()
    [0, 1, 2, 1, 2]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from jax.tree_util import tree_flatten

from pytreestore._commit import versions
from pytreestore._commit.fragment import Fragment, begun_key, manifest_key
from pytreestore._commit.layouts import layouts
from pytreestore._commit.record import Commit, now_utc
from pytreestore._format import validate as _validate
from pytreestore._format.names import RETIRED_DIR, fragment_folder
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore._location import Location
from pytreestore._tree.convert import RecordError, RowFiller, casters
from pytreestore._tree.stack import batch_length
from pytreestore.backends import Backend, ChunkCopies, ColumnLayout, KeyListing, LocalFiles
from pytreestore.backends._base import missing_chunk
from pytreestore.errors import (
    CorruptChunkError,
    FragmentError,
    PyTreeStoreError,
    SchemaMismatchError,
    StorageError,
)

# ---- writing -------------------------------------------------------------------------------


def write(engine: Backend, schema: TreeSchema, head: Commit, data: Any, where: str) -> Fragment:
    """Writes ``data`` (records, or a batch of the schema's structure) as a fragment of the
    store behind ``engine``, a store of one fixed structure (a ragged store's fragments:
    :mod:`pytreestore._ragged.fragments`), whose latest commit is ``head``; its description.

    Raises:
        FragmentError: the store has no store id (written before format 2).
        SchemaMismatchError: a record or the batch does not match the schema; nothing written.
    """
    assert schema.ragged is None, "a ragged store's fragments are _ragged.fragments'"
    if head.store is None:
        raise FragmentError(
            f"store {where} was written by a pytreestore before format 2 and has no store id, "
            "which fragments are checked against; copy it to a new store "
            "(pytreestore.copy) to write fragments to it. Nothing was written."
        )
    blocks = column_blocks(schema, data)
    count = len(blocks[0])
    fragment = Fragment(
        uuid.uuid4().hex, head.store, _validate.id_of(schema), count, head.generation, now_utc()
    )
    engine.write_bytes(begun_key(fragment.id), json.dumps({"time": fragment.time}).encode())
    try:
        if count:
            lays = fragment_layouts(schema, fragment)
            keys = [lay.key for lay in lays]
            engine.create_columns(lays)
            engine.resize(keys, count)
            engine.write(keys, 0, blocks)
        engine.write_bytes(manifest_key(fragment.id), fragment.to_json().encode())
    except BaseException:
        # one left is vacuum's: it has no fragment.json, so it is never committed
        with contextlib.suppress(PyTreeStoreError):
            remove(engine, [fragment.id])
        raise
    return fragment


def column_blocks(schema: TreeSchema, data: Any) -> list[np.ndarray]:
    """One array per column from ``data``: a batch (the schema's structure, leaves with a
    leading record axis) or an iterable of records, checked and cast.

    Raises:
        SchemaMismatchError: names the record (or batch leaf) refused.
    """
    leaves, treedef = tree_flatten(data)
    if treedef == schema.treedef and not isinstance(data, Iterator):
        leaves = schema.column_leaves(leaves)
        count = batch_length(leaves, schema.paths)
        return [
            c.coerce(leaf, batch=count, what="batch")
            for c, leaf in zip(casters(schema.columns), leaves)
        ]
    if isinstance(data, Mapping | np.ndarray) or not isinstance(data, Iterable):
        raise SchemaMismatchError(
            "write_fragment() takes an iterable of records or a batch of the store's "
            f"structure; {schema.mismatch_message(data, what='batch')} Nothing was written."
        )
    rows = []
    for i, record in enumerate(data):
        leaves, got = tree_flatten(record)
        if got != schema.treedef:
            raise SchemaMismatchError(
                f"write_fragment() refused record {i} (nothing was written): "
                f"{schema.mismatch_message(record)}"
            )
        rows.append(schema.column_leaves(leaves))
    buffers = [np.empty((len(rows), *c.shape), c.dtype) for c in schema.columns]
    try:
        RowFiller(casters(schema.columns), buffers).fill_block(rows, 0)
    except RecordError as err:
        raise SchemaMismatchError(
            f"write_fragment() refused record {err.index} (nothing was written): {err.error}"
        ) from err.error
    return buffers


def fragment_layouts(schema: TreeSchema, fragment: Fragment) -> list[ColumnLayout]:
    """The layouts of ``fragment``'s arrays: the store's columns', below its folder."""
    return [dataclasses.replace(lay, key=f"{fragment.folder}/{lay.key}") for lay in layouts(schema)]


# ---- committing ----------------------------------------------------------------------------


def check(
    engine: Backend,
    location: Location | None,
    fragments: Sequence[Any],
    head: Commit,
    schema: TreeSchema,
    *,
    same_schema: bool = True,
) -> list[Fragment]:
    """The fragments, each checked for a commit after ``head``; reads, writes nothing.
    ``same_schema=False`` leaves the schema to the caller (a ragged store's fragments may
    hold structures it learns: :mod:`pytreestore._ragged.placing`).

    Raises:
        FragmentError: one is not a Fragment, is listed twice, belongs to another store or
            schema, was committed already, or its files are gone.
    """
    where = str(location)
    found: list[Fragment] = []
    schema_id, seen = _validate.id_of(schema), set()
    for i, f in enumerate(fragments):
        if not isinstance(f, Fragment):
            raise FragmentError(
                f"commit_fragments() takes Fragments (what pytreestore.write_fragment "
                f"returned, or Fragment.from_json of its JSON); item {i} is a "
                f"{type(f).__name__}. Nothing was committed."
            )
        if f.id in seen:
            raise _refused(f, i, "is listed twice")
        if f.store != head.store:
            raise _refused(
                f, i, f"belongs to another store (store id {f.store}; {where} is {head.store})"
            )
        if same_schema and f.schema != schema_id:
            raise _refused(
                f,
                i,
                f"was written with another schema ({f.schema}; the store's is now {schema_id}, "
                "after an evolve or in another store); write it again against this schema",
            )
        seen.add(f.id)
        found.append(f)
    _check_not_committed(engine, found, head, where)
    _check_written(engine, location, found)
    return found


def _refused(f: Fragment, i: int, why: str) -> FragmentError:
    return FragmentError(f"fragment {f.id} (item {i}) {why}. Nothing was committed.")


def _check_not_committed(
    engine: Backend, fragments: Sequence[Fragment], head: Commit, where: str
) -> None:
    """Every version since the oldest fragment was written, against the fragments' ids."""
    if not fragments:
        return
    ids = {f.id: i for i, f in enumerate(fragments)}
    for number in range(min(f.generation for f in fragments) + 1, head.generation + 1):
        commit = head if number == head.generation else versions.read(engine, number, where)
        for fid in commit.fragments if commit is not None else ():
            if fid in ids:
                raise _refused(
                    fragments[ids[fid]], ids[fid], f"was committed already, in version {number}"
                )


def _check_written(
    engine: Backend, location: Location | None, fragments: Sequence[Fragment]
) -> None:
    keys = [manifest_key(f.id) for f in fragments]
    root = local_root(engine)
    if root is not None:  # plain reads: no engine call
        found = [_read_file(os.path.join(root, k)) for k in keys]
    elif len(keys) > 8:  # each read waits on storage: many at once
        with ThreadPoolExecutor(16) as pool:
            found = list(pool.map(engine.read_bytes, keys))
    else:
        found = [engine.read_bytes(k) for k in keys]
    for i, (f, raw) in enumerate(zip(fragments, found)):
        if raw is None:
            raise _refused(
                f,
                i,
                f"has no files under the store ({f.folder}/ holds no fragment.json): it was "
                "committed already, removed by vacuum(), or deleted. Write it again",
            )
        if raw != f.to_json().encode():  # to_json is canonical: sorted keys, one spacing
            raise _refused(f, i, f"differs from the description in {manifest_key(f.id)}")


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StorageError(f"cannot read {path}: {err}") from err


def place(
    engine: Backend, schema: TreeSchema, fragments: Sequence[Fragment], start: int
) -> tuple[int, int]:
    """Writes the fragments' rows into the store's columns from record ``start`` on (the
    columns already hold them); (records placed without decoding, records rewritten).

    Raises:
        FragmentError: a fragment's chunk is missing (nothing is committed; the rows placed
            lie past the commit).
    """
    keys = [c.key for c in schema.columns]
    chunk, at = schema.chunk_records, start
    pairs: list[tuple[str, str]] = []
    rewrites: list[tuple[Fragment, int]] = []
    for f in fragments:
        if f.records and at % chunk == 0:
            pairs.extend(chunk_pairs(schema.columns, f, at // chunk))
        elif f.records:
            rewrites.append((f, at))
        at += f.records
    try:
        _copy(engine, pairs)
        for f, offset in rewrites:
            lays = fragment_layouts(schema, f)
            engine.open_columns(lays)
            blocks = engine.read([lay.key for lay in lays], slice(0, f.records), f.records)
            engine.write(keys, offset, blocks)
    except CorruptChunkError as err:
        owner = next((f for f in fragments if str(err.key or err.path).startswith(f.folder)), None)
        name = owner.id if owner is not None else "a fragment"
        raise FragmentError(
            f"fragment {name} is incomplete: {err}. Its files were changed or partly deleted "
            "after it was written; write it again. Nothing was committed."
        ) from err
    moved = sum(f.records for f in fragments) - sum(f.records for f, _ in rewrites)
    return moved, sum(f.records for f, _ in rewrites)


def chunk_pairs(
    columns: Sequence[ColumnSpec], fragment: Fragment, first: int
) -> list[tuple[str, str]]:
    """(fragment chunk key, store chunk key) of every chunk of ``fragment``, placed from
    chunk row ``first`` of the store on."""
    rows = -(-fragment.records // columns[0].chunks[0]) if columns else 0
    pairs = []
    for c in columns:
        if 0 in c.shape:
            continue
        grid = _grid(c)
        for row in range(rows):
            for rest in grid:
                tail = "".join(f"/{i}" for i in rest)
                pairs.append(
                    (f"{fragment.folder}/{c.key}/c/{row}{tail}", f"{c.key}/c/{row + first}{tail}")
                )
    return pairs


def _grid(column: ColumnSpec) -> list[tuple[int, ...]]:
    grid: list[tuple[int, ...]] = [()]
    for n, size in zip(column.shape, column.chunks[1:]):
        grid = [(*g, i) for g in grid for i in range(-(-n // size))]
    return grid


def _copy(engine: Backend, pairs: Sequence[tuple[str, str]]) -> None:
    if not pairs:
        return
    if isinstance(engine, ChunkCopies):
        engine.copy_chunks(pairs)
        return
    found = {source: engine.read_bytes(source) for source, _ in pairs}
    missing = [s for s, raw in found.items() if raw is None]
    if missing:
        raise missing_chunk(missing[0], None, f"no object at {missing[0]}")
    engine.write_many_bytes({d: found[s] or b"" for s, d in pairs})


# ---- removing ------------------------------------------------------------------------------


def local_root(engine: Backend) -> str | None:
    """The folder whose files are ``engine``'s keys (so fragments are read, renamed and
    deleted as files), or None: every call goes through the engine (S3, OCDBT, memory)."""
    return engine.files_root if isinstance(engine, LocalFiles) else None


def retire(engine: Backend, ids: Sequence[str]) -> str | None:
    """Takes committed fragments out of ``fragments/``: on local files one rename of each
    folder into ``.pytreestore/retired/`` (returns the store's folder: :func:`purge` deletes
    them later), elsewhere a deletion of their keys now (returns None)."""
    root = local_root(engine)
    if root is None:
        remove(engine, ids)
        return None
    retired = os.path.join(root, RETIRED_DIR)
    os.makedirs(retired, exist_ok=True)
    for fid in ids:
        with contextlib.suppress(FileNotFoundError):
            os.rename(os.path.join(root, fragment_folder(fid)), os.path.join(retired, fid))
    return root


def purge(root: str) -> int:
    """Deletes the retired fragments' folders of the local store at ``root``; how many."""
    retired = os.path.join(root, RETIRED_DIR)
    try:
        names = os.listdir(retired)
    except FileNotFoundError:
        return 0
    with ThreadPoolExecutor(8) as pool:
        for _ in pool.map(lambda n: shutil.rmtree(os.path.join(retired, n), True), names):
            pass
    return len(names)


def remove(engine: Backend, ids: Iterable[str]) -> None:
    """Deletes the folders of the fragments ``ids`` (locally with one tree removal each)."""
    ids = list(ids)
    folders = [fragment_folder(i) for i in ids]
    root = local_root(engine)
    if root is not None:
        for folder in folders:
            shutil.rmtree(os.path.join(root, folder), ignore_errors=True)
        return
    if not isinstance(engine, KeyListing):
        engine.delete_keys([manifest_key(i) for i in ids] + [begun_key(i) for i in ids])
        return
    keys = [k for folder in folders for k in engine.list_keys(folder + "/")]
    # the description first: a deletion cut short leaves a folder vacuum removes
    engine.delete_keys(sorted(keys, key=lambda k: not k.endswith("/fragment.json")))


__all__ = [
    "check",
    "chunk_pairs",
    "column_blocks",
    "place",
    "purge",
    "remove",
    "retire",
    "write",
]
