"""Recording every step of a compiled loop: records packed on the device, written off the
step's critical path (issue 46).

A loop of jitted steps runs ahead of its device: each call returns once it is dispatched. A
``store.append(state)`` per step waits for the step and copies each leaf (20 leaves, 20
copies), so the loop runs at the pace of the copies (3.8-5.6x a loop keeping a list on the
CPU). A :class:`Recorder` keeps the loop asynchronous:

- :meth:`Recorder.append` dispatches one jitted *pack* of the record: its leaves ravelled and
  concatenated into one row of 32-bit words (a :class:`Layout`), one array instead of one per
  leaf; the record's arrays are read by that dispatch, so the caller may donate or delete
  them afterwards. Every ``block`` records, one jitted stack makes a block of rows on the
  device and its copy to the host starts.
- :func:`record_scan` runs ``jax.lax.scan`` over blocks of steps whose outputs are the packed
  rows: XLA stacks them into the block (no Python per step, no host callback inside the
  compiled step: its executable is cached like any other).
- Blocks are written in order on a background thread (:class:`ChunkWrites`): copied to the
  host, cut back into leaves (views of the rows) and handed to ``store.extend_batch`` while
  the next block computes.

A failure is never lost: a block the store refuses, or whose values cannot be fetched (the
computation failed), stops the recorder; the next call (``append``, ``flush``, ``close``,
or the store's ``flush``/``close``) raises it, naming the records not written. A storage
failure keeps its block and is retried after it is reported, as the store's own background
writer does. ``close()`` waits for every block.

Every store takes a block through ``extend_batch`` with the mask
:data:`~pytreestore._write.records.EVERY_RECORD_REAL`: a fixed store as one batch, a store with
ragged or optional parts record by record (its writer walks them): inside a compiled step every list has
its length and every optional subtree is there or None for every step, so each record is a
fixed-shape record of the store.

Example:
    >>> import jax.numpy as jnp, pytreestore
    >>> store = pytreestore.create("memory://doc-recorder", {"x": jnp.zeros(2), "n": jnp.int32(0)})
    >>> step = jax.jit(lambda s: {"x": s["x"] + 1, "n": s["n"] + 1})
    >>> with store.recorder(block=4) as rec:
    ...     state = {"x": jnp.zeros(2), "n": jnp.int32(0)}
    ...     for _ in range(6):
    ...         state = step(state)
    ...         rec.append(state)
    >>> store.load(as_numpy=True)["n"].tolist()
    [1, 2, 3, 4, 5, 6]
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from jax.core import Tracer
from jax.tree_util import tree_flatten

from pytreestore import _arguments
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.device import refuse_unreadable
from pytreestore._tree.packing import (
    Layout,
    LayoutChanged,
    Packed,
    host,
    packer,
    same,
    shapes_of,
    stacker,
    start_copies,
)
from pytreestore._write.background import ChunkWrites
from pytreestore._write.records import EVERY_RECORD_REAL
from pytreestore.errors import (
    ArgumentError,
    ClosedStoreError,
    DeviceFetchError,
    PyTreeStoreError,
    StorageError,
)


class Sink(Protocol):
    """What a recorder needs of a store (a :class:`~pytreestore.TreeStore`)."""

    @property
    def path(self) -> str: ...

    @property
    def schema(self) -> TreeSchema: ...

    def __len__(self) -> int: ...

    def extend(self, records: Iterable[Any], *, progress: bool = False) -> None: ...

    def extend_batch(self, batch: Any, mask: Any = None) -> None: ...


def check_layout(store: Sink, layout: Layout) -> None:
    """Refuses records of ``layout`` that ``store`` would refuse, before any is recorded (a
    fixed store checks an empty batch; a store with tables checks each block as it is
    written)."""
    write_block(store, layout.empty())


def write_block(store: Sink, batch: Any) -> None:
    """Appends ``batch`` (records of one structure and fixed shapes, a leading
    record axis) to ``store``, whatever its kind: the store's writer takes the rows as
    records (:data:`~pytreestore._write.records.EVERY_RECORD_REAL`; a fixed store as one
    batch, a store with tables record by record)."""
    store.extend_batch(batch, EVERY_RECORD_REAL)


#: the recorders of each store (by id of its core) not yet closed, which the store's
#: ``flush`` and ``close`` flush first
_OPEN: dict[int, list[Recorder]] = {}
_OPEN_LOCK = threading.Lock()


class Recorder:
    """Records appended from a loop of jitted steps, packed on the device and written in
    blocks on a background thread (made by :meth:`pytreestore.TreeStore.recorder`).

    Records land in the store in the order they were appended, after the records the store
    held when their block was written: mix a recorder with the store's own ``append`` only
    after :meth:`flush`. ``close()`` (or the ``with`` block's end, or the store's
    ``close()``) writes what is left and waits for it; the store stays open.
    """

    def __init__(self, store: Sink, owner: int, block: int = 256) -> None:
        self._store = store
        self._owner = owner
        self._block = _arguments.count(block, "block must be a positive int", minimum=1)
        self._layout: Layout | None = None
        self._pack: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None
        self._rows: list[tuple[Any, ...]] = []
        self._writes = ChunkWrites()
        self._handed = 0  # records handed to the background writer
        self._stopped: PyTreeStoreError | None = None  # a block refused: nothing after it
        self._late: StorageError | None = None  # a commit failed after its block landed
        self._reported = False
        self._closed = False
        with _OPEN_LOCK:
            _OPEN.setdefault(owner, []).append(self)

    @property
    def block(self) -> int:
        """Records per block: stacked on the device and written at once."""
        return self._block

    @property
    def stopped(self) -> bool:
        """Whether the recorder stopped at a failure it has reported (it only closes now)."""
        return self._stopped is not None and self._reported

    def __len__(self) -> int:
        """Records appended or extended so far (written or not)."""
        return self._handed + len(self._rows)

    # ---- recording -------------------------------------------------------------------------

    def append(self, record: Any) -> None:
        """Records one record (a pytree of ``jax.Array`` or numpy leaves) without waiting
        for its values: one jitted pack is dispatched; every ``block`` records one jitted
        stack, then the block is written on a background thread.

        Raises:
            ClosedStoreError: the recorder is closed.
            SchemaMismatchError, StorageError: an earlier block failed (reported once).
            DeletedArrayError: a leaf was donated or deleted before this call.
        """
        if self._stopped or self._late or self._writes.failed or self._closed:
            self._check()
        leaves, treedef = tree_flatten(record)
        layout, pack = self._layout, self._pack
        if layout is None or pack is None or treedef != layout.treedef:
            pack = self._new_layout(record, leaves)
        try:
            try:
                rows = pack(leaves)
            except LayoutChanged:
                rows = self._new_layout(record, leaves)(leaves)
        except Exception as err:  # JAX's: a deleted leaf, or a failed computation
            refuse_unreadable(err, record, "Recorder.append: ")
            raise
        self._rows.append(rows)
        if len(self._rows) == self._block:
            self._hand_over()

    def wrap(
        self,
        step: Callable[..., Any],
        *,
        record: Callable[[Any], Any] | None = None,
        donate_argnums: int | Sequence[int] = (),
    ) -> Callable[..., Any]:
        """``step`` jitted together with the pack of its result: the returned function
        takes and returns what ``step`` does, and records ``record(result)`` (default: the
        result) at the cost of two or three more outputs of the step's own dispatch (the
        cheapest way to record a loop of jitted steps: :meth:`append` dispatches a pack of
        its own). Its records must keep one structure, shapes and dtypes.

        Args:
            step: the step (jitted or not: it is traced into one jitted function).
            record: what to record of each result (a pure function).
            donate_argnums: passed to ``jax.jit`` (a step jitted with donation loses it
                inside another jit: give it here).

        Example:
            >>> import jax.numpy as jnp, pytreestore
            >>> store = pytreestore.create("memory://doc-wrap", {"t": jnp.int32(0)})
            >>> with store.recorder(block=2) as rec:
            ...     step = rec.wrap(lambda s: {"t": s["t"] + 1})
            ...     state = {"t": jnp.int32(0)}
            ...     for _ in range(3):
            ...         state = step(state)
            >>> store.load(as_numpy=True)["t"].tolist()
            [1, 2, 3]
        """
        donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
        jitted, fixed = _wrapped(step, same if record is None else record, donate)
        checked: list[Layout] = []

        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self._stopped or self._late or self._writes.failed or self._closed:
                self._check()
            out, rows = jitted(*args, **kwargs)
            if self._layout is not fixed[0]:
                self._use(fixed[0], checked)
            self._rows.append(rows)
            if len(self._rows) == self._block:
                self._hand_over()
            return out

        return recorded

    def _use(self, layout: Layout, checked: list[Layout]) -> None:
        """A wrapped step's records follow: its layout checked against the store (once),
        the rows of the layout before handed over."""
        if not checked:
            check_layout(self._store, layout)
            checked.append(layout)
        self._hand_over()
        self._layout, self._pack = layout, None

    def extend(self, batch: Any) -> None:
        """Records a batch of records (leaves with a leading record axis: a scan's outputs,
        say; or a block of packed records, as :func:`pytreestore.record_scan` hands over),
        written on the background thread after the records before it. The
        batch's arrays must stay valid until :meth:`flush` (they are not copied here).

        Raises:
            ArgumentError: the leaves do not share one leading record axis.
            ClosedStoreError, SchemaMismatchError, StorageError: as :meth:`append`.
        """
        self._check()
        self._hand_over()
        if isinstance(batch, Packed):
            start_copies(batch.rows)
            self._submit(batch.unpacked, batch.count)
            return
        leaves, treedef = tree_flatten(batch)
        counts = {int(np.shape(x)[0]) if np.ndim(x) else -1 for x in leaves}
        if len(counts) != 1 or -1 in counts:
            raise ArgumentError(
                f"Recorder.extend of store {self._store.path}: a batch's leaves need one "
                f"leading record axis of one length, got lengths {sorted(counts)}"
            )
        start_copies([x for x in leaves if isinstance(x, jax.Array)])
        self._submit(lambda: treedef.unflatten([host(x) for x in leaves]), counts.pop())

    # ---- writing ----------------------------------------------------------------------------

    def flush(self) -> None:
        """Writes every record recorded so far and waits for it (not committed: the store's
        ``flush`` or ``close`` commits).

        Raises:
            SchemaMismatchError, DeviceFetchError, StorageError: a block failed; see
                the message for the records not written.
        """
        self._check()
        self._hand_over()
        try:
            self._writes.drain()
        finally:
            self._check()

    def close(self) -> None:
        """Writes what is left, waits for it, and closes the recorder (not the store). A
        second call is a no-op; after a storage failure the recorder stays open for another.
        """
        if self._closed:
            return
        if not self.stopped:
            self.flush()
        self._closed = True
        with _OPEN_LOCK:
            mine = _OPEN.get(self._owner, [])
            if self in mine:
                mine.remove(self)
            if not mine:
                _OPEN.pop(self._owner, None)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception as err:
            exc.add_note(f"closing the recorder of store {self._store.path} failed as well ({err})")

    # ---- inside --------------------------------------------------------------------------------

    def _check(self) -> None:
        """Raises a failure not yet reported, or refuses a closed recorder."""
        if self._stopped is not None and not self._reported:
            self._reported = True
            raise self._stopped
        late, self._late = self._late, None
        if late is not None:
            raise late
        if self._closed or self._stopped is not None:
            raise ClosedStoreError(
                f"the recorder of store {self._store.path} is closed"
                + (" (it stopped at the failure reported before)" if self._stopped else "")
                + "; make a new one with store.recorder()"
            )
        self._writes.check()

    def _new_layout(
        self, record: Any, leaves: Sequence[Any]
    ) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
        """The packer of a record of a new layout (the rows of the old one handed over)."""
        if leaves and isinstance(leaves[0], Tracer):
            raise ArgumentError(
                f"Recorder.append of store {self._store.path} was called inside jax.jit or "
                "a scan: it records concrete arrays from the Python loop around a jitted "
                "step. Inside a compiled loop, return the records as the scan's outputs and "
                "pass them to Recorder.extend, or use pytreestore.record_scan"
            )
        layout = Layout.of(record)
        if layout != self._layout:
            check_layout(self._store, layout)
            self._hand_over()
            self._layout = layout
        self._pack = packer(layout)
        return self._pack

    def _hand_over(self) -> None:
        """The rows recorded since the last block, stacked on the device (padded to a whole
        block with the last row: one compile per layout) and handed to the writer."""
        rows, layout = self._rows, self._layout
        if not rows or layout is None:
            return
        self._rows = []
        count = len(rows)
        rows = rows + [rows[-1]] * (self._block - count)
        block = stacker()(rows)
        start_copies(block)
        self._submit(lambda: layout.unpack([host(r) for r in block], count), count)

    def _submit(self, make: Callable[[], Any], count: int) -> None:
        first = self._handed
        self._handed += count
        self._writes.submit(lambda: self._write(make, first, count))

    def _write(self, make: Callable[[], Any], first: int, count: int) -> None:
        """The background job of one block: fetched, cut into leaves, appended. A storage
        failure before the block landed is raised (the job is retried once reported); one
        after it landed (the commit that followed) is kept for the next call only."""
        if self._stopped is not None:
            return  # after a refused block nothing is written
        try:
            batch = make()
            before = len(self._store)
            write_block(self._store, batch)
        except StorageError as err:
            if len(self._store) < before + count:
                raise  # kept and retried once reported (ChunkWrites)
            self._late = err
        except Exception as err:
            self._stopped = _stopped(self._store, err, first, count, self)

    def __repr__(self) -> str:
        return f"Recorder({self._store.path!r}, block={self._block}, records={len(self)})"


def _stopped(
    store: Sink, err: BaseException, first: int, count: int, recorder: Recorder
) -> PyTreeStoreError:
    """The error a refused block leaves: its records and the ones after it not written."""
    kind = type(err) if isinstance(err, PyTreeStoreError) else DeviceFetchError
    last = len(recorder) - 1
    cause = str(err).strip().splitlines()[0][:300] if str(err) else type(err).__name__
    made = kind(
        f"the recorder of store {store.path} could not write its records {first} to "
        f"{first + count - 1} ({type(err).__name__}: {cause}). Records {first} to {last} of "
        f"this recorder are not in the store; those before {first} are. Fix the records (or "
        "the store) and record again with a new store.recorder()"
    )
    made.__cause__ = err
    return made


def recorders_of(owner: int) -> list[Recorder]:
    """The recorders of the store whose core is ``owner`` (``id``) not yet closed."""
    with _OPEN_LOCK:
        return list(_OPEN.get(owner, []))


def flush_recorders(owner: int, *, close: bool = False) -> None:
    """Flushes (``close``: closes) the recorders of the store whose core is ``owner``: its
    ``flush`` and ``close`` call it first.

    Raises:
        PyTreeStoreError: the first recorder's failure (every recorder is tried; one whose
            failure is reported stops, and closes with the store).
    """
    failure: BaseException | None = None
    for rec in recorders_of(owner):
        try:
            rec.close() if close or rec.stopped else rec.flush()
        except PyTreeStoreError as err:
            failure = failure or err
    if failure is not None:
        raise failure


@functools.lru_cache(maxsize=64)
def _wrapped(
    step: Callable[..., Any], record: Callable[[Any], Any], donate: tuple[int, ...]
) -> tuple[Callable[..., Any], list[Layout]]:
    """``step`` and the pack of ``record(result)`` in one jitted function (made once per
    step: recorders share its executables), and the records' layout, fixed at its first
    trace (a later trace of another layout is refused)."""
    fixed: list[Layout] = []

    def packed(*args: Any, **kwargs: Any) -> tuple[Any, tuple[Any, ...]]:
        out = step(*args, **kwargs)
        tree = record(out)
        layout = Layout.of(tree)
        if not fixed:
            fixed.append(layout)
        elif layout != fixed[0]:
            raise ArgumentError(
                f"a step wrapped by Recorder.wrap returned records of another structure, "
                f"shapes or dtypes than at its first call ({shapes_of(tree)}): a wrapped step "
                "records one layout; wrap another function for another"
            )
        return out, layout.pack(jax.tree.leaves(tree))

    return jax.jit(packed, donate_argnums=donate), fixed


__all__ = [
    "Recorder",
    "Sink",
    "check_layout",
    "flush_recorders",
    "recorders_of",
    "write_block",
]
