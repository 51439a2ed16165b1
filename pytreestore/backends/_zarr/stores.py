"""The zarr stores under the zarr backend, the event loop it runs zarr-python's coroutines on, and its dtypes.

zarr-python data types for the ml_dtypes floats: bfloat16 and the float8 family.

They live in the top-level module :mod:`pytreestore_zarr_dtypes` of the same distribution,
which zarr-python loads from an entry point without importing pytreestore (docs/interop.md);
this module is their name inside the package. pytreestore's zarr backend calls
:func:`register`; an installed pytreestore also registers them in every zarr-python process.

Example:
    >>> from zarr.core.dtype import data_type_registry
    >>> register()
    >>> data_type_registry.get("bfloat16") is DTYPES["bfloat16"], NAMES[0]
    (True, 'bfloat16')

Running zarr-python's coroutines from the zarr backends' synchronous calls.

zarr-python's files and codecs work in its event loop's default executor
(``asyncio.to_thread``), a ``ThreadPoolExecutor``, which refuses new work once the interpreter
exits (``concurrent.futures`` shuts down before any ``atexit`` hook runs): the chunks a store
commits at the exit (its last flush, the chunks handed to the background writer) failed with
"cannot schedule new futures after shutdown". So the loop's default executor is an
:class:`ExitSafePool`, which then runs the work on the loop's own thread.

Example:
    >>> import asyncio
    >>> async def one(x): return x
    >>> run(gather(one(i) for i in range(3)), "counting")
    [0, 1, 2]

obstore in a forked child: a clear error before a call that would hang.

The zarr backend reaches ``s3://`` and ``http(s)://`` stores through obstore, whose requests
run on a tokio runtime: threads that ``os.fork`` does not copy. A child forked from a process
that had used obstore waits forever on its first request (obstore's maintainers: "obstore is
not fork safe"). Every call of those backends that issues I/O first asks :func:`check`, which
raises :class:`~pytreestore.errors.ForkedBackendError` in such a child instead. A child whose
parent never used obstore starts its own runtime and works.

Example:
    >>> check("s3://my-bucket/doc-fork")  # in the process that used obstore: nothing to say

The zarr stores under the zarr backend: durable local files, shared in-memory dicts, reads
that refuse a missing chunk, and reads that see one version of each object.

Example:
    >>> from pytreestore._location import Location
    >>> type(open_local_store(Location.parse("memory://doc-stores"))).__name__
    'MemoryStore'
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import zarr
from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.sync import sync
from zarr.storage import LocalStore, MemoryStore, WrapperStore

from pytreestore._format.keys import CHUNK_KEY_PATTERN
from pytreestore._location import Location
from pytreestore._runtime import RUNTIME, ExitSafePool
from pytreestore.backends._base import missing_chunk, symlink_loop
from pytreestore.backends._errors import ForkGuard
from pytreestore.errors import BadLocationError, PyTreeStoreError, StorageError
from pytreestore_zarr_dtypes import DTYPES, NAMES, MLFloat, register

_T = TypeVar("_T")


#: the event loops whose default executor is an ExitSafePool
_SAFE: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


async def _exit_safe(coroutine: Awaitable[_T]) -> _T:
    """Awaits ``coroutine`` on a loop whose default executor is an :class:`ExitSafePool`."""
    loop = asyncio.get_running_loop()
    if loop not in _SAFE:
        workers = zarr.config.get("threading.max_workers", None)
        loop.set_default_executor(RUNTIME.loop_pool(workers))
        _SAFE.add(loop)
    return await coroutine


async def gather(aws: Iterable[Awaitable[_T]]) -> list[_T]:
    """Awaits every awaitable at once; their results in order."""
    return list(await asyncio.gather(*aws))


async def settle(aws: Iterable[Awaitable[_T]]) -> list[_T]:
    """Awaits every awaitable at once; their results in order, or, once every one has ended,
    the first error (what they hold may be released after this returns)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


async def collect(items: AsyncIterator[_T]) -> list[_T]:
    """Every item of an async iterator, in a list."""
    return [item async for item in items]


