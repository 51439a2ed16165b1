"""Particles are born and die: a simulation whose records vary in structure.

``make demo`` runs this after ``simulation.py``. Each step is one record: a fixed part (the
step number and the time), a list of particles whose length changes from step to step (births
and deaths drawn from a seeded generator, the list empty at times), and a collision event
that most steps do not have (``None``). The store is created with ``ragged=`` and
``optional=`` and each step is appended as it is produced; then every step is loaded padded,
with a mask, and a jitted ``jax.vmap`` computes each step's mean speed, checked against a
Python loop over the steps kept in memory.

Usage: ``python examples/particles.py [DIRECTORY]``. The store is written to
``DIRECTORY/particles.pytreestore`` (replacing one left there by an earlier run), or to a
temporary directory that is removed afterwards.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import pytreestore

N_STEPS = 300
DT = np.float32(0.05)
BIRTH_RATE = 0.9  # mean births per step (Poisson) ...
DROUGHT = range(120, 220)  # ... except in these steps, when the population dies out
DEATH_PROBABILITY = 0.08  # per particle and step
BOX = np.float32(1.0)  # particles bounce off the walls of [-BOX, BOX]^2


@struct.dataclass
class Particle:
    position: np.ndarray  # float32[2]
    velocity: np.ndarray  # float32[2]
    age: np.ndarray  # int32: steps lived


@struct.dataclass
class Collision:
    """The fastest particle that hit a wall during the step."""

    position: np.ndarray  # float32[2]
    speed: np.ndarray  # float32


@struct.dataclass
class Step:
    step: np.ndarray  # int32
    time: np.ndarray  # float32
    particles: list[Particle]  # ragged: as many as are alive
    collision: Collision | None  # optional: None when no particle hit a wall


LIKE = Step(
    step=np.int32(0),
    time=np.float32(0),
    particles=[Particle(np.zeros(2, np.float32), np.zeros(2, np.float32), np.int32(0))],
    collision=Collision(np.zeros(2, np.float32), np.float32(0)),
)


def simulate(n_steps: int, seed: int = 0):
    """Yields each step's record as it is produced."""
    rng = np.random.default_rng(seed)
    alive: list[Particle] = []
    for step in range(n_steps):
        born = [
            Particle(
                position=rng.uniform(-BOX, BOX, 2).astype(np.float32),
                velocity=rng.normal(0, 1, 2).astype(np.float32),
                age=np.int32(0),
            )
            for _ in range(rng.poisson(0 if step in DROUGHT else BIRTH_RATE))
        ]
        survivors = [p for p in alive if rng.random() >= DEATH_PROBABILITY]
        alive, hits = [], []
        for p in survivors + born:
            position = p.position + DT * p.velocity
            out = np.abs(position) > BOX
            velocity = np.where(out, -p.velocity, p.velocity).astype(np.float32)
            position = np.clip(position, -BOX, BOX).astype(np.float32)
            alive.append(Particle(position, velocity, np.int32(p.age + 1)))
            if out.any():
                hits.append(Collision(position, np.float32(np.linalg.norm(velocity))))
        collision = max(hits, key=lambda c: float(c.speed)) if hits else None
        yield Step(np.int32(step), np.float32(step * DT), alive, collision)


def mean_speed(step: Any, mask: Any) -> jax.Array:
    """The mean speed of the particles alive at one step (0 when there are none).

    ``step`` is one step of the padded batch: its list of particles is one stacked
    ``Particle`` whose leaves have a leading axis of the padded length.
    """
    speed = jnp.linalg.norm(step.particles.velocity, axis=-1)  # [L]
    real = mask.particles.age  # [L]: True for real particles, False for padding
    total = jnp.sum(jnp.where(real, speed, 0))
    return jnp.where(real.any(), total / jnp.maximum(real.sum(), 1), 0)


def loop_mean_speed(step: Step) -> float:
    if not step.particles:
        return 0.0
    return float(np.mean([np.linalg.norm(p.velocity) for p in step.particles]))


def main(root: Path) -> None:
    path = root / "particles.pytreestore"
    kept = []  # the steps in memory, only to check the store against
    with pytreestore.create(
        path, like=LIKE, ragged=[".particles"], optional=[".collision"], overwrite=True
    ) as store:
        for state in simulate(N_STEPS):
            store.append(state)  # as produced: any number of particles, a collision or None
            kept.append(state)

    store = pytreestore.open(path)
    lengths = store.lengths()[".particles"]  # reads the offsets only
    print(
        f"{len(store)} steps, {int(lengths.sum()):,} particle rows, "
        f"{int(lengths.min())} to {int(lengths.max())} alive per step"
    )
    assert lengths.tolist() == [len(s.particles) for s in kept]

    batch, mask = store.load(ragged="pad")  # padded to the most particles alive at once
    speeds = jax.jit(jax.vmap(mean_speed))(batch, mask)
    expected = [loop_mean_speed(s) for s in kept]
    np.testing.assert_allclose(np.asarray(speeds), expected, rtol=1e-5, atol=1e-6)
    print(
        f"padded to {batch.particles.age.shape[1]} particles; "
        "mean speed per step matches a Python loop over the steps"
    )

    had = np.asarray(mask.collision.speed)  # presence of the optional collision, per step
    assert had.tolist() == [s.collision is not None for s in kept]
    fastest = float(jnp.max(jnp.where(had, batch.collision.speed, 0)))
    want = max(float(s.collision.speed) for s in kept if s.collision is not None)
    assert np.isclose(fastest, want), (fastest, want)
    print(f"{int(had.sum())} of {len(store)} steps had a collision, fastest {fastest:.3f}")

    # One step comes back exactly as appended: its own number of particles, None kept.
    empty = next(i for i, s in enumerate(kept) if not s.particles)
    quiet = next(i for i, s in enumerate(kept) if s.collision is None and s.particles)
    for i in (empty, quiet, N_STEPS - 1):
        got = store[i]
        assert len(got.particles) == len(kept[i].particles)
        assert (got.collision is None) == (kept[i].collision is None)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(kept[i]), strict=True):
            assert np.array_equal(np.asarray(g), np.asarray(w))
    print(f"store[{empty}] has {len(store[empty].particles)} particles; records read back exactly")
    store.close()
    print("particles: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
