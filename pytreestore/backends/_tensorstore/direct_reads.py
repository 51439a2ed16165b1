"""Reads of local chunk files as one table of pieces for the compiled loop
(:func:`.direct.run`): every column of a read at once, only the byte ranges it needs.

A request (a column, the rows it wants, perhaps a part of its second axis) becomes pieces,
one per (inner) chunk it touches, and copies, one per run of rows out of a decoded piece
into the output. A plain chunk is one piece, its whole file. A shard (``sharding_indexed``,
docs/format.md "Inner chunks") is read through its index, which is read once per version of
the file and kept (:class:`ShardIndexes`: keyed by the file's device, inode, size and
modification time, so a shard rewritten by a writer is read again); each inner chunk the
read wants is then one piece at the byte range the index gives. An absent chunk file, or an
inner chunk its shard's index lists as never written, is a missing chunk
(:func:`~pytreestore.backends._base.missing_chunk`), as the engine says it. A piece's damage
(size, checksum, decoding, a short file, an index that points past the shard) raises
:class:`~pytreestore.errors.CorruptChunkError` naming the column, the chunk and the inner
chunk.

Example:
    >>> import numpy as np, tempfile
    >>> from pathlib import Path
    >>> from pytreestore.backends._tensorstore import direct
    >>> meta = {"shape": [0], "data_type": "int32",
    ...         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
    ...         "chunk_key_encoding": {"name": "default"},
    ...         "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
    ...                    {"name": "crc32c"}]}
    >>> column = direct.plan(Path(tempfile.mkdtemp()), meta)
    >>> direct.write([column], 0, [np.arange(8, dtype=np.int32)])
    8
    >>> got = direct.native() is None or read([(column, np.array([6, 1, 6]), None)])[0]
    >>> got is True or got.tolist() == [6, 1, 6]
    True
"""

from __future__ import annotations

import collections
import errno
import math
import os
import threading
from collections.abc import Sequence
from stat import S_ISDIR
from typing import Any, NoReturn

import google_crc32c
import numpy as np

from pytreestore._runtime import at_fork
from pytreestore.backends._base import damaged_chunk, missing_chunk
from pytreestore.backends._tensorstore import direct as _pieces
from pytreestore.backends._tensorstore.direct import DirectColumn

_Request = tuple[DirectColumn, Any, "slice | None"]
#: an inner chunk the shard's index lists as never written
_ABSENT = np.uint64(2**64 - 1)


