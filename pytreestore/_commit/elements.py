"""The table of a ragged list whose elements' leaves are numpy scalars: rows kept as tuples
until a block is full, then converted one column at a time.

An element's leaves that are numpy scalars of exactly their columns' dtypes
(:meth:`~pytreestore._commit.flat.FlatList.exact_rows`) need no check and no cast, and
numpy scalars cannot change once made: :class:`ElementRows` keeps each record's tuples as
they are and converts a block of them (``np.array`` of a column's values, about 10 ns a
value, against about 0.5 us a column for one record's handful) when the block is due, at
:meth:`ElementRows.push`. Anything else appended to the table (blocks already checked and
cast) waits in the same queue, in order.

It stands in for the table's :class:`~pytreestore._commit.writer.Writer` in a
:class:`~pytreestore._commit.records.RecordWriter`: its length counts the rows waiting,
``flush``, ``snapshot`` and ``rollback`` push or forget them first, so every commit holds
every row of the records it counts. A push writes whole chunks only at chunk boundaries; if
a chunk write fails, the rows not written stay queued and the writer is as before that
chunk (nothing acknowledged is lost).

Example:
    >>> import numpy as np
    >>> from pytreestore._commit.record import Commit
    >>> from pytreestore._commit.protocol import layouts
    >>> from pytreestore._commit.writer import Writer
    >>> from pytreestore._format.schema import TreeSchema
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import TensorStoreBackend
    >>> schema = TreeSchema.from_example({"x": np.float32(0)}, chunk_records=4)
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-elements"))
    >>> backend.create_columns(layouts(schema))
    >>> rows = ElementRows(Writer(backend, schema, Commit(0, 0)), (np.float32,))
    >>> rows.defer([(np.float32(1),), (np.float32(2),)]); len(rows), rows.waiting
    (2, 2)
    >>> rows.push(); len(rows), rows.waiting, rows.writer.buffers[0][:2].tolist()
    (2, 0, [1.0, 2.0])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np

#: rows a table keeps waiting before it converts and buffers them (at most)
BLOCK_ROWS = 2048


class ElementRows:
    """The table ``writer`` (a :class:`~pytreestore._commit.writer.Writer`) of a ragged
    list whose columns hold numpy scalars of ``types`` (its columns' scalar types, in
    order), with rows waiting to be converted."""

    def __init__(self, writer: Any, types: Sequence[type]) -> None:
        self.writer = writer
        self.schema = writer.schema
        self.casters = writer.casters
        self._dtypes = [np.dtype(t) for t in types]
        #: what waits, in order: lists of row tuples, or lists of column blocks
        self._queue: list[tuple[bool, Any]] = []
        self.waiting = 0  # rows in the queue

    def __len__(self) -> int:
        return len(self.writer) + self.waiting

    @property
    def due(self) -> bool:
        """Whether enough rows wait to fill the writer's chunk, or a block."""
        writer = self.writer
        return self.waiting >= min(BLOCK_ROWS, writer.chunk - writer.fill)

    # ---- what a record's walk appends (never any I/O, never a failure) -------------------

    def defer(self, rows: list[tuple]) -> None:
        """Queues rows of exact numpy scalars (one tuple per row, columns in order)."""
        self._queue.append((True, rows))
        self.waiting += len(rows)

    def defer_blocks(self, blocks: Sequence[np.ndarray]) -> None:
        """Queues checked and cast column blocks this table owns (no caller keeps them)."""
        self._queue.append((False, blocks))
        self.waiting += len(blocks[0]) if len(blocks) else 0

    def forget(self, mark: tuple[int, int]) -> None:
        """Forgets what was queued since :meth:`mark` gave ``mark``."""
        del self._queue[mark[0] :]
        self.waiting = mark[1]

    def mark(self) -> tuple[int, int]:
        return (len(self._queue), self.waiting)

    # ---- the table writer's calls ----------------------------------------------------------

    def push(self) -> None:
        """Converts and buffers every queued row (whole chunks written as they fill).

        If a chunk write fails, the writer is as it was before that chunk and the rows not
        buffered stay queued."""
        if not self.waiting:
            return
        blocks = self._blocks()
        self._queue, self.waiting = [], 0
        writer, count, done = self.writer, len(blocks[0]), 0
        while done < count:
            take = min(count - done, max(writer.chunk - writer.fill, 1))
            position = (writer.start, writer.fill)
            try:
                writer.write_batch([b[done : done + take] for b in blocks])
            except BaseException:
                writer.rollback(position)
                self._queue = [(False, [b[done:] for b in blocks])]
                self.waiting = count - done
                raise
            done += take

    def _blocks(self) -> list[np.ndarray]:
        """The queue as one block per column."""
        parts: list[list[np.ndarray]] = []
        rows: list[list[tuple]] = []
        for is_rows, item in self._queue:
            if is_rows:
                rows.append(item)
                continue
            if rows:
                parts.append(self._convert(rows))
                rows = []
            parts.append(item)
        if rows:
            parts.append(self._convert(rows))
        if len(parts) == 1:
            return parts[0]
        return [np.concatenate(column) for column in zip(*parts)]

    def _convert(self, rows: list[list[tuple]]) -> list[np.ndarray]:
        columns = zip(*chain.from_iterable(rows))
        return [np.array(c, dtype) for c, dtype in zip(columns, self._dtypes)]

    def append(self, leaves: Sequence[Any]) -> None:
        self.push()
        self.writer.append(leaves)

    def append_many(self, leaves_iter: Iterator[Sequence[Any]]) -> None:
        self.push()
        self.writer.append_many(leaves_iter)

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        self.push()
        self.writer.write_batch(blocks)

    def flush(self) -> None:
        self.push()
        self.writer.flush()

    def snapshot(self) -> tuple[int, int]:
        """The writer's position once every queued row is buffered."""
        self.push()
        return self.writer.snapshot()

    def rollback(self, position: tuple[int, int]) -> None:
        """Forgets the queue, and the writer's rows since ``position``."""
        self._queue, self.waiting = [], 0
        self.writer.rollback(position)


__all__ = ["BLOCK_ROWS", "ElementRows"]
