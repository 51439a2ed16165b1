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

import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from pytreestore._location import Location
from pytreestore.backends._base import ColumnLayout

_MEMORY: dict[str, Any] = {}
_MEMORY_LOCK = threading.Lock()


def _memory_context() -> ts.Context:
    """One context for every ``memory://`` store of this process, so reopening finds the data."""
    with _MEMORY_LOCK:
        if "context" not in _MEMORY:
            _MEMORY["context"] = ts.Context()
        return _MEMORY["context"]


def codec_json(codec: str | None, dtype: np.dtype) -> list[dict[str, Any]]:
    """zarr v3 codec chain for ``codec``."""
    chain: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if codec is None:
        return chain
    if codec == "zstd":
        chain.append({"name": "zstd", "configuration": {"level": 3, "checksum": False}})
    elif codec == "gzip":
        chain.append({"name": "gzip", "configuration": {"level": 5}})
    elif codec == "blosc":
        chain.append(
            {
                "name": "blosc",
                "configuration": {
                    "cname": "lz4",
                    "clevel": 5,
                    "shuffle": "shuffle",
                    "typesize": dtype.itemsize,
                    "blocksize": 0,
                },
            }
        )
    else:
        raise ValueError(f"unknown codec {codec!r}; choose 'zstd', 'blosc', 'gzip' or None")
    return chain


def array_metadata(layout: ColumnLayout) -> dict[str, Any]:
    """The zarr v3 array metadata of an empty column."""
    return {
        "shape": [0, *layout.shape],
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(layout.chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "data_type": layout.dtype.name,
        "fill_value": layout.fill_value,
        "codecs": codec_json(layout.codec, layout.dtype),
        "dimension_names": list(layout.dimension_names),
    }


class TensorStoreBackend:
    """Columns as TensorStore ``zarr3`` arrays on the ``file`` or ``memory`` kvstore."""

    def __init__(self, location: Location) -> None:
        self._location = location
        if location.kind == "memory":
            self._context = _memory_context()
            self._kv_spec: dict[str, Any] = {"driver": "memory", "path": location.root + "/"}
        else:
            self._context = ts.Context()
            self._kv_spec = {"driver": "file", "path": location.root + "/"}
        self._kv: ts.KvStore | None = None
        self._handles: dict[str, ts.TensorStore] = {}

    # ---- keys and bytes ----------------------------------------------------------------------

    @property
    def kvstore(self) -> ts.KvStore:
        if self._kv is None:
            self._kv = ts.KvStore.open(self._kv_spec, context=self._context).result()
        return self._kv

    def read_bytes(self, key: str) -> bytes | None:
        result = self.kvstore.read(key).result()
        return bytes(result.value) if result.state == "value" else None

    def write_bytes(self, key: str, data: bytes) -> None:
        self.kvstore.write(key, data).result()

    def write_many_bytes(self, items: dict[str, bytes]) -> None:
        futures = [self.kvstore.write(k, v) for k, v in items.items()]
        for fut in futures:
            fut.result()

    def delete_all(self) -> None:
        self._handles.clear()
        if self._location.kind == "file":
            shutil.rmtree(self._location.root, ignore_errors=True)
        else:
            self.kvstore.delete_range(ts.KvStore.KeyRange()).result()

    def is_empty(self) -> bool:
        if self._location.kind == "file":
            root = Path(self._location.root)
            return not root.exists() or not any(root.iterdir())
        return not self.kvstore.list().result()

    # ---- columns -----------------------------------------------------------------------------

    def _spec(self, key: str) -> dict[str, Any]:
        kv = dict(self._kv_spec, path=self._kv_spec["path"] + key + "/")
        return {"driver": "zarr3", "kvstore": kv}

    def create_columns(self, layouts: Sequence[ColumnLayout]) -> None:
        futures = [
            ts.open(
                dict(self._spec(lay.key), metadata=array_metadata(lay)),
                create=True,
                context=self._context,
            )
            for lay in layouts
        ]
        for lay, fut in zip(layouts, futures):
            self._handles[lay.key] = fut.result()

    def _open(self, keys: Sequence[str], records: int = 0) -> list[ts.TensorStore]:
        """Handles for ``keys`` whose domain covers ``records``, (re)opened concurrently."""
        stale = [k for k in keys if k not in self._handles or self._handles[k].shape[0] < records]
        futures = [ts.open(self._spec(k), context=self._context) for k in stale]
        for key, fut in zip(stale, futures):
            self._handles[key] = fut.result()
        return [self._handles[k] for k in keys]

    def column_shapes(self, keys: Sequence[str]) -> list[tuple[int, ...]]:
        for k in keys:
            self._handles.pop(k, None)
        return [tuple(h.shape) for h in self._open(keys)]

    def resize(self, keys: Sequence[str], records: int) -> None:
        handles = self._open(keys)
        futures = [
            h.resize(exclusive_max=[records] + [None] * (h.rank - 1), resize_metadata_only=True)
            if h.shape[0] != records
            else None
            for h in handles
        ]
        for key, fut in zip(keys, futures):
            if fut is not None:
                self._handles[key] = fut.result()

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> None:
        handles = self._open(keys, start + (len(blocks[0]) if blocks else 0))
        futures = [h[start : start + len(b)].write(b) for h, b in zip(handles, blocks)]
        for fut in futures:
            fut.result()

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        handles = self._open(keys, records)
        with ts.Batch() as batch:
            futures = [h[index].read(batch=batch) for h in handles]
        return [f.result() for f in futures]

    def close(self) -> None:
        self._handles.clear()
        self._kv = None
