"""The two roles a :class:`~pytreestore._write.records.RecordWriter` is built from.

A **table buffer** (:class:`TableBuffer`) takes one table's rows: a
:class:`~pytreestore._write.writer.Writer` keeps one chunk of them and writes chunks to
storage as they fill (on a background thread); a shared writer's
:class:`~pytreestore._write.coordinated.CoordinatedRows` and a fragment's
:class:`~pytreestore._fragments.cast.TableRows` keep them all in memory.

A **committer** (:class:`Commits`) makes the tables a writer fills and commits them: the store's
only writer commits to storage (:class:`~pytreestore._write.commits.DirectCommits`), writers
sharing a store through a coordinator commit in turn
(:class:`~pytreestore._write.coordinated.CoordinatedCommits`), and a fragment commits nothing
(:class:`~pytreestore._fragments.cast.FragmentCommits`). The record writer itself is the same
for all of them.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-roles", {"x": np.int8(0)})
    >>> isinstance(s._core.writer.tables[None], TableBuffer)
    True
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._log.committer import Committer
from pytreestore._tree.convert import LeafCaster

#: one row's leaves (numpy arrays or scalars, Python numbers, jax.Arrays), in column order
Row = Sequence[object]

#: one table's rows given a block at a time: per column, each row's value, and the count
Block = tuple[Sequence[Sequence[object]], int]

#: a buffer's position to roll back to (its first buffered row, and the rows buffered)
Position = tuple[int, int]


@typing.final
@dataclasses.dataclass(frozen=True)
class Held:
    """A table's rows that only the writer's memory holds: rows ``[start, stop)``, in pieces
    of consecutive rows (the chunks handed to the background writer and not yet written,
    the chunk being filled, rows waiting to be converted), each its first row and one array
    per column; every row before ``start`` is on storage. What a read of the writer takes
    instead of committing them (:class:`pytreestore._read.index.View`); valid while the store's
    mutex is held (the writer reuses its buffers).

    Example:
        >>> held = Held(4, 7, ((4, [np.array([10, 11, 12, 0])]),))
        >>> held.take([0], np.array([6, 4]))[0].tolist()
        [12, 10]
    """

    start: int
    stop: int
    pieces: tuple[tuple[int, Sequence[np.ndarray]], ...]

    def take(self, columns: Sequence[int], rows: np.ndarray) -> list[np.ndarray]:
        """Rows ``rows`` (each in ``[start, stop)``) of the columns at ``columns``, copied."""
        if len(self.pieces) == 1:
            first, arrays = self.pieces[0]
            if _consecutive(rows):  # one copy of a run, not a gather
                low = int(rows[0]) - first
                return [arrays[c][low : low + len(rows)].copy() for c in columns]
            return [arrays[c][rows - first] for c in columns]
        firsts = np.array([first for first, _ in self.pieces[1:]])
        which = np.searchsorted(firsts, rows, side="right")
        like = self.pieces[0][1]
        out = [np.empty((len(rows), *like[c].shape[1:]), like[c].dtype) for c in columns]
        for k, (first, arrays) in enumerate(self.pieces):
            here = np.flatnonzero(which == k)
            for o, c in zip(out, columns):
                o[here] = arrays[c][rows[here] - first]
        return out


def _consecutive(rows: np.ndarray) -> bool:
    """Whether ``rows`` is a run of consecutive rows."""
    n = len(rows)
    if not n or int(rows[-1]) - int(rows[0]) != n - 1:
        return False
    return n <= 2 or bool((np.diff(rows) == 1).all())


@runtime_checkable
class TableBuffer(Protocol):
    """One table's rows, buffered: each row a record's (or an element's) leaves, checked and
    cast by the table's casters.

    Attributes:
        schema: the table's columns and its rows per chunk.
        casters: one per column, in column order.
        chunk: rows per chunk (a buffer kept whole in memory: never full).
        start: the first row buffered (the rows before it are written).
        fill: the rows buffered after ``start``.
    """

    @property
    def schema(self) -> TreeSchema: ...

    @property
    def casters(self) -> list[LeafCaster]: ...

    @property
    def chunk(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def fill(self) -> int: ...

    def __len__(self) -> int:
        """The table's rows, buffered ones included."""
        ...

    def append(self, leaves: Row, /) -> None:
        """Buffers one row of structure-checked leaves (cast here)."""
        ...

    def append_many(self, leaves_iter: Iterator[Row], /) -> None:
        """Buffers rows; RecordError (``index`` from the first) names a refused one."""
        ...

    def append_blocks(self, blocks: Iterator[Block], /) -> None:
        """Buffers rows given a block at a time as columns; RecordError as above."""
        ...

    def write_batch(self, blocks: Sequence[np.ndarray], /) -> None:
        """Buffers (or writes) checked and cast column blocks of one leading length."""
        ...

    def snapshot(self) -> Position:
        """The position to :meth:`rollback` to if a multi-row append fails."""
        ...

    def rollback(self, position: Position, /) -> None:
        """Forgets every row appended since ``position``."""
        ...

    def buffered_rows(self) -> Held | None:
        """The rows only memory holds, for a read of the writer (the store's mutex held);
        None: its rows have no place before their commit (a shared writer's), so a read
        commits them first."""
        ...


class Commits(Protocol):
    """What makes a record writer's tables and commits them."""

    @property
    def commit(self) -> Commit:
        """The last commit (records and each table's rows)."""
        ...

    def tables(
        self, schema: TreeSchema, commit: Commit, *, whole: bool
    ) -> dict[str | None, TableBuffer]:
        """The buffers of every table of ``schema`` (the record table None first) at
        ``commit``; ``whole``: the record table's rows are whole records of ``schema`` (a
        fixed store's one table, which may commit them itself as its chunks fill)."""
        ...

    def records(self) -> int:
        """The records once what is buffered is committed."""
        ...

    def check(self) -> None:
        """Raises CommitConflictError if another writer committed since (where it can tell)."""
        ...

    def full(self) -> None:
        """The record table's chunk is full (before a record): commit what is buffered."""
        ...

    def after_call(self, *, extended: bool) -> None:
        """After an ``append`` (``extended``: an ``extend``) accepted its records."""
        ...

    def flush(self) -> None:
        """Commits every buffered row of every table, in one commit."""
        ...

    def sole(self) -> Committer:
        """The committer of operations (evolve, truncate, fragments), which need the store's
        only writer; refused where there is none."""
        ...

    def may_learn(self, schema: TreeSchema) -> None:
        """Refuses a record that shows a structure ``schema`` has not learnt where the schema
        cannot change (a writer sharing its store); nothing where it can."""
        ...

    def adopt(self, old: TreeSchema, grown: TreeSchema) -> Commit:
        """Takes ``grown`` (``old`` with structures a record showed learnt; nothing buffered)
        and returns the commit its tables start at; refused where the schema cannot change."""
        ...


__all__ = ["Block", "Commits", "Held", "Position", "Row", "TableBuffer"]
