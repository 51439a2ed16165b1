"""The five kinds of store every feature is tested on (issue 29's parity matrix).

Each kind is a set of importable classes (stores bind them again by module path), a function
that makes varied records, and the declarations ``create`` takes. The kinds:

* ``fixed``: every record has one structure (no declarations);
* ``ragged_list``: a list of dataclasses whose length varies (``ragged=[".agents"]``);
* ``ragged_axis``: an array leaf whose leading axis varies (``ragged=[".trail"]``);
* ``optional``: a subtree that is sometimes ``None`` (``optional=[".storm"]``);
* ``nested``: a ragged list inside the elements of a ragged list
  (``ragged=[".agents", ".agents[*].events"]``).

All records of all kinds share the top class ``Step``, so a feature's test is written once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from flax import struct

KINDS = ("fixed", "ragged_list", "ragged_axis", "optional", "nested")
BACKENDS = ("tensorstore", "zarr", "ocdbt")


@struct.dataclass
class Agent:
    pos: Any  # float32[2]
    energy: Any  # float32[]
    events: Any = None  # list of int32[] (nested kind only)


@struct.dataclass
class Storm:
    strength: Any  # float32[]
    cells: Any  # int16[3]


@struct.dataclass
class Step:
    t: Any  # int32[]
    x: Any  # float32[4]
    agents: Any  # list of Agent (fixed length 2 unless ragged)
    trail: Any  # float32[n, 2] (n fixed at 3 unless ragged)
    storm: Any  # Storm or None (always there unless optional)


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of store: its declarations and how its records vary."""

    name: str
    ragged: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()

    @property
    def declarations(self) -> dict[str, list[str]]:
        """The keyword arguments ``create`` takes for this kind."""
        out: dict[str, list[str]] = {}
        if self.ragged:
            out["ragged"] = list(self.ragged)
        if self.optional:
            out["optional"] = list(self.optional)
        return out

    @property
    def is_fixed(self) -> bool:
        return not (self.ragged or self.optional)


def kind(name: str) -> Kind:
    """The kind called ``name`` (one of ``KINDS``)."""
    return {
        "fixed": Kind("fixed"),
        "ragged_list": Kind("ragged_list", ragged=(".agents",)),
        "ragged_axis": Kind("ragged_axis", ragged=(".trail",)),
        "optional": Kind("optional", optional=(".storm",)),
        "nested": Kind("nested", ragged=(".agents", ".agents[*].events")),
    }[name]


def _agent(rng: np.random.Generator, name: str) -> Agent:
    events = None
    if name == "nested":
        events = [np.int32(rng.integers(0, 100)) for _ in range(int(rng.integers(0, 4)))]
    return Agent(
        pos=rng.standard_normal(2).astype(np.float32),
        energy=np.float32(rng.standard_normal()),
        events=events,
    )


def record(name: str, i: int, seed: int = 0) -> Step:
    """Record ``i`` of kind ``name``; records vary where the kind allows."""
    rng = np.random.default_rng([seed, i])
    n_agents = int(rng.integers(0, 4)) if name in ("ragged_list", "nested") else 2
    n_trail = int(rng.integers(0, 5)) if name == "ragged_axis" else 3
    storm = None
    if name != "optional" or rng.random() < 0.5:
        storm = Storm(np.float32(rng.random()), rng.integers(0, 9, 3).astype(np.int16))
    return Step(
        t=np.int32(i),
        x=rng.standard_normal(4).astype(np.float32),
        agents=[_agent(rng, name) for _ in range(n_agents)],
        trail=rng.standard_normal((n_trail, 2)).astype(np.float32),
        storm=storm,
    )


def records(name: str, n: int, seed: int = 0, start: int = 0) -> list[Step]:
    """Records ``start .. start + n`` of kind ``name``."""
    return [record(name, i, seed) for i in range(start, start + n)]


def like(name: str) -> Step:
    """An example record with every optional part present and one element in each list."""
    rng = np.random.default_rng(12345)
    agent = _agent(rng, name)
    if name == "nested":
        agent = agent.replace(events=[np.int32(1)])
    agents = [agent] if name in ("ragged_list", "nested") else [agent, agent]
    return Step(
        t=np.int32(0),
        x=np.zeros(4, np.float32),
        agents=agents,
        trail=np.zeros((3 if name != "ragged_axis" else 1, 2), np.float32),
        storm=Storm(np.float32(0), np.zeros(3, np.int16)),
    )


def create(path: Any, name: str, backend: str, **kw: Any):
    """A new store of kind ``name`` at ``path`` on ``backend``."""
    import pytreestore

    return pytreestore.create(path, like(name), backend=backend, **kind(name).declarations, **kw)


def filled(path: Any, name: str, backend: str, n: int = 9, seed: int = 0, **kw: Any):
    """A store of kind ``name`` with ``n`` records appended (some by extend, some by append)."""
    store = create(path, name, backend, **kw)
    recs = records(name, n, seed)
    with store:
        store.extend(recs[: n // 2])
        for r in recs[n // 2 :]:
            store.append(r)
    return recs


def assert_same(got: Any, want: Any) -> None:
    """Asserts that ``got`` is ``want`` exactly: one structure (lists of the same lengths,
    ``None`` at the same places, the same classes) and equal leaves of the same dtypes."""
    import jax

    got_leaves, got_def = jax.tree.flatten(got)
    want_leaves, want_def = jax.tree.flatten(want)
    assert got_def == want_def, f"structure {got_def} != {want_def}"
    for i, (a, b) in enumerate(zip(got_leaves, want_leaves)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape, (
            f"leaf {i}: {a.dtype}{a.shape} != {b.dtype}{b.shape}"
        )
        assert np.array_equal(a, b), f"leaf {i}: {a} != {b}"
