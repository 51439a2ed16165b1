"""A store's codec as a value: the one registry from a codec to its zarr v3 codec chain, and back.

A store compresses every column with one codec, named in its schema (``"codec"``) and by
``create(codec=)``, ``copy(codec=)`` and ``pytreestore copy --codec``. Each :class:`Codec`
registered in :data:`CODECS` says which zarr v3 codec follows ``bytes`` (little-endian) in a
column's chunks, with its configuration; ``crc32c`` ends every chain. :func:`chain` writes the
chain of a column's ``zarr.json`` (one ``sharding_indexed`` codec around it with inner
chunks); :func:`parse` reads one back, for the direct reader (plain chunks are read as files)
and ``verify`` (unchecksummed chunks are reported). Adding a codec (a compressor, or another
configuration of one, such as a zstd level) is one entry here, its row in docs/format.md
("Codecs") and its name in the shipped JSON Schema (``pytreestore/schema.json``, which
docs/format.md renders): ``tests/test_compression.py`` checks that the three agree.

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


@dataclasses.dataclass(frozen=True)
class Codec:
    """A codec of the format: how every chunk of every column of a store is compressed.

    Attributes:
        name: the codec's name in the schema and in ``create(codec=)``; None: uncompressed.
        compressor: the name of the zarr v3 codec that follows ``bytes``; None: none (the
            chunk is its elements' bytes, then their checksum).
        configuration: the compressor's ``configuration``, as ``(member, value)`` pairs.
        itemsize: the member of the configuration that takes the column's itemsize
            (blosc's ``typesize``), if any.
    """

    name: str | None
    compressor: str | None = None
    configuration: tuple[tuple[str, Any], ...] = ()
    itemsize: str | None = None

    def compressor_json(self, dtype: np.dtype) -> dict[str, Any] | None:
        """The compressor's zarr v3 JSON for a column of ``dtype`` (None: no compressor)."""
        if self.compressor is None:
            return None
        config = dict(self.configuration)
        if self.itemsize is not None:
            config[self.itemsize] = dtype.itemsize
        return {"name": self.compressor, "configuration": config}


_BY_NAME: dict[str | None, Codec] = {
    c.name: c
    for c in (
        Codec("zstd", "zstd", (("level", 3), ("checksum", False))),
        Codec(
            "blosc",
            "blosc",
            (
                ("cname", "lz4"),
                ("clevel", 5),
                ("shuffle", "shuffle"),
                ("typesize", 0),
                ("blocksize", 0),
            ),
            itemsize="typesize",
        ),
        Codec("gzip", "gzip", (("level", 5),)),
        Codec(None),
    )
}
#: every codec the format names, by name, ``create(codec=)``'s default first
#: (docs/format.md#codecs)
CODECS: Mapping[str | None, Codec] = MappingProxyType(_BY_NAME)


def choices() -> str:
    """The registered names as a message lists them: ``'zstd', 'blosc', 'gzip' or None``."""
    names = [repr(name) for name in CODECS]
    return f"{', '.join(names[:-1])} or {names[-1]}"


def _lookup(name: Any) -> Codec | None:
    """The codec called ``name`` (a str, or None), or None (an unhashable ``name`` too)."""
    if name is None or isinstance(name, str):
        return _BY_NAME.get(name)
    return None


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
    """The zarr v3 ``codecs`` of a column of ``dtype`` compressed with ``codec``: ``bytes``
    (little-endian), the compressor, ``crc32c``; or, with ``inner`` (an inner chunk's shape),
    one ``sharding_indexed`` codec applying that chain to each inner chunk, whose index (at
    the end of the shard, the zarr v3 default) is checksummed too.

    Example:
        >>> chain(named(None), np.dtype("float32"))
        [{'name': 'bytes', 'configuration': {'endian': 'little'}}, {'name': 'crc32c'}]
    """
    compressor = codec.compressor_json(dtype)
    plain = {"name": "bytes", "configuration": {"endian": "little"}}
    if compressor is None:
        chunk = [plain, {"name": "crc32c"}]
    else:
        chunk = [plain, compressor, {"name": "crc32c"}]
    if inner is None:
        return chunk
    configuration = {
        "chunk_shape": list(inner),
        "codecs": chunk,
        "index_codecs": [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "crc32c"},
        ],
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
    if len(chunk) != len(middle) + 2 or chunk[1:] != [*middle, {"name": "crc32c"}]:
        return False
    first = chunk[0]
    config = first.get("configuration", {})
    endian = config.get("endian", "little") if isinstance(config, dict) else None
    return first.get("name") == "bytes" and (endian == "little" or dtype.itemsize == 1)


__all__ = [
    "CODECS",
    "Chain",
    "Codec",
    "chain",
    "choices",
    "named",
    "parse",
    "stored",
]
