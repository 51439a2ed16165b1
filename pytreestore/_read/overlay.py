"""What one read of a store sees: the commit it reads at and, through a writer, the rows only
the writer's memory holds (issue 46: a read of a writer commits nothing).

A read through the store's writer sees every record appended, buffered ones included, and
commits nothing: each table's rows that only the writer's memory holds (the chunk being
filled, chunks handed to the background writer and not yet written, rows waiting to be
converted: :class:`~pytreestore._write.roles.Held`) are taken from memory, the rows before
them from storage as any read's (whole chunks, through the decoded-chunk cache). A
:class:`View` is made once per read (:meth:`pytreestore._core.StoreCore.viewing`) and every
route of the read engine takes its rows through :meth:`View.read`: the fixed reads
(:mod:`pytreestore._read.reader`, sharded loads through :meth:`View.reads`) and the
gathers of a store's tables (:mod:`pytreestore._read.tables`). A read of rows that memory
alone holds touches no storage.

A reader's view, and a writer's seen while another thread appends, is its commit alone.

Example:
    >>> import numpy as np
    >>> from pytreestore._log.commit_record import Commit
    >>> from pytreestore._write.roles import Held
    >>> held = Held(4, 6, ((4, [np.array([40, 50, 0, 0])]),))
    >>> view = View(Commit(6, 1), {"x": (held, 0)})
    >>> stored = lambda keys, index, records: [np.arange(records)[index] * 10]
    >>> view.read(stored, ["x"], np.array([5, 1, 4]), 6)[0].tolist()
    [50, 10, 40]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from pytreestore._log.commit_record import Commit
from pytreestore._read.index import rows

#: reads ``keys`` at ``index`` of a table holding ``rows`` rows (storage's, or a cache's)
ReadFn = Callable[[Sequence[str], Any, int], list[np.ndarray]]


class HeldRows(Protocol):
    """A table's rows ``[start, stop)`` that only memory holds (the rows before ``start``
    are on storage): :class:`~pytreestore._write.roles.Held`."""

    @property
    def start(self) -> int: ...

    @property
    def stop(self) -> int: ...

    def take(self, columns: Sequence[int], rows: np.ndarray) -> list[np.ndarray]: ...


@dataclasses.dataclass(frozen=True)
class View:
    """What one read sees.

    Attributes:
        commit: the records and each table's rows the read sees (a writer's: buffered ones
            counted, as if committed; nothing is).
        held: by storage key, the rows of its table only memory holds and the column's
            place among them (empty: everything is on storage).
    """

    commit: Commit
    held: Mapping[str, tuple[HeldRows, int]] = dataclasses.field(default_factory=dict)

    @property
    def records(self) -> int:
        """The records the read sees."""
        return self.commit.records

    def read(self, read: ReadFn, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        """Rows ``index`` (normalised) of the columns ``keys`` (of one table, holding
        ``records`` rows): those memory holds taken from it, the others read by ``read``
        (storage, with the rows before the held ones as the table's rows)."""
        found = self.held.get(keys[0]) if keys else None
        if found is None:
            return read(keys, index, records)
        held = found[0]
        wanted = rows(index)
        memory = wanted >= held.start
        if not memory.any():
            return read(keys, index, min(records, held.start))
        columns = [self.held[k][1] for k in keys]
        if memory.all():
            return held.take(columns, wanted)
        stored = _stored_index(index, wanted[~memory], held.start)
        got = read(keys, stored, min(records, held.start))
        taken = held.take(columns, wanted[memory])
        out = []
        for array, rows_held in zip(got, taken):
            both = np.empty((len(wanted), *array.shape[1:]), array.dtype)
            both[~memory], both[memory] = array, rows_held
            out.append(both)
        return out

    def reads(self, backend: Any) -> Any:
        """``backend`` for a sharded load (its ``read`` and ``read_many``), rows memory holds
        taken from it; ``backend`` itself when memory holds none."""
        return _HeldReads(backend, self) if self.held else backend


def _stored_index(index: Any, stored: np.ndarray, start: int) -> Any:
    """The index of the rows of ``index`` before ``start`` (a slice's: a slice)."""
    if isinstance(index, slice):
        return slice(index.start, min(index.stop, start), index.step)
    return stored


class _HeldReads:
    """A backend's reads through a :class:`View` (what a sharded load reads with)."""

    def __init__(self, backend: Any, view: View) -> None:
        self._backend = backend
        self._view = view

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        return self._view.read(self._backend.read, keys, index, records)

    def read_many(self, requests: Sequence[tuple[str, Any]], records: int) -> list[np.ndarray]:
        return [self.read([key], index, records)[0] for key, index in requests]


def committed(commit: Commit) -> View:
    """The view of ``commit`` alone (a reader's, or a writer's seen from another thread)."""
    return View(commit)


def of_writer(
    commit: Commit,
    records: int,
    rows: Mapping[str | None, int],
    held: Mapping[str | None, HeldRows],
    keys: Mapping[str, tuple[str | None, int]],
) -> View:
    """The view of a writer at ``commit`` holding ``records`` records, each table's ``rows``
    and its rows only memory holds (``held``); ``keys``: each storage key's table and place
    among its table's columns."""
    tables = tuple((t, n) for t, n in rows.items() if t is not None)
    seen = dataclasses.replace(commit, records=records, tables=tables or commit.tables)
    busy = {t for t, h in held.items() if h.stop > h.start}
    return View(seen, {k: (held[t], i) for k, (t, i) in keys.items() if t in busy})


__all__ = ["HeldRows", "ReadFn", "View", "committed", "of_writer"]