def run(
    coroutine: Awaitable[_T], doing: str, errors: tuple[type[Exception], ...] = (OSError,)
) -> _T:
    """Runs ``coroutine`` on zarr-python's event loop and waits for it.

    Raises:
        StorageError: storage refused a request (disk full, server down, ...): any of
            ``errors`` (``OSError``, and obstore's errors on S3).
    """
    try:
        return sync(_exit_safe(coroutine))
    except PyTreeStoreError:
        raise
    except errors as err:
        loop = symlink_loop(doing, err)
        if loop is not None:
            raise loop from err
        brief = str(err).split("\n\nDebug source:", 1)[0]  # obstore appends a Rust dump
        raise StorageError(
            f"{doing} failed: {brief}. Records committed before stay committed; once storage "
            "is reachable (or has space) again, retry the call (a failed flush() can be "
            "repeated)."
        ) from err


#: raises ForkedBackendError in a child forked from a process that had used obstore
check = ForkGuard(
    "obstore",
    ", which the zarr backend reads s3:// and http(s):// stores with",
    "its requests would wait forever",
    "",
).check


_MEMORY: dict[str, dict[str, Buffer]] = {}


_MEMORY_LOCK = threading.Lock()


class ChunksRequired(WrapperStore[Store]):
    """A store whose missing chunks raise :class:`CorruptChunkError` instead of reading as
    the fill value: every chunk of a pytreestore column is stored (all-zero ones too), so a
    missing one below the committed count is lost data. Used for reads only (a write of a new
    tail chunk legitimately finds none)."""

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        value = await self._store.get(key, prototype, byte_range)
        if value is None:
            _raise_missing(key)
        return value

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        ranges = list(key_ranges)
        values = await self._store.get_partial_values(prototype, ranges)
        for (key, _), value in zip(ranges, values):
            if value is None:
                _raise_missing(key)
        return values


