"""Out-of-core map: ``jax.jit(jax.vmap(fn))`` over a store, one batch of records at a time.

Batches are read in the background (see :class:`pytreestore._pipelines.prefetch.Prefetcher`) while the
previous one computes. The last, short batch is padded by repeating its final record, so
``fn`` compiles once; the padding's results are dropped. Results are copied to host as they
come and either concatenated into one batched pytree (placed on the default device at the end)
or appended to another store, so that they never need to fit in memory.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-map", {"x": np.float32(0)})
    >>> store.extend({"x": np.float32(i)} for i in range(5))
    >>> store.map(lambda r: r["x"] * 2, batch_size=2)
    Array([0., 2., 4., 6., 8.], dtype=float32)
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytreestore._format.weak import is_weak, weaken
from pytreestore._inspect.progress import progress_bar
from pytreestore._pipelines.prefetch import Prefetcher
from pytreestore._tree.stack import is_constant
from pytreestore.errors import ArgumentError


def map_records(
    fn: Callable[[Any], Any],
    load: Callable[[Any], Any],
    *,
    count: int,
    batch_size: int,
    out: Any = None,
    progress: bool = False,
    record_nbytes: int = 0,
    prefetch: int = 2,
    create: Callable[[Any, Any], Any] | None,
) -> Any:
    """Applies ``fn`` to records ``[0, count)`` that ``load(index)`` returns in batches.

    Args:
        fn: a function of one record, traceable by JAX.
        load: loads a batched record for a slice or int-array index.
        count: how many records to map over.
        batch_size: records per call of the compiled ``vmap(fn)``.
        out: None to return the results; a :class:`pytreestore.TreeStore` open for appending,
            or a path where a new store is created from the first result, to append them to.
        progress: show a progress bar (records and MB/s) on standard error.
        record_nbytes: bytes one loaded record takes, for the bar's MB/s figure.
        prefetch: batches read ahead in the background.
        create: ``create(path, like)`` makes the new store when ``out`` is a path
            (:func:`pytreestore.create`).

    Returns:
        The batched results (leaves with a leading record axis), or the ``out`` store.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ArgumentError(f"batch_size must be a positive int, got {batch_size!r}")
    step = _Vmapped(fn)
    sink = _Sink(out, create)
    bar = progress_bar(total=count, desc="map", record_nbytes=record_nbytes, enabled=progress)
    batches = Prefetcher(lambda ix: (ix[0], load(ix[1])), _indices(count, batch_size), prefetch)
    try:
        for valid, batch in batches:
            result = step(batch)
            sink.note_weak(result)
            if valid < batch_size:
                result = jax.tree.map(lambda leaf, n=valid: np.asarray(leaf)[:n], result)
            sink.add(result)
            bar.advance(valid)
    finally:
        batches.close()
        bar.close()
    return sink.finish(lambda: step.eval_shape(load(slice(0, 0))))


#: the compiled steps of functions given already wrapped in ``jax.jit``, kept while the
#: function lives: ``(treedef, mask, const ids) -> (consts, step)`` (the consts kept so their
#: ids stay theirs)
_KEPT: weakref.WeakKeyDictionary[Any, dict[Any, tuple[tuple[Any, ...], Any]]] = (
    weakref.WeakKeyDictionary()
)
_KEPT_LOCK = threading.Lock()
_JITTED = type(jax.jit(lambda x: x))


