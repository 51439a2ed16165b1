"""Direct I/O of uncompressed local chunks: chunk files read into (and written from) the
caller's arrays, with no intermediate buffer.

An uncompressed pytreestore chunk on local disk is a plain file: the chunk's records as raw
little-endian bytes, then the 4-byte zarr v3 ``crc32c`` checksum of those bytes. Reading one
through TensorStore decodes it into a chunk buffer and copies that into the output; here the
bytes go straight from the page cache into the output array (one ``preadv``), and the checksum
is computed on them in place (``google_crc32c``, which zarr-python uses too). Threads overlap
the reads, which release the GIL, with the checksums. This is what lets a full read of an uncompressed store run at the speed of
``np.load`` (see ``docs/benchmarks.md``).

Only columns whose chunks hold whole records (the chunk shape is the record shape on every
axis but the first), whose codecs are exactly ``bytes`` (little-endian) and ``crc32c``, and
whose chunk keys use the default ``/`` encoding qualify (:func:`plan`); everything else, and
any chunk file that is missing, goes through the engine as before. Every chunk read here is
checked against its checksum: a mismatch raises :class:`~pytreestore.errors.CorruptChunkError`
naming the chunk.

Writes follow the TensorStore ``file`` kvstore's own protocol: each chunk goes to
``<chunk>.__lock``, is fsynced and renamed over the chunk, so readers see the old chunk or the
new one; the folders are fsynced before :func:`write` returns, so a commit written after it
never counts a chunk that is not on disk (step 6 of the commit protocol,
:mod:`pytreestore._log.protocol`).

Example:
    >>> import numpy as np, tempfile
    >>> from pathlib import Path
    >>> meta = {"shape": [0, 2], "data_type": "int32",
    ...         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 2]}},
    ...         "chunk_key_encoding": {"name": "default"},
    ...         "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
    ...                    {"name": "crc32c"}]}
    >>> column = plan(Path(tempfile.mkdtemp()), meta)
    >>> write([column], 0, [np.arange(16, dtype=np.int32).reshape(8, 2)])
    8
    >>> read([(column, slice(3, 6), None)])[0].tolist()
    [[6, 7], [8, 9], [10, 11]]
    >>> read([(column, slice(3, 6), slice(1, 2))])[0].tolist()
    [[7], [9], [11]]
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import wait
from pathlib import Path
from typing import Any, TypeVar

import google_crc32c
import numpy as np

from pytreestore._format import compression as _compression
from pytreestore._runtime import RUNTIME
from pytreestore.backends._base import damaged_chunk

_T = TypeVar("_T")
_LITTLE = sys.byteorder == "little"


class MissingChunk(Exception):
    """A chunk file is absent: the caller reads the whole request through its engine, which
    knows the fill value (internal; never escapes the backend)."""


@dataclasses.dataclass(frozen=True)
class DirectColumn:
    """A column whose chunks can be read and written as plain files.

    Attributes:
        key: the column's storage key (for error messages).
        folder: the array's folder (holding ``zarr.json`` and ``c/``).
        dtype: element dtype.
        shape: per-record shape.
        chunk: records per chunk.
    """

    key: str
    folder: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    chunk: int

    @property
    def row_nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)

    def chunk_key(self, k: int) -> str:
        return "/".join(["c", str(k), *["0"] * len(self.shape)])

    def path(self, k: int) -> str:
        return os.path.join(self.folder, self.chunk_key(k))


def plan(folder: Path, metadata: dict[str, Any], key: str = "") -> DirectColumn | None:
    """The :class:`DirectColumn` of the array whose ``zarr.json`` is ``metadata``, or None
    when its chunks are not plain bytes plus a ``crc32c`` checksum on this machine (the
    codec registry reads its ``codecs``: :attr:`pytreestore._format.compression.Chain.plain`)."""
    try:
        dtype = np.dtype(metadata["data_type"])
        shape = tuple(int(n) for n in metadata["shape"][1:])
        chunks = [int(n) for n in metadata["chunk_grid"]["configuration"]["chunk_shape"]]
        encoding = metadata["chunk_key_encoding"]
        codecs = metadata["codecs"]
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    plain = (
        _LITTLE
        and _compression.parse(codecs, dtype).plain
        and encoding.get("name") == "default"
        and encoding.get("configuration", {}).get("separator", "/") == "/"
        and tuple(chunks[1:]) == shape
        and dtype.kind in "biufc"
        and dtype.itemsize > 0
        and 0 not in shape
    )
    return DirectColumn(key, Path(folder), dtype, shape, chunks[0]) if plain else None


# ---- reads -----------------------------------------------------------------------------------


def read(
    requests: Sequence[tuple[DirectColumn, Any, slice | None]],
    into: Sequence[np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """Reads ``index`` (a slice with a positive step, or an int array) of each column; with a
    ``part`` (a slice of the second axis), only that part: each chunk is then read whole into
    a scratch buffer, checked, and the part copied out, so the output holds the part alone.
    ``into[i]``, where given, receives the rows of a request of a slice of step 1 and no part
    (C-ordered, of the column's dtype and the rows' shape).

    Raises:
        MissingChunk: a chunk file is absent (read the request through the engine instead).
        CorruptChunkError: a chunk's size or checksum is wrong.
    """
    outs: list[np.ndarray] = []
    tasks: list[Callable[[], None]] = []
    plans: dict[tuple[int, int], tuple[Any, int, list[tuple[int, np.ndarray, np.ndarray]]]] = {}
    for i, (column, index, part) in enumerate(requests):
        if part is None and isinstance(index, slice) and (index.step or 1) == 1:
            start, stop = index.start or 0, index.stop
            given = into[i] if into is not None else None
            out = np.empty((stop - start, *column.shape), column.dtype) if given is None else given
            tasks.extend(_slice_tasks(column, start, stop, out))
        else:
            key = (id(index), column.chunk)  # the columns of a call share their index
            if key not in plans:
                rows = _rows(index)
                plans[key] = (index, len(rows), _by_chunk(rows, column.chunk))  # keeps id(index)
            _, count, plan = plans[key]
            shape = column.shape if part is None else _part_shape(column.shape, part)
            out = np.empty((count, *shape), column.dtype)
            tasks.extend(_gather_task(column, *where, out, part) for where in plan)
        outs.append(out)
    _run_all(tasks)
    return outs


def _part_shape(shape: tuple[int, ...], part: slice) -> tuple[int, ...]:
    low, high, _ = part.indices(shape[0])
    return (max(high - low, 0), *shape[1:])


def _rows(index: Any) -> np.ndarray:
    if isinstance(index, slice):
        return np.arange(index.start or 0, index.stop, index.step, dtype=np.int64)
    return np.asarray(index, np.int64)


def _by_chunk(rows: np.ndarray, size: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``(chunk, positions in rows, rows within the chunk)`` for every chunk ``rows`` touch."""
    chunk_of = rows // size
    order = np.argsort(chunk_of, kind="stable")
    ks, starts = np.unique(chunk_of[order], return_index=True)
    groups = np.split(order, starts[1:]) if len(rows) else []
    return [(k, g, rows[g] - k * size) for k, g in zip(ks.tolist(), groups)]


