"""flax nnx: a model's ``nnx.state`` and its ``nnx.Optimizer``'s, appended each training step
and resumed bit-identically with ``nnx.update`` in a fresh process.

``nnx.state(optimizer)`` keys its ``opt_state`` tuple by int, and a model keeping its layers in
an ``nnx.List`` has an int-keyed ``State`` too: stored with their key types. A model of plain
attributes (str keys only) is the case that already worked.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from pytreestore.testing import assert_trees_equal
from tests.libraries.harness import BACKENDS, Case, Results, describe, write_and_read
from tests.trial_harness import Zygote

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

pytest_plugins = ("tests.fixtures",)

STEPS = 3
X = jnp.linspace(-1, 1, 6, dtype=jnp.float32).reshape(2, 3)
Y = jnp.asarray([[0.5], [-0.5]], jnp.float32)


class ListMLP(nnx.Module):
    """Layers in an ``nnx.List`` (int keys in its state), and a BatchNorm's batch statistics."""

    def __init__(self, rngs: Any) -> None:
        self.layers = nnx.List([nnx.Linear(3, 4, rngs=rngs), nnx.Linear(4, 1, rngs=rngs)])
        self.norm = nnx.BatchNorm(4, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.layers[1](jax.nn.relu(self.norm(self.layers[0](x))))


class PlainMLP(nnx.Module):
    """Layers as plain attributes: every key of its state is a str."""

    def __init__(self, rngs: Any) -> None:
        self.first = nnx.Linear(3, 4, rngs=rngs)
        self.second = nnx.Linear(4, 1, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.second(jax.nn.relu(self.first(x)))


MODELS = {"list": ListMLP, "plain": PlainMLP}


def build(case: str) -> tuple[Any, Any]:
    """The case's model and optimizer: Adam for ``list``; for ``plain``, whose records hold
    the model only, plain SGD (no state a resumed run would need)."""
    model = MODELS[case](nnx.Rngs(0))
    tx = optax.adam(1e-2) if case == "list" else optax.sgd(0.1)
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


def train_step(model: Any, optimizer: Any) -> None:
    grads = nnx.grad(lambda m: jnp.mean((m(X) - Y) ** 2))(model)
    optimizer.update(model, grads)


def snapshot(case: str, model: Any, optimizer: Any) -> Any:
    """The record of one step. ``nnx.state`` returns the live Variables, which the next step
    updates: ``jax.tree.map`` copies them, so that the test keeps each step's values."""
    state = (
        nnx.state(model)
        if case == "plain"
        else {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}
    )
    return jax.tree.map(lambda v: v, state)


def training(case: str) -> list[Any]:
    model, optimizer = build(case)
    records = [snapshot(case, model, optimizer)]
    for _ in range(STEPS):
        train_step(model, optimizer)
        records.append(snapshot(case, model, optimizer))
    return records


def list_like() -> Any:
    return snapshot("list", *build("list"))


def plain_like() -> Any:
    return snapshot("plain", *build("plain"))


CASES = {
    "list": Case(lambda: training("list"), "list_like"),
    "plain": Case(lambda: training("plain"), "plain_like"),
}


def resume(case: str, record: Any) -> Any:
    """A fresh model and optimizer, updated from ``record``, after one more training step."""
    model, optimizer = build(case)
    if case == "plain":
        nnx.update(model, record)
    else:
        nnx.update(model, record["model"])
        nnx.update(optimizer, record["optimizer"])
    train_step(model, optimizer)
    return snapshot(case, model, optimizer)


def child_checks(case: str, records: list[Any]) -> dict[str, Any]:
    """Resumed from the second-to-last record read back, one step gives the last record."""
    return {"resumed": describe(resume(case, records[-2]))}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, zygote: Zygote) -> Iterator[Results]:
    yield write_and_read(__name__, CASES, tmp_path_factory.mktemp("nnx"), zygote)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_training_states(results: Results, case: str, backend: str) -> None:
    records = results.records[case]
    got = results.check(case, backend)
    assert got["checks"]["resumed"] == describe(records[-1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_resume_here_is_bit_identical(results: Results, case: str, backend: str) -> None:
    store = results.open(case, backend)
    assert_trees_equal(resume(case, store[STEPS - 1]), results.records[case][STEPS])
    assert_trees_equal(
        resume(case, store[STEPS - 1]), resume(case, results.records[case][STEPS - 1])
    )
