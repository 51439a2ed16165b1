"""Device arrays appended without waiting: the store copies them at ``append`` and fetches the
copies' values when their chunk is written.

``store.append(state)`` right after a jitted step must not wait for the step, and must keep
the record whatever the caller does with ``state`` afterwards: a training step that donates
it (``jax.jit(step, donate_argnums=0)``), ``.delete()``, reuse. A writer's row filler gives
the record's ``jax.Array`` leaves (fully addressable, of the column's dtype and shape) to
:meth:`DeviceLeaves.own`, which makes them the store's own before ``append`` returns:

- a leaf on a CPU device is copied into its row at once (its memory is the host's: one
  ``np.asarray`` per leaf, about 1 us, after the step that made it has run; a view would not
  do, since a donated buffer's memory is reused);
- a leaf on an accelerator is copied on its device by one jitted copy of the record's leaves
  per device set, dispatched without waiting (the copy is the store's: nothing the caller
  does can delete it; JAX orders a donation or deletion after a read dispatched before it).
  :func:`fetch` copies those to the host when the chunk is written (on the writer's
  background thread) or flushed, each column's arrays of a device stacked first.

``copy_to_host_async`` at ``append`` would not survive: deleting or donating an array drops
the host copy it started (``PyArray::Delete`` resets its host value, and ``np.asarray`` of a
deleted array raises), and the stack of the kept states (one jitted update per record) cost
2.4x the jitted copy on a TPU v5e (docs/benchmarks.md, "Donated training loop").

An array deleted before its ``append`` is refused by that ``append`` (nothing appended). A
copy whose values cannot be fetched later (the computation that made it failed) raises
:class:`LostLeaf` from :func:`fetch`, which the writer turns into
:class:`~pytreestore.errors.DeviceFetchError`, dropping that record and the ones after it.

Every other path copies a ``jax.Array`` to the host at once (a ragged or optional store's
walk, ``extend``, ``extend_batch``, ``write_fragment``, ``stack``, a cast): when that copy
raises JAX's error, :func:`refuse_unreadable` finds the record's first array that cannot be
read (:func:`unreadable`) and raises the same error as a fixed store's ``append``, naming
the record and the keypath; nothing is appended.

Example:
    >>> import jax.numpy as jnp, numpy as np
    >>> buf = np.zeros((1, 3), np.int32)
    >>> leaves = DeviceLeaves()
    >>> leaves.keep(0, 0, jnp.arange(3, dtype=jnp.int32)); leaves.own(0, [buf])
    >>> buf, leaves.take()  # a CPU array: copied into its row at once, nothing left to fetch
    (array([[0, 1, 2]], dtype=int32), [])
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from pytreestore._runtime import RUNTIME
from pytreestore.errors import DeletedArrayError, DeviceFetchError, PyTreeStoreError

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


class LostLeaf(Exception):
    """Row ``row``'s array of column ``column`` could not be read: deleted (``cause`` None)
    or its computation failed (``cause``). Internal: the writer turns it into
    :class:`DeletedArrayError` or :class:`DeviceFetchError` with the record's number."""

    def __init__(self, row: int, column: int, cause: BaseException | None = None) -> None:
        super().__init__(row, column, cause)
        self.row = row
        self.column = column
        self.cause = cause