class _Vmapped:
    """``jax.jit(jax.vmap(fn))`` of a batched record whose constant leaves (functions, see
    :mod:`pytreestore._format.consts`) are closed over rather than traced, as
    ``eqx.filter_jit`` does. A plain ``fn`` is traced afresh by each ``map`` (what it reads
    from outside its argument may have changed); a ``jax.jit``-wrapped one keeps its compiled
    step from call to call, as ``jax.jit`` keeps its own."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self._fn = fn
        self._compiled: dict[Any, tuple[tuple[Any, ...], Any]] = {}
        if isinstance(fn, _JITTED):
            with _KEPT_LOCK:
                self._compiled = _KEPT.setdefault(fn, {})

    def _split(self, batch: Any) -> tuple[Callable[[list[Any]], Any], list[Any], Any, tuple]:
        leaves, treedef = jax.tree_util.tree_flatten(batch)
        mask = tuple(is_constant(leaf) for leaf in leaves)
        consts = tuple(leaf for leaf, c in zip(leaves, mask) if c)
        arrays = [leaf for leaf, c in zip(leaves, mask) if not c]
        fn = weakref.ref(self._fn) if isinstance(self._fn, _JITTED) else (lambda f=self._fn: f)

        def inner(arrays: list[Any]) -> Any:  # (holds no strong reference to a kept fn)
            a, k = iter(arrays), iter(consts)
            return fn()(treedef.unflatten([next(k) if c else next(a) for c in mask]))  # type: ignore[misc]

        key = (treedef, mask, tuple(id(c) for c in consts))
        return inner, arrays, key, consts

    def __call__(self, batch: Any) -> Any:
        inner, arrays, key, consts = self._split(batch)
        kept = self._compiled.get(key)
        if kept is None or any(a is not b for a, b in zip(kept[0], consts)):
            kept = self._compiled[key] = (consts, jax.jit(jax.vmap(inner)))
        return kept[1](arrays)

    def eval_shape(self, batch: Any) -> Any:
        inner, arrays, _, _ = self._split(batch)
        return jax.eval_shape(jax.vmap(inner), arrays)


def _indices(count: int, batch_size: int) -> Iterator[tuple[int, Any]]:
    """``(records, index)`` of each batch; the last is padded with its final record."""
    for lo in range(0, count, batch_size):
        hi = min(lo + batch_size, count)
        if hi - lo == batch_size:
            yield batch_size, slice(lo, hi)
        else:
            pad = np.full(batch_size - (hi - lo), hi - 1, np.int64)
            yield hi - lo, np.concatenate([np.arange(lo, hi, dtype=np.int64), pad])


class _Sink:
    """Where results go: host arrays to concatenate, or a store to append to.

    Each result is copied to host only when the next one has been dispatched, so the device
    keeps computing while the previous result is copied out.
    """

    def __init__(self, out: Any, create: Callable[[Any, Any], Any] | None) -> None:
        self._out = out
        self._create = create
        self._pending: Any = None
        self._parts: list[Any] = []
        self._weak: list[bool] | None = None  # the results' weak types, from the device

    def note_weak(self, result: Any) -> None:
        """Keeps which leaves of ``fn``'s result are weakly typed (the host copies lose it)."""
        if self._weak is None:
            self._weak = [is_weak(leaf) for leaf in jax.tree.leaves(result)]

    def _weak_like(self, like: Any) -> Any:
        """``like`` (host values) with each weakly typed result leaf as a weak ``jax.Array``,
        so that the out store's column is weak (``weak_type``) as the results were."""
        leaves, treedef = jax.tree.flatten(like)
        weak = self._weak or [False] * len(leaves)
        placed = [jnp.asarray(v) if w else v for v, w in zip(leaves, weak)]
        return treedef.unflatten(weaken(placed, weak) if any(weak) else placed)

    def _weakened(self, tree: Any) -> Any:
        """``tree`` (of ``jax.Array`` leaves) with the results' weak types."""
        leaves, treedef = jax.tree.flatten(tree)
        return treedef.unflatten(weaken(leaves, self._weak if any(self._weak or ()) else None))

    def add(self, result: Any) -> None:
        self._drain()
        self._pending = result

    def _drain(self) -> None:
        if self._pending is None:
            return
        host, self._pending = jax.device_get(self._pending), None
        if self._out is None:
            self._parts.append(host)
            return
        if isinstance(self._out, (str, os.PathLike)):
            like = self._weak_like(jax.tree.map(lambda leaf: leaf[0], host))
            assert self._create is not None, "a store opened by pytreestore has a creator"
            self._out = self._create(self._out, like)
        self._out.extend_batch(host)

    def finish(self, empty_shape: Callable[[], Any]) -> Any:
        self._drain()
        if self._out is not None and not isinstance(self._out, (str, os.PathLike)):
            self._out.flush()
            return self._out
        if self._out is not None:
            raise ArgumentError(
                f"map(out={self._out!r}) over an empty store: no result to build the new "
                "store's schema from; create the out store yourself"
            )
        if not self._parts:
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), empty_shape())
        joined = jax.tree.map(lambda *leaves: np.concatenate(leaves), *self._parts)
        return self._weakened(jax.device_put(joined))
