"""What the model-based test (:mod:`tests.test_model_based`) does with device arrays, reader
threads and other processes (issue 44).

- :func:`place` puts a record's leaves on simulated CPU devices, spread over several of them;
  :func:`meet` then does to them what a training loop may do once ``append`` returned: donate
  them to a jitted step (``donate_argnums``), ``.delete()`` them, feed them to another step,
  or overwrite the host buffers appended beside them. The store must keep the record anyway.
- :func:`failed` makes a ``jax.Array`` whose computation failed: on the CPU an ``io_callback``
  that raises inside ``jit`` fails the call itself when its inputs are ready, so it is given
  an input still being computed (a matrix product dispatched just before); the call then
  returns an array whose ``np.asarray`` raises ``JaxRuntimeError``.
- :class:`Readers` reads a store from another thread while the test's thread appends.
- :func:`fragment_json` runs in another process (the ``pool`` fixture) and writes a fragment.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

import pytreestore

#: the simulated CPU devices the leaves are spread over (tests/conftest.py makes 8)
SPREAD = 3
#: what happens to an appended record's arrays after ``append`` returned
FATES = ("keep", "donate", "delete", "step", "overwrite")


def devices() -> list[Any]:
    return jax.devices("cpu")[:SPREAD]


def jax_keeps(leaf: Any) -> bool:
    """Whether JAX holds ``leaf``'s dtype as it is (32 bits or fewer; no x64)."""
    value = np.asarray(leaf)
    return value.dtype.itemsize <= 4 and value.dtype.kind in "biuf"


def place(record: Any, first: int) -> Any:
    """``record`` with every leaf JAX keeps as a ``jax.Array``, leaf ``k`` on device
    ``first + k`` (modulo :data:`SPREAD`); the other leaves as copies (the model keeps the
    originals, which :func:`meet` must not overwrite)."""
    leaves, treedef = jax.tree.flatten(record)
    spread = devices()
    placed = [
        jax.device_put(np.asarray(leaf), spread[(first + k) % len(spread)])
        if jax_keeps(leaf)
        else np.array(leaf, copy=True)
        for k, leaf in enumerate(leaves)
    ]
    return jax.tree.unflatten(treedef, placed)


@functools.partial(jax.jit, donate_argnums=0)
def _donating_step(x: jax.Array) -> jax.Array:
    return x + jnp.zeros_like(x)  # the dtype kept (bool + bool is bool): the buffer is reused


@jax.jit
def _step(x: jax.Array) -> jax.Array:
    return x + jnp.ones_like(x)


def meet(record: Any, fate: str) -> None:
    """Does ``fate`` (one of :data:`FATES`) to the leaves of ``record``, appended just before."""
    for leaf in jax.tree.leaves(record):
        if isinstance(leaf, jax.Array):
            if fate == "donate":
                _donating_step(leaf).block_until_ready()
            elif fate == "delete":
                leaf.delete()
            elif fate == "step":
                _step(leaf).block_until_ready()
        elif fate == "overwrite" and isinstance(leaf, np.ndarray) and leaf.size:
            leaf[...] = leaf.flat[0] + 1  # the caller reuses its buffer


# ---- a failed computation ------------------------------------------------------------------------


class FailedOnPurpose(RuntimeError):
    """What the callback of :func:`failed` raises."""


def _raise(_: Any) -> Any:
    raise FailedOnPurpose("a computation the test made fail (its io_callback raised)")


@functools.partial(jax.jit, static_argnums=(1, 2))
def _failing(gate: jax.Array, shape: tuple[int, ...], dtype: np.dtype) -> jax.Array:
    return io_callback(_raise, jax.ShapeDtypeStruct(shape, dtype), gate[0, 0])


@jax.jit
def _busy(a: jax.Array) -> jax.Array:
    return a @ a


@jax.jit
def _passing(x: jax.Array) -> jax.Array:
    return io_callback(lambda v: v, jax.ShapeDtypeStruct(x.shape, x.dtype), x)


def failed(like: Any, device: Any) -> jax.Array:
    """A ``jax.Array`` of ``like``'s dtype and shape on ``device`` whose computation failed:
    ``np.asarray`` of it raises (``JaxRuntimeError``); it is not deleted."""
    value = np.asarray(like)
    for attempt in range(12):
        size = 256 << min(attempt, 3)
        gate = _busy(jax.device_put(np.ones((size, size), np.float32), device))
        try:
            out = _failing(gate, value.shape, value.dtype)
        except Exception:  # the product was done before the call: it failed at once
            continue
        # the failed call left its runtime token on the device, which JAX waits for (and
        # raises) at exit: a passing callback there replaces it
        _passing(jax.device_put(np.zeros(1, np.float32), device)).block_until_ready()
        assert not out.is_deleted()
        return out
    raise AssertionError("the callback's input was ready each time: no failed array made")


def with_failed_leaf(record: Any) -> tuple[Any, str] | None:
    """``record`` with its first leaf that JAX keeps replaced by a failed array (on the
    device of that leaf), and that leaf's keypath; None if it has none."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(record)
    for k, (path, leaf) in enumerate(leaves):
        if isinstance(leaf, jax.Array):
            out = [x for _, x in leaves]
            out[k] = failed(leaf, next(iter(leaf.devices())))
            return jax.tree.unflatten(treedef, out), jax.tree_util.keystr(path)
    return None


# ---- another thread, another process -------------------------------------------------------------


class Readers:
    """A thread that reads a store while the test's thread appends to it: in turn the
    writer's own ``records()`` and those of a reader opened once and refreshed."""

    def __init__(self, writer: Any, open_reader: Callable[[], Any]) -> None:
        self.writer, self.open_reader = writer, open_reader
        self.results: list[tuple[str, list[Any]]] = []
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with self.open_reader() as reader:
                while not self.stop.is_set() or len(self.results) < 2:
                    self.results.append(("writer", list(self.writer.records(as_numpy=True))))
                    reader.refresh()
                    self.results.append(("reader", list(reader.records(as_numpy=True))))
        except BaseException as err:  # handed to the test's thread
            self.error = err

    def join(self) -> list[tuple[str, list[Any]]]:
        self.stop.set()
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the reader thread did not end"
        if self.error is not None:
            raise self.error
        return self.results


def fragment_json(args: tuple[str, str, Sequence[Any]]) -> str:
    """Runs in another process: writes ``records`` as a fragment of the store at ``path``."""
    path, backend, records = args
    return pytreestore.write_fragment(path, list(records), backend=backend).to_json()
