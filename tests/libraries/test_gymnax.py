"""gymnax environment states appended per step, and a resumed jitted ``env.step`` that does
not recompile: CartPole-v1 (scalars, ``.time`` weakly typed) and Breakout-MinAtar (a brick
map, and four weakly typed ints)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest

import pytreestore
from tests import optional
from tests.libraries.harness import BACKENDS, Case, Results, write_and_read
from tests.trial_harness import Zygote

gymnax = optional.importorskip("gymnax")

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


# ---- weak types of a whole transition (issue 44, item 14) ----------------------------------------


@functools.cache
def transitions(name: str) -> list[Any]:
    """``(state, reward, terminated, truncated, info)`` of :data:`STEPS` jitted steps: the
    states' weak ints, a weak ``reward``, and ``truncated`` (``time >= max_steps``), a
    weakly typed *bool*."""
    env, params = gymnax.make(ENVS[name])
    step = jax.jit(lambda key, state, act: env.step(key, state, act, params))
    state, out = reset(name), []
    for i in range(STEPS + 4):
        _, state, reward, terminated, truncated, info = step(jax.random.key(i), state, action(i))
        out.append((state, reward, terminated, truncated, dict(info)))
    return out


def kinds_of(tree: Any) -> dict[str, tuple[str, bool]]:
    """``{keypath: (dtype, weak_type)}`` of every leaf."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(k): (str(v.dtype), bool(v.weak_type)) for k, v in flat}


@pytest.mark.parametrize("like", ["record", "eval_shape"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_weak_type_of_a_transition_round_trips(tmp_path, backend, case, like):
    """Every leaf's dtype and ``weak_type`` (the weak bool ``truncated`` too) read back as
    appended, by ``store[i]``, iteration, ``load`` and ``batches``, whether the store was
    created from a record or from its abstract shape (``jax.eval_shape``)."""
    records = transitions(case)
    want = kinds_of(records[0])
    assert want["[3]"] == ("bool", True) and want["[4]['truncated']"] == ("bool", True)
    example = records[0] if like == "record" else jax.eval_shape(lambda: records[0])
    with pytreestore.create(tmp_path / "s", example, backend=backend, chunk_records=4) as s:
        for record in records:
            s.append(record)
    store = pytreestore.open(tmp_path / "s", backend=backend)
    assert [kinds_of(store[i]) for i in range(len(store))] == [want] * len(records)
    assert [kinds_of(r) for r in store] == [want] * len(records)
    assert kinds_of(store.load()) == want
    assert [kinds_of(b) for b in store.batches(3)] == [want] * 3
    seen: list[int] = []

    @jax.jit
    def use(transition: Any) -> Any:
        seen.append(1)
        return transition[1] * 2 + transition[3]

    use(records[0])
    for record in store:
        use(record)
    assert len(seen) == 1, "a transition read back traced the jitted function again"
