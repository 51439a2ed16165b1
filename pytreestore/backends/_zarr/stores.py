"""The zarr stores under the zarr backend: durable local files, shared in-memory dicts, and
reads that refuse a missing chunk.

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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest, Store
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.storage import LocalStore, MemoryStore, WrapperStore

from pytreestore._format.names import CHUNK_KEY_PATTERN
from pytreestore._location import Location
from pytreestore.backends._base import missing_chunk
from pytreestore.errors import BadLocationError

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


__all__ = ["ChunksRequired", "DurableLocalStore", "durable_put", "memory_dict", "open_local_store"]
