"""flax nnx states, whose dicts have int keys (``nnx.List`` layers, optax states by index):
``nnx.state`` of a model and of its ``nnx.Optimizer`` and ``nnx.to_pure_dict`` of them are
stored and read back exactly, with equal treedefs, and a model resumed with ``nnx.update``."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

import pytreestore

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")


class Stack(nnx.Module):
    def __init__(self, rngs: Any) -> None:
        self.layers = nnx.List([nnx.Linear(3, 3, rngs=rngs) for _ in range(2)])

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _trained(steps: int):
    model = Stack(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = np.ones((4, 3), np.float32)
    for _ in range(steps):
        grads = nnx.grad(lambda m: (m(x) ** 2).mean())(model)
        optimizer.update(model, grads)
    return model, optimizer


def _assert_same(got, want) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape, a.tobytes()) == (b.dtype, b.shape, b.tobytes())


@pytest.fixture(scope="module")
def trained() -> list:
    """(model, optimizer) after 0, 1 and 2 steps."""
    return [_trained(k) for k in (0, 1, 2)]


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_nnx_model_and_optimizer_states_round_trip(trained, backend, tmp_path):
    states = [(nnx.state(m), nnx.state(o)) for m, o in trained]
    assert 0 in states[0][1]["opt_state"]  # int keys, as nnx keeps them
    with pytreestore.create(tmp_path / "s", states[0], backend=backend) as store:
        store.extend(states)
    store = pytreestore.open(tmp_path / "s", backend=backend)
    for i, want in enumerate(states):
        _assert_same(store[i], want)
    model = Stack(nnx.Rngs(1))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    nnx.update(model, store[2][0])
    nnx.update(optimizer, store[2][1])
    _assert_same(nnx.state(model), states[2][0])
    _assert_same(nnx.state(optimizer), states[2][1])


def test_nnx_pure_dicts_round_trip(trained, tmp_path):
    pure = [nnx.to_pure_dict(nnx.state(o)) for _, o in trained]
    with pytreestore.create(tmp_path / "s", pure[0]) as store:
        store.extend(pure)
    store = pytreestore.open(tmp_path / "s")
    assert "['opt_state'][0]['mu']['layers'][1]['kernel']" in store.schema.paths
    for i, want in enumerate(pure):
        _assert_same(store[i], want)