def _slice_tasks(
    column: DirectColumn, start: int, stop: int, out: np.ndarray
) -> list[Callable[[], None]]:
    flat = out.reshape(-1).view(np.uint8)
    row, size = column.row_nbytes, column.chunk
    tasks = []
    for k in range(start // size, -(-stop // size)):
        lo, hi = max(start, k * size), min(stop, (k + 1) * size)
        target = flat[(lo - start) * row : (hi - start) * row]
        if hi - lo == size:
            tasks.append(lambda k=k, target=target: _read_into(column, k, target))
        else:
            offset = (lo - k * size) * row
            tasks.append(lambda k=k, t=target, o=offset: _read_part(column, k, t, o))
    return tasks


def _gather_task(
    column: DirectColumn,
    k: int,
    positions: np.ndarray,
    rows: np.ndarray,
    out: np.ndarray,
    part: slice | None = None,
) -> Callable[[], None]:
    def task() -> None:
        chunk = _whole_chunk(column, k).view(column.dtype).reshape(-1, *column.shape)
        out[positions] = chunk[rows] if part is None else chunk[rows, part]

    return task


def _read_part(column: DirectColumn, k: int, target: np.ndarray, offset: int) -> None:
    target[:] = _whole_chunk(column, k)[offset : offset + len(target)]


def _whole_chunk(column: DirectColumn, k: int) -> np.ndarray:
    """Chunk ``k``'s bytes, read into this thread's scratch buffer (which the caller must use
    before its next call)."""
    chunk = _scratch(column.chunk * column.row_nbytes)
    _read_into(column, k, chunk)
    return chunk


_LOCAL = threading.local()


def _scratch(nbytes: int) -> np.ndarray:
    """A buffer of ``nbytes`` reused by this thread: a fresh one would cost page faults."""
    buffer = getattr(_LOCAL, "scratch", None)
    if buffer is None or len(buffer) < nbytes:
        buffer = _LOCAL.scratch = np.empty(nbytes, np.uint8)
    return buffer[:nbytes]


def _read_into(column: DirectColumn, k: int, target: np.ndarray) -> None:
    """Reads chunk ``k`` (exactly ``len(target)`` bytes and a checksum) into ``target``."""
    path = column.path(k)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise MissingChunk(path) from None
    checksum = bytearray(4)
    try:
        got = _preadv_all(fd, [target.data, memoryview(checksum)])
        extra = os.pread(fd, 1, got)
    finally:
        os.close(fd)
    want = len(target) + 4
    if got != want or extra:
        size = got + len(extra) if extra else got
        _damaged(column, k, f"the file holds {size}{'+' if extra else ''} bytes, not {want}")
    if google_crc32c.value(target) != int.from_bytes(checksum, "little"):
        _damaged(column, k, "its crc32c checksum does not match its bytes")


def _preadv_all(fd: int, buffers: list[memoryview]) -> int:
    """``preadv`` until the buffers are full or the file ends; the bytes read."""
    total, offset = 0, 0
    while buffers:
        n = os.preadv(fd, buffers, offset)
        if n == 0:
            break
        total += n
        offset += n
        while buffers and n >= len(buffers[0]):
            n -= len(buffers[0])
            buffers.pop(0)
        if buffers and n:
            buffers[0] = buffers[0][n:]
    return total


def _damaged(column: DirectColumn, k: int, why: str) -> None:
    raise damaged_chunk(column.key, (k, *[0] * len(column.shape)), why)


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


__all__ = ["DirectColumn", "MissingChunk", "plan", "read", "write"]
