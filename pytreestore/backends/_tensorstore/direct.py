"""Local chunk files read and written without the engine: which columns can be (:func:`plan`),
the compiled loop that reads them (:func:`run`), and the writes of plain chunks.

**Which columns.** A column qualifies when its (inner) chunks hold whole records (the chunk
shape is the record shape on every axis but the first) as little-endian bytes, uncompressed
or zstd, each ending in its ``crc32c``; a shard's index at its end, checksummed; chunk keys
in the default ``/`` encoding. Everything else goes through TensorStore.

**The compiled loop.** A read is a table of pieces, each a byte range of an open file (a
plain chunk, or an inner chunk of a zarr v3 shard: :mod:`.direct_reads` makes the table),
and of copies out of each decoded piece. The loop is a small C file (``_pieces.c``) that
``make install`` (``pip install -e .``) compiles into a shared library beside this module;
it is loaded with :mod:`ctypes` (whose calls release the GIL), and it loads by path the
libraries the Python packages already ship: google-crc32c's ``libcrc32c`` and libzstd (the
system's, else numcodecs'). Several threads of the pool run it on one table at once, taking
pieces from a shared counter. Where the library was not built (no C compiler) or a library
is missing, :func:`native` is None and every read goes through TensorStore: the same
bytes, more slowly.

**Writes** of plain (uncompressed, unsharded) chunks follow the TensorStore ``file``
kvstore's own protocol: each chunk goes to ``<chunk>.__lock``, is fsynced and renamed over
the chunk, so readers see the old chunk or the new one; the folders are fsynced before
:func:`write` returns, so a commit written after it never counts a chunk that is not on disk
(step 6 of the commit protocol, :mod:`pytreestore._log.protocol`).

Example:
    >>> import numpy as np, os, tempfile
    >>> from pathlib import Path
    >>> meta = {"shape": [0, 2], "data_type": "int32",
    ...         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 2]}},
    ...         "chunk_key_encoding": {"name": "default"},
    ...         "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
    ...                    {"name": "crc32c"}]}
    >>> column = plan(Path(tempfile.mkdtemp()), meta)
    >>> write([column], 0, [np.arange(16, dtype=np.int32).reshape(8, 2)])
    8
    >>> out = np.zeros(2, np.int32)
    >>> fd = os.open(column.path(1), os.O_RDONLY)
    >>> table = pieces(1)
    >>> table[0] = (0, 36, 32, 0, 1, 0, fd, NONE, 1, 0)
    >>> moves = copies(1)
    >>> moves[0] = (8, out.ctypes.data, 8)
    >>> native() is None or (run(table, moves), out.tolist())[1] == [10, 11]
    True
    >>> os.close(fd)
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import glob
import importlib.machinery
import math
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from pathlib import Path
from typing import Any, TypeVar

import google_crc32c
import numpy as np

from pytreestore._format import compression as _compression
from pytreestore._runtime import RUNTIME

_T = TypeVar("_T")
_LITTLE = sys.byteorder == "little"

#: a piece's codec: its stored bytes as they are, or zstd
NONE, ZSTD = 0, 1
#: a piece's status after :func:`run`
OK, OS_ERROR, SHORT, CHECKSUM, DECODE, SIZE, MEMORY, NO_CODEC, BOUNDS = range(9)

#: one piece, laid out as ``pts_piece`` in ``_pieces.c``
PIECE = np.dtype(
    [
        ("offset", "<i8"),
        ("length", "<i8"),
        ("decoded", "<i8"),
        ("copy_lo", "<i8"),
        ("copy_hi", "<i8"),
        ("detail", "<i8"),
        ("fd", "<i4"),
        ("codec", "<i4"),
        ("checksum", "<i4"),
        ("status", "<i4"),
    ]
)
#: one copy out of a decoded piece, laid out as ``pts_copy``
COPY = np.dtype([("src", "<i8"), ("dst", "<i8"), ("nbytes", "<i8")])

#: decoded bytes of work a thread takes at least (more threads cost more than they save)
_BYTES_PER_THREAD = 64 << 10
_CORES = os.cpu_count() or 1
#: pieces the caller's thread reads in one call of the loop, at most
_PIECES_A_CALL = 256


@dataclasses.dataclass(frozen=True)
class DirectColumn:
    """A column whose chunks can be read (and, plain ones, written) as files.

    Attributes:
        key: the column's storage key (for error messages).
        folder: the array's folder (holding ``zarr.json`` and ``c/``).
        dtype: element dtype.
        shape: per-record shape.
        chunk: records per chunk (per shard, when sharded).
        inner: records per inner chunk of a ``sharding_indexed`` shard; None: plain chunks.
        codec: how each (inner) chunk is stored: :data:`.pieces.NONE` (its bytes) or
            :data:`.pieces.ZSTD`.
    """

    key: str
    folder: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    chunk: int
    inner: int | None = None
    codec: int = NONE

    def __post_init__(self) -> None:  # what every read asks, worked out once
        row = self.dtype.itemsize * math.prod(self.shape)
        per = self.inner or self.chunk
        sets = {
            "row_nbytes": row,
            "per": per,
            "entries": self.chunk // per,
            "_prefix": os.path.join(self.folder, "c") + "/",
            "_suffix": "/0" * len(self.shape),
        }
        for name, value in sets.items():
            object.__setattr__(self, name, value)

    #: bytes of one record's row
    row_nbytes: int = dataclasses.field(init=False, repr=False, compare=False)
    #: records per piece: per inner chunk, or per chunk
    per: int = dataclasses.field(init=False, repr=False, compare=False)
    #: pieces per chunk (inner chunks per shard; 1 when plain)
    entries: int = dataclasses.field(init=False, repr=False, compare=False)
    _prefix: str = dataclasses.field(init=False, repr=False, compare=False)
    _suffix: str = dataclasses.field(init=False, repr=False, compare=False)

    @property
    def plain(self) -> bool:
        """Chunk files that are the rows' bytes and a checksum (written here too)."""
        return self.inner is None and self.codec == NONE

    def chunk_key(self, k: int) -> str:
        return "/".join(["c", str(k), *["0"] * len(self.shape)])

    def path(self, k: int) -> str:
        return f"{self._prefix}{k}{self._suffix}"

    def coords(self, k: int) -> tuple[int, ...]:
        """Chunk ``k``'s coordinates in the chunk grid (its leaf axes are whole)."""
        return (k, *[0] * len(self.shape))


