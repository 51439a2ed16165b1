"""The TensorStore backend: zarr v3 arrays through TensorStore's ``zarr3`` driver.

Handles are opened lazily and concurrently, and reopened when another process has grown the
arrays past what a handle sees (a TensorStore handle never sees another handle's resize).

Example:
    >>> import numpy as np
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import ColumnLayout
    >>> b = TensorStoreBackend(Location.parse("memory://doc-ts"))
    >>> b.create_columns([ColumnLayout("x", np.dtype("int32"), (), (4,), None, ("record",), 0)])
    >>> b.resize(["x"], 2); b.write(["x"], 0, [np.array([7, 8], np.int32)])
    >>> b.read(["x"], slice(0, 2), 2)[0]
    array([7, 8], dtype=int32)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from pytreestore._format import validate as _validate
from pytreestore._location import Location
from pytreestore._runtime import RUNTIME
from pytreestore.backends._base import (
    BatchedReads,
    CheckedReads,
    ChunkCopies,
    ColumnLayout,
    ColumnShape,
    ConditionalWrites,
    FolderDeletes,
    KeyListing,
    LocalFiles,
    ManyReads,
    PartialReads,
    PartialWriteCleanup,
    ReadsInto,
    TensorStoreKvStore,
    delete_folder,
    missing_chunk,
)
from pytreestore.backends._links import link_files
from pytreestore.backends._metadata import array_metadata
from pytreestore.backends._tensorstore import direct as _direct
from pytreestore.backends._tensorstore import futures as _fork
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.backends._tensorstore import reads as _reads
from pytreestore.backends._tensorstore.kvstore import (
    create_documents,
    kvstore_spec,
    partial_writes,
    plain_fill,
    remove_abandoned,
)
from pytreestore.backends._unstored import Unstored
from pytreestore.errors import CorruptChunkError, PyTreeStoreError

_MEMORY: dict[str, Any] = {}
_Part = tuple[str, Any, "slice | None"]  # (key, index, part of the second axis or None: all)
_MEMORY_LOCK = threading.Lock()


#: reads of an HTTP store tried again after a damaged chunk (a shard torn by a writer)
_TORN_RETRIES = 2


def memory_context() -> ts.Context:
    """One context for every ``memory://`` store of this process, so reopening finds the data."""
    with _MEMORY_LOCK:
        if "context" not in _MEMORY:
            _MEMORY["context"] = ts.Context()
        return _MEMORY["context"]


