"""Device arrays appended without waiting: their values are fetched when their chunk is written.

``store.append(state)`` right after a jitted step would wait for the step to finish if it copied
the state's ``jax.Array`` leaves to the host at once, so a loop could never run ahead of the
device. A writer's row filler instead keeps such a leaf (a fully addressable array of the
column's dtype and shape) in :class:`DeviceLeaves`, and :func:`fetch` copies the values into
the rows when the chunk is written (on the writer's background thread) or flushed: the copies
to the host are started together, then waited for.

A kept array must still exist when it is fetched. One deleted meanwhile (donated to a jitted
function with ``donate_argnums``, or ``.delete()``-d) is never read: JAX refuses to, and the
store raises :class:`~pytreestore.errors.DeletedArrayError` naming the record and keypath.
The first kept array of each record is watched, so that the usual case (a step donating the
state appended just before) is found by the next ``append``, not a chunk later.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> leaves = DeviceLeaves()
    >>> leaves.keep(0, 0, jnp.arange(3, dtype=jnp.int32)); leaves.arrived(0, leaves.kept[0])
    >>> buf = np.zeros((1, 3), np.int32)
    >>> fetch([buf], leaves.take(), [".x"], 0); buf
    array([[0, 1, 2]], dtype=int32)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from pytreestore.errors import DeletedArrayError, PyTreeStoreError

#: the concrete classes of ``jax.Array`` taken by the fast path of a fill (met so far, in a
#: single process: there every array is fully addressable; with several processes none is
#: added, and each array is asked)
DEVICE_TYPES: set[type] = set()

#: a leaf kept for fetching: (row in the chunk, column index, the array)
Kept = tuple[int, int, Any]


def is_device_array(leaf: Any) -> bool:
    """Whether ``leaf`` is a concrete ``jax.Array`` whose values this process can fetch (in
    a single process its class joins :data:`DEVICE_TYPES`, the fast path)."""
    if not isinstance(leaf, jax.Array) or isinstance(leaf, Tracer):
        return False
    if jax.process_count() == 1:
        DEVICE_TYPES.add(type(leaf))
        return True
    return leaf.is_fully_addressable


class DeletedLeaf(Exception):
    """Row ``row``'s array of column ``column`` was deleted before it was fetched (internal:
    the writer turns it into :class:`DeletedArrayError` with the record's number)."""

    def __init__(self, row: int, column: int) -> None:
        super().__init__(row, column)
        self.row = row
        self.column = column


class DeviceLeaves:
    """The device arrays of one chunk's rows, kept until they are fetched."""

    __slots__ = ("kept", "watch")

    def __init__(self) -> None:
        self.kept: list[Kept] = []
        #: the first kept array of the last record that had one: (row, column, array)
        self.watch: Kept | None = None

    def keep(self, row: int, column: int, leaf: Any) -> None:
        """Keeps ``leaf`` for row ``row`` of column ``column`` (the fast path of a fill
        appends to :attr:`kept` itself; :meth:`arrived` follows either)."""
        self.kept.append((row, column, leaf))

    def arrived(self, row: int, first: Kept) -> None:
        """After a record of row ``row`` kept ``first`` and maybe more: checks that the last
        record's first array still exists, and this one's.

        Raises:
            DeletedLeaf: one of them was deleted (a row before ``row``, or ``row`` itself).
        """
        watch = self.watch
        if watch is not None and watch[0] != row and watch[2].is_deleted():
            raise DeletedLeaf(watch[0], watch[1])
        if first[2].is_deleted():
            raise DeletedLeaf(row, first[1])
        self.watch = first

    def forget(self, row: int) -> None:
        """Drops what was kept for rows from ``row`` on (a refused record, rows cut)."""
        kept = self.kept
        while kept and kept[-1][0] >= row:
            kept.pop()
        if self.watch is not None and self.watch[0] >= row:
            self.watch = kept[-1] if kept else None

    def take(self) -> list[Kept]:
        """What is kept, handed over for fetching (this object starts empty again; its
        :attr:`kept` stays the same list, which a fill's generated code appends to)."""
        kept = list(self.kept)
        self.kept.clear()
        self.watch = None
        return kept