def plan(folder: Path, metadata: dict[str, Any], key: str = "") -> DirectColumn | None:
    """The :class:`DirectColumn` of the array whose ``zarr.json`` is ``metadata``, or None when the direct reader cannot read its chunks on this machine:
    each (inner) chunk must hold whole records as little-endian bytes, uncompressed or zstd,
    then a ``crc32c``; a shard's index at its end, checksummed (the codec registry reads the
    ``codecs``: :func:`pytreestore._format.compression.parse`); zstd and shards need the
    compiled loop (:func:`.pieces.native`)."""
    try:
        dtype = np.dtype(metadata["data_type"])
        shape = tuple(int(n) for n in metadata["shape"][1:])
        chunks = [int(n) for n in metadata["chunk_grid"]["configuration"]["chunk_shape"]]
        encoding = metadata["chunk_key_encoding"]
        codecs = metadata["codecs"]
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    usable = (
        _LITTLE
        and encoding.get("name") == "default"
        and encoding.get("configuration", {}).get("separator", "/") == "/"
        and tuple(chunks[1:]) == shape
        and dtype.kind in "biufcV"
        and dtype.itemsize > 0
        and 0 not in shape
    )
    layout = _layout(codecs, dtype, chunks) if usable else None
    if layout is None:
        return None
    inner, codec = layout
    return DirectColumn(key, Path(folder), dtype, shape, chunks[0], inner, codec)


_CODECS = {None: NONE, "zstd": ZSTD}


