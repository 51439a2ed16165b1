"""optax optimizer states, as ``tx.init``/``tx.update`` make them: ``ScaleByAdamState`` and
``EmptyState`` in a chain, ``MultiSteps`` and ``inject_hyperparams`` (NamedTuples, dicts)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytreestore.testing import assert_trees_equal
from tests.libraries.harness import BACKENDS, Case, Results, write_and_read
from tests.trial_harness import Zygote

optax = pytest.importorskip("optax")

pytest_plugins = ("tests.fixtures",)

STEPS = 3


def params() -> dict[str, Any]:
    return {"w": jnp.arange(6, dtype=jnp.float32).reshape(3, 2) / 7, "b": jnp.zeros(2)}


def transforms() -> dict[str, Any]:
    return {
        "adam": optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2)),
        "multi": optax.MultiSteps(optax.sgd(0.1, momentum=0.9), every_k_schedule=2),
        "inject": optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2, weight_decay=1e-4),
    }


def loss(p: dict[str, Any]) -> Any:
    return jnp.sum(jnp.tanh(jnp.ones(3) @ p["w"] + p["b"]) ** 2)


def run(name: str, steps: int = STEPS) -> tuple[list[Any], Any]:
    """The optimizer state after init and after each step, and the final parameters."""
    tx, p = transforms()[name], params()
    state = tx.init(p)
    states = [state]
    for _ in range(steps):
        updates, state = tx.update(jax.grad(loss)(p), state, p)
        p = optax.apply_updates(p, updates)
        states.append(state)
    return states, p


def adam_like() -> Any:
    return transforms()["adam"].init(params())


def multi_like() -> Any:
    return transforms()["multi"].init(params())


def inject_like() -> Any:
    return transforms()["inject"].init(params())


CASES = {
    "adam": Case(lambda: run("adam")[0], "adam_like"),
    "multi": Case(lambda: run("multi")[0], "multi_like"),
    "inject": Case(lambda: run("inject")[0], "inject_like"),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, zygote: Zygote) -> Iterator[Results]:
    yield write_and_read(__name__, CASES, tmp_path_factory.mktemp("optax"), zygote)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_optimizer_state(results: Results, case: str, backend: str) -> None:
    results.check(case, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_training_resumes_from_the_stored_state(results: Results, case: str, backend: str) -> None:
    """The next update from a state read back is the one from the state in memory, bit for bit."""
    tx, p = transforms()[case], params()
    kept = results.records[case][1]
    stored = results.open(case, backend)[1]
    p = optax.apply_updates(p, tx.update(jax.grad(loss)(p), results.records[case][0], p)[0])
    grads = jax.grad(loss)(p)
    assert_trees_equal(tx.update(grads, stored, p), tx.update(grads, kept, p))


@pytest.mark.parametrize("backend", ["tensorstore", "ocdbt", "zarr"])
def test_a_donating_adam_loop_keeps_every_state(tmp_path, backend) -> None:
    """optax's everyday loop (issue 44): ``store.append(state); state = step(state)`` with the
    step donating ``(params, opt_state)``; all 41 states read back exactly (7787639 kept 1)."""
    import pytreestore

    tx = optax.adam(1e-2)

    def train(s: Any) -> Any:
        p, opt = s
        updates, opt = tx.update(jax.grad(loss)(p), opt, p)
        return optax.apply_updates(p, updates), opt

    plain, donating = jax.jit(train), jax.jit(train, donate_argnums=0)
    state, want = (params(), tx.init(params())), []
    for _ in range(41):
        want.append(jax.device_get(state))
        state = plain(state)
    path = tmp_path / "adam"
    state = (params(), tx.init(params()))
    store = pytreestore.create(path, jax.device_get(state), backend=backend, chunk_records=16)
    for _ in range(40):
        store.append(state)
        old, state = state, donating(state)
    store.append(state)
    store.close()
    assert old[0]["w"].is_deleted()  # the step did donate what was appended
    got = pytreestore.open(path, backend=backend)
    assert len(got) == 41
    for i, record in enumerate(want):
        assert_trees_equal(jax.tree.map(np.asarray, got[i]), record)
