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
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np


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
        """Creates one empty array (record axis of length 0) per layout."""
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
