"""The fast path of a commit of fragments: an array of a fragment whose rows start at a
chunk boundary of its table (and whose layout is the store's, as every fragment's is unless
the store learnt the structure since) has its encoded chunks placed at the store's chunk
keys as they are, no chunk decoded (:func:`place_aligned`). The same for every store, fixed,
ragged or optional: on local disk array leaves' chunk-row folders renamed and scalar leaves'
chunk files linked, under the intent record of :mod:`pytreestore._log.placing` (which the
commit protocol reads back before it repairs a store, moving the folders back into their
fragments when the commit never came); in an OCDBT database keys copied inside it
(:class:`~pytreestore.backends.ChunkCopies`); elsewhere raw bytes copied. :data:`PLACED`
counts what each way placed.

Example:
    >>> import numpy as np
    >>> from pytreestore._format.columns import ColumnSpec
    >>> column = ColumnSpec("['x']", "x", np.dtype("float32"), (3,), (2, 3))
    >>> a = Aligned(".pytreestore/fragments/f", "x", column, 3, 5)
    >>> [(a.source(r), a.destination(r)) for r in a.chunk_rows()]
    [('.pytreestore/fragments/f/x/c/0', 'x/c/5'), ('.pytreestore/fragments/f/x/c/1', 'x/c/6')]
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from pytreestore._format.columns import ColumnSpec
from pytreestore._log.placing import Pair, local_root, place_chunks, place_local
from pytreestore.backends import Backend

#: what the fast path placed in this process, by way: ``"renamed"`` chunk-row folders,
#: ``"linked"`` chunk files, ``"copied"`` chunks (by the backend, or as raw bytes)
PLACED: collections.Counter[str] = collections.Counter()


@dataclasses.dataclass(frozen=True)
class Aligned:
    """One array of a fragment placed unchanged: the fragment's ``folder``, its array's key
    ``key`` below it, the store's ``column``, the fragment's ``rows``, placed from chunk row
    ``first`` of the store's column on."""

    folder: str
    key: str
    column: ColumnSpec
    rows: int
    first: int

    def chunk_rows(self) -> range:
        """The fragment's chunk rows of the array."""
        return range(-(-self.rows // self.column.chunks[0]))

    def source(self, row: int) -> str:
        """The key of the fragment's chunk row ``row`` (a file, or a folder of chunks)."""
        return f"{self.folder}/{self.key}/c/{row}"

    def destination(self, row: int) -> str:
        """The key of the store's chunk row that the fragment's ``row`` becomes."""
        return f"{self.column.key}/c/{row + self.first}"


def place_aligned(engine: Backend, aligned: Sequence[Aligned], base: int) -> None:
    """Places every chunk of the ``aligned`` arrays at the store's chunk keys unchanged, for
    a commit after version ``base``: locally by :func:`place_local` (folders renamed under an
    intent record, files linked), elsewhere by :func:`place_chunks`.

    Raises:
        CorruptChunkError: a fragment's chunk (or chunk-row folder) is missing.
        StorageError: the file system refused.
    """
    aligned = [a for a in aligned if 0 not in a.column.shape]
    if not aligned:
        return
    root = local_root(engine)
    if root is None:
        pairs = [p for a in aligned for p in _chunk_pairs(a)]
        place_chunks(engine, pairs)
        PLACED.update(copied=len(pairs))
        return
    moves: list[Pair] = []
    chunks: list[tuple[str, ...]] = []  # the chunk files below each moved folder
    files: list[Pair] = []
    for a in aligned:
        rows = [(a.source(r), a.destination(r)) for r in a.chunk_rows()]
        if not a.column.shape:  # scalar leaves: one file per chunk row
            files.extend(rows)
        elif a.key == a.column.key:  # array leaves: one folder per chunk row
            names = tuple("/".join(map(str, g)) for g in _grid(a.column))
            moves.extend(rows)
            chunks.extend(names for _ in rows)
        else:  # a key the intent record could not name: its chunk files linked
            files.extend(_chunk_pairs(a))
    place_local(root, base, moves, files, chunks)
    PLACED.update(renamed=len(moves), linked=len(files))


def _chunk_pairs(a: Aligned) -> list[Pair]:
    """(fragment chunk key, store chunk key) of every chunk of ``a``."""
    tails = ["".join(f"/{i}" for i in g) for g in _grid(a.column)]
    return [(a.source(r) + t, a.destination(r) + t) for r in a.chunk_rows() for t in tails]


def _grid(column: ColumnSpec) -> list[tuple[int, ...]]:
    """The chunk indices of one chunk row of ``column`` past its record axis."""
    grid: list[tuple[int, ...]] = [()]
    for n, size in zip(column.shape, column.chunks[1:]):
        grid = [(*g, i) for g in grid for i in range(-(-n // size))]
    return grid


__all__ = ["PLACED", "Aligned", "place_aligned"]