class DeviceLeaves:
    """The store's copies of device arrays of one chunk's rows, kept until they are fetched."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        #: the copies, in row order (a fill's generated code appends the caller's arrays
        #: here first, :meth:`own` replaces them)
        self.kept: list[Kept] = []

    def keep(self, row: int, column: int, leaf: Any) -> None:
        """Keeps ``leaf`` for row ``row`` of column ``column`` until :meth:`own` (the fast
        path of a fill appends to :attr:`kept` itself)."""
        self.kept.append((row, column, leaf))

    def own(self, mark: int, buffers: Sequence[np.ndarray]) -> None:
        """After a fill kept ``kept[mark:]`` (the caller's arrays of one record): copies those
        on the host into ``buffers`` and replaces the others by the store's own copies.

        Raises:
            LostLeaf: an array is deleted, or (on the host) its computation failed: the
                record is not appended.
        """
        record = self.kept[mark:]
        del self.kept[mark:]
        device = []
        for row, column, leaf in record:
            if leaf.is_deleted():
                raise LostLeaf(row, column)
            if _on_host(leaf):
                try:
                    buffers[column][row] = np.asarray(leaf)
                except Exception as err:
                    raise LostLeaf(row, column, None if leaf.is_deleted() else err) from err
            else:
                device.append((row, column, leaf))
        if device:
            self.kept.extend(_copied(device))

    def forget(self, row: int) -> None:
        """Drops what was kept for rows from ``row`` on (a refused record, rows cut)."""
        kept = self.kept
        while kept and kept[-1][0] >= row:
            kept.pop()

    def take(self) -> list[Kept]:
        """What is kept, handed over for fetching (this object starts empty again; its
        :attr:`kept` stays the same list, which a fill's generated code appends to)."""
        kept = list(self.kept)
        self.kept.clear()
        return kept


@functools.cache
def _copier() -> Any:
    return jax.jit(lambda leaves: [jax.numpy.copy(x) for x in leaves])


def _copied(record: Sequence[Kept]) -> list[Kept]:
    """The store's copies of ``record``'s arrays: one jitted copy per sharding, dispatched
    without waiting (one record's arrays: they share a row).

    Raises:
        LostLeaf: a copy could not be dispatched (found leaf by leaf).
    """
    groups: dict[Any, list[Kept]] = {}
    for kept in record:
        groups.setdefault(kept[2].sharding, []).append(kept)
    out: list[Kept] = []
    for group in groups.values():
        try:
            copies = _copier()([leaf for _, _, leaf in group])
        except Exception:
            _fetch_in_order(None, group)
            raise
        out.extend((row, column, copy) for (row, column, _), copy in zip(group, copies))
    return out


def fetch(buffers: Sequence[np.ndarray], kept: Sequence[Kept]) -> None:
    """Copies ``kept`` device arrays into their rows of ``buffers``.

    Raises:
        LostLeaf: an array could not be fetched (deleted, or its computation failed); every
            row before its row is filled.
    """
    if not kept:
        return
    try:
        _fetch_stacked(buffers, kept)
    except Exception:  # a failed array: found in row order (rows before it filled)
        _fetch_in_order(buffers, kept)


@functools.cache
def _stacker() -> Any:
    return jax.jit(lambda *arrays: jax.numpy.stack(arrays))


def _fetch_stacked(buffers: Sequence[np.ndarray], kept: Sequence[Kept]) -> None:
    """Each column's kept arrays of one sharding stacked on it
    ``RUNTIME.writes.device_stack`` at a time (the last group padded with its last array;
    fewer, one by one), every copy to the host
    started, then waited for."""
    columns: dict[tuple[int, Any], tuple[list[int], list[Any]]] = {}
    for row, column, leaf in kept:
        rows, leaves = columns.setdefault((column, leaf.sharding), ([], []))
        rows.append(row)
        leaves.append(leaf)
    stack, stacked, each = _stacker(), [], RUNTIME.writes.device_stack
    for (column, _), (rows, leaves) in columns.items():
        if len(leaves) < each:  # too few to pay for compiling a stack: copied one by one
            stacked.extend((column, [row], leaf) for row, leaf in zip(rows, leaves))
            continue
        for i in range(0, len(leaves), each):
            group = leaves[i : i + each]
            group += [group[-1]] * (each - len(group))
            stacked.append((column, rows[i : i + each], stack(*group)))
    for _, _, block in stacked:
        block.copy_to_host_async()
    for column, rows, block in stacked:
        if len(rows) == 1 and block.shape == buffers[column].shape[1:]:
            buffers[column][rows[0]] = np.asarray(block)
        else:
            buffers[column][rows] = np.asarray(block)[: len(rows)]


def _fetch_in_order(buffers: Sequence[np.ndarray] | None, kept: Sequence[Kept]) -> None:
    """Fetches ``kept`` one by one, in row order, up to the first that fails (``buffers``
    None: only looks for it).

    Raises:
        LostLeaf: the first array that could not be fetched.
    """
    for row, column, leaf in kept:
        if leaf.is_deleted():
            raise LostLeaf(row, column)
        try:
            value = np.asarray(leaf)
        except Exception as err:
            raise LostLeaf(row, column, None if leaf.is_deleted() else err) from err
        if buffers is not None:
            buffers[column][row] = value


def _on_host(leaf: Any) -> bool:
    """Whether ``leaf`` lives in this host's memory (CPU devices only): no copy to start."""
    return _host_sharding(leaf.sharding)


@functools.lru_cache(maxsize=256)
def _host_sharding(sharding: Any) -> bool:
    return all(d.platform == "cpu" for d in sharding.device_set)


#: how a refused append ends
NOT_APPENDED = "Nothing was appended: append a record whose arrays are valid."
#: how a refused call of many records ends (extend, extend_batch, write_fragment, stack)
VALID = "Pass records whose arrays are valid."


def lost_error(
    err: LostLeaf, path: str, record: int, *, dropped: range, refused: bool = False
) -> DeletedArrayError | DeviceFetchError:
    """The error for record ``record``'s array at keypath ``path`` that could not be read;
    ``dropped``: the records dropped with it (empty: the record was not appended);
    ``refused``: the call that reports it appended nothing either."""
    kind, what = _described(err, path, f"record {record}'s")
    if not dropped:
        return kind(f"{what}. {NOT_APPENDED}")
    return kind(
        f"{what}. {_records(dropped)} dropped: record {record} and the ones appended after "
        f"it (records before {record} are kept, and committed by flush() or close()); the "
        f"store holds {dropped.start} records, so the next append is record {dropped.start}"
        + (". This call's record was not appended." if refused else ".")
    )


def _described(
    err: LostLeaf, path: str, whose: str
) -> tuple[type[DeletedArrayError | DeviceFetchError], str]:
    """The error class and the description of ``whose`` array at ``path`` (``err``)."""
    where = path or "the root"
    if err.cause is None:
        what = f"{whose} jax.Array at {where} is deleted (donated to a jitted function, or deleted)"
        return DeletedArrayError, what
    first = str(err.cause).strip().splitlines()[0][:200] if str(err.cause) else ""
    return DeviceFetchError, (
        f"{whose} jax.Array at {where} could not be fetched from its device: the computation "
        f"that made it failed ({type(err.cause).__name__}: {first})"
    )


def unreadable(tree: Any) -> tuple[str, LostLeaf] | None:
    """The keypath of the first ``jax.Array`` leaf of ``tree`` that cannot be read, and why
    (a :class:`LostLeaf` of row and column 0: deleted, or its computation failed); None if
    every one can. Waits for each array's computation: for an error path."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not is_device_array(leaf):
            continue
        if leaf.is_deleted():
            return jax.tree_util.keystr(path), LostLeaf(0, 0)
        try:
            leaf.block_until_ready()
        except Exception as err:
            return jax.tree_util.keystr(path), LostLeaf(0, 0, None if leaf.is_deleted() else err)
    return None


def refuse_unreadable(
    err: BaseException, tree: Any, head: str, *, whose: str = "its", fix: str = NOT_APPENDED
) -> None:
    """After taking ``tree`` raised ``err``: if ``err`` is no pytreestore error and a
    ``jax.Array`` leaf of ``tree`` cannot be read, raises the error of the fixed path's
    ``append`` (:func:`lost_error`) for it instead of JAX's; else returns (the caller
    raises ``err``). The message is ``head``, ``whose`` array described, then ``fix``.

    Raises:
        DeletedArrayError: the first such leaf is deleted (donated, or ``.delete()``).
        DeviceFetchError: the computation that made it failed.
    """
    if isinstance(err, PyTreeStoreError) or not isinstance(err, Exception):
        return
    found = unreadable(tree)
    if found is None:
        return
    kind, what = _described(found[1], found[0], whose)
    raise kind(f"{head}{what}. {fix}") from None


def _records(dropped: range) -> str:
    if len(dropped) == 1:
        return f"Record {dropped.start} (1 record) was"
    return f"Records {dropped.start} to {dropped.stop - 1} ({len(dropped)} records) were"


__all__ = [
    "DEVICE_TYPES",
    "NOT_APPENDED",
    "VALID",
    "DeviceLeaves",
    "Kept",
    "LostLeaf",
    "fetch",
    "is_device_array",
    "lost_error",
    "refuse_unreadable",
    "unreadable",
]
