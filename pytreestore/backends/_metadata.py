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

from pytreestore.backends._base import ColumnLayout


def codec_json(codec: str | None, dtype: np.dtype) -> list[dict[str, Any]]:
    """zarr v3 codec chain for ``codec``, ending in a ``crc32c`` checksum of every chunk.

    Example:
        >>> codec_json(None, np.dtype("float32"))
        [{'name': 'bytes', 'configuration': {'endian': 'little'}}, {'name': 'crc32c'}]
    """
    return [*_compression_chain(codec, dtype), {"name": "crc32c"}]


def _compression_chain(codec: str | None, dtype: np.dtype) -> list[dict[str, Any]]:
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
        "codecs": codec_json(layout.codec, layout.dtype),
        "dimension_names": list(layout.dimension_names),
    }


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
    codecs = [
        {"name": "bytes"} if c["name"] == "bytes" and layout.dtype.itemsize == 1 else c
        for c in meta["codecs"]
    ]  # TensorStore drops the endianness of one-byte types
    return {
        **meta,
        "codecs": codecs,
        "chunk_key_encoding": encoding,
        "shape": [records, *layout.shape],
        "node_type": "array",
        "zarr_format": 3,
    }


def encode_document(document: dict[str, Any]) -> bytes:
    """JSON the way TensorStore writes ``zarr.json``: sorted keys, no spaces, UTF-8.

    Example:
        >>> encode_document({"b": 1, "a": "é"})
        b'{"a":"\xc3\xa9","b":1}'
    """
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


__all__ = ["array_document", "array_metadata", "codec_json", "encode_document"]