class ShardIndexes:
    """The shard indexes read so far, by file, each with the identity of the file it was
    read from (a shard a writer rewrote is a new file: its index is read again)."""

    def __init__(self, bound: int = 4096) -> None:
        self._bound = bound
        self._found: collections.OrderedDict[str, tuple[tuple[int, ...], np.ndarray]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: a fresh lock (another thread may have held the parent's)."""
        self._lock = threading.Lock()

    def get(self, path: str, fd: int, stat: os.stat_result, entries: int) -> np.ndarray | None:
        """The ``(entries, 2)`` offsets and lengths of the shard open as ``fd``; None: its
        index is damaged (too short, or its checksum is wrong)."""
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with self._lock:
            kept = self._found.get(path)
        if kept is not None and kept[0] == identity:
            return kept[1]
        index = _read_index(fd, stat.st_size, entries)
        if index is not None:
            with self._lock:
                self._found[path] = (identity, index)
                while len(self._found) > self._bound:
                    self._found.popitem(last=False)
        return index


SHARD_INDEXES = ShardIndexes()
at_fork(SHARD_INDEXES.after_fork)


def _read_index(fd: int, size: int, entries: int) -> np.ndarray | None:
    nbytes = entries * 16
    if size < nbytes + 4:
        return None
    raw = os.pread(fd, nbytes + 4, size - nbytes - 4)
    if len(raw) != nbytes + 4:
        return None
    if google_crc32c.value(raw[:nbytes]) != int.from_bytes(raw[nbytes:], "little"):
        return None
    return np.frombuffer(raw, "<u8", count=2 * entries).reshape(entries, 2)


class _Table:
    """Pieces and copies gathered request by request, then made one table: a few rows as
    Python tuples (a structured array's fields cost microseconds each), many as arrays."""

    def __init__(self) -> None:
        self.pieces: list[np.ndarray] = []  # blocks, in order
        self.copies: list[np.ndarray] = []
        self.owners: list[Any] = []  # per block: each piece's (column, chunk, inner chunk)
        self.few_pieces: list[tuple[int, ...]] = []  # the block being gathered
        self.few_copies: list[tuple[int, int, int]] = []
        self.few_owners: list[tuple[DirectColumn, int, int | None]] = []
        self.fds: dict[str, int] = {}
        self._copied = 0  # copies in the blocks

    @property
    def copied(self) -> int:
        """Copies added so far (where the next piece's copies begin)."""
        return self._copied + len(self.few_copies)

    def add_piece(self, column: DirectColumn, g: int, moves: list[tuple[int, int, int]]) -> None:
        """Piece ``g`` of ``column``, found through its file, with its copies ``moves``."""
        fd, offset, length, codec = _piece_at(self, column, g)
        lo, decoded = self.copied, column.per * column.row_nbytes
        self.few_copies.extend(moves)
        self.few_pieces.append((offset, length, decoded, lo, lo + len(moves), 0, fd, codec, 1, 0))
        k = g // column.entries
        self.few_owners.append((column, k, g - k * column.entries if column.inner else None))

    def add_block(self, pieces: np.ndarray, copies: np.ndarray, owners: Any) -> None:
        """Adds pieces and copies made as arrays, after the few gathered so far."""
        self.flush()
        self.pieces.append(pieces)
        self.copies.append(copies)
        self.owners.append(owners)
        self._copied += len(copies)

    def flush(self) -> None:
        """Makes the few pieces gathered so far a block."""
        if self.few_pieces:
            pieces = np.array(self.few_pieces, _pieces.PIECE)
            copies = np.array(self.few_copies, _pieces.COPY)
            owners = self.few_owners
            self.few_pieces, self.few_copies, self.few_owners = [], [], []
            self.add_block(pieces, copies, owners)

    def file(self, path: str) -> tuple[int, os.stat_result] | None:
        """``path`` open (once per read) and its status; None: absent."""
        fd = self.fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return None
            self.fds[path] = fd
        return fd, os.fstat(fd)


def read(
    requests: Sequence[_Request], into: Sequence[np.ndarray | None] | None = None
) -> list[np.ndarray]:
    """Reads ``index`` (a slice with a positive step, or an int array) of each column; with a
    ``part`` (a slice of the second axis, step 1), only that part. ``into[i]``, where given,
    receives the rows of a request of a slice of step 1 and no part (C-ordered, of the
    column's dtype and the rows' shape). Every request is read in one call of the compiled
    loop (:func:`.direct.native` must not be None).

    Raises:
        CorruptChunkError: a damaged chunk, inner chunk or shard index.
        OSError: a file could not be read (the backend says it as a StorageError).
    """
    outs: list[np.ndarray] = []
    table = _Table()
    try:
        if into is None and all(_one_row(index, part) for _, index, part in requests):
            outs = _add_record(table, requests)
        else:
            for i, (column, index, part) in enumerate(requests):
                given = into[i] if into is not None else None
                outs.append(_add(table, column, index, part, given))
        pieces, copies = _joined(table)
        if len(pieces):
            _pieces.run(pieces, copies)
            if pieces["status"].any():
                _check(table, pieces)
    finally:
        for fd in table.fds.values():
            os.close(fd)
    return outs


def _one_row(index: Any, part: slice | None) -> bool:
    return (
        part is None
        and isinstance(index, slice)
        and index.stop - (index.start or 0) == 1
        and (index.step or 1) == 1
    )


def _add_record(table: _Table, requests: Sequence[_Request]) -> list[np.ndarray]:
    """One row of every column (a record's read): the outputs are views of one buffer, each
    on its own cache line, so that one address serves them all."""
    sizes = [-(-column.row_nbytes // 64) * 64 for column, _, _ in requests]
    buffer = np.empty(sum(sizes), np.uint8)
    base = buffer.ctypes.data
    outs, at = [], 0
    for (column, index, _), size in zip(requests, sizes):
        row = column.row_nbytes
        outs.append(buffer[at : at + row].view(column.dtype).reshape(1, *column.shape))
        _add_few(table, column, [index.start or 0], base + at, row, row, 0)
        at += size
    return outs


def _add(
    table: _Table, column: DirectColumn, index: Any, part: slice | None, given: np.ndarray | None
) -> np.ndarray:
    """Adds the pieces and copies of one request; its output array."""
    shape = column.shape if part is None else (_part_len(column, part), *column.shape[1:])
    row = column.row_nbytes
    out_row = column.dtype.itemsize * math.prod(shape)
    skip = 0 if part is None else (part.start or 0) * (row // max(column.shape[0], 1))
    per = column.per
    if isinstance(index, slice) and (index.step or 1) == 1 and part is None:
        start, stop = index.start or 0, index.stop
        out = given if given is not None else np.empty((stop - start, *shape), column.dtype)
        if stop - start == 1:
            _add_few(table, column, [start], out.ctypes.data, row, row, 0)
        elif 0 < -(-stop // per) - start // per <= _FEW:  # a few pieces: planned one by one
            _add_span(table, column, start, stop, out.ctypes.data)
        elif stop > start:
            _add_run(table, column, start, stop, per, out.ctypes.data)
        return out
    rows = _rows(index)
    out = np.empty((len(rows), *shape), column.dtype)
    if 0 < len(rows) <= _FEW:
        _add_few(table, column, rows.tolist(), out.ctypes.data, row, out_row, skip)
    elif len(rows):
        _add_rows(table, column, rows, per, out.ctypes.data, row, out_row, skip)
    return out


#: rows of a request planned in Python, one by one (more: with array operations)
_FEW = 8


def _add_span(table: _Table, column: DirectColumn, start: int, stop: int, base: int) -> None:
    """Rows ``[start, stop)`` spanning a few pieces (a cache's whole inner chunk): one copy
    out of each."""
    per, row = column.per, column.row_nbytes
    for g in range(start // per, -(-stop // per)):
        lo, hi = max(start, g * per), min(stop, g * per + per)
        table.add_piece(
            column, g, [((lo - g * per) * row, base + (lo - start) * row, (hi - lo) * row)]
        )


def _add_few(
    table: _Table,
    column: DirectColumn,
    rows: list[int],
    base: int,
    row: int,
    out_row: int,
    skip: int,
) -> None:
    """A few rows, each a copy out of its piece (pieces shared between them read once)."""
    per = column.per
    moves: dict[int, list[tuple[int, int, int]]] = {}
    for position, r in enumerate(rows):
        g = r // per
        moves.setdefault(g, []).append(
            ((r - g * per) * row + skip, base + position * out_row, out_row)
        )
    for g, its in moves.items():
        table.add_piece(column, g, its)


def _piece_at(table: _Table, column: DirectColumn, g: int) -> tuple[int, int, int, int]:
    """``(fd, offset, length, codec)`` of piece ``g`` of ``column``."""
    entries = column.entries
    k = g // entries
    path = column.path(k)
    fd, stat = _opened(table, column, k)
    if column.inner is None:
        return fd, 0, stat.st_size, column.codec
    index = SHARD_INDEXES.get(path, fd, stat, entries)
    if index is None:
        _damaged(column, k, None, _BAD_INDEX)
    q = g - k * entries
    offset, length = int(index[q, 0]), int(index[q, 1])
    if offset == _ABSENT:
        raise missing_chunk(column.key, column.coords(k), _NEVER.format(q=q))
    if offset + length > stat.st_size - entries * 16 - 4:
        _damaged(column, k, q, _PAST_END)
    return fd, offset, length, column.codec


_FOLDER = "its key is a folder, not a file"
_NEVER = "inner chunk {q} of the shard was never written"
_BAD_INDEX = "its shard index is damaged (too short, or its checksum is wrong)"
_PAST_END = "the shard's index points past the end of its data"


def _part_len(column: DirectColumn, part: slice) -> int:
    low, high, _ = part.indices(column.shape[0])
    return max(high - low, 0)


def _rows(index: Any) -> np.ndarray:
    if isinstance(index, slice):
        return np.arange(index.start or 0, index.stop, index.step or 1, dtype=np.int64)
    return np.asarray(index, np.int64).reshape(-1)


def _add_run(
    table: _Table, column: DirectColumn, start: int, stop: int, per: int, base: int
) -> None:
    """Rows ``[start, stop)`` into consecutive output rows: one copy per piece."""
    row = column.row_nbytes
    first = np.arange(start // per, -(-stop // per), dtype=np.int64)  # piece ids
    lo = np.maximum(first * per, start)
    hi = np.minimum(first * per + per, stop)
    moves = _pieces.copies(len(first))
    moves["src"] = (lo - first * per) * row
    moves["dst"] = base + (lo - start) * row
    moves["nbytes"] = (hi - lo) * row
    _add_pieces(table, column, first, np.arange(len(first) + 1, dtype=np.int64), moves)


def _add_rows(
    table: _Table,
    column: DirectColumn,
    rows: np.ndarray,
    per: int,
    base: int,
    row: int,
    out_row: int,
    skip: int,
) -> None:
    """Any rows (unsorted, repeated) into output rows in their order: one copy per row."""
    piece_of = rows // per
    ids, inverse = np.unique(piece_of, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.zeros(len(ids) + 1, np.int64)
    np.cumsum(np.bincount(inverse, minlength=len(ids)), out=bounds[1:])
    moves = _pieces.copies(len(rows))
    moves["src"] = (rows[order] - piece_of[order] * per) * row + skip
    moves["dst"] = base + order.astype(np.int64) * out_row
    moves["nbytes"] = out_row
    _add_pieces(table, column, ids, bounds, moves)


def _add_pieces(
    table: _Table, column: DirectColumn, ids: np.ndarray, bounds: np.ndarray, moves: np.ndarray
) -> None:
    """Pieces ``ids`` (inner chunk numbers, or chunk numbers) of ``column``, whose copies are
    ``moves[bounds[j]:bounds[j + 1]]``; their files opened, their byte ranges found (the
    files one by one, everything else for all of them at once)."""
    table_pieces = _pieces.pieces(len(ids))
    chunks = ids // column.entries
    inner = ids - chunks * column.entries
    start = table.copied
    table_pieces["decoded"] = column.per * column.row_nbytes
    table_pieces["codec"] = column.codec
    table_pieces["checksum"] = 1
    table_pieces["copy_lo"] = bounds[:-1] + start
    table_pieces["copy_hi"] = bounds[1:] + start
    cuts = np.flatnonzero(np.diff(chunks)) + 1
    firsts = [0, *cuts.tolist()]
    files = [_opened(table, column, int(chunks[lo])) for lo in firsts]
    counts = np.diff([*firsts, len(ids)])
    table_pieces["fd"] = np.repeat([fd for fd, _ in files], counts)
    if column.inner is None:
        table_pieces["length"] = np.repeat([s.st_size for _, s in files], counts)
    else:
        _from_indexes(table, column, table_pieces, chunks, inner, files, firsts, counts)
    table.add_block(table_pieces, moves, (column, chunks, inner))


def _opened(table: _Table, column: DirectColumn, k: int) -> tuple[int, os.stat_result]:
    """Chunk ``k``'s file of ``column``, open, and its status."""
    opened = table.file(column.path(k))
    if opened is None:
        where = f"no object at {column.key}/{column.chunk_key(k)}"
        raise missing_chunk(column.key, column.coords(k), where)
    if S_ISDIR(opened[1].st_mode):
        _damaged(column, k, None, _FOLDER)
    return opened


def _from_indexes(
    table: _Table,
    column: DirectColumn,
    pieces: np.ndarray,
    chunks: np.ndarray,
    inner: np.ndarray,
    files: list[tuple[int, os.stat_result]],
    firsts: list[int],
    counts: np.ndarray,
) -> None:
    """The byte ranges of inner chunks ``inner`` of shards ``chunks`` from the shards' indexes
    (each read once per version of its file), checked against the shards' sizes."""
    entries = column.entries
    indexes = []
    for (fd, stat), lo in zip(files, firsts):
        k = int(chunks[lo])
        index = SHARD_INDEXES.get(column.path(k), fd, stat, entries)
        if index is None:
            _damaged(column, k, None, _BAD_INDEX)
        indexes.append(index)
    found = np.concatenate(indexes)[np.repeat(np.arange(len(files)) * entries, counts) + inner]
    absent = found[:, 0] == _ABSENT
    ends = np.repeat([s.st_size - entries * 16 - 4 for _, s in files], counts)
    ends = ends.astype(np.uint64)
    bad = ~absent & ((found[:, 0] > ends) | (found[:, 1] > ends - found[:, 0]))
    if bad.any() or absent.any():
        j = int(np.flatnonzero(bad | absent)[0])
        k, q = int(chunks[j]), int(inner[j])
        if absent[j]:
            raise missing_chunk(column.key, column.coords(k), _NEVER.format(q=q))
        _damaged(column, k, q, _PAST_END)
    pieces["offset"] = found[:, 0]
    pieces["length"] = found[:, 1]


def _joined(table: _Table) -> tuple[np.ndarray, np.ndarray]:
    """The table's pieces and copies, each one array."""
    table.flush()
    if not table.pieces:
        return _pieces.pieces(0), _pieces.copies(0)
    if len(table.pieces) == 1:
        return table.pieces[0], table.copies[0]
    return np.concatenate(table.pieces), np.concatenate(table.copies)


_WHY = {  # a damaged piece's status: why (OS_ERROR and MEMORY are raised as such)
    _pieces.SHORT: "the file ends before the piece's {length} bytes (it holds {detail})",
    _pieces.CHECKSUM: "its crc32c checksum does not match its bytes",
    _pieces.DECODE: "it could not be decoded (zstd error {detail})",
    _pieces.SIZE: "it decodes to {detail} bytes, not {decoded}",
    _pieces.BOUNDS: "a read fell outside it",
    _pieces.NO_CODEC: "its codec is not available to the direct reader",
}


def _check(table: _Table, pieces: np.ndarray) -> None:
    """Raises the first failed piece's error."""
    failed = np.flatnonzero(pieces["status"] != _pieces.OK)
    if not len(failed):
        return
    first = int(failed[0])
    piece = pieces[first]
    status, detail = int(piece["status"]), int(piece["detail"])
    if status == _pieces.OS_ERROR and detail == errno.EISDIR:
        column, k, q = _owner(table, first)
        _damaged(column, k, q, _FOLDER)
    if status == _pieces.OS_ERROR:
        raise OSError(detail, os.strerror(detail))
    if status == _pieces.MEMORY:
        raise MemoryError("the direct reader could not allocate its buffers")
    column, k, q = _owner(table, first)
    if status == _pieces.SIZE and int(piece["codec"]) == _pieces.NONE:  # stored as it is
        detail = int(piece["length"])
        why = f"it holds {detail} bytes, not {int(piece['decoded']) + 4}"
        _damaged(column, k, q, why)
    why = _WHY[status].format(
        length=int(piece["length"]), detail=detail, decoded=int(piece["decoded"])
    )
    _damaged(column, k, q, why)


def _owner(table: _Table, position: int) -> tuple[DirectColumn, int, int | None]:
    """The column, chunk and inner chunk of the table's piece at ``position``: a block's
    owners are a list of those, or ``(column, chunks, inner chunks)`` as arrays."""
    for owners in table.owners:
        if isinstance(owners, list):
            if position < len(owners):
                return owners[position]
            position -= len(owners)
            continue
        column, chunks, inner = owners
        if position < len(chunks):
            q = int(inner[position]) if column.inner is not None else None
            return column, int(chunks[position]), q
        position -= len(chunks)
    raise AssertionError("a piece beyond the table")  # pragma: no cover


def _damaged(column: DirectColumn, k: int, inner: int | None, why: str) -> NoReturn:
    where = "" if inner is None else f"inner chunk {inner} of the shard: "
    raise damaged_chunk(column.key, column.coords(k), where + why)


__all__ = ["SHARD_INDEXES", "ShardIndexes", "read"]
