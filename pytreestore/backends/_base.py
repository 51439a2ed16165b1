"""The interface a storage engine implements.

A backend knows keys, bytes and chunked arrays; it knows nothing of trees or commits. Every
multi-column call issues its I/O for all columns at once and waits for all of it.

Example:
    >>> from pytreestore.backends import TensorStoreBackend
    >>> from pytreestore._location import Location
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-backend"))
    >>> backend.write_bytes("note", b"hi"); backend.read_bytes("note")
    b'hi'
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pytreestore._names import META_DIR, chunk_key
from pytreestore.errors import CorruptChunkError


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
    """

    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    codec: str | None
    dimension_names: tuple[str, ...]
    fill_value: Any


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


class Backend(Protocol):
    """A storage engine under one store root."""

    def read_bytes(self, key: str) -> bytes | None:
        """The value at ``key``, or None when absent."""
        ...

    def write_bytes(self, key: str, data: bytes) -> None:
        """Writes ``key`` atomically: readers see the old value or the new one."""
        ...

    def write_many_bytes(self, items: dict[str, bytes]) -> None:
        """Writes several keys concurrently, each atomically (not all together)."""
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
        """The shapes the arrays' metadata holds now."""
        ...

    def resize(self, keys: Sequence[str], records: int) -> None:
        """Sets the record axis of every array to ``records`` (metadata only)."""
        ...

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> None:
        """Writes ``blocks[i]`` at records ``[start, start + len)`` of column ``keys[i]``."""
        ...

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        """Reads ``index`` (a slice or int array over ``[0, records)``) of every column."""
        ...

    def close(self) -> None:
        """Releases handles."""
        ...


def missing_chunk(column: str, chunk: tuple[int, ...] | None, why: object) -> CorruptChunkError:
    """The error of a committed chunk of ``column`` (a storage key) whose object is gone: its
    records are lost, and are never read as the fill value (zeros)."""
    key = chunk_key(column, chunk) if chunk else None
    where = f"chunk {chunk} ({key})" if chunk else "a chunk"
    return CorruptChunkError(
        f"column {column}: {where} is missing, so committed records in it cannot be read "
        f"({why}); they are not returned as zeros. Restore the chunk from a backup, or copy "
        "the records before it to a new store. Run store.verify() to list every problem.",
        path=column,
        chunk=chunk,
        key=key,
    )


def damaged_chunk(column: str, chunk: tuple[int, ...] | None, why: object) -> CorruptChunkError:
    """The error of a chunk of ``column`` (a storage key) that cannot be read, naming the chunk
    and its key when known; every backend raises it in these words."""
    key = chunk_key(column, chunk) if chunk else None
    where = f"chunk {chunk} ({key})" if chunk else "a chunk"
    return CorruptChunkError(
        f"column {column}: {where} is damaged and cannot be read ({why}). "
        "Run store.verify() to list every damaged chunk.",
        path=column,
        chunk=chunk,
        key=key,
    )


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
