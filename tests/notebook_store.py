"""The example store of the notebook view's tests and screenshots (docs/images/notebook-view-*.png):
a simulation's frames with a ragged list of particles, a ragged leading axis, an optional
subtree, a static field and a tag."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
from flax import struct

import pytreestore


@struct.dataclass
class Particle:
    pos: Any  # float32[3]
    vel: Any  # float32[3]


@struct.dataclass
class Wind:
    speed: Any  # float32[]
    heading: Any  # float32[]


@struct.dataclass
class Frame:
    step: Any  # int32[]
    time: Any  # float64[]
    particles: list[Particle]  # ragged
    trace: Any  # float32[n] (ragged leading axis)
    image: Any  # uint8[4, 4]
    wind: Wind | None  # optional
    run: str = struct.field(pytree_node=False, default="run-a")


RECORDS = 12
RAGGED = [".particles", ".trace"]
OPTIONAL = [".wind"]


def frame(i: int) -> Frame:
    """Frame ``i``: ``i % 4`` particles, a trace of ``i % 5 + 1`` values, wind every third."""
    rng = np.random.default_rng(i)
    particles = [
        Particle(
            np.round(rng.standard_normal(3), 2).astype(np.float32),
            np.full(3, i + k / 10, np.float32),
        )
        for k in range(i % 4)
    ]
    wind = Wind(np.float32(3 + i), np.float32(90)) if i % 3 == 0 else None
    image = np.arange(16, dtype=np.uint8).reshape(4, 4) + i
    trace = np.arange(i % 5 + 1, dtype=np.float32) * 0.5
    return Frame(np.int32(i), np.float64(i * 0.01), particles, trace, image, wind)


def example(path: Path, backend: str = "tensorstore") -> pytreestore.TreeStore:
    """The example store at ``path``, written, tagged and opened for reading."""
    like = dataclasses.replace(frame(1), wind=Wind(np.float32(0), np.float32(0)))
    with pytreestore.create(path, like, ragged=RAGGED, optional=OPTIONAL, backend=backend) as store:
        store.extend(frame(i) for i in range(RECORDS - 2))
        store.flush()
        store.tag("first-ten")
        store.extend(frame(i) for i in range(RECORDS - 2, RECORDS))
    return pytreestore.open(path)


def example_view(tmp: Path) -> str:
    """The example store's notebook view."""
    store = example(tmp / "frames.pts")
    try:
        html = store._repr_html_()
        assert html is not None
        return html
    finally:
        store.close()
