"""MJX (MuJoCo's JAX engine): ``mjx.Data`` rollouts and ``mjx.Model``, stored as themselves.

MJX keeps numpy arrays as static fields, inside its hashable ``_NumPyArrayHashWrapper``
(``Contact.dim``, most of ``Model``): a store keeps them in its schema, and the child's
treedefs must equal those MJX builds there (the wrapper compares by content).

The rollout steps on MuJoCo's CPU engine and converts each step with ``mjx.put_data``: the
same ``mjx.Data`` a jitted ``mjx.step`` returns (same treedef and dtypes), without the
seconds ``mjx.step`` takes to compile (benchmarks/bench_libraries.py times that).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from tests import optional
from tests.libraries.harness import BACKENDS, Case, Results, write_and_read
from tests.trial_harness import Zygote

mujoco = optional.importorskip("mujoco")
mjx = optional.importorskip("mujoco.mjx")

pytest_plugins = ("tests.fixtures",)

#: a sphere and a box falling on a plane: contacts from the first steps
XML = """
<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <geom name="floor" type="plane" size="2 2 0.1"/>
    <body name="ball" pos="0 0 0.08"><freejoint/><geom type="sphere" size="0.05" mass="0.1"/></body>
    <body name="box" pos="0.2 0 0.07"><freejoint/><geom type="box" size="0.05 0.05 0.05"/></body>
  </worldbody>
</mujoco>
"""
STEPS = 4
ENVS = 3


def model() -> Any:
    return mujoco.MjModel.from_xml_string(XML)


def rollout(env: int = 0) -> list[Any]:
    """``mjx.Data`` of the initial state and of each of :data:`STEPS` steps."""
    m = model()
    d = mujoco.MjData(m)
    d.qpos[2] += 0.01 * env  # each environment drops the ball from its own height
    out = [mjx.put_data(m, d)]
    for _ in range(STEPS):
        mujoco.mj_step(m, d)
        out.append(mjx.put_data(m, d))
    return out


def batched() -> list[Any]:
    """One ``mjx.Data`` per step whose leaves have a leading axis of :data:`ENVS`."""
    envs = [rollout(env) for env in range(ENVS)]
    return [jax.tree.map(lambda *xs: jnp.stack(xs), *step) for step in zip(*envs)]


def data_like() -> Any:
    m = model()
    return mjx.put_data(m, mujoco.MjData(m))


def batched_like() -> Any:
    return jax.tree.map(lambda x: jnp.stack([x] * ENVS), data_like())


def model_like() -> Any:
    return mjx.put_model(model())


CASES = {
    "data": Case(rollout, "data_like"),
    "batched": Case(batched, "batched_like"),
    "model": Case(lambda: [mjx.put_model(model())], "model_like"),
}


def child_checks(case: str, records: list[Any]) -> dict[str, Any]:
    """A jitted function of what was read hits the cache entry of MJX's own state: one trace."""
    if case == "batched":
        return {}
    traces = []

    @jax.jit
    def f(state: Any) -> Any:
        traces.append(1)
        leaves = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
        return sum(jnp.sum(x) for x in leaves)

    f(globals()[CASES[case].like]())
    for record in records:
        f(record)
    return {"traces": len(traces)}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, zygote: Zygote) -> Iterator[Results]:
    yield write_and_read(__name__, CASES, tmp_path_factory.mktemp("mjx"), zygote)


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_rollout(results: Results, backend: str) -> None:
    got = results.check("data", backend)
    assert got["checks"] == {"traces": 1}
    assert results.records["data"][-1]._impl.contact.dist.shape[0] > 0  # contacts were stored


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmapped_rollout(results: Results, backend: str) -> None:
    results.check("batched", backend)
    assert results.records["batched"][0].qpos.shape[0] == ENVS


@pytest.mark.parametrize("backend", BACKENDS)
def test_model(results: Results, backend: str) -> None:
    got = results.check("model", backend)
    assert got["checks"] == {"traces": 1}


def test_static_arrays_are_compared_by_content(results: Results) -> None:
    """The store's MJX statics are MJX's own wrappers, equal by content to a fresh model's."""
    read = results.open("model", "tensorstore")[0]
    fresh = model_like()
    assert type(read) is type(fresh)
    assert jax.tree.structure(read) == jax.tree.structure(fresh)
    assert read.body_parentid.tolist() == fresh.body_parentid.tolist()
