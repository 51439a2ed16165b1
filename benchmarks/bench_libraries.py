"""The cost of ``store.append(state)`` per step, against each library's own jitted step.

For each library (docs/libraries.md), a loop of steps of its own jitted function, each step
waited for (``jax.block_until_ready``); ours appends the state of every step to a store
(created outside the timed region, closed inside it, so that every write is counted), the
baseline is the same loop without the store. The ratio is the slowdown of the loop; the notes
give the append's cost per step (ours minus baseline, divided by the steps) and the step's.

* **MJX**: ``jax.jit(mjx.step)`` of a sphere and a box on a plane; the ``mjx.Data``.
* **flax nnx**: an ``nnx.jit`` training step of an MLP (``nnx.List`` layers) and its
  ``nnx.Optimizer`` (Adam); ``{"model": nnx.state(model), "optimizer": nnx.state(opt)}``.
* **optax**: a jitted Adam update of a 2-layer MLP's parameters; the optimizer state.
* **gymnax**: a jitted ``env.step`` of CartPole-v1; the ``EnvState``.
* **jraph**: a jitted ``GraphNetwork`` over a molecule padded to a fixed size; the molecule
  itself, of its own size, in a ``ragged=`` store.
* **equinox**: a jitted SGD step of an ``eqx.nn.MLP``; the module.

A library that is not installed gives a row marked skipped. The goal, at most 2x, is what a
user would accept for logging every step of a small model; larger models' steps take longer
while an append's cost grows with the state's bytes only.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import Case, Result, Timed, Timing, at_most, format_seconds, measure_side_by_side

import pytreestore

TITLE = "Appending a library's state at every step"


@dataclass(frozen=True)
class Sizes:
    steps: int
    repeats: int


FULL = Sizes(steps=200, repeats=3)
QUICK = Sizes(steps=10, repeats=1)


@dataclass
class Loop:
    """A library's jitted ``step(state) -> state`` and what a store holds of the state.

    Attributes:
        start: the state before the first step.
        step: one step (jitted; its result is waited for).
        record: the record appended after a step, from the state.
        options: ``pytreestore.create`` options (``ragged=``).
    """

    start: Any
    step: Callable[[Any, int], Any]
    record: Callable[[Any], Any] = lambda state: state
    options: dict[str, Any] | None = None


class _Skip(Exception):
    """The library is not installed."""


def _need(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as err:
        raise _Skip(f"{module} is not installed (`pip install -e '.[test]'`): {err}") from err


XML = """
<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <geom type="plane" size="2 2 0.1"/>
    <body pos="0 0 0.1"><freejoint/><geom type="sphere" size="0.05"/></body>
    <body pos="0.2 0 0.1"><freejoint/><geom type="box" size="0.05 0.05 0.05"/></body>
  </worldbody>
