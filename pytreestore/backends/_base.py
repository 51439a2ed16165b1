"""The backend contract: the interface every storage engine implements, in one file.

A backend knows keys, bytes and chunked arrays below one store root; it knows nothing of trees
or commits (the store owns the commit protocol). :class:`Backend` lists what every backend
does; each optional capability is a ``runtime_checkable`` Protocol below it, which the store
checks with ``isinstance`` (never ``hasattr``) before using it, and which the shipped
conformance suite (:mod:`pytreestore.testing.conformance`) tests only where a backend has it.

Construction:
    ``Backend(location, **options)``: ``location`` is a parsed
    :class:`~pytreestore._location.Location` (``file``, ``memory``, ``s3``, ``gcs`` or ``http``,
    with its storage options; at an ``http`` location, which is read-only, the package wraps
    the backend in :class:`~pytreestore.backends._registry.ReadOnly`); ``options`` are engine settings (the shipped backends take none).
    Constructing does no I/O that can fail on a missing store. Register a factory under a name
    with :func:`pytreestore.backends.register_backend` to make ``backend="name"`` work in
    ``create``, ``open`` and ``copy``.

Errors (every one a :class:`~pytreestore.errors.PyTreeStoreError`, never engine text alone):
    * :class:`~pytreestore.errors.StorageError`: storage could not be reached or refused the
      call (network, permissions, timeouts). Retryable; nothing is known to be damaged.
    * :class:`~pytreestore.errors.CorruptChunkError`: a chunk is damaged or missing (built with
      :func:`damaged_chunk` / :func:`missing_chunk`, naming the column key, chunk and its key).
    * :class:`~pytreestore.errors.CorruptStoreError`: an array's ``zarr.json`` is missing or
      disagrees with its column, or a file or folder of a local store is a symlink loop
      (built with :func:`symlink_loop`, naming it).
    * :class:`~pytreestore.errors.CommitConflictError` is raised by the store, not the
      backend: a :class:`ConditionalWrites` backend returns None from ``write_bytes_if`` when
      the key changed, and the store turns that into the conflict.

Atomicity:
    * ``write_bytes`` is atomic per key: a reader sees the old value or the new one, never a
      mix. ``write_many_bytes`` is atomic per key, not across keys.
    * ``resize`` is metadata-only: it rewrites each array's ``zarr.json`` and never touches a
      chunk (chunks past the new end are the store's to delete, with ``delete_keys``).
    * Every multi-column call (``write``, ``read``, ``resize``, ``column_shapes``) issues its
      I/O for all columns at once and waits for all of it.

Records and rows:
    A column's length (its rows) is the backend's to report, with ``column_shapes``; nothing
    outside the backend derives it from the record count. The ``records`` that ``read``,
    ``read_many`` and ``read_checked`` take is the commit's visible record count: a backend
    uses it only to bound the read (rows a writer added past the commit stay invisible) and
    to know which metadata it must have seen, never as a column's length. ``resize`` takes a
    record count too and makes each column hold the rows of that many records. Every column
    the store writes today holds one row per record, so rows and records coincide; a column
    stored another way (issue #14: a ragged leaf's values stored flat, with offsets, whose
    length is not the record count) is added behind these same calls, by the backend that
    stores it, without changing this Protocol.

Example:
    >>> from pytreestore.backends import ConditionalWrites, KeyListing, TensorStoreBackend
    >>> from pytreestore._location import Location
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-backend"))
    >>> backend.write_bytes("note", b"hi"); backend.read_bytes("note")
    b'hi'
    >>> isinstance(backend, ConditionalWrites), isinstance(backend, KeyListing)
    (True, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pytreestore._format.keys import META_DIR
from pytreestore.backends._errors import MissingChunkError as MissingChunkError
from pytreestore.backends._errors import damaged_chunk as damaged_chunk
from pytreestore.backends._errors import missing_chunk as missing_chunk
from pytreestore.backends._errors import symlink_loop as symlink_loop
from pytreestore.errors import PyTreeStoreError


@dataclasses.dataclass(frozen=True)
class ColumnLayout:
    """How one column is laid out on disk.

    Attributes:
        key: storage key below the store root.
        dtype: element dtype.
        shape: per-record shape.
        chunks: chunk shape, record axis first.
        codec: ``"zstd"``, ``"blosc"``, ``"gzip"`` or None.
        dimension_names: zarr ``dimension_names``, ``"record"`` first.
        fill_value: zarr ``fill_value`` JSON.
        inner: records per inner chunk: each chunk is then a zarr v3 shard
            (``sharding_indexed``) of inner chunks of that many records, each compressed and
            checksummed on its own; None: plain chunks.
    """

    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    codec: str | None
    dimension_names: tuple[str, ...]
    fill_value: Any
    inner: int | None = None


class ColumnShape(Protocol):
    """What checking a column's array needs: a :class:`ColumnLayout`, or the schema's
    :class:`~pytreestore.ColumnSpec` (so that opening builds no layouts)."""

    @property
    def key(self) -> str: ...

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def chunks(self) -> tuple[int, ...]: ...


@runtime_checkable
class Backend(Protocol):
    """A storage engine under one store root: what every backend does (see the module)."""

    def read_bytes(self, key: str) -> bytes | None:
        """The value at ``key``, or None when absent."""
        ...

    def write_bytes(self, key: str, data: bytes) -> None:
        """Writes ``key`` atomically: readers see the old value or the new one."""
        ...

    def write_many_bytes(self, items: dict[str, bytes]) -> None:
        """Writes several keys concurrently, each atomically (not all together)."""
        ...

    def delete_keys(self, keys: Sequence[str]) -> None:
        """Deletes ``keys`` (absent ones are skipped): markers and chunks past a commit."""
        ...

    def delete_all(self) -> None:
        """Deletes everything below the root."""
        ...

    def is_empty(self) -> bool:
        """Whether nothing lies below the root."""
        ...

    def create_columns(self, layouts: Sequence[ColumnLayout]) -> None:
        """Creates one empty array (record axis of length 0) per layout, and declares it."""
        ...

    def open_columns(self, columns: Sequence[ColumnShape]) -> None:
        """Declares the columns of an existing store, without I/O.

        Each array's metadata is read when its column is first used (for all the columns of
        a call at once) and checked against its column: a data type, shape or chunk shape
        that disagrees, or an array holding fewer records than asked for, raises
        :class:`~pytreestore.errors.CorruptStoreError` naming the array's ``zarr.json``.
        """
        ...

    def column_shapes(self, keys: Sequence[str]) -> list[tuple[int, ...]]:
        """The shapes the arrays' metadata holds now, read again (not from a cache).

        The first axis is the column's length in rows, which may exceed the committed record
        count (a writer's uncommitted tail, trimmed by repair) and is the backend's to report:
        callers never assume it from a record count.
        """
        ...

    def resize(self, keys: Sequence[str], records: int) -> None:
        """Makes every column hold the rows of ``records`` records (metadata only).

        For a column with one row per record (every column today) that sets its first axis
        to ``records``; a backend that stores a column otherwise sets that column's own
        length from ``records``. Never deletes a chunk: shrinking then growing again shows
        the old rows.
        """
        ...

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> None:
        """Writes ``blocks[i]`` at records ``[start, start + len)`` of column ``keys[i]``."""
        ...

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        """Reads the records ``index`` (a slice or int array over ``[0, records)``) of every
        column, one array per key with the record axis first.

        ``records`` is the commit's visible record count: it bounds the read (a slice is
        taken over ``[0, records)``) and says how many records each column must have; it is
        not read as any column's length (see :meth:`column_shapes`). A column whose array
        holds fewer rows than those records raises
        :class:`~pytreestore.errors.CorruptStoreError`.
        """
        ...

    def close(self) -> None:
        """Releases handles."""
        ...


# ---- optional capabilities -------------------------------------------------------------------


@runtime_checkable
class ConditionalWrites(Protocol):
    """Compare-and-swap on single keys: the writer lock on object stores and the conditional
    commit (two writers that both saw commit *n* cannot both write commit *n + 1*).

    A token is opaque bytes naming one value of a key; a missing key's token is
    :data:`~pytreestore._format.keys.NO_VALUE`. Both calls must be atomic against each other across
    processes and machines; a backend that cannot promise that must not have this capability.
    """

    def read_bytes_versioned(self, key: str, /) -> tuple[bytes | None, bytes]:
        """The value at ``key`` (None when absent) and its token."""
        ...

    def write_bytes_if(self, key: str, data: bytes | None, token: bytes, /) -> bytes | None:
        """Writes ``data`` (None: deletes) at ``key`` only if its token is still ``token``.

        Returns:
            The new token, or None when the key had changed and nothing was written.
        """
        ...


@runtime_checkable
class KeyListing(Protocol):
    """Listing keys: lets verify find missing chunks and repair find chunks past a commit."""

    def list_keys(self, prefix: str, /) -> list[str]:
        """Every stored key below the folder ``prefix`` (ending in ``/``), sorted.

        A prefix that does not end in ``/`` is not part of the contract (zarr-python's local
        store lists nothing for it; the S3 backends filter by it).
        """
        ...


@runtime_checkable
class CheckedReads(Protocol):
    """Reading many ``(key, index)`` pairs and collecting each one's damage, for verify."""

    def read_checked(
        self, reads: Sequence[tuple[str, Any]], records: int, /
    ) -> list[PyTreeStoreError | None]:
        """Each read's error (None where it worked); storage failures raise StorageError.

        ``records`` is the commit's visible record count, bounding each read as in
        :meth:`Backend.read`.
        """
        ...


