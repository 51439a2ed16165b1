"""A particle simulation whose every step is one record of a deep pytree.

This is what ``make demo`` runs. It simulates a few clusters of particles bouncing in a box with
numpy, appends the full simulation state of every step to a store one record at a time, reopens
the store, loads a slice of steps as one batched state and ``jax.vmap``s an analysis over it,
and checks everything against the states it kept in memory.

Usage: ``python examples/simulation.py [DIRECTORY]``. The store is written to
``DIRECTORY/simulation.pytreestore`` (replacing one left there by an earlier run), or to a
temporary directory that is removed afterwards.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from time import perf_counter
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

import pytreestore

N_STEPS = 2_000
N_CLUSTERS = 3
N_PARTICLES = 4  # per cluster
DT = 0.01
MAX_BOUNCES = 60  # a particle that has hit the walls this often stops: alive becomes False
CHUNK_RECORDS = 256
WINDOW = slice(500, 1500)


# --- the simulation state: SimState > World > list > Cluster > list > Particle > Body > dict ---


class Body(NamedTuple):
    kinematics: dict[str, np.ndarray]  # "position", "velocity": float32[3]
    mass: np.float32


@struct.dataclass
class Particle:
    body: Body
    alive: np.bool_
    stats: dict[str, np.generic]  # "bounces": int32, "charge": float32


@struct.dataclass
class Cluster:
    transform: np.ndarray  # float32[4, 4]: rotation about z and the centroid, homogeneous
    particles: list[Particle]


@struct.dataclass
class World:
    gravity: np.ndarray  # float32[3]
    clusters: list[Cluster]


@struct.dataclass
class SimState:
    step: int  # a Python int: an int32 column
    time: np.float64  # a float64 column, stored exactly
    world: World
    name: str = struct.field(pytree_node=False, default="particles-in-a-box")  # in the treedef


# --- the physics, vectorised over (cluster, particle) in numpy -------------------------------


class Arrays(NamedTuple):
    pos: np.ndarray  # float32[C, P, 3]
    vel: np.ndarray  # float32[C, P, 3]
    mass: np.ndarray  # float32[C, P]
    charge: np.ndarray  # float32[C, P]
    bounces: np.ndarray  # int32[C, P]
    alive: np.ndarray  # bool[C, P]


GRAVITY = np.array([0.0, 0.0, -1.0], np.float32)
SPIN = np.array([0.5, -1.0, 2.0], np.float32)  # rad/s, one per cluster


def initial_arrays(rng: np.random.Generator) -> Arrays:
    shape = (N_CLUSTERS, N_PARTICLES)
    return Arrays(
        pos=rng.uniform(-0.8, 0.8, (*shape, 3)).astype(np.float32),
        vel=rng.normal(0.0, 2.0, (*shape, 3)).astype(np.float32),
        mass=rng.uniform(0.5, 2.0, shape).astype(np.float32),
        charge=rng.choice(np.array([-1.0, 1.0], np.float32), shape),
        bounces=np.zeros(shape, np.int32),
        alive=np.ones(shape, bool),
    )


def advance(a: Arrays) -> Arrays:
    """One semi-implicit Euler step: gravity, a spring to the cluster centroid, elastic walls."""
    centroid = a.pos.mean(axis=1, keepdims=True)
    moving = a.alive[..., None]
    vel = np.where(moving, a.vel + DT * (GRAVITY + 4.0 * (centroid - a.pos)), 0.0)
    pos = a.pos + DT * vel
    outside = np.abs(pos) > 1.0
    pos = np.where(outside, np.sign(pos) * 2.0 - pos, pos).astype(np.float32)
    vel = np.where(outside, -vel, vel).astype(np.float32)
    bounces = (a.bounces + outside.any(axis=-1)).astype(np.int32)
    return a._replace(pos=pos, vel=vel, bounces=bounces, alive=bounces < MAX_BOUNCES)


def transform(angle: float, centroid: np.ndarray) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    m = np.eye(4, dtype=np.float32)
    m[:2, :2] = [[c, -s], [s, c]]
    m[:3, 3] = centroid
    return m


def snapshot(step: int, a: Arrays) -> SimState:
    """The pytree for one step: copies, so that later steps do not change it."""
    t = np.float64(step * DT)
    clusters = [
        Cluster(
            transform=transform(float(SPIN[c] * t), a.pos[c].mean(axis=0)),
            particles=[
                Particle(
                    body=Body(
                        kinematics={"position": a.pos[c, p].copy(), "velocity": a.vel[c, p].copy()},
                        mass=a.mass[c, p],
                    ),
                    alive=a.alive[c, p],
                    stats={"bounces": a.bounces[c, p], "charge": a.charge[c, p]},
                )
                for p in range(N_PARTICLES)
            ],
        )
        for c in range(N_CLUSTERS)
    ]
    return SimState(step=step, time=t, world=World(gravity=GRAVITY.copy(), clusters=clusters))


def simulate(n_steps: int) -> list[SimState]:
    a = initial_arrays(np.random.default_rng(0))
    states = []
    for step in range(n_steps):
        states.append(snapshot(step, a))
        a = advance(a)
    return states


# --- the analysis ----------------------------------------------------------------------------


def kinetic_energy(state: SimState) -> jax.Array:
    """Total kinetic energy of the living particles in one state (written for one record)."""
    total = jnp.float32(0.0)
    for cluster in state.world.clusters:
        for particle in cluster.particles:
            v = particle.body.kinematics["velocity"]
            total += 0.5 * particle.body.mass * jnp.dot(v, v) * particle.alive
    return total


def kinetic_energy_reference(state: SimState) -> float:
    """The same quantity from an in-memory state, in float64 numpy."""
    total = 0.0
    for cluster in state.world.clusters:
        for particle in cluster.particles:
            v = particle.body.kinematics["velocity"].astype(np.float64)
            total += 0.5 * float(particle.body.mass) * float(v @ v) * bool(particle.alive)
    return total


# --- helpers for the report ------------------------------------------------------------------


def disk_usage(path: Path) -> tuple[int, int]:
    files = [Path(root) / name for root, _, names in os.walk(path) for name in names]
    return sum(f.stat().st_size for f in files), len(files)


def same_tree(got, expected) -> bool:
    if jax.tree.structure(got) != jax.tree.structure(expected):
        return False
    pairs = zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True)
    return all(np.array_equal(np.asarray(g), np.asarray(e)) for g, e in pairs)


def under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith((prefix + ".", prefix + "["))


def line(what: str, seconds: float, extra: str = "") -> None:
    print(f"   {what:<56} {seconds * 1e3:8.1f} ms{extra}")


# --- the demo --------------------------------------------------------------------------------


def write(path: Path, states: list[SimState]) -> None:
    t0 = perf_counter()
    store = pytreestore.create(path, like=states[0], chunk_records=CHUNK_RECORDS, overwrite=True)
    line("created the store (schema from the first state)", perf_counter() - t0)

    t0 = perf_counter()
    for state in states:
        store.append(state)
    dt = perf_counter() - t0
    line(
        f"appended {len(states):,} states one at a time",
        dt,
        f"  ({dt / len(states) * 1e6:.0f} us each)",
    )

    t0 = perf_counter()
    store.flush()
    store.close()
    line("flushed the buffered tail and committed, closed", perf_counter() - t0)
    n_chunks, tail = divmod(len(states), CHUNK_RECORDS)
    print(f"   ({n_chunks} whole chunks of {CHUNK_RECORDS} records went out while appending,")
    print(f"    the last {tail} records on flush; all {len(states):,} are now durable)")


def describe(path: Path, store: pytreestore.TreeStore) -> None:
    columns = store.schema.columns
    size, n_files = disk_usage(path)
    print(f"   {len(store):,} records, {len(columns)} columns,", end=" ")
    print(f"{size / 2**20:.2f} MiB on disk in {n_files} files")
    deepest = max(columns, key=lambda c: c.key.count("/"))
    print(f"   deepest column: {deepest.path}")
    print(
        f"     stored at key {deepest.key!r} as {np.dtype(deepest.dtype).name}{list(deepest.shape)}"
    )
    dtypes = sorted({np.dtype(c.dtype).name for c in columns})
    print(f"   column dtypes: {', '.join(dtypes)}")


def analyse(store: pytreestore.TreeStore, states: list[SimState]) -> None:
    # store[WINDOW] would load every column, and .time is float64, which a jax.Array cannot
    # hold while JAX's x64 mode is off (pytreestore refuses rather than round it). So load
    # the columns the analysis needs; step 5 reads .time exactly, with as_numpy=True.
    t0 = perf_counter()
    batch = store.load(WINDOW, columns=[".step", ".world"])
    jax.block_until_ready(batch)
    n = batch.world.clusters[0].particles[0].body.mass.shape[0]
    line(
        f'load(slice({WINDOW.start}, {WINDOW.stop}), columns=[".step", ".world"])',
        perf_counter() - t0,
    )
    print(f"     -> one SimState whose leaves have a leading axis of {n}; .time is None")

    energy_fn = jax.jit(jax.vmap(kinetic_energy))
    t0 = perf_counter()
    energy = jax.block_until_ready(energy_fn(batch))
    line("jax.jit(jax.vmap(kinetic_energy))(batch), with compile", perf_counter() - t0)
    t0 = perf_counter()
    jax.block_until_ready(energy_fn(batch))
    line("the same, compiled", perf_counter() - t0)

    reference = np.array([kinetic_energy_reference(s) for s in states[WINDOW]])
    np.testing.assert_allclose(np.asarray(energy), reference, rtol=1e-5, atol=1e-6)
    err = np.max(np.abs(np.asarray(energy, np.float64) - reference) / np.maximum(reference, 1e-12))
    print(f"   kinetic energy matches the in-memory states (max relative error {err:.1e}):")
    for i in (0, len(reference) // 2, len(reference) - 1):
        print(f"     step {WINDOW.start + i:>5}: {float(energy[i]):9.4f}")


def select(store: pytreestore.TreeStore, states: list[SimState]) -> None:
    prefix = ".world.clusters[0].particles[0]"
    t0 = perf_counter()
    part = store.load(columns=[prefix])
    dt = perf_counter() - t0
    expected = sum(under(c.path, prefix) for c in store.schema.columns)
    loaded = len(jax.tree.leaves(part))
    assert loaded == expected, (loaded, expected)
    assert part.world.clusters[1].particles[0].body.mass is None
    line(f'load(columns=["{prefix}"])', dt, f"  ({loaded} of {len(store.schema.columns)} columns)")
    bounces = np.asarray(part.world.clusters[0].particles[0].stats["bounces"])
    assert np.array_equal(
        bounces, [s.world.clusters[0].particles[0].stats["bounces"] for s in states]
    )
    print(f"     that particle hit a wall {int(bounces[-1])} times in {len(states):,} steps")

    times = store.load(WINDOW, columns=[".time"], as_numpy=True).time
    assert times.dtype == np.float64, times.dtype
    assert np.array_equal(times, [s.time for s in states[WINDOW]])
    print("   load(columns=['.time'], as_numpy=True): float64 time stamps, bit for bit")

    i = 1234
    record = store.load(i, as_numpy=True)
    assert same_tree(record, states[i]), "store record differs from the appended state"
    assert record.name == states[i].name
    print(f"   load({i}, as_numpy=True) equals the state appended at step {i},")
    print(f"     static field included: name={record.name!r}")


def main(root: Path) -> None:
    start = perf_counter()
    path = root / "simulation.pytreestore"
    print("pytreestore demo: one record per step of a particle simulation")
    print(f"   {N_CLUSTERS} clusters x {N_PARTICLES} particles, {N_STEPS:,} steps; store at {path}")

    print("1. simulate")
    t0 = perf_counter()
    states = simulate(N_STEPS)
    line(f"simulated {N_STEPS:,} steps in numpy, kept every state", perf_counter() - t0)
    alive = sum(bool(p.alive) for c in states[-1].world.clusters for p in c.particles)
    print(f"   {alive} of {N_CLUSTERS * N_PARTICLES} particles still moving at the end")

    print("2. write")
    write(path, states)

    print("3. reopen")
    t0 = perf_counter()
    store = pytreestore.open(path)
    line("pytreestore.open(path)", perf_counter() - t0)
    describe(path, store)

    print("4. analyse a window of steps")
    analyse(store, states)

    print("5. select columns")
    select(store, states)
    store.close()
    print(f"demo finished in {perf_counter() - start:.2f} s: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
