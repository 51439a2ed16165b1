"""Recording every step of a simulation compiled with ``jax.lax.scan``, then checking the
store against a run that recorded nothing.

A small N-body-like system (masses on springs, with a random kick each step and a count of
steps where the energy grew) runs 1,000 steps in ``pytreestore.record_scan``: blocks of 256
steps compiled with ``lax.scan``, each block's records written on a background thread while
the next block computes. The same steps are then run in a plain ``lax.scan`` that keeps its
states as outputs, and every recorded record is compared with them bit for bit. Last, a
Python loop of the jitted step records through a recorder's wrapped step (``rec.wrap``),
and its records are checked against the same loop recording nothing.

    python examples/record_scan.py
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import pytreestore

STEPS = 1_000


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class World:
    pos: Any  # float32[8, 2]
    vel: Any  # float32[8, 2]
    energy: Any  # float32[]
    grew: Any  # int32[]: steps where the energy grew
    key: Any  # a typed PRNG key


def start() -> World:
    key = jax.random.key(0)
    pos = jax.random.normal(key, (8, 2))
    return World(pos, jnp.zeros((8, 2)), jnp.float32(0), jnp.int32(0), jax.random.key(1))


def step(w: World) -> World:
    key, kick = jax.random.split(w.key)
    force = -w.pos + 0.01 * jax.random.normal(kick, w.pos.shape)
    vel = 0.99 * w.vel + 0.05 * force
    pos = w.pos + 0.05 * vel
    energy = 0.5 * jnp.sum(vel**2) + 0.5 * jnp.sum(pos**2)
    return World(pos, vel, energy, w.grew + (energy > w.energy).astype(jnp.int32), key)


def reference(steps: int) -> World:
    """Every state of an unrecorded scan, stacked (its outputs)."""

    def body(w: World, _: None) -> tuple[World, World]:
        w = step(w)
        return w, w

    return jax.jit(lambda w: jax.lax.scan(body, w, None, length=steps))(start())[1]


def check(path: Path, want: World, n: int) -> None:
    """The store at ``path`` holds the first ``n`` states of ``want``, bit for bit."""
    with pytreestore.open(path) as reader:
        got = reader.load(as_numpy=True)
    assert len(got.energy) == n, len(got.energy)
    for name in ("pos", "vel", "energy", "grew"):
        a, b = getattr(got, name), np.asarray(getattr(want, name))[:n]
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    keys = np.asarray(jax.random.key_data(want.key))[:n]
    assert np.array_equal(np.asarray(jax.random.key_data(got.key)), keys)


def main() -> None:
    want = reference(STEPS)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "world"
        with pytreestore.create(path, start()) as store:
            end = pytreestore.record_scan(store, step, start(), STEPS, block=256)
        assert int(end.grew) == int(want.grew[-1])
        check(path, want, STEPS)
        print(f"{STEPS:,} steps recorded from lax.scan blocks match an unrecorded scan")

        path = Path(tmp) / "loop"
        with pytreestore.create(path, start()) as store:
            rec = store.recorder(block=64)
            recorded, world = rec.wrap(step), start()
            for _ in range(200):
                world = recorded(world)
        jitted, world, states = jax.jit(step), start(), []
        for _ in range(200):  # the same loop, recording nothing
            world = jitted(world)
            states.append(world)
        check(path, jax.tree.map(lambda *v: jnp.stack(v), *states), 200)
        print("200 steps of a Python loop recorded through rec.wrap(step) match the loop's")
    print("record scan: all checks passed")


if __name__ == "__main__":
    main()
