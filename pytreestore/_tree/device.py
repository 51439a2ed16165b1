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
    >>> leaves.keep(0, 0, jnp.arange(3, dtype=jnp.int32))
    >>> buf = np.zeros((1, 3), np.int32)
    >>> fetch([buf], leaves.take(), [".x"], 0); buf
    array([[0, 1, 2]], dtype=int32)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from pytreestore.errors import DeletedArrayError, PyTreeStoreError

#: the concrete classes of ``jax.Array`` met so far (a tracer is never one of them)
DEVICE_TYPES: set[type] = set()

#: a leaf kept for fetching: (row in the chunk, column index, the array)
Kept = tuple[int, int, Any]


def is_device_array(leaf: Any) -> bool:
    """Whether ``leaf`` is a concrete ``jax.Array`` whose values this process can fetch (its
    class is remembered in :data:`DEVICE_TYPES` for the fast path)."""
    if not isinstance(leaf, jax.Array) or isinstance(leaf, jax.core.Tracer):
        return False
    DEVICE_TYPES.add(type(leaf))
    return True


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
        """Keeps ``leaf`` for row ``row`` of column ``column``; at a record's first, checks
        that the last record's first array still exists (and this one).

        Raises:
            DeletedLeaf: one of them was deleted (a row before ``row``, or ``row`` itself).
        """
        if self.watch is None or self.watch[0] != row:
            watch = self.watch
            if watch is not None and watch[2].is_deleted():
                raise DeletedLeaf(watch[0], watch[1])
            if leaf.is_deleted():
                raise DeletedLeaf(row, column)
            self.watch = (row, column, leaf)
        self.kept.append((row, column, leaf))

    def forget(self, row: int) -> None:
        """Drops what was kept for rows from ``row`` on (a refused record, rows cut)."""
        while self.kept and self.kept[-1][0] >= row:
            self.kept.pop()
        if self.watch is not None and self.watch[0] >= row:
            self.watch = self.kept[-1] if self.kept else None

    def take(self) -> list[Kept]:
        """What is kept, handed over for fetching (this object starts empty again)."""
        kept, self.kept, self.watch = self.kept, [], None
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
    for _, _, leaf in kept:
        if leaf.is_deleted():
            break
        leaf.copy_to_host_async()  # every copy under way before the first is waited for
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