class PinnedReads(WrapperStore[Store]):
    """The store as one read sees it: every ranged read of a key (a shard's index, then its
    inner chunks, each a read of its own) reads the object that the first of them found, so a
    writer's rename between them cannot pair one version's index with another's inner chunks
    (a false checksum failure, or an inner chunk missed and read as the fill value).

    On local disk the first ranged read opens the file and the later ones read that open file
    (a rename leaves it as it was); past ``RUNTIME.reads.open_files`` open files a read takes the
    whole
    object's bytes instead. In memory the first read takes the key's value (values are never
    changed in place). Elsewhere (S3, HTTP) reads pass through: the backend reads again once
    when a checksum fails. Whole-object reads of keys not read by ranges pass through
    everywhere (one read sees one version). Made for one read; :meth:`release` after it.
    """

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self._local = isinstance(store, LocalStore)
        self._pinned = self._local or isinstance(store, MemoryStore)
        self._files: dict[str, int | None] = {}  # open files, by key (None: absent)
        self._values: dict[str, bytes | None] = {}  # whole objects, by key (None: absent)

    async def get(
        self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        if not self._pinned or (byte_range is None and not self._holds(key)):
            return await self._store.get(key, prototype, byte_range)
        if self._local and key not in self._values:
            raw = await asyncio.to_thread(self._read_file, key, byte_range)
        else:
            whole = await self._value(key, prototype)
            raw = None if whole is None else whole[_bounds(byte_range, len(whole))]
        return None if raw is None else prototype.buffer.from_bytes(raw)

    def release(self) -> None:
        """Closes the files this read opened, and forgets what it pinned."""
        files, self._files = self._files, {}
        self._values = {}
        for fd in files.values():
            if fd is not None:
                os.close(fd)

    def _holds(self, key: str) -> bool:
        return key in self._files or key in self._values

    async def _value(self, key: str, prototype: BufferPrototype) -> bytes | None:
        if key not in self._values:
            value = await self._store.get(key, prototype)
            self._values.setdefault(key, None if value is None else value.to_bytes())
        return self._values[key]

    def _read_file(self, key: str, byte_range: ByteRequest | None) -> bytes | None:
        """``byte_range`` of the file at ``key`` as this read first opened it (runs in a
        worker thread; the event loop's coroutines share the dict of open files)."""
        if key not in self._files:
            if len(self._files) >= RUNTIME.reads.open_files:
                root = Path(self._store.root)  # type: ignore[attr-defined]
                # the first whole read of the key is the one every read of it sees
                whole = self._values.setdefault(key, _read_whole(root / key))
                return None if whole is None else whole[_bounds(byte_range, len(whole))]
            fd = _open_file(Path(self._store.root) / key)  # type: ignore[attr-defined]
            if self._files.setdefault(key, fd) != fd and fd is not None:
                os.close(fd)  # another read of the key opened it first
        fd = self._files[key]
        if fd is None:
            return None
        size = os.fstat(fd).st_size
        bounds = _bounds(byte_range, size)
        return os.pread(fd, max(0, min(bounds.stop, size) - bounds.start), bounds.start)


def _open_file(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None


def _read_whole(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _bounds(byte_range: ByteRequest | None, size: int) -> slice:
    """The bytes ``byte_range`` asks of an object of ``size`` bytes (as zarr's stores read
    them: a range past the end is cut short)."""
    if byte_range is None:
        return slice(0, size)
    if isinstance(byte_range, RangeByteRequest):
        return slice(byte_range.start, byte_range.end)
    if isinstance(byte_range, OffsetByteRequest):
        return slice(byte_range.offset, size)
    if isinstance(byte_range, SuffixByteRequest):
        return slice(max(0, size - byte_range.suffix), size)
    raise TypeError(f"unexpected byte range {byte_range!r}")


def _raise_missing(key: str) -> None:
    found = CHUNK_KEY_PATTERN.match(key)
    if found:
        chunk = tuple(int(i) for i in found.group(2).split("/"))
        raise missing_chunk(found.group(1), chunk, f"no object at {key}")


def open_local_store(location: Location) -> Store:
    """The zarr store of a local (``file``) or ``memory://`` location.

    Raises:
        BadLocationError: ``location`` is on S3 (that is :class:`ZarrS3Backend`'s; backend="zarr"
            picks it), or anywhere else the zarr backends do not store.
    """
    if location.kind == "memory":
        return MemoryStore(store_dict=memory_dict(location.root))
    if location.kind == "file":
        return DurableLocalStore(location.root)
    if location.kind == "s3":
        raise BadLocationError(
            f"ZarrBackend stores on local disk and memory://, not at {location}; on S3 the "
            "zarr backend is ZarrS3Backend, which backend='zarr' picks for s3:// locations"
        )
    raise BadLocationError(
        f"the zarr backend stores on local disk, memory:// and s3:// only, not at {location}; "
        "use backend='tensorstore' there"
    )


def memory_dict(name: str) -> dict[str, Buffer]:
    """The dict of the ``memory://NAME`` zarr store, shared per process by name."""
    with _MEMORY_LOCK:
        return _MEMORY.setdefault(name, {})


class DurableLocalStore(LocalStore):
    """zarr-python's ``LocalStore`` with durable atomic writes, and no directory created
    before the first write.

    ``LocalStore`` already writes a temporary file and renames it; this one also fsyncs the
    file before the rename and the directory after it, as TensorStore's ``file`` kvstore does,
    so that a commit record never reaches the disk before the chunks it counts.
    """

    async def _open(self, *, mode: Any = None) -> None:
        self._is_open = True  # reading a missing store must not create its directory

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        self._check_writable()
        await asyncio.to_thread(durable_put, self.root / key, value.to_bytes(), exclusive)


def durable_put(path: Path, data: bytes, exclusive: bool = False) -> None:
    """Writes ``path`` atomically and durably: temp file, fsync, rename, fsync of the folder.

    With ``exclusive``, an existing ``path`` is left alone (``FileExistsError`` is swallowed
    by the caller, as zarr-python's ``set_if_not_exists`` expects).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


__all__ = [
    "DTYPES",
    "NAMES",
    "ChunksRequired",
    "DurableLocalStore",
    "ExitSafePool",
    "MLFloat",
    "PinnedReads",
    "check",
    "collect",
    "durable_put",
    "gather",
    "memory_dict",
    "open_local_store",
    "register",
    "run",
    "settle",
]
