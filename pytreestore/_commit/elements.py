"""The table of a ragged list whose elements' leaves are numpy scalars: their values kept
as they are until a block is due, then converted one column at a time.

An element's leaves that are numpy scalars of exactly their columns' dtypes
(:meth:`~pytreestore._commit.flat.FlatList.exact_values`) need no check and no cast, and
numpy scalars cannot change once made: :class:`ElementRows` keeps each record's values
as they are, element after element in one list, and converts a block of them when it is
due (:meth:`ElementRows.push`: one ``np.fromiter`` per column of about 20 ns a value, against
about 0.5 us per column and record for one record's handful). Anything else appended to the table (blocks already checked and
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
    >>> rows.defer([np.float32(1), np.float32(2)]); len(rows), rows.waiting
    (2, 2)
    >>> rows.push(); len(rows), rows.waiting, rows.writer.buffers[0][:2].tolist()
    (2, 0, [1.0, 2.0])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from pytreestore._commit.roles import Block, Position, Row
from pytreestore._commit.writer import Writer
from pytreestore._runtime import RUNTIME


class ElementRows:
    """The table ``writer`` (a :class:`~pytreestore._commit.writer.Writer`) of a ragged
    list whose columns hold numpy scalars of ``types`` (its columns' scalar types, in
    order), with rows waiting to be converted."""

    def __init__(self, writer: Writer, types: Sequence[type]) -> None:
        self.writer = writer
        self.schema = writer.schema
        self.casters = writer.casters
        self._dtypes = [np.dtype(t) for t in types]
        #: what waits, in order: blocks (one array per column), then the values of the
        #: records deferred since (element after element, each element's in column order)
        self._blocks: list[list[np.ndarray]] = []
        self._values: list[object] = []
        self._counts: list[int] = []  # rows of each of those records
        self.waiting = 0  # rows waiting, in both
        self.due_at = 0  # rows waiting from which a push is due (see due)
        self._due()

    def __len__(self) -> int:
        return len(self.writer) + self.waiting

    @property
    def due(self) -> bool:
        """Whether enough rows wait to fill the writer's chunk, or a block."""
        return self.waiting >= self.due_at

    # ---- what a record's walk appends (never any I/O, never a failure) -------------------

    def defer(self, values: list[object]) -> None:
        """Queues rows of exact numpy scalars given row after row (each row's values in
        column order); the list is the table's from now on."""
        n = len(values) // len(self._dtypes)
        self._values += values
        self._counts.append(n)
        self.waiting += n

    def defer_blocks(self, blocks: Sequence[np.ndarray]) -> None:
        """Queues checked and cast column blocks this table owns (no caller keeps them)."""
        self._close_columns()
        self._blocks.append(list(blocks))
        self.waiting += len(blocks[0])

    def forget(self, waiting: int) -> None:
        """Forgets the rows queued last, down to ``waiting`` rows (:attr:`waiting` before)."""
        drop = self.waiting - waiting
        while drop and self._counts:  # whole records' values, the last first
            assert self._counts[-1] <= drop, "forget() never cuts one deferral's rows"
            count = self._counts.pop()
            del self._values[len(self._values) - count * len(self._dtypes) :]
            drop -= count
        while drop:
            last = self._blocks[-1]
            if len(last[0]) <= drop:
                drop -= len(self._blocks.pop()[0])
            else:
                self._blocks[-1] = [b[: len(b) - drop] for b in last]
                drop = 0
        self.waiting = waiting

    def _close_columns(self) -> None:
        """The records' values waiting, as one block (one ``np.fromiter`` per column)."""
        if not self._counts:
            return
        values, count, k = self._values, sum(self._counts), len(self._dtypes)
        self._blocks.append(
            [
                np.fromiter(values[j::k] if k > 1 else values, t, count)
                for j, t in enumerate(self._dtypes)
            ]
        )
        self._values, self._counts = [], []

    # ---- the table writer's calls ----------------------------------------------------------

    def push(self) -> None:
        """Converts and buffers every queued row (whole chunks written as they fill).

        If a chunk write fails, the writer is as it was before that chunk and the rows not
        buffered stay queued."""
        if not self.waiting:
            return
        self._close_columns()
        parts = self._blocks
        blocks = parts[0] if len(parts) == 1 else [np.concatenate(c) for c in zip(*parts)]
        self._blocks, self.waiting = [], 0
        writer, count, done = self.writer, len(blocks[0]), 0
        while done < count:
            take = min(count - done, max(writer.chunk - writer.fill, 1))
            position = (writer.start, writer.fill)
            try:
                writer.write_batch([b[done : done + take] for b in blocks])
            except BaseException:
                writer.rollback(position)
                self._blocks = [[b[done:] for b in blocks]]
                self.waiting = count - done
                raise
            done += take
        self._due()

    def _due(self) -> None:
        writer = self.writer
        self.due_at = max(1, min(RUNTIME.writes.table_block_rows, writer.chunk - writer.fill))

    @property
    def chunk(self) -> int:
        return self.writer.chunk

    @property
    def start(self) -> int:
        return self.writer.start

    @property
    def fill(self) -> int:
        """The writer's rows buffered (the rows waiting here come after them)."""
        return self.writer.fill

    def hand_partial(self) -> Callable[[], None] | None:
        """The writer's job for its rows not yet committed, every waiting row buffered first
        (:meth:`~pytreestore._commit.writer.Writer.hand_partial`)."""
        self.push()
        return self.writer.hand_partial()

    def append_blocks(self, blocks: Iterator[Block]) -> None:
        self.push()
        self.writer.append_blocks(blocks)

    def append(self, leaves: Row) -> None:
        self.push()
        self.writer.append(leaves)

    def append_many(self, leaves_iter: Iterator[Row]) -> None:
        self.push()
        self.writer.append_many(leaves_iter)

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        self.push()
        self.writer.write_batch(blocks)

    def flush(self) -> None:
        self.push()
        self.writer.flush()
        self._due()

    def snapshot(self) -> Position:
        """The writer's position once every queued row is buffered."""
        self.push()
        return self.writer.snapshot()

    def rollback(self, position: Position) -> None:
        """Forgets the queue, and the writer's rows since ``position``."""
        self._blocks, self._values, self._counts, self.waiting = [], [], [], 0
        self.writer.rollback(position)
        self._due()


__all__ = ["ElementRows"]
