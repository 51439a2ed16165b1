"""The zarr v3 metadata of a column, shared by both backends (it imports no storage engine).

Example:
    >>> import numpy as np
    >>> from pytreestore.backends import ColumnLayout
    >>> layout = ColumnLayout("x", np.dtype("int32"), (3,), (4, 3), "zstd", ("record", "x0"), 0)
    >>> meta = array_metadata(layout)
    >>> meta["shape"], meta["data_type"], [c["name"] for c in meta["codecs"]]
    ([0, 3], 'int32', ['bytes', 'zstd', 'crc32c'])
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from pytreestore._format import compression as _compression
from pytreestore.backends._base import ColumnLayout


def array_metadata(layout: ColumnLayout) -> dict[str, Any]:
    """The zarr v3 array metadata of an empty column (record axis of length 0).

    Example:
        >>> layout = ColumnLayout("x", np.dtype("uint8"), (), (8,), None, ("record",), 0)
        >>> array_metadata(layout)["chunk_grid"]
        {'name': 'regular', 'configuration': {'chunk_shape': [8]}}
    """
    return {
        "shape": [0, *layout.shape],
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(layout.chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "data_type": layout.dtype.name,
        "fill_value": layout.fill_value,
        "codecs": _codecs(layout),
        "dimension_names": list(layout.dimension_names),
    }


def _codecs(layout: ColumnLayout) -> list[dict[str, Any]]:
    """A column's codec chain (:func:`pytreestore._format.compression.chain`): plain chunks,
    or shards of inner chunks of ``layout.inner`` records."""
    inner = None if layout.inner is None else (layout.inner, *layout.chunks[1:])
    return _compression.chain(_compression.stored(layout.codec), layout.dtype, inner)


def array_document(layout: ColumnLayout, records: int) -> dict[str, Any]:
    """A column's ``zarr.json`` holding ``records`` records, exactly as the TensorStore
    backend writes it (the zarr backend writes it byte for byte the same).

    Example:
        >>> layout = ColumnLayout("x", np.dtype("int8"), (), (8,), None, ("record",), 0)
        >>> doc = array_document(layout, 5)
        >>> doc["shape"], doc["codecs"][0], doc["chunk_key_encoding"]
        ([5], {'name': 'bytes'}, {'name': 'default'})
    """
    meta = array_metadata(layout)
    encoding = meta["chunk_key_encoding"]
    if encoding.get("configuration") == {"separator": "/"}:  # the default; TensorStore omits it
        encoding = {"name": encoding["name"]}
    codecs = _as_written(meta["codecs"], layout.dtype)
    return {
        **meta,
        "codecs": codecs,
        "chunk_key_encoding": encoding,
        "shape": [records, *layout.shape],
        "node_type": "array",
        "zarr_format": 3,
    }


def _as_written(codecs: list[dict[str, Any]], dtype: np.dtype) -> list[dict[str, Any]]:
    """``codecs`` as TensorStore writes them: the endianness of one-byte types dropped, also
    in a shard's inner chunks (the index keeps it: its entries are 8-byte integers)."""
    out = []
    for c in codecs:
        if c["name"] == "bytes" and dtype.itemsize == 1:
            c = {"name": "bytes"}
        elif c["name"] == "sharding_indexed":
            inner = _as_written(c["configuration"]["codecs"], dtype)
            c = {**c, "configuration": {**c["configuration"], "codecs": inner}}
        out.append(c)
    return out


def encode_document(document: dict[str, Any]) -> bytes:
    """JSON the way TensorStore writes ``zarr.json``: sorted keys, no spaces, UTF-8.

    Example:
        >>> encode_document({"b": 1, "a": "é"})
        b'{"a":"\xc3\xa9","b":1}'
    """
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


__all__ = ["array_document", "array_metadata", "encode_document"]