class TensorStoreBackend(
    ConditionalWrites,
    KeyListing,
    CheckedReads,
    BatchedReads,
    PartialWriteCleanup,
    TensorStoreKvStore,
    ChunkCopies,
    LocalFiles,
    PartialReads,
    ReadsInto,
    ManyReads,
    FolderDeletes,
):
    """Columns as TensorStore ``zarr3`` arrays on the ``file``, ``memory``, ``s3`` or ``gcs``
    kvstore.

    Storage failures raise :class:`StorageError`; chunks that cannot be decoded raise
    :class:`CorruptChunkError` naming the column key and the chunk.
    """

    def __init__(self, location: Location) -> None:
        self._location = location
        self._unstored = Unstored()
        self._timeout: float | None = getattr(location.options, "total_timeout", None)
        # decoded chunks are cached above the backends (pytreestore._read.cache)
        self._context = memory_context() if location.kind == "memory" else ts.Context()
        self._kv_spec, self._cleanup = kvstore_spec(location)
        self._kv: ts.KvStore | None = None
        self._handles: dict[str, ts.TensorStore] = {}
        self._layouts: dict[str, ColumnShape] = {}
        self._direct: dict[str, _direct.DirectColumn | None] = {}

    # ---- keys and bytes ----------------------------------------------------------------------

    @property
    def timeout(self) -> float | None:
        """Seconds any one storage call may take (the location's ``total_timeout``), or None."""
        return self._timeout

    @property
    def files_root(self) -> str | None:
        """The store's folder on the file kvstore (its keys are files there), else None."""
        return self._location.root if self._location.kind == "file" else None

    def check_usable(self) -> None:
        """Raises :class:`ForkedBackendError` in a process forked from one that had used
        TensorStore, before a call that would abort it (:mod:`.fork`)."""
        _fork.check(self._location)

    @property
    def kvstore(self) -> ts.KvStore:
        _fork.check(self._location)
        if self._kv is None:
            opening = ts.KvStore.open(self._kv_spec, context=self._context)
            kv: ts.KvStore = _futures.result(opening, self._timeout)
            self._kv = kv
            return kv
        return self._kv

    def read_bytes(self, key: str) -> bytes | None:
        return self.read_bytes_versioned(key)[0]

    def write_bytes(self, key: str, data: bytes) -> None:
        self.write_many_bytes({key: data})

    def read_many_bytes(self, keys: Sequence[str]) -> list[bytes | None]:
        """The value at each key (None where absent), every read issued at once."""
        reads = [self.kvstore.read(k) for k in keys]
        found = _futures.wait(reads, list(keys), f"reading {self._location}", timeout=self._timeout)
        return [bytes(r.value) if r.state == "value" else None for r in found]

    def delete_folders(self, folders: Sequence[str]) -> None:
        """Deletes every key below each folder: one ``delete_range`` each, all at once."""
        ranges = [ts.KvStore.KeyRange(f + "/", f + "0") for f in folders]  # "0" follows "/"
        futures = [self.kvstore.delete_range(r) for r in ranges]
        _futures.wait(
            futures, list(folders), f"deleting from {self._location}", timeout=self._timeout
        )

    def write_many_bytes(self, items: dict[str, bytes]) -> None:
        futures = [self.kvstore.write(k, v) for k, v in items.items()]
        _futures.wait(futures, list(items), f"writing to {self._location}", timeout=self._timeout)

    def read_bytes_versioned(self, key: str) -> tuple[bytes | None, bytes]:
        """The value at ``key`` (None when absent) and its storage generation.

        The generation of a missing key is :data:`NO_VALUE`.
        """
        try:
            result = _futures.result(self.kvstore.read(key), self._timeout)
        except ValueError as err:
            raise _futures.storage_error(f"reading {self._location}/{key}", err) from err
        value = bytes(result.value) if result.state == "value" else None
        return value, bytes(result.stamp.generation)

    def write_bytes_if(self, key: str, data: bytes | None, generation: bytes) -> bytes | None:
        """Writes (or with None deletes) ``key`` only if its generation is ``generation``.

        Atomic on the file and memory kvstores, on GCS, and on S3 servers that honour
        ``If-Match``/``If-None-Match`` (AWS, MinIO, moto). Pass :data:`NO_VALUE` to create only.

        Returns:
            The new generation, or None when the key had changed and nothing was written.
        """
        try:
            stamp = _futures.result(
                self.kvstore.write(key, data, if_equal=generation), self._timeout
            )
        except ValueError as err:
            raise _futures.storage_error(f"writing {self._location}/{key}", err) from err
        return None if stamp.generation == b"" else bytes(stamp.generation)

    def list_keys(self, prefix: str) -> list[str]:
        """Every key below the root that starts with ``prefix``."""
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else ""
        try:
            keys = _futures.result(
                self.kvstore.list(ts.KvStore.KeyRange(prefix, end)), self._timeout
            )
        except ValueError as err:
            raise _futures.storage_error(f"listing {self._location}/{prefix}", err) from err
        return sorted(bytes(k).decode() for k in keys)

    def delete_keys(self, keys: Sequence[str]) -> None:
        """Deletes every key of ``keys`` (absent ones too), all at once."""
        futures = [self.kvstore.write(k, None) for k in keys]
        _futures.wait(futures, list(keys), f"deleting from {self._location}", timeout=self._timeout)
        for column in _columns_of(keys, self._handles):  # their caches may hold what is gone
            del self._handles[column]

    def delete_all(self) -> None:
        self._handles.clear()
        if self._location.kind == "file":
            delete_folder(self._location.root)
        else:
            try:
                _futures.result(self.kvstore.delete_range(ts.KvStore.KeyRange()), self._timeout)
            except ValueError as err:
                raise _futures.storage_error(f"deleting {self._location}", err) from err

    def is_empty(self) -> bool:
        if self._location.kind == "file":
            root = Path(self._location.root)
            return not root.exists() or not any(root.iterdir())
        try:
            return not _futures.result(self.kvstore.list(), self._timeout)
        except ValueError as err:
            raise _futures.storage_error(f"listing {self._location}", err) from err

    # ---- columns -----------------------------------------------------------------------------

    def _spec(self, key: str) -> dict[str, Any]:
        kv = dict(self._kv_spec, path=self._kv_spec["path"] + key + "/")
        # every chunk is stored, all-zero ones too, so a missing chunk means lost data: it
        # reads as an error, never as the fill value
        return {
            "driver": "zarr3",
            "kvstore": kv,
            "store_data_equal_to_fill_value": True,
            "fill_missing_data_reads": False,
        }

    def create_columns(self, layouts: Sequence[ColumnLayout]) -> None:
        _fork.check(self._location)
        if self.files_root is not None:  # documents as files: one round of writes, no reads
            plain = [lay for lay in layouts if plain_fill(lay)]
            create_documents(self.kvstore, plain, str(self._location), self._timeout)
            self._layouts.update((lay.key, lay) for lay in plain)
            layouts = [lay for lay in layouts if not plain_fill(lay)]
        futures = [
            ts.open(
                dict(self._spec(lay.key), metadata=array_metadata(lay)),
                create=True,
                context=self._context,
            )
            for lay in layouts
        ]
        handles = _futures.wait(
            futures,
            [lay.key for lay in layouts],
            f"{self._location}: creating column",
            timeout=self._timeout,
        )
        self._handles.update(zip((lay.key for lay in layouts), handles))
        self._layouts.update((lay.key, lay) for lay in layouts)

    def open_columns(self, columns: Sequence[ColumnShape]) -> None:
        self._unstored.note(columns)
        self._layouts.update((c.key, c) for c in columns)

    def column_handles(self, keys: Sequence[str], records: int = 0) -> list[ts.TensorStore]:
        """Handles for ``keys`` whose domain covers ``records``, (re)opened concurrently and
        checked against the declared layouts."""
        stale = [k for k in keys if k not in self._handles or self._handles[k].shape[0] < records]
        if stale:
            _fork.check(self._location)
        txn = self._active()  # metadata read inside it sees the transaction's own resizes
        futures = [ts.open(self._spec(k), context=self._context, transaction=txn) for k in stale]
        handles = _futures.wait(
            futures, stale, f"{self._location}: opening column", meta=True, timeout=self._timeout
        )
        for key, handle in zip(stale, handles):
            self._check(key, handle, records)
        self._handles.update(zip(stale, handles))
        return [self._handles[k] for k in keys]

    def _active(self) -> ts.Transaction | None:
        """The transaction this thread's writes join: none here (a subclass may have one)."""
        return None

    def _check(self, key: str, handle: ts.TensorStore, records: int) -> None:
        if key in self._layouts:
            _validate.check_column(
                f"{self._location}/{key}/zarr.json",
                self._layouts[key],
                data_type=handle.dtype.name,
                shape=handle.shape,
                chunks=handle.chunk_layout.write_chunk.shape,
                records=records,
            )

    def column_shapes(self, keys: Sequence[str]) -> list[tuple[int, ...]]:
        for k in keys:
            self._handles.pop(k, None)
        return [tuple(h.shape) for h in self.column_handles(keys)]

    def resize(self, keys: Sequence[str], records: int) -> None:
        _fork.check(self._location)
        handles = self.column_handles(keys)
        futures = [
            h.resize(
                exclusive_max=[records] + [None] * (h.rank - 1),
                resize_metadata_only=True,
                # growing never shrinks what another writer grew (its handle is newer)
                expand_only=records > h.shape[0],
            )
            if h.shape[0] != records
            else None
            for h in handles
        ]
        pending = [(k, f) for k, f in zip(keys, futures) if f is not None]
        done = _futures.wait(
            [f for _, f in pending],
            [k for k, _ in pending],
            "resizing column",
            timeout=self._timeout,
        )
        self._handles.update(zip((k for k, _ in pending), done))

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> None:
        handles = self.column_handles(keys, start + (len(blocks[0]) if blocks else 0))
        direct = [self.direct_plan(k, h) for k, h in zip(keys, handles)]
        if blocks and all(p is not None and p.plain for p in direct):
            try:
                done = _direct.write(direct, start, blocks)  # type: ignore[arg-type]
            except PyTreeStoreError:
                raise
            except OSError as err:
                raise _futures.storage_error(f"writing columns of {self._location}", err) from err
            start, blocks = start + done, [b[done:] for b in blocks]
            if not len(blocks[0]):
                return
        _fork.check(self._location)
        futures = [h[start : start + len(b)].write(b) for h, b in zip(handles, blocks)]
        _futures.wait(futures, keys, f"{self._location}: writing column", timeout=self._timeout)

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        return self.read_many([(k, index) for k in keys], records)

    def read_many(self, requests: Sequence[tuple[str, Any]], records: int) -> list[np.ndarray]:
        """Reads ``index`` of column ``key`` for every ``(key, index)`` pair, all at once;
        rows below a column's ``start`` (added by ``evolve``) read its default unstored."""
        return self._unstored.read_many(requests, records, self._read_stored)

    def _read_stored(self, requests: Sequence[tuple[str, Any]], records: int) -> list[np.ndarray]:
        return self._read_parts([(key, index, None) for key, index in requests], records)

    def read_parts(self, requests: Sequence[_Part], records: int) -> list[np.ndarray]:
        """``index`` of ``key``, only ``part`` of its second axis (None: all), per request,
        all at once (:class:`~pytreestore.backends.PartialReads`): each chunk touched is
        decoded, and only the part copied out."""
        if any(self._unstored.first_stored(k) for k, _, _ in requests):  # rare: evolve's
            rows = self.read_many([(k, index) for k, index, _ in requests], records)
            return [r if part is None else r[:, part] for r, (_, _, part) in zip(rows, requests)]
        return self._read_parts(requests, records)

    def read_into(
        self, keys: Sequence[str], index: slice, records: int, outs: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """(:class:`~pytreestore.backends.ReadsInto`) see :func:`.reads.read_parts`."""
        if any(self._unstored.first_stored(k) for k in keys):  # rare: defaults fill first rows
            return self.read(keys, index, records)
        return self._read_parts([(k, index, None) for k in keys], records, outs)

    def _read_parts(
        self, requests: Sequence[_Part], records: int, outs: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """Reads ``(key, index, part)`` requests, all at once, into new arrays or ``outs``
        (:func:`.reads.read_parts`)."""
        keys = list(dict.fromkeys(key for key, _, _ in requests))
        handles = dict(zip(keys, self.column_handles(keys, records)))
        plans = {k: self.reads_plan(k, handles[k]) for k in keys}
        for attempt in range(_TORN_RETRIES + 1):
            try:
                return _reads.read_parts(
                    self._location, handles, plans, requests, self._timeout, outs
                )
            except CorruptChunkError:
                # over HTTP a shard's index and its inner chunks are separate requests: a
                # writer that replaced the shard between them tears it; read it again
                if self._location.kind != "http" or attempt == _TORN_RETRIES:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def direct_plan(self, key: str, handle: ts.TensorStore) -> _direct.DirectColumn | None:
        """How ``key``'s local chunk files can be read directly (and, plain ones, written), or
        None (not on local disk, or a chain the direct reader does not read)."""
        if key not in self._direct:
            _fork.check(self._location)  # the handle's codec is TensorStore's to say
            plan = None
            codec = handle.codec if self._location.kind == "file" else None
            codecs = codec.to_json()["codecs"] if codec is not None else []
            chunks = handle.chunk_layout.write_chunk.shape if codecs else None
            if chunks is not None:  # local chunk files: the reader says if it can read them
                metadata = {
                    "data_type": handle.dtype.name,
                    "shape": list(handle.shape),
                    "chunk_grid": {"configuration": {"chunk_shape": list(chunks)}},
                    # the format's encoding; a foreign one misses its files and falls back
                    "chunk_key_encoding": {"name": "default"},
                    "codecs": codecs,
                }
                folder = Path(self._location.root) / key
                plan = _direct.plan(folder, metadata, key)
            self._direct[key] = plan
        return self._direct[key]

    def reads_directly(self, keys: Sequence[str]) -> bool:
        """(:class:`~pytreestore.backends.DirectReads`) every column of ``keys`` has inner
        chunks the direct reader reads, as learnt when they were first read (a key that names
        no array, such as a packed leaf's, is not one)."""
        if not RUNTIME.reads.direct or _direct.native() is None or self.files_root is None:
            return False
        plans = self._direct
        return all((p := plans.get(k)) is not None and p.inner is not None for k in keys)

    def reads_plan(self, key: str, handle: ts.TensorStore) -> _direct.DirectColumn | None:
        """How the direct reader reads ``key``'s chunks, or None: TensorStore reads them (not
        on local disk, a chain it does not read, no compiled loop here, or
        ``RUNTIME.reads.direct`` off)."""
        if not RUNTIME.reads.direct or _direct.native() is None:
            return None
        return self.direct_plan(key, handle)

    def remove_partial_writes(self, keys: Sequence[str], tail_chunk: int) -> list[str]:
        """Deletes the ``<key>.__lock`` files a killed writer left behind; the paths removed.

        TensorStore's file kvstore writes a key through ``<key>.__lock`` and renames it over
        the key; a writer killed in between leaves that file. A file whose lock a live
        process holds (a write in flight) is kept
        (:func:`~pytreestore.backends._tensorstore.kvstore.remove_abandoned`). Only the
        holder of the writer lock may call this. Chunks below ``tail_chunk`` (on the record
        axis) are never written again, so only the chunks from there on are looked at.
        (Repair on open for append, step 4 of :mod:`pytreestore._log.protocol`.)
        """
        if self._location.kind != "file":
            return []
        try:
            return remove_abandoned(partial_writes(Path(self._location.root), keys, tail_chunk))
        except OSError as err:  # a symlink loop in the store, a folder we may not read
            raise _futures.storage_error(f"cleaning up {self._location}", err) from err

    def read_checked(
        self, reads: Sequence[tuple[str, Any]], records: int
    ) -> list[PyTreeStoreError | None]:
        """Reads every ``(key, index)`` at once; each read's error, or None where it worked
        (:func:`pytreestore.backends._tensorstore.reads.read_checked`)."""
        return _reads.read_checked(self, reads, records)

    def copy_chunks(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Places each source key's object at its destination key: a hard link on the file
        kvstore, elsewhere the raw bytes read and written again, all at once (no decoding)."""
        if self.files_root is not None:
            link_files(self.files_root, pairs)
            return
        reads = [self.kvstore.read(source) for source, _ in pairs]
        found = _futures.wait(
            reads, [s for s, _ in pairs], f"reading {self._location}", timeout=self._timeout
        )
        for (source, _), result in zip(pairs, found):
            if result.state != "value":
                raise missing_chunk(source, None, f"no object at {source}")
        writes = [self.kvstore.write(d, r.value) for (_, d), r in zip(pairs, found)]
        _futures.wait(
            writes, [d for _, d in pairs], f"writing to {self._location}", timeout=self._timeout
        )

    def close(self) -> None:
        self._handles.clear()
        self._kv = None
        self._cleanup()


def _columns_of(keys: Sequence[str], columns: Any) -> set[str]:
    """The columns among ``columns`` (storage keys) that hold one of ``keys`` (a chunk, the
    array's ``zarr.json``)."""
    found = set()
    for key in keys:
        parts = key.split("/")
        found.update(c for i in range(1, len(parts)) if (c := "/".join(parts[:i])) in columns)
    return found
