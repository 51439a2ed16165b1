"""gymnax environment states appended per step, and a resumed jitted ``env.step`` that does
not recompile: CartPole-v1 (scalars, ``.time`` weakly typed) and Breakout-MinAtar (a brick
map, and four weakly typed ints)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from tests.libraries.harness import BACKENDS, Case, Results, write_and_read
from tests.trial_harness import Zygote

gymnax = pytest.importorskip("gymnax")

pytest_plugins = ("tests.fixtures",)

ENVS = {"cartpole": "CartPole-v1", "breakout": "Breakout-MinAtar"}
STEPS = 4
KEY = 0


def counted_step(name: str) -> tuple[Callable[..., Any], list[int], Any, Any]:
    """``jax.jit(env.step)`` that counts its traces; the env and its default params."""
    env, params = gymnax.make(ENVS[name])
    traces: list[int] = []

    @jax.jit
    def step(key: Any, state: Any, action: Any) -> Any:
        traces.append(1)
        return env.step(key, state, action, params)

    return step, traces, env, params


def reset(name: str) -> Any:
    env, params = gymnax.make(ENVS[name])
    return env.reset(jax.random.key(KEY), params)[1]


def action(i: int) -> Any:
    return jnp.asarray(i % 2, jnp.int32)


#: the jitted steps of the rollouts written here, for the in-process resume
STEPPERS: dict[str, tuple[Callable[..., Any], list[int]]] = {}


def rollout(name: str) -> list[Any]:
    """The state after reset and after each of :data:`STEPS` jitted steps."""
    step, traces, _, _ = counted_step(name)
    STEPPERS[name] = (step, traces)
    states = [reset(name)]
    for i in range(STEPS):
        states.append(step(jax.random.key(i + 1), states[-1], action(i))[1])
    return states


def cartpole_like() -> Any:
    return reset("cartpole")


def breakout_like() -> Any:
    return reset("breakout")


CASES = {
    "cartpole": Case(lambda: rollout("cartpole"), "cartpole_like"),
    "breakout": Case(lambda: rollout("breakout"), "breakout_like"),
}


def child_checks(case: str, records: list[Any]) -> dict[str, Any]:
    """In the fresh process: step once from a fresh reset, then from every state read back;
    a read state that differed in ``weak_type`` or static data would trace again."""
    if case != "cartpole":
        return {}
    step, traces, _, _ = counted_step(case)
    step(jax.random.key(KEY), reset(case), action(0))
    resumed = [step(jax.random.key(9), record, action(1))[1] for record in records]
    return {"traces": len(traces), "time": [int(s.time) for s in resumed]}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, zygote: Zygote) -> Iterator[Results]:
    yield write_and_read(__name__, CASES, tmp_path_factory.mktemp("gymnax"), zygote)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_env_states(results: Results, case: str, backend: str) -> None:
    results.check(case, backend)
    weak = [leaf.weak_type for leaf in jax.tree.leaves(results.records[case][-1])]
    assert any(weak) and not all(weak)  # the case does test weak_type


@pytest.mark.parametrize("backend", BACKENDS)
def test_resumed_step_does_not_recompile_in_a_fresh_process(results: Results, backend: str) -> None:
    got = results.check("cartpole", backend)
    assert got["checks"] == {"traces": 1, "time": list(range(1, STEPS + 2))}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_resumed_step_does_not_recompile_here(results: Results, case: str, backend: str) -> None:
    """The jitted step that made the rollout takes every state read back with no new trace,
    and steps it exactly as it stepped the state in memory."""
    step, traces = STEPPERS[case]
    assert len(traces) == 1  # the rollout's states all hit one cache entry
    store = results.open(case, backend)
    for i, record in enumerate(store):
        got = step(jax.random.key(7), record, action(i))
        want = step(jax.random.key(7), results.records[case][i], action(i))
        assert all(
            jax.tree.leaves(jax.tree.map(lambda a, b: a.tobytes() == b.tobytes(), got, want))
        )
    assert len(traces) == 1, "a state read back traced the jitted step again"
