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
chunks placed at the store's chunk keys as they are, no chunk decoded: on local disk its
chunk files hard-linked and its chunk-row folders renamed into the store under an intent
record (:mod:`pytreestore._commit.placing`), on OCDBT its keys copied inside the database
(:class:`~pytreestore.backends.ChunkCopies`), elsewhere its raw bytes copied. One that does
not (the records before it are not a multiple of ``chunk_records``) is read and written
again. Only after the commit are the fragments' folders deleted (on OCDBT in the commit's
own transaction; locally on a thread of their own): a crash before it leaves chunks past the
commit, which repair on the next open for appending removes, after moving renamed chunk rows
back into their fragments, so every fragment is whole again.

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

from pytreestore._commit import placing, versions
from pytreestore._commit.fragment import MANIFEST, Fragment, begun_key, manifest_key
from pytreestore._commit.layouts import layouts
from pytreestore._commit.placing import local_root, place_chunks
from pytreestore._commit.record import Commit, now_utc
from pytreestore._format import validate as _validate
from pytreestore._format.names import fragment_folder
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore._location import Location
from pytreestore._tree.convert import RecordError, RowFiller, casters
from pytreestore._tree.stack import batch_length
from pytreestore.backends import (
    Backend,
    ColumnLayout,
    FolderDeletes,
    KeyListing,
    ManyReads,
)
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
        FragmentError: the store packs leaves (``pack=``), or has no store id (written
            before format 2).
        SchemaMismatchError: a record or the batch does not match the schema; nothing written.
    """
    assert schema.ragged is None, "a ragged store's fragments are _ragged.fragments'"
    check_unpacked(schema, where)
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


def check_unpacked(schema: TreeSchema, where: str) -> None:
    """Raises FragmentError for a store that packs leaves: fragments need one array each."""
    if schema.packs:
        raise FragmentError(
            f"store {where} packs small leaves into shared arrays (created with pack=); "
            "fragments need one array per leaf. Append to it from one writer, or copy it to "
            "a store created without pack= (pytreestore.copy). Nothing was written."
        )


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
    """Every version since the oldest fragment was written, against the fragments' ids. A
    version the log no longer keeps (``keep_versions``) could have committed a fragment
    written before it, whose folder a crash left: such a fragment is refused, as unknown."""
    if not fragments:
        return
    ids = {f.id: i for i, f in enumerate(fragments)}
    for number in range(min(f.generation for f in fragments) + 1, head.generation + 1):
        commit = head if number == head.generation else versions.read(engine, number, where)
        if commit is None:
            i, f = next((i, f) for i, f in enumerate(fragments) if f.generation < number)
            raise _refused(
                f,
                i,
                f"was written at version {f.generation}, and the store's version log no longer "
                f"keeps version {number} (it keeps the last keep_versions versions), so "
                "whether that version committed it cannot be checked; write its records "
                "again (pytreestore.write_fragment) and commit the new fragment",
            )
        for fid in commit.fragments:
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
    elif isinstance(engine, ManyReads):  # each read waits on storage: all at once
        found = engine.read_many_bytes(keys)
    elif len(keys) > 8:
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
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StorageError(f"cannot read {path}: {err}") from err
    try:
        parts = [os.read(fd, 4096)]
        while parts[-1]:
            parts.append(os.read(fd, 1 << 16))
        return b"".join(parts)
    except OSError as err:
        raise StorageError(f"cannot read {path}: {err}") from err
    finally:
        os.close(fd)


def place(
    engine: Backend, schema: TreeSchema, fragments: Sequence[Fragment], start: int, base: int
) -> tuple[int, int]:
    """Writes the fragments' rows into the store's columns from record ``start`` on (the
    columns already hold them), for a commit after version ``base``; (records placed without
    decoding, records rewritten).

    Raises:
        FragmentError: a fragment's chunk is missing (nothing is committed; the rows placed
            lie past the commit, and chunk-row folders moved are moved back).
    """
    keys = [c.key for c in schema.columns]
    chunk, at = schema.chunk_records, start
    aligned: list[tuple[Fragment, int]] = []
    rewrites: list[tuple[Fragment, int]] = []
    for f in fragments:
        if f.records and at % chunk == 0:
            aligned.append((f, at // chunk))
        elif f.records:
            rewrites.append((f, at))
        at += f.records
    try:
        _place_aligned(engine, schema.columns, aligned, base)
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
    moved = sum(f.records for f, _ in aligned)
    return moved, sum(f.records for f, _ in rewrites)


def _place_aligned(
    engine: Backend,
    columns: Sequence[ColumnSpec],
    aligned: Sequence[tuple[Fragment, int]],
    base: int,
) -> None:
    """Places the chunks of each (fragment, its first chunk row in the store) unchanged."""
    if not aligned:
        return
    root = local_root(engine)
    if root is None:
        place_chunks(engine, [p for f, first in aligned for p in chunk_pairs(columns, f, first)])
        return
    moves: list[tuple[str, str]] = []
    chunks: list[tuple[str, ...]] = []  # the chunk files below each moved folder
    files: list[tuple[str, str]] = []
    grids = {c.key: tuple("/".join(map(str, g)) for g in _grid(c)) for c in columns if c.shape}
    for f, first in aligned:
        for c in columns:
            if 0 in c.shape:
                continue
            rows = range(-(-f.records // c.chunks[0]))
            head, tail = f"{f.folder}/{c.key}/c/", f"{c.key}/c/"
            if c.shape:  # array leaves: one folder per chunk row
                moves.extend((f"{head}{r}", f"{tail}{r + first}") for r in rows)
                chunks.extend(grids[c.key] for _ in rows)
            else:
                files.extend((f"{head}{r}", f"{tail}{r + first}") for r in rows)
    placing.place_local(root, base, moves, files, chunks)


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


# ---- removing ------------------------------------------------------------------------------


def purge(root: str, ids: Sequence[str]) -> int:
    """Deletes the folders of the committed fragments ``ids`` of the local store at
    ``root`` (a thread's work after the commit); how many were there."""
    folders = [os.path.join(root, fragment_folder(i)) for i in ids]
    try:
        with ThreadPoolExecutor(4) as pool:
            return sum(pool.map(_delete_folder, folders))
    except RuntimeError:  # the interpreter is exiting: it starts no new threads
        return sum(map(_delete_folder, folders))


def _delete_folder(folder: str) -> bool:
    """Deletes ``folder``: its description first, so that a deletion cut short leaves a
    folder that is never committed (vacuum removes it); whether it was there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, MANIFEST))
    if not os.path.isdir(folder):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def remove(engine: Backend, ids: Iterable[str]) -> None:
    """Deletes the folders of the fragments ``ids`` (locally with one tree removal each;
    inside a :class:`~pytreestore.backends.Transactions` block, as part of it)."""
    ids = list(ids)
    folders = [fragment_folder(i) for i in ids]
    root = local_root(engine)
    if root is not None:
        purge(root, ids)
        return
    if isinstance(engine, FolderDeletes):
        engine.delete_folders(folders)
        return
    if not isinstance(engine, KeyListing):
        engine.delete_keys([manifest_key(i) for i in ids] + [begun_key(i) for i in ids])
        return
    keys = [k for folder in folders for k in engine.list_keys(folder + "/")]
    # the description first: a deletion cut short leaves a folder vacuum removes
    engine.delete_keys(sorted(keys, key=lambda k: not k.endswith("/fragment.json")))


__all__ = [
    "check",
    "check_unpacked",
    "chunk_pairs",
    "column_blocks",
    "local_root",
    "place",
    "purge",
    "remove",
    "write",
]
