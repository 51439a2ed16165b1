"""``record_scan``: a loop compiled as ``jax.lax.scan`` blocks, every step recorded (issue 46).

Each block of ``block`` steps is one cached executable whose outputs are the steps' records
packed into one row of 32-bit words (:mod:`pytreestore._tree.packing`): XLA stacks them into the
block, with no Python and no host callback per step. The block is handed to a
:class:`~pytreestore._write.recorder.Recorder`, which copies it to the host and appends it on
its background thread while the next block computes.

Example:
    >>> import jax.numpy as jnp, pytreestore
    >>> store = pytreestore.create("memory://doc-scan", {"t": jnp.int32(0)})
    >>> end = record_scan(store, lambda s: {"t": s["t"] * 2}, {"t": jnp.int32(1)}, steps=3)
    >>> store.load(as_numpy=True)["t"].tolist()
    [2, 4, 8]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from pytreestore import _arguments
from pytreestore._tree.packing import Layout, Packed, same, shapes_of
from pytreestore._write.recorder import Sink, check_layout
from pytreestore.errors import ArgumentError


def _scan(carry: Any, step: Any, record: Any, layout: Layout, length: int) -> tuple[Any, Any]:
    def body(c: Any, _: None) -> tuple[Any, tuple[Any, ...]]:
        c = step(c)
        return c, layout.pack(jax.tree.leaves(record(c)))

    return jax.lax.scan(body, carry, None, length=length)


_scan_jit = jax.jit(_scan, static_argnames=("step", "record", "layout", "length"))


def record_scan(
    store: Any,
    step: Callable[[Any], Any],
    carry: Any,
    steps: int,
    *,
    block: int = 256,
    record: Callable[[Any], Any] | None = None,
) -> Any:
    """Runs ``steps`` steps of ``carry = step(carry)`` in ``jax.lax.scan`` blocks of
    ``block`` steps, appending every step's ``record(carry)`` (default: the carry) to
    ``store``; each block is written on a background thread while the next one computes.

    The compiled block holds no host callback: it is one cached executable (a second for
    the last, shorter block). Returns once every record is written (committed by the
    store's next ``flush`` or ``close``).

    Args:
        store: a :class:`~pytreestore.TreeStore` open for appending.
        step: a pure function of the carry, returning a carry of the same structure,
            shapes and dtypes (jitted or not: it is traced into the scan).
        carry: the first carry (not recorded).
        steps: how many steps to run (and records to append).
        block: steps per compiled block (and per write).
        record: what to record of each new carry (a pure function; default: all of it).

    Returns:
        The carry after the last step.

    Raises:
        ArgumentError: ``steps`` or ``block`` is not a count, or ``step`` changes the
            carry's structure, shapes or dtypes. Nothing is appended.
        SchemaMismatchError: the records do not fit the store. Nothing is appended.
        StorageError: a block could not be written (see the message).

    Example:
        >>> import jax.numpy as jnp, pytreestore
        >>> store = pytreestore.create("memory://doc-record-scan", {"t": jnp.int32(0)})
        >>> end = pytreestore.record_scan(store, lambda s: {"t": s["t"] + 1},
        ...                               {"t": jnp.int32(0)}, steps=5, block=2)
        >>> int(end["t"]), store.load(as_numpy=True)["t"].tolist()
        (5, [1, 2, 3, 4, 5])
    """
    steps = _arguments.count(steps, "steps must be an int >= 0")
    block = _arguments.count(block, "block must be a positive int", minimum=1)
    keep = same if record is None else record
    layout = _scan_layout(store, step, keep, carry)
    with store.recorder(block=block) as rec:
        full, rest = divmod(steps, block)
        for length in [block] * full + ([rest] if rest else []):
            carry, rows = _scan_jit(carry, step, keep, layout, length)
            rec.extend(Packed(layout, rows, length))
    return carry


def _scan_layout(store: Sink, step: Any, record: Any, carry: Any) -> Layout:
    """The records' layout, checked against ``carry`` and the store before any step runs
    (the step traced once per step, record function and carry shapes: :func:`_traced`)."""
    before = jax.eval_shape(same, carry)
    leaves, treedef = jax.tree.flatten(before)
    try:
        layout, after = _traced(step, record, treedef, tuple(leaves))
    except TypeError:  # an unhashable step or record function: traced each time
        layout, after = _traced.__wrapped__(step, record, treedef, tuple(leaves))
    if layout is None:
        raise ArgumentError(
            f"record_scan of store {store.path}: step must return a carry of the structure, "
            f"shapes and dtypes it is given: got {shapes_of(before)}, returned {after}"
        )
    check_layout(store, layout)
    return layout


@functools.lru_cache(maxsize=64)
def _traced(
    step: Any, record: Any, treedef: Any, leaves: tuple[Any, ...]
) -> tuple[Layout | None, str]:
    """The layout of ``record`` of ``step``'s carry from a carry of ``treedef`` and shapes
    ``leaves`` (None if ``step`` changes them), and the shapes it returns, for the message."""
    before = treedef.unflatten(leaves)
    after = jax.eval_shape(step, before)
    if jax.tree.structure(before) != jax.tree.structure(after) or jax.tree.leaves(
        before
    ) != jax.tree.leaves(after):
        return None, shapes_of(after)
    return Layout.of(jax.eval_shape(record, after)), ""


__all__ = ["record_scan"]