def _layout(codecs: Any, dtype: np.dtype, chunks: list[int]) -> tuple[int | None, int] | None:
    """``(records per inner chunk or None, piece codec)`` of a chain the reader takes."""
    chain = _compression.parse(codecs, dtype)
    if chain.plain:
        return None, NONE
    name = chain.codec.name if chain.codec is not None else "?"
    lib = native()
    if lib is None or not chain.checksummed or name not in _CODECS:
        return None
    if name == "zstd" and not lib.zstd:
        return None
    if not chain.sharded:
        return None, _CODECS[name]
    config = codecs[0].get("configuration", {})
    inner = [int(n) for n in config.get("chunk_shape", [])]
    index = config.get("index_codecs")
    ours = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
    if (
        config.get("index_location", "end") != "end"
        or index != ours
        or inner[1:] != chunks[1:]
        or not inner
        or inner[0] <= 0
        or chunks[0] % inner[0]
    ):
        return None
    return inner[0], _CODECS[name]


# ---- the compiled loop ---------------------------------------------------------------------


def pieces(n: int) -> np.ndarray:
    """An empty table of ``n`` pieces."""
    return np.zeros(n, PIECE)


def copies(n: int) -> np.ndarray:
    """An empty table of ``n`` copies."""
    return np.zeros(n, COPY)


class Native:
    """The loaded library: ``zstd`` says whether it decodes zstd."""

    def __init__(self, lib: ctypes.CDLL, have: int) -> None:
        self.zstd = bool(have & 2)
        self._run = lib.pts_run
        self._run.restype = ctypes.c_int64
        self._run.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
        self._run.argtypes += [ctypes.c_int64]

    def run(
        self, table: np.ndarray, moves: np.ndarray, counter: np.ndarray, limit: int = 1 << 62
    ) -> int:
        """Works through ``table`` (at most ``limit`` pieces) with the other threads sharing
        ``counter``."""
        addresses = (table.ctypes.data, len(table), moves.ctypes.data, counter.ctypes.data)
        return int(self._run(*addresses, limit))


@functools.cache
def native() -> Native | None:
    """The compiled loop, or None where it cannot run here (not built, no libcrc32c, a
    big-endian machine)."""
    path = _built()
    crc = _crc32c_library()
    if path is None or crc is None or np.little_endian is False:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        lib.pts_layout.restype = ctypes.c_int64
        if lib.pts_layout() != PIECE.itemsize * 1000 + COPY.itemsize:
            return None  # built from another version of the C file
        lib.pts_load.restype = ctypes.c_int
        lib.pts_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        have = 0
        for zstd in _zstd_libraries():
            have = lib.pts_load(os.fsencode(crc), os.fsencode(zstd))
            if have & 2:
                break
        if not have & 1:
            return None
        return Native(lib, have)
    except (OSError, AttributeError):
        return None


def _built() -> Path | None:
    """The compiled ``_pieces`` library beside this module, if ``make install`` built it."""
    here = Path(__file__).parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = here / f"_pieces{suffix}"
        if candidate.is_file():
            return candidate
    return None


def _crc32c_library() -> str | None:
    """google-crc32c's own ``libcrc32c`` (its wheels ship it beside the package)."""
    try:
        import google_crc32c
    except ImportError:  # pragma: no cover - a dependency
        return None
    site = Path(google_crc32c.__file__).parent.parent
    found = sorted(glob.glob(str(site / "google_crc32c.libs" / "libcrc32c*")))
    found += sorted(glob.glob(str(site / "google_crc32c" / "libcrc32c*")))
    return found[0] if found else None


def _zstd_libraries() -> list[str]:
    """Where libzstd may be: the system's, then the copy inside numcodecs' zstd codec."""
    found = ["libzstd.so.1", "libzstd.dylib"]
    try:
        import numcodecs.zstd

        found.append(str(numcodecs.zstd.__file__))
    except ImportError:  # pragma: no cover - zarr's dependency
        pass
    return found