@runtime_checkable
class BatchedReads(Protocol):
    """Reading different indices of different columns in one batch (the sharded load)."""

    def read_many(self, requests: Sequence[tuple[str, Any]], records: int, /) -> list[np.ndarray]:
        """``index`` (a slice or a 1-d int array over ``[0, records)``) of column ``key`` for
        every ``(key, index)``, issued all at once; ``records`` bounds the reads as in
        :meth:`Backend.read`."""
        ...


@runtime_checkable
class PartialReads(Protocol):
    """Reading a range of a column's second axis only (a packed leaf's elements of its pack,
    :mod:`pytreestore.backends._packed`): the output holds only that range, so reading one
    leaf of a wide pack costs memory for the leaf, not for the pack's whole rows."""

    def read_parts(
        self, requests: Sequence[tuple[str, Any, slice | None]], records: int, /
    ) -> list[np.ndarray]:
        """``array[index, part]`` of column ``key`` for every ``(key, index, part)``: ``index``
        over the records as in :meth:`BatchedReads.read_many`, ``part`` a slice (step 1) of
        the first axis after the record axis, or None for all of every other axis; issued
        all at once, damage reported as :meth:`Backend.read` reports it."""
        ...


@runtime_checkable
class ReadsInto(Protocol):
    """Reading rows into arrays the caller owns: a big load onto an accelerator reads its
    pieces into host buffers it reuses (:mod:`pytreestore._read.slabs`), so no fresh
    memory is faulted in for each piece."""

    def read_into(
        self, keys: Sequence[str], index: slice, records: int, outs: Sequence[np.ndarray], /
    ) -> list[np.ndarray]:
        """Rows ``index`` (a slice of step 1 within ``[0, records)``) of each column
        ``keys[i]``, as :meth:`Backend.read` reads them, written into ``outs[i]`` (C-ordered,
        of the column's dtype and of shape ``(rows, *column shape)``). Returns the arrays
        read: ``outs[i]``, or an array of the backend's own where it could not write into
        ``outs[i]`` (the caller uses what is returned). Damage is reported as
        :meth:`Backend.read` reports it; a failed call may have written part of ``outs``."""
        ...


