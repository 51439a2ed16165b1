"""A store's codec as a value: the one registry from a codec to its zarr v3 codec chain, and back.

A store compresses every column with one codec, named in its schema (``"codec"``) and by
``create(codec=)``, ``copy(codec=)`` and ``pytreestore copy --codec``. Each :class:`Codec`
registered in :data:`CODECS` says which zarr v3 codec follows ``bytes`` (little-endian) in a
column's chunks, with its configuration; ``crc32c`` ends every chain. :func:`chain` writes the
chain of a column's ``zarr.json`` (one ``sharding_indexed`` codec around it with inner
chunks); :func:`parse` reads one back, for the direct reader (plain chunks are read as files)
and ``verify`` (unchecksummed chunks are reported). Adding a codec, or an option of one (a
zstd level), is one entry here, its row in docs/format.md and a test.

Example:
    >>> import numpy as np
    >>> [c["name"] for c in chain(named("zstd"), np.dtype("float32"))]
    ['bytes', 'zstd', 'crc32c']
    >>> parse(chain(named(None), np.dtype("int8")), np.dtype("int8")).plain
    True
    >>> named("lzma")
    Traceback (most recent call last):
    pytreestore.errors.ArgumentError: unknown codec 'lzma'; choose 'zstd', 'blosc', 'gzip' or None
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from pytreestore.errors import ArgumentError, FormatVersionError

#: in a compressor's configuration, stands for the column's itemsize (blosc's ``typesize``)
ITEMSIZE = "<itemsize>"
#: ``create(codec=)``'s default
DEFAULT = "zstd"
_BYTES = MappingProxyType({"name": "bytes", "configuration": {"endian": "little"}})
_CRC32C = MappingProxyType({"name": "crc32c"})


@dataclasses.dataclass(frozen=True)
class Codec:
    """A codec of the format: how every chunk of every column of a store is compressed.

    Attributes:
        name: the codec's name in the schema and in ``create(codec=)``; None: uncompressed.
        compressor: the zarr v3 codec that follows ``bytes``, its ``name`` and
            ``configuration``, with :data:`ITEMSIZE` where the column's itemsize goes; None:
            none (the chunk is its elements' bytes, then their checksum).
    """

    name: str | None
    compressor: Mapping[str, Any] | None = None

    def compressor_json(self, dtype: np.dtype) -> dict[str, Any] | None:
        """The compressor's zarr v3 JSON for a column of ``dtype`` (None: no compressor)."""
        if self.compressor is None:
            return None
        config = {
            k: dtype.itemsize if v == ITEMSIZE else v
            for k, v in self.compressor["configuration"].items()
        }
        return {"name": self.compressor["name"], "configuration": config}

    def chunk_chain(self, dtype: np.dtype) -> list[dict[str, Any]]:
        """The zarr v3 codecs of one (inner) chunk: ``bytes``, the compressor, ``crc32c``."""
        compressor = self.compressor_json(dtype)
        middle = [] if compressor is None else [compressor]
        return [_json(_BYTES), *middle, _json(_CRC32C)]


def _json(codec: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh, mutable copy of a codec's JSON (callers may edit what they are given)."""
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in codec.items()}


def _codec(name: str | None, compressor: str | None = None, **configuration: Any) -> Codec:
    if compressor is None:
        return Codec(name)
    return Codec(name, MappingProxyType({"name": compressor, "configuration": configuration}))


#: every codec the format names, the default first, by name (docs/format.md, "codec")
CODECS: Mapping[str | None, Codec] = MappingProxyType(
    {
        c.name: c
        for c in (
            _codec("zstd", "zstd", level=3, checksum=False),
            _codec(
                "blosc",
                "blosc",
                cname="lz4",
                clevel=5,
                shuffle="shuffle",
                typesize=ITEMSIZE,
                blocksize=0,
            ),
            _codec("gzip", "gzip", level=5),
            _codec(None),
        )
    }
)


def choices() -> str:
    """The registered names as a message lists them: ``'zstd', 'blosc', 'gzip' or None``."""
    names = [repr(name) for name in CODECS]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _lookup(name: Any) -> Codec | None:
    """The codec called ``name`` (a str, or None), or None (an unhashable ``name`` too)."""
    if name is not None and not isinstance(name, str):
        return None
    return CODECS.get(name)


def named(name: Any) -> Codec:
    """The codec a caller asked for (``create``, ``copy``, the CLI) by ``name``.

    Raises:
        ArgumentError: no codec is called ``name``; the message lists the choices.
    """
    codec = _lookup(name)
    if codec is None:
        raise ArgumentError(f"unknown codec {name!r:.80}; choose {choices()}")
    return codec


def stored(name: Any) -> Codec:
    """The codec a store's schema names, to write new columns with.

    Raises:
        FormatVersionError: this pytreestore knows no codec called ``name`` (a newer one
            wrote the store): its arrays can be read, new ones cannot be made.
    """
    codec = _lookup(name)
    if codec is None:
        raise FormatVersionError(
            f"the store's schema names the codec {name!r:.80}, which this pytreestore does "
            f"not write (it writes {choices()}); a newer pytreestore made the store: upgrade "
            "pytreestore to add columns to it (reading it needs no upgrade)"
        )
    return codec


def chain(
    codec: Codec, dtype: np.dtype, inner: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """The zarr v3 ``codecs`` of a column of ``dtype`` compressed with ``codec``: its
    :meth:`~Codec.chunk_chain`, or, with ``inner`` (an inner chunk's shape), one
    ``sharding_indexed`` codec applying that chain to each inner chunk, whose index (at the
    end of the shard, the zarr v3 default) is checksummed too.

    Example:
        >>> chain(named(None), np.dtype("float32"))
        [{'name': 'bytes', 'configuration': {'endian': 'little'}}, {'name': 'crc32c'}]
    """
    chunk = codec.chunk_chain(dtype)
    if inner is None:
        return chunk
    configuration = {
        "chunk_shape": list(inner),
        "codecs": chunk,
        "index_codecs": [_json(_BYTES), _json(_CRC32C)],
    }
    return [{"name": "sharding_indexed", "configuration": configuration}]


@dataclasses.dataclass(frozen=True)
class Chain:
    """What a column's zarr v3 ``codecs`` say, read back by :func:`parse`.

    Attributes:
        codec: the registered codec whose chain each (inner) chunk has; None: a chain that
            pytreestore does not write (another compressor or configuration, no checksum...).
        sharded: each chunk is a ``sharding_indexed`` shard of inner chunks.
        checksummed: each (inner) chunk ends in a ``crc32c`` checksum.
    """

    codec: Codec | None
    sharded: bool
    checksummed: bool

    @property
    def plain(self) -> bool:
        """Whether each chunk is its elements' little-endian bytes then their ``crc32c``:
        uncompressed, unsharded, checksummed (the direct reader reads such chunks as files)."""
        return self.codec is CODECS[None] and not self.sharded


def parse(codecs: Any, dtype: np.dtype) -> Chain:
    """Reads back the ``codecs`` of a column of ``dtype`` (its ``zarr.json``'s, or what an
    engine reports); never raises, whatever the JSON holds.

    Example:
        >>> parse(chain(named("blosc"), np.dtype("int16"), (4,)), np.dtype("int16")).codec.name
        'blosc'
    """
    if not isinstance(codecs, list) or not all(isinstance(c, dict) for c in codecs):
        return Chain(None, False, False)
    shard = next((c for c in codecs if c.get("name") == "sharding_indexed"), None)
    if shard is not None:  # each inner chunk has its own chain
        configuration = shard.get("configuration")
        inner = parse(
            configuration.get("codecs") if isinstance(configuration, dict) else None, dtype
        )
        ours = len(codecs) == 1 and not inner.sharded
        return Chain(inner.codec if ours else None, True, inner.checksummed)
    checksummed = any(c.get("name") == "crc32c" for c in codecs)
    codec = next((c for c in CODECS.values() if _is_chain(codecs, c, dtype)), None)
    return Chain(codec, False, checksummed)


def _is_chain(chunk: list[dict[str, Any]], codec: Codec, dtype: np.dtype) -> bool:
    """Whether ``chunk`` is ``codec``'s chain: ``bytes`` (little-endian; the endianness may
    be left out, as it is for one-byte types), the compressor as configured, ``crc32c``."""
    compressor = codec.compressor_json(dtype)
    middle = [] if compressor is None else [compressor]
    if len(chunk) != len(middle) + 2 or chunk[1:] != [*middle, dict(_CRC32C)]:
        return False
    first = chunk[0]
    config = first.get("configuration", {})
    endian = config.get("endian", "little") if isinstance(config, dict) else None
    return first.get("name") == "bytes" and (endian == "little" or dtype.itemsize == 1)


__all__ = [
    "CODECS",
    "DEFAULT",
    "ITEMSIZE",
    "Chain",
    "Codec",
    "chain",
    "choices",
    "named",
    "parse",
    "stored",
]