def run(table: np.ndarray, moves: np.ndarray) -> None:
    """Reads, checks, decodes and copies out every piece of ``table`` (each piece's
    ``status`` then says how it went), on as many of the pool's threads as its bytes are
    worth, this one among them. Every thread has ended when it returns or raises."""
    lib = native()
    assert lib is not None, "run() needs the compiled loop: check native() first"
    counter = np.zeros(1, np.int64)
    work = int(table["decoded"].sum()) if len(table) > 1 else 0
    helpers = min(len(table), _CORES, max(1, work // _BYTES_PER_THREAD)) - 1
    if helpers <= 0 and len(table) <= _PIECES_A_CALL:
        lib.run(table, moves, counter)
        return
    pool = RUNTIME.direct_pool()
    futures = [pool.submit(lib.run, table, moves, counter) for _ in range(max(helpers, 0))]
    try:
        while counter[0] < len(table):  # a few pieces a call: Ctrl-C is seen between them
            lib.run(table, moves, counter, _PIECES_A_CALL)
    finally:
        counter[0] = len(table)  # on an interrupt: the others take no new piece
        wait(futures)


# ---- writes ----------------------------------------------------------------------------------


def write(columns: Sequence[DirectColumn], start: int, blocks: Sequence[np.ndarray]) -> int:
    """Writes the whole chunks of ``blocks[i]`` (records from ``start``, a chunk boundary) to
    ``columns[i]``, durably; the records written, the same for every column (the rest of
    each block, less than a chunk, is left to the caller).
    """
    if not columns:
        return 0
    size = columns[0].chunk
    if any(c.chunk != size for c in columns) or start % size:
        return 0
    whole = (len(blocks[0]) // size) * size
    if whole == 0:
        return 0
    tasks = []
    for column, block in zip(columns, blocks):
        data = np.ascontiguousarray(block[:whole], column.dtype)
        for k in range(start // size, (start + whole) // size):
            lo = k * size - start
            part = data[lo : lo + size]
            tasks.append(lambda c=column, k=k, p=part: _write_chunk(c, k, p))
    paths = _run_all(tasks)
    folders = {str(c.folder) for c in columns}  # new chunk folders are entries of their parents
    for path in paths:
        folder = os.path.dirname(path)
        while folder not in folders:
            folders.add(folder)
            folder = os.path.dirname(folder)
    _run_all([lambda p=p: _fsync(p) for p in sorted(folders)])  # the renames
    return whole


def _write_chunk(column: DirectColumn, k: int, part: np.ndarray) -> str:
    path = column.path(k)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = part.reshape(-1).view(np.uint8)
    checksum = google_crc32c.value(data).to_bytes(4, "little")
    temp = path + ".__lock"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, [data.data, memoryview(checksum)])
        os.fsync(fd)  # here, not after every write: the disk works while other chunks are copied
    finally:
        os.close(fd)
    os.replace(temp, path)
    return path


def _write_all(fd: int, buffers: list[memoryview]) -> None:
    while buffers:
        n = os.writev(fd, buffers)
        while buffers and n >= len(buffers[0]):
            n -= len(buffers[0])
            buffers.pop(0)
        if buffers and n:
            buffers[0] = buffers[0][n:]


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- threads ---------------------------------------------------------------------------------


def _run_all(tasks: Sequence[Callable[[], _T]]) -> list[_T]:
    """Runs ``tasks`` on the shared pool and returns their results; the first error raises
    (after every task has finished, so no thread still writes into an output)."""
    if len(tasks) <= 1:
        return [t() for t in tasks]
    pool = RUNTIME.direct_pool()
    futures = [pool.submit(t) for t in tasks]
    try:
        errors = [f.exception() for f in futures]
    except BaseException:  # interrupted: nothing may still write into an output once we raise
        for f in futures:
            f.cancel()
        wait(futures)
        raise
    for err in errors:
        if err is not None:
            raise err
    return [f.result() for f in futures]


__all__ = [
    "CHECKSUM",
    "COPY",
    "DECODE",
    "NONE",
    "OK",
    "PIECE",
    "ZSTD",
    "DirectColumn",
    "Native",
    "copies",
    "native",
    "pieces",
    "plan",
    "run",
    "write",
]