@runtime_checkable
class DirectReads(Protocol):
    """Reads of columns that decode only the small pieces each read needs, at about the cost
    of a copy out of the decoded-chunk cache (a local store's inner chunks, read by the
    direct reader): the read engine reads them without its cache
    (:mod:`pytreestore._read.cache`), whose bookkeeping would cost more than it saves."""

    def reads_directly(self, keys: Sequence[str], /) -> bool:
        """Whether every column of ``keys`` is read that way (False for a column not read
        yet: the backend learns how a column's chunks are laid out when it first reads it)."""
        ...


@runtime_checkable
class PartialWriteCleanup(Protocol):
    """Removing an engine's own leftovers of a killed writer (TensorStore's ``*.__lock``)."""

    def remove_partial_writes(self, keys: Sequence[str], tail_chunk: int, /) -> list[str]:
        """Deletes what a killed writer left in columns ``keys`` from chunk row ``tail_chunk``
        on (and in the store's own files); the paths removed. Only the lock holder calls it."""
        ...


@runtime_checkable
class Transactions(Protocol):
    """Atomic commits over many keys and arrays: a commit's resizes, chunk writes, version
    record, commit record and root land together or not at all (TensorStore's OCDBT kvstore
    with one writer; not through an OCDBT coordinator, where TensorStore refuses a
    transaction over two keys, so that backend does not declare it).

    A backend declares this only if its blocks really are atomic: the store then relies on
    it (one commit, one step; a failed root write fails the commit). The store wraps each
    commit in :func:`pytreestore._log.committer.atomic`, which enters :meth:`transaction`
    when a backend has this capability and does nothing otherwise (the writes then land one
    by one, in the commit protocol's order). The conformance suite checks the promise
    (:mod:`pytreestore.testing.capabilities`).
    """

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """A block whose writes through this backend (``write_bytes``, ``write_many_bytes``,
        ``write_bytes_if``, ``delete_keys``, ``resize``, ``write``) commit as one atomic step
        when it exits normally, and none of them when it raises: until it exits, another
        backend on the same store (another process) sees none of them; after, all. Reads
        inside the block see its own bytes, deletions and resizes; the chunk data it wrote
        is read once it has committed (TensorStore 0.1.86, with ``fill_missing_data_reads``
        false so that a lost chunk is an error, reports a chunk written in an open
        transaction as missing when read there; the store never reads one back in the block
        that wrote it). Re-entrant: a block inside another joins the outer one.

        A conditional write (``write_bytes_if``) inside the block whose token is stale
        returns None at once (the caller gives the block up by raising), or, when the token
        goes stale only before the block commits, makes the block's exit raise
        :class:`~pytreestore.errors.CommitConflictError` with nothing of the block landed;
        so two writers can never both commit.
        """
        ...


