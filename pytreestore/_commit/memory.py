"""Tables kept whole in memory, and the committer of a walk into them, which commits nothing:
a fragment's records (:mod:`pytreestore._fragments.rows`), and a ragged store's ``extend`` of
a list, stacked into each table's columns before the store's tables take them as blocks
(:meth:`pytreestore._commit.records.RecordWriter.extend`).

Example:
    >>> import numpy as np
    >>> from pytreestore._commit.record import Commit
    >>> from pytreestore._format.schema import TreeSchema
    >>> commits = MemoryCommits(Commit(0, 0), "doc")
    >>> schema = TreeSchema.from_example({"x": np.int16(0)})
    >>> tables = commits.tables(schema, Commit(0, 0), whole=True)
    >>> tables[None].append([7]); commits.records()
    1
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from pytreestore._commit.committer import Committer
from pytreestore._commit.record import Commit
from pytreestore._commit.roles import Block, Position, Row, TableBuffer
from pytreestore._commit.rows import block_rows
from pytreestore._commit.tables import table_schemas
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.convert import RowFiller, casters
from pytreestore.errors import FragmentError


class TableRows:
    """One table's rows kept whole in memory (a fragment's, a stacked ``extend``'s): a table
    buffer that writes nothing.

    Example:
        >>> from pytreestore._format.schema import TreeSchema
        >>> rows = TableRows(TreeSchema.from_example({"x": np.int16(0)}, chunk_records=2))
        >>> rows.append([1]); rows.write_batch([np.array([2, 3], np.int16)])
        >>> len(rows), rows.blocks()[0].tolist()
        (3, [1, 2, 3])
    """

    chunk = sys.maxsize  # never full: a walk never writes a chunk
    start = 0

    def __init__(self, schema: TreeSchema) -> None:
        self.schema = schema
        self.casters = casters(schema.columns)
        self.fill = 0
        self._capacity = 0
        self.buffers: list[np.ndarray] = []
        #: the compiled fill of the buffers, made when rows are first filled in (a table
        #: that only takes batches, a fragment's, never compiles one)
        self._filler: RowFiller | None = None

    def __len__(self) -> int:
        return self.fill

    def _reserve(self, n: int) -> RowFiller:
        """The fill of buffers with room for ``n`` rows more (``n`` > 0)."""
        filler = self._filler
        if self.fill + n <= self._capacity and filler is not None:
            return filler
        capacity = max(2 * self._capacity, self.fill + n, 64)
        grown = [np.empty((capacity, *c.shape), c.dtype) for c in self.schema.columns]
        for new, old in zip(grown, self.buffers):
            new[: self.fill] = old[: self.fill]
        self.buffers, self._capacity = grown, capacity
        if filler is None:
            filler = self._filler = RowFiller(self.casters, grown)
        else:
            filler.use(grown)  # the same compiled fill, on the grown buffers
        return filler

    def append(self, leaves: Row) -> None:
        """One row of already structure-checked leaves, cast as a Writer casts them."""
        self._reserve(1).fill(leaves, self.fill)
        self.fill += 1

    def append_many(self, rows: Iterable[Row]) -> None:
        """Rows of leaves; raises RecordError (its ``index`` from the first) if one is refused."""
        rows = list(rows)
        if rows:
            self._reserve(len(rows)).fill_block(rows, self.fill)
            self.fill += len(rows)

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        """Checked and cast column blocks with one leading length (the first rows of a table
        whose buffers cannot hold them are the blocks themselves, not copied: a row added
        later copies them first)."""
        count = len(blocks[0]) if blocks else 0
        if self.fill == 0 and count > self._capacity:
            self.buffers, self._capacity, self.fill = list(blocks), 0, count
            return
        if count:
            self._reserve(count)
        for buf, block in zip(self.buffers, blocks):
            buf[self.fill : self.fill + count] = block
        self.fill += count

    def append_blocks(self, blocks: Iterator[Block]) -> None:
        """Rows given a block at a time as columns; RecordError as :meth:`append_many`."""
        self.append_many(block_rows(blocks))

    def snapshot(self) -> Position:
        return (0, self.fill)

    def rollback(self, position: Position) -> None:
        self.fill = position[1]

    def blocks(self) -> list[np.ndarray]:
        """Every column's rows."""
        return [b[: self.fill] for b in self.buffers]


class MemoryCommits:
    """The committer of a walk into tables kept in memory (:class:`TableRows`), which
    commits nothing: a fragment's (:func:`~pytreestore._fragments.write.write` writes the
    tables), a stacked ``extend``'s (the store's writer takes the tables' rows as blocks). Its
    ``commit`` is the store's latest, ``head`` (where the arrays a record teaches the walk
    start); ``where`` names the store."""

    def __init__(self, head: Commit, where: str) -> None:
        self.commit = head
        self._where = where
        self.rows: dict[str | None, TableRows] = {}

    def tables(
        self, schema: TreeSchema, commit: Commit, *, whole: bool
    ) -> dict[str | None, TableBuffer]:
        """Every table of ``schema`` (``whole``: a fixed store's one table) in memory."""
        if whole:
            self.rows = {None: TableRows(schema)}
            return {t: rows for t, rows in self.rows.items()}
        self.rows = {t: TableRows(sub) for t, sub in table_schemas(schema).items()}
        return {t: rows for t, rows in self.rows.items()}  # a dict of the role's type

    def records(self) -> int:
        return len(self.rows[None])

    def check(self) -> None:
        """Nothing: a fragment commits nothing."""

    def full(self) -> None:
        """Nothing: a table in memory is never full."""

    def after_call(self, *, extended: bool) -> None:
        """Nothing: the rows wait for the fragment's write."""

    def flush(self) -> None:
        """Nothing to commit: the tables' owner takes their rows."""

    def clear(self) -> None:
        """Forgets every table's rows (the tables stay, for the next walk)."""
        for rows in self.rows.values():
            rows.fill = 0

    def sole(self) -> Committer:
        raise FragmentError(
            f"a walk into memory for {self._where} commits nothing: it has no committer (internal)"
        )

    def may_learn(self, schema: TreeSchema) -> None:
        """A walk in memory learns every structure, in memory."""

    def adopt(self, old: TreeSchema, grown: TreeSchema) -> Commit:
        """The structures a record showed, learnt in memory: the tables start again."""
        return Commit(0, 0)


__all__ = ["MemoryCommits", "TableRows"]
