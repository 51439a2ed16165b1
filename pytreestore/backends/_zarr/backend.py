"""The zarr backend: the same zarr v3 arrays and protocol, through zarr-python 3, on local
disk and ``memory://`` here, and on ``s3://`` in its subclass
:class:`~pytreestore.backends._zarr.remote.ZarrS3Backend` (zarr-python's ``ObjectStore`` over
obstore's ``S3Store``); ``backend="zarr"`` picks the class by location.

It writes byte for byte the metadata documents the TensorStore backend writes, and keeps the
guarantees the store's commit protocol relies on:

* **Atomic single-key writes.** On local disk every key (chunk, ``zarr.json``, commit record)
  is written to a temporary file beside it, fsynced, and renamed over it, and the directory is
  fsynced: a reader sees the old bytes or the new, and a crash leaves no torn file (the
  TensorStore ``file`` kvstore does the same). ``memory://NAME`` stores are zarr
  ``MemoryStore`` objects shared per process by name, where a write is one dict assignment.
  They are separate from the TensorStore backend's ``memory://`` stores. On S3 every key is
  one PUT, which S3 makes visible whole or not at all.
* **Metadata-only resize.** ``resize`` rewrites each array's ``zarr.json`` with the new shape
  and nothing else. zarr-python's own ``Array.resize`` deletes the chunks outside a smaller
  shape; this backend never deletes a chunk, so shrinking to the committed length cannot lose
  a committed row.
* **Concurrent I/O across columns.** Every multi-column call gathers one coroutine per column
  on zarr-python's event loop and waits for all of them.
* **Checked metadata.** A column's ``zarr.json`` is read (all of them at once) when the column
  is first used and checked against the layout the store declared; handles are built from it
  without reading it again.
* **Conditional commits.** ``read_bytes_versioned`` and ``write_bytes_if`` compare and swap a
  key: the token is a digest of the key's bytes (every commit record differs from the one
  before: its generation grows), and the comparison and the write happen under an exclusive
  ``flock`` on the store's ``.pytreestore`` folder (a process-wide lock for ``memory://``).
  Growing a column happens under the same lock and refuses a column that another writer has
  grown since this one last saw it, before any chunk is written. So a second writer (the
  lock file deleted under a running writer, a forked child) gets
  :class:`CommitConflictError` instead of losing the first writer's commits.
  On S3, :class:`~pytreestore.backends._zarr.remote.ZarrS3Backend` (the subclass that
  ``backend="zarr"`` makes for an ``s3://`` location) implements both with ETags and
  ``If-Match``/``If-None-Match`` PUTs instead.

Example:
    >>> import numpy as np
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import ColumnLayout
    >>> b = ZarrBackend(Location.parse("memory://doc-zarr"))
    >>> b.create_columns([ColumnLayout("x", np.dtype("int32"), (), (4,), None, ("record",), 0)])
    >>> b.resize(["x"], 2); b.write(["x"], 0, [np.array([7, 8], np.int32)])
    >>> b.read(["x"], slice(0, 2), 2)[0]
    array([7, 8], dtype=int32)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import threading
from collections.abc import Awaitable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from zarr.abc.store import Store
from zarr.core.array import AsyncArray
from zarr.core.buffer import default_buffer_prototype
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.storage._common import StorePath

from pytreestore._format import validate as _validate
from pytreestore._format.keys import META_DIR, NO_VALUE, array_json
from pytreestore._location import Location
from pytreestore._runtime import flock_module
from pytreestore.backends._base import (
    BatchedReads,
    ChunkCopies,
    ColumnLayout,
    ColumnShape,
    ConditionalWrites,
    KeyListing,
    LocalFiles,
    ManyReads,
    PartialReads,
    damaged_chunk,
    delete_folder,
    missing_chunk,
)
from pytreestore.backends._links import link_files
from pytreestore.backends._metadata import array_document, encode_document
from pytreestore.backends._unstored import Unstored
from pytreestore.backends._zarr import stores as _zarr_dtypes
from pytreestore.backends._zarr import stores as forked
from pytreestore.backends._zarr.stores import (
    ChunksRequired,
    PinnedReads,
    collect,
    gather,
    memory_dict,
    open_local_store,
    run,
    settle,
)
from pytreestore.errors import (
    CommitConflictError,
    CorruptChunkError,
    CorruptStoreError,
    PyTreeStoreError,
    StorageError,
)

_T = TypeVar("_T")
_PROTOTYPE = default_buffer_prototype()
_CONFIG = {"write_empty_chunks": True, "order": "C"}  # a chunk of zeros is still written
_COMMIT_LOCK = threading.Lock()  # the commit lock of memory:// stores


class ZarrBackend(
    ConditionalWrites, KeyListing, BatchedReads, ChunkCopies, LocalFiles, PartialReads, ManyReads
):
    """Columns as zarr-python 3 arrays on a local directory or a ``memory://`` store; its
    subclass :class:`~pytreestore.backends._zarr.remote.ZarrS3Backend` stores on S3
    (``backend="zarr"`` picks the class by location: :func:`zarr_backend`).

    Capabilities: ConditionalWrites (a ``flock`` locally, a process lock in memory; ETags on
    S3), KeyListing, BatchedReads, ChunkCopies (hard links locally, raw bytes elsewhere),
    PartialReads, ManyReads.
    """

    #: whether requests go through obstore (S3, web servers), which a forked child cannot use
    _obstore_io = False

    def __init__(self, location: Location) -> None:
        _zarr_dtypes.register()
        self._location = location
        self._unstored = Unstored()
        self._store: Store = self._open_store(location)
        self._errors: tuple[type[Exception], ...] = (OSError,)
        self._layouts: dict[str, ColumnShape] = {}
        self._documents: dict[str, dict[str, Any]] = {}
        self._arrays: dict[str, AsyncArray[ArrayV3Metadata]] = {}
        self._attempted: dict[str, int] = {}  # grows whose write failed: maybe on disk

    def _open_store(self, location: Location) -> Store:
        """The zarr store under ``location`` (local disk or memory; S3 in the subclass)."""
        return open_local_store(location)

    # ---- keys and bytes ----------------------------------------------------------------------

    @property
    def files_root(self) -> str | None:
        """The store's folder on local disk (its keys are files there), else None."""
        return self._location.root if self._location.kind == "file" else None

    def read_bytes(self, key: str) -> bytes | None:
        return self._call(self._get(key), f"reading {self._location}/{key}")

    def write_bytes(self, key: str, data: bytes) -> None:
        self.write_many_bytes({key: data})

    def read_many_bytes(self, keys: Sequence[str]) -> list[bytes | None]:
        """The value at each key (None where absent), all read at once."""
        return self._call(gather(self._get(k) for k in keys), f"reading {self._location}")

    def write_many_bytes(self, items: dict[str, bytes]) -> None:
        sets = (self._store.set(k, _PROTOTYPE.buffer.from_bytes(v)) for k, v in items.items())
        self._call(gather(sets), f"writing to {self._location}")

    def list_keys(self, prefix: str) -> list[str]:
        """Every key below the root that starts with ``prefix``."""
        listing = collect(self._store.list_prefix(prefix))
        return sorted(self._call(listing, f"listing {self._location}/{prefix}"))

    def delete_keys(self, keys: Sequence[str]) -> None:
        """Deletes every key of ``keys`` (absent ones too), all at once."""
        deletes = (self._store.delete(k) for k in keys)
        self._call(gather(deletes), f"deleting from {self._location}")

    def delete_all(self) -> None:
        self.close()
        if self._location.kind == "file":
            delete_folder(self._location.root)
        else:
            memory_dict(self._location.root).clear()

    def is_empty(self) -> bool:
        if self._location.kind == "file":
            root = Path(self._location.root)
            return not root.exists() or not any(root.iterdir())
        return not memory_dict(self._location.root)

    def read_bytes_versioned(self, key: str) -> tuple[bytes | None, bytes]:
        """The value at ``key`` (None when absent) and its token (:data:`NO_VALUE` if absent)."""
        raw = self.read_bytes(key)
        return raw, _digest(raw)

    def write_bytes_if(self, key: str, data: bytes | None, token: bytes) -> bytes | None:
        """Writes (or with None deletes) ``key`` only if its token is still ``token``.

        Returns:
            The new token, or None when the key had changed and nothing was written.
        """
        with self._exclusive():
            if _digest(self.read_bytes(key)) != token:
                return None
            if data is None:
                self._call(self._store.delete(key), f"deleting {self._location}/{key}")
            else:
                self.write_bytes(key, data)
        return _digest(data)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Holds the store's commit lock: a ``flock`` on its ``.pytreestore`` folder."""
        if self._location.kind != "file":
            with _COMMIT_LOCK:
                yield
            return
        folder = Path(self._location.root) / META_DIR
        fcntl = flock_module(self._location, "committing to")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as err:
            raise StorageError(f"cannot lock {folder} to commit: {err}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the flock

    def copy_chunks(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Places each source key's object at its destination key: a hard link on local
        disk, elsewhere the raw bytes read and written again, all at once (no decoding)."""
        if self.files_root is not None:
            link_files(self.files_root, pairs)
            return
        found = self._call(gather(self._get(s) for s, _ in pairs), f"reading {self._location}")
        for (source, _), raw in zip(pairs, found):
            if raw is None:
                raise missing_chunk(source, None, f"no object at {source}")
        self.write_many_bytes({d: raw for (_, d), raw in zip(pairs, found) if raw is not None})

    async def _get(self, key: str) -> bytes | None:
        buffer = await self._store.get(key, prototype=_PROTOTYPE)
        return None if buffer is None else buffer.to_bytes()

    def _call(self, coroutine: Awaitable[_T], doing: str) -> _T:
        if self._obstore_io:
            forked.check(self._location)
        return run(coroutine, doing, self._errors)

    # ---- columns -----------------------------------------------------------------------------

    def create_columns(self, layouts: Sequence[ColumnLayout]) -> None:
        documents = {lay.key: array_document(lay, 0) for lay in layouts}
        self._write_documents(documents)
        self._layouts.update((lay.key, lay) for lay in layouts)
        self._documents.update(documents)

    def open_columns(self, columns: Sequence[ColumnShape]) -> None:
        self._unstored.note(columns)
        self._layouts.update((c.key, c) for c in columns)

    def column_shapes(self, keys: Sequence[str]) -> list[tuple[int, ...]]:
        self._load_documents(keys, records=0, refresh=True)
        return [tuple(self._documents[k]["shape"]) for k in keys]

    def resize(self, keys: Sequence[str], records: int) -> None:
        self._load_documents(keys, records=0)
        changed, grown = {}, set()
        for k in keys:
            shape = self._documents[k]["shape"]
            if shape[0] != records:
                changed[k] = dict(self._documents[k], shape=[records, *shape[1:]])
            if shape[0] < records:
                grown.add(k)
        self._write_documents(changed, grown)
        self._documents.update(changed)

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> None:
        stop = start + (len(blocks[0]) if blocks else 0)
        arrays = self._handles(keys, stop)
        writes = (a.setitem(slice(start, start + len(b)), b) for a, b in zip(arrays, blocks))
        self._call(gather(writes), f"writing columns of {self._location}")

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        return self.read_many([(k, index) for k in keys], records)

    def read_many(self, requests: Sequence[tuple[str, Any]], records: int) -> list[np.ndarray]:
        """Reads ``index`` of column ``key`` for every ``(key, index)`` pair, all at once;
        rows below a column's ``start`` (added by ``evolve``) read its default unstored."""
        return self._unstored.read_many(requests, records, self._read_stored)

    def _read_stored(self, requests: Sequence[tuple[str, Any]], records: int) -> list[np.ndarray]:
        """Reads ``index`` of column ``key`` for every ``(key, index)`` pair, all at once."""
        return self._read_columns([(key, index, None) for key, index in requests], records)

    def read_parts(
        self, requests: Sequence[tuple[str, Any, slice | None]], records: int
    ) -> list[np.ndarray]:
        """``index`` of column ``key`` restricted to ``part`` of its second axis, for every
        ``(key, index, part)`` (None: whole rows), all at once
        (:class:`~pytreestore.backends.PartialReads`)."""
        if any(self._unstored.first_stored(k) for k, _, _ in requests):  # rare: evolve's
            rows = self.read_many([(k, index) for k, index, _ in requests], records)
            return [r if part is None else r[:, part] for r, (_, _, part) in zip(rows, requests)]
        return self._read_columns(requests, records)

    def _read_columns(
        self, requests: Sequence[tuple[str, Any, slice | None]], records: int
    ) -> list[np.ndarray]:
        """``index`` of column ``key`` (``part`` of its second axis; None: whole rows) for
        every ``(key, index, part)``, all at once, each object read as one version
        (:class:`PinnedReads`). A chunk that fails its checksum or decoding is read once more,
        from fresh reads, before it is reported damaged: where reads cannot be pinned (S3,
        HTTP), a writer's rename may have landed between a shard's index and its inner chunks.
        """
        keys = list(dict.fromkeys(key for key, _, _ in requests))
        arrays = dict(zip(keys, self._handles(keys, records)))
        doing = f"reading columns of {self._location}"
        try:
            return self._call(self._read_pinned(arrays, requests), doing)
        except CorruptChunkError:
            return self._call(self._read_pinned(arrays, requests), doing)

    async def _read_pinned(
        self,
        arrays: dict[str, AsyncArray[ArrayV3Metadata]],
        requests: Sequence[tuple[str, Any, slice | None]],
    ) -> list[np.ndarray]:
        """The reads of :meth:`_read_columns` through one :class:`PinnedReads`, released once
        every read has ended."""
        pinned = PinnedReads(self._store)
        store = ChunksRequired(pinned)  # a missing chunk raises
        try:
            return await settle(
                _read(k, _reading(arrays[k], store, k), i, part) for k, i, part in requests
            )
        finally:
            pinned.release()

    def close(self) -> None:
        self._documents.clear()
        self._arrays.clear()

    # ---- metadata and handles ----------------------------------------------------------------

    def _write_documents(self, documents: dict[str, Any], grown: Collection[str] = ()) -> None:
        """Writes the ``zarr.json`` of every column in ``documents``, all at once.

        ``grown`` names the columns whose record axis grows. Under the commit lock, a grown
        column that another writer has grown since this one last saw it raises
        :class:`CommitConflictError` and nothing is written (:class:`ZarrS3Backend` does the
        same with conditional PUTs).
        """
        items = {array_json(k): encode_document(d) for k, d in documents.items()}
        if not grown:
            self.write_many_bytes(items)
            return
        with self._exclusive():
            reads = (self._get(array_json(k)) for k in grown)
            raws = self._call(gather(reads), f"reading column metadata of {self._location}")
            for key, raw in zip(grown, raws):
                file = f"{self._location}/{array_json(key)}"
                known = self._documents[key]["shape"][0]
                shape = _validate.array_facts(_validate.parse_array_json(raw, file), file)[1]
                found = shape[0] if shape else known
                if found > known and found != self._attempted.get(key):
                    raise CommitConflictError(
                        f"column {key} holds {found} records on disk but this writer last saw "
                        f"{known}: another writer is appending to {self._location}. Nothing "
                        "more was written; reopen the store to append after its records."
                    )
            try:
                self.write_many_bytes(items)
            except PyTreeStoreError:  # some may have landed: this writer's own, if retried
                self._attempted.update((k, documents[k]["shape"][0]) for k in grown)
                raise
            for key in grown:
                self._attempted.pop(key, None)

    def _load_documents(self, keys: Sequence[str], records: int, refresh: bool = False) -> None:
        """Reads (concurrently) and checks the ``zarr.json`` of every key not known to hold
        ``records`` rows."""
        stale = [
            k
            for k in keys
            if refresh or k not in self._documents or self._documents[k]["shape"][0] < records
        ]
        if not stale:
            return
        reads = (self._get(array_json(k)) for k in stale)
        raws = self._call(gather(reads), f"reading column metadata of {self._location}")
        for key, raw in zip(stale, raws):
            file = f"{self._location}/{array_json(key)}"
            document = _validate.parse_array_json(raw, file)
            data_type, shape, chunks = _validate.array_facts(document, file)
            if key in self._layouts:
                _validate.check_column(
                    file,
                    self._layouts[key],
                    data_type=data_type,
                    shape=shape,
                    chunks=chunks,
                    records=records,
                )
            self._documents[key] = document

    def _handles(self, keys: Sequence[str], records: int) -> list[AsyncArray[ArrayV3Metadata]]:
        """Handles whose shape is the one on disk, which holds at least ``records`` rows."""
        self._load_documents(keys, records)
        out = []
        for key in keys:
            shape = tuple(self._documents[key]["shape"])
            array = self._arrays.get(key)
            if array is None or array.shape != shape:
                array = self._make_array(key, shape)
                self._arrays[key] = array
            out.append(array)
        return out

    def _make_array(self, key: str, shape: tuple[int, ...]) -> AsyncArray[ArrayV3Metadata]:
        document = self._documents[key]
        file = f"{self._location}/{array_json(key)}"
        try:
            metadata = _parse_metadata(encode_document(dict(document, shape=[0, *shape[1:]])))
        except (ValueError, TypeError, KeyError) as err:
            raise CorruptStoreError(
                f"{file} is not zarr v3 array metadata that zarr-python can read: {err}"
            ) from err
        path = StorePath(self._store, key)
        return AsyncArray(metadata.update_shape(shape), path, config=_CONFIG)  # type: ignore[arg-type]


def _reading(
    array: AsyncArray[ArrayV3Metadata], store: Store, key: str
) -> AsyncArray[ArrayV3Metadata]:
    """``array`` reading through ``store`` (one read's :class:`ChunksRequired`)."""
    return AsyncArray(array.metadata, StorePath(store, key), config=_CONFIG)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=4096)
def _parse_metadata(document: bytes) -> ArrayV3Metadata:
    """Parsed once per distinct document: the columns of a wide tree mostly share one."""
    return ArrayV3Metadata.from_dict(json.loads(document))


async def _read(
    key: str, array: AsyncArray[ArrayV3Metadata], index: Any, part: slice | None = None
) -> np.ndarray:
    rest = () if part is None else (part,)
    try:
        if isinstance(index, slice):
            out = await array.getitem((index, *rest))
        else:
            out = await array.get_orthogonal_selection((np.asarray(index), *rest))
    except (ValueError, RuntimeError) as err:  # a checksum or decoder refused a chunk's bytes
        raise _chunk_error(key, array, index, err) from err
    return np.asarray(out)


def _chunk_error(
    key: str, array: AsyncArray[ArrayV3Metadata], index: Any, err: Exception
) -> CorruptChunkError:
    """The error of a damaged chunk, naming the chunk (a shard's: the key it is stored at)
    when the read touched only one."""
    chunks = tuple(array.metadata.chunk_grid.chunk_shape)  # type: ignore[attr-defined]
    rows = range(*index.indices(array.shape[0])) if isinstance(index, slice) else index
    first = {int(r) // chunks[0] for r in rows}
    whole_leaf = all(c >= n for c, n in zip(chunks[1:], array.shape[1:]))
    chunk = (first.pop(), *[0] * (len(chunks) - 1)) if len(first) == 1 and whole_leaf else None
    return damaged_chunk(key, chunk, err)


# ---- stores --------------------------------------------------------------------------------------


def _digest(raw: bytes | None) -> bytes:
    """The token of a key holding ``raw``: a digest of its bytes (:data:`NO_VALUE` if absent)."""
    return NO_VALUE if raw is None else hashlib.sha256(raw).hexdigest().encode()


__all__ = ["ZarrBackend"]