@runtime_checkable
class ChunkCopies(Protocol):
    """Placing stored objects at other keys as they are, encoded, without decoding them: how
    a fragment's chunks become the store's (:mod:`pytreestore._fragments.fastpath`).

    Locally a hard link (no byte is copied); in an OCDBT database a copy of the key's entry
    (its value is not rewritten); elsewhere a copy of the raw bytes. The source stays as it
    was. Inside a :class:`Transactions` block the writes join the transaction.
    """

    def copy_chunks(self, pairs: Sequence[tuple[str, str]], /) -> None:
        """Places the object at each ``(source, destination)`` pair's source key at its
        destination key (replacing what is there), all before returning, durably.

        Raises:
            CorruptChunkError: a source key holds nothing (its ``key`` names it); the
                destinations placed before are left (they lie past the commit).
            StorageError: storage failed.
        """
        ...


@runtime_checkable
class ManyReads(Protocol):
    """Reading many small objects at once (fragments' descriptions before their commit)."""

    def read_many_bytes(self, keys: Sequence[str], /) -> list[bytes | None]:
        """The value at each key (None where absent), all read at once.

        Raises:
            StorageError: storage failed.
        """
        ...


@runtime_checkable
class FolderDeletes(Protocol):
    """Deleting every key below some folders at once, without listing them first (committed
    and abandoned fragments): TensorStore's ``delete_range``."""

    def delete_folders(self, folders: Sequence[str], /) -> None:
        """Deletes every key below each folder (a key prefix, given without its trailing
        ``/``), all at once. Inside a :class:`Transactions` block the deletions join it.

        Raises:
            StorageError: storage failed.
        """
        ...


@runtime_checkable
class LocalFiles(Protocol):
    """Keys that are plain files: key ``k`` is the file ``<files_root>/k`` (the file kvstore,
    zarr-python's local store; not an OCDBT database, whose keys live inside its files)."""

    @property
    def files_root(self) -> str | None:
        """The local folder holding the keys as files, or None where they are not files."""
        ...


@runtime_checkable
class Snapshots(Protocol):
    """Every storage generation kept and readable (TensorStore's OCDBT kvstore, both OCDBT
    backends): a store version opened with ``open(path, version=N)`` reads the generation
    whose commit record first names it, so its rows are pinned by the storage itself
    (:mod:`pytreestore._log.commit_record`). Generations count up, and a commit record only
    ever names higher versions in later generations. Nothing written is ever reclaimed by
    deleting keys: a deleted key is gone from later generations only."""

    def latest_generation(self) -> int:
        """The newest storage generation's number (generations count up from 1; 0: none)."""
        ...

    def at_generation(self, generation: int, /) -> Backend:
        """A read-only backend of the store as generation ``generation`` left it, with this
        backend's columns declared; its writes raise
        :class:`~pytreestore.errors.ReadOnlyError`."""
        ...


@runtime_checkable
class TensorStoreKvStore(Protocol):
    """The engine's TensorStore key-value store (sizes of in-memory stores in ``repr``)."""

    @property
    def kvstore(self) -> Any:
        """An open ``tensorstore.KvStore`` at the store root."""
        ...


def delete_folder(root: str) -> None:
    """Deletes a store's folder, its ``.pytreestore`` folder last: a deletion cut off midway
    leaves the commit record (or the copy marker), so the rest is still known as a store and
    ``overwrite=True`` can replace it."""
    folder = Path(root)
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name != META_DIR:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)