</mujoco>
"""


def mjx_loop() -> Loop:
    import jax

    mujoco, mjx = _need("mujoco"), _need("mujoco.mjx")
    m = mujoco.MjModel.from_xml_string(XML)
    model = mjx.put_model(m)
    step = jax.jit(mjx.step)
    return Loop(mjx.put_data(m, mujoco.MjData(m)), lambda d, _: step(model, d))


def nnx_loop() -> Loop:
    import jax
    import jax.numpy as jnp

    nnx, optax = _need("flax.nnx"), _need("optax")

    class MLP(nnx.Module):
        def __init__(self, rngs: Any) -> None:
            self.layers = nnx.List([nnx.Linear(16, 64, rngs=rngs), nnx.Linear(64, 1, rngs=rngs)])

        def __call__(self, x: Any) -> Any:
            return self.layers[1](jax.nn.relu(self.layers[0](x)))

    model = MLP(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    x, y = jnp.ones((32, 16)), jnp.zeros((32, 1))

    @nnx.jit
    def train(model: Any, optimizer: Any) -> Any:
        grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return optimizer.step[...]

    def state(_: Any) -> Any:
        return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}

    return Loop(None, lambda _, i: train(model, optimizer), state)


def optax_loop() -> Loop:
    import jax
    import jax.numpy as jnp

    optax = _need("optax")
    params = {"w1": jnp.ones((16, 64)) / 16, "w2": jnp.ones((64, 1)) / 64}
    tx = optax.adam(1e-3)
    x = jnp.ones((32, 16))

    @jax.jit
    def update(carry: Any) -> Any:
        params, opt_state = carry
        grads = jax.grad(lambda p: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    return Loop((params, tx.init(params)), lambda c, _: update(c), lambda c: c[1])


def gymnax_loop() -> Loop:
    import jax
    import jax.numpy as jnp

    gymnax = _need("gymnax")
    env, params = gymnax.make("CartPole-v1")
    step = jax.jit(env.step)
    keys = jax.random.split(jax.random.key(0), 1024)
    state = env.reset(keys[0], params)[1]
    return Loop(state, lambda s, i: step(keys[i % 1024], s, jnp.int32(i % 2), params)[1])


def jraph_loop() -> Loop:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jraph = _need("jraph")

    def molecule(i: int) -> Any:
        atoms, bonds = 3 + i % 7, 4 + i % 11
        rng = np.random.default_rng(i)
        return jraph.GraphsTuple(
            nodes=rng.normal(size=(atoms, 8)).astype(np.float32),
            edges=rng.normal(size=(bonds, 8)).astype(np.float32),
            senders=rng.integers(0, atoms, bonds).astype(np.int32),
            receivers=rng.integers(0, atoms, bonds).astype(np.int32),
            n_node=np.array([atoms], np.int32),
            n_edge=np.array([bonds], np.int32),
            globals=np.zeros((1, 8), np.float32),
        )

    net = jraph.GraphNetwork(
        update_edge_fn=lambda e, s, r, g: jnp.tanh(e + s + r),
        update_node_fn=lambda n, s, r, g: jnp.tanh(n + s + r),
    )
    forward = jax.jit(net)

    def step(_: Any, i: int) -> Any:
        graph = molecule(i)
        forward(jraph.pad_with_graphs(graph, n_node=16, n_edge=24, n_graph=2))
        return graph

    ragged = [".nodes", ".edges", ".senders", ".receivers"]
    return Loop(molecule(0), step, options={"ragged": ragged})


def equinox_loop() -> Loop:
    import jax
    import jax.numpy as jnp

    eqx = _need("equinox")
    mlp = eqx.nn.MLP(16, 1, width_size=64, depth=2, key=jax.random.key(0))
    x = jnp.ones((32, 16))

    @eqx.filter_jit
    def sgd(model: Any) -> Any:
        grads = eqx.filter_grad(lambda m: jnp.mean(jax.vmap(m)(x) ** 2))(model)
        return eqx.apply_updates(model, jax.tree.map(lambda g: -1e-3 * g, grads))

    return Loop(mlp, lambda m, _: sgd(m))


LOOPS = {
    "mjx": mjx_loop,
    "nnx": nnx_loop,
    "optax": optax_loop,
    "gymnax": gymnax_loop,
    "jraph": jraph_loop,
    "equinox": equinox_loop,
}


def _run(loop: Loop, steps: int, store: Any) -> Any:
    import jax

    state = loop.start
    for i in range(steps):
        state = jax.block_until_ready(loop.step(state, i))
        if store is not None:
            store.append(loop.record(state))
    if store is not None:
        store.close()
    return state


def _case(name: str, sizes: Sizes) -> list[Result]:
    try:
        loop = LOOPS[name]()
    except _Skip as why:
        nan = Timing((math.nan,))
        return [_row(name, sizes, nan, nan, (f"Skipped: {why}",))]
    _run(loop, 2, None)  # compile outside the timed region
    root = Path(tempfile.mkdtemp(prefix="pytreestore-bench-libraries-"))
    like = loop.record(loop.step(loop.start, 0))
    count = iter(range(10**6))
    try:

        def create() -> Any:
            path = root / f"s{next(count)}"
            return pytreestore.create(path, like, **(loop.options or {}))

        def check(store: Any, _: Any) -> None:
            if len(pytreestore.open(store.path)) != sizes.steps:
                raise RuntimeError(f"{name}: the store lacks steps")

        ours, base = measure_side_by_side(
            Timed(lambda store: _run(loop, sizes.steps, store), sizes.repeats, 1, create, check),
            Timed(lambda _: _run(loop, sizes.steps, None), sizes.repeats, 1),
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    per_append = (ours.median - base.median) / sizes.steps
    per_step = base.median / sizes.steps
    leaves = len(__import__("jax").tree.leaves(like))
    notes = (
        f"Per step: the step {format_seconds(per_step)}, the append "
        f"{format_seconds(per_append)} ({leaves} leaves).",
    )
    return [_row(name, sizes, ours, base, notes)]


def _row(name: str, sizes: Sizes, ours: Timing, base: Timing, notes: tuple[str, ...]) -> Result:
    return Result(
        case=f"{name}: {sizes.steps} steps, appending each"
        + (" (skipped)" if math.isnan(ours.median) else ""),
        n=sizes.steps,
        ours=ours,
        baseline=base,
        goal=at_most(2.0),
        higher_is_better=False,
        ours_label="the jitted step + `store.append(state)`, then `close`",
        baseline_label="the jitted step alone",
        notes=notes,
    )


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    return [Case(name, lambda name=name: _case(name, sizes)) for name in LOOPS]
