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
        "codecs": _codecs(layout),
        "dimension_names": list(layout.dimension_names),
    }


def _codecs(layout: ColumnLayout) -> list[dict[str, Any]]:
    """A column's codec chain: :func:`codec_json`, or, with inner chunks, one
    ``sharding_indexed`` codec applying it to each inner chunk, whose index (at the end of
    the shard, the zarr v3 default) is checksummed too."""
    chain = codec_json(layout.codec, layout.dtype)
    if layout.inner is None:
        return chain
    configuration = {
        "chunk_shape": [layout.inner, *layout.chunks[1:]],
        "codecs": chain,
        "index_codecs": [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "crc32c"},
        ],
    }
    return [{"name": "sharding_indexed", "configuration": configuration}]


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


__all__ = ["array_document", "array_metadata", "codec_json", "encode_document"]