def fetch(
    buffers: Sequence[np.ndarray], kept: Sequence[Kept], paths: Sequence[str], start: int
) -> None:
    """Copies ``kept`` device arrays into their rows of ``buffers`` (rows ``start + row``).

    Raises:
        DeletedLeaf: an array was deleted; the rows before its row were filled.
        PyTreeStoreError: an array's values could not be fetched (its computation failed).
    """
    if not kept:
        return
    try:
        if _on_host(kept[0][2]):  # a view of host memory: one leaf at a time is cheapest
            asarray = np.asarray
            for row, column, leaf in kept:
                buffers[column][row] = asarray(leaf)
        else:  # a copy per array costs a round trip: columns stacked on the device first
            _fetch_stacked(buffers, kept)
    except Exception:  # a deleted array, or a failed computation: found in row order
        _fetch_in_order(buffers, kept, paths, start)
        raise AssertionError("unreachable: fetching in order raises the same error") from None


#: arrays stacked on a device per call (a fixed count: one compiled stack per leaf shape)
STACK = 256


@functools.cache
def _stacker() -> Any:
    return jax.jit(lambda *arrays: jax.numpy.stack(arrays))


def _fetch_stacked(buffers: Sequence[np.ndarray], kept: Sequence[Kept]) -> None:
    """Each column's kept arrays stacked on their device :data:`STACK` at a time (the last
    group padded with its last array; a column of fewer, one by one), every copy to the host
    started, then waited for."""
    columns: dict[int, tuple[list[int], list[Any]]] = {}
    for row, column, leaf in kept:
        rows, leaves = columns.setdefault(column, ([], []))
        rows.append(row)
        leaves.append(leaf)
    stack, stacked = _stacker(), []
    for column, (rows, leaves) in columns.items():
        if len(leaves) < STACK:  # too few to pay for compiling a stack: copied one by one
            stacked.extend((column, [row], leaf) for row, leaf in zip(rows, leaves))
            continue
        for i in range(0, len(leaves), STACK):
            group = leaves[i : i + STACK]
            group += [group[-1]] * (STACK - len(group))
            stacked.append((column, rows[i : i + STACK], stack(*group)))
    for _, _, block in stacked:
        block.copy_to_host_async()
    for column, rows, block in stacked:
        if len(rows) == 1 and block.shape == buffers[column].shape[1:]:
            buffers[column][rows[0]] = np.asarray(block)
        else:
            buffers[column][rows] = np.asarray(block)[: len(rows)]


def _fetch_in_order(
    buffers: Sequence[np.ndarray], kept: Sequence[Kept], paths: Sequence[str], start: int
) -> None:
    """Fetches ``kept`` one by one, in row order, up to the first that fails (its error)."""
    for row, column, leaf in kept:
        if leaf.is_deleted():
            raise DeletedLeaf(row, column)
        try:
            buffers[column][row] = np.asarray(leaf)
        except Exception as err:
            if leaf.is_deleted():
                raise DeletedLeaf(row, column) from None
            where = paths[column] or "the root"
            raise PyTreeStoreError(
                f"record {start + row}'s array at {where} could not be fetched from its "
                f"device: {type(err).__name__}: {err}"
            ) from err


def _on_host(leaf: Any) -> bool:
    """Whether ``leaf`` lives in this host's memory (a CPU device): no copy to start."""
    try:
        return all(d.platform == "cpu" for d in leaf.devices())
    except Exception:
        return False


def deleted_error(path: str, record: int, *, dropped: int, previous: bool) -> DeletedArrayError:
    """The error for record ``record``'s array at keypath ``path``, deleted before it was
    fetched; ``dropped``: the records dropped with it (it and those appended after it)."""
    which = "the record appended before this one" if previous else f"record {record}"
    return DeletedArrayError(
        f"{which} (record {record}) held a jax.Array at {path or 'the root'} that was deleted "
        "before the store fetched its values: it was donated to a jitted function "
        "(donate_argnums) or deleted. The store fetches device arrays when their chunk is "
        f"written, so it cannot keep that record: {dropped} record(s) from {record} on were "
        "dropped (those before it are kept"
        + (", and this call's record was not appended" if previous else "")
        + "). Append a copy that stays alive (store.append(jax.tree.map(jnp.copy, state))), "
        "or the host values (store.append(jax.device_get(state)), which waits for the step), "
        "or stop donating the state you append."
    )


__all__ = [
    "DEVICE_TYPES",
    "DeletedLeaf",
    "DeviceLeaves",
    "deleted_error",
    "fetch",
    "is_device_array",
]
