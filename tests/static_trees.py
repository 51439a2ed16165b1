"""Records whose nodes hold arrays in static fields (as MJX's do) and dicts with int keys (as
flax nnx states do), on every kind of store: importable classes, so that stores bind them again
by module path, and the records of each kind.

``World`` keeps a static array wrapper (:class:`~pytreestore.testing.strategies.HashableArray`,
which has a static codec) on itself and on every ``Body``; its ``layers`` and each body's
``slots`` are dicts with int keys. The kinds are those of :mod:`tests.parity.kinds`:

* ``fixed``: no declarations;
* ``ragged_list``: ``ragged=[".bodies"]`` (static arrays and int-keyed dicts inside the elements);
* ``ragged_axis``: ``ragged=[".trail"]``;
* ``optional``: ``optional=[".extra"]`` (a body, so both inside an optional subtree);
* ``nested``: ``ragged=[".bodies", ".bodies[*].hits"]``;

and ``golden`` (the golden store ``static-arrays``): ``ragged=[".bodies"], optional=[".extra"]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_dtypes
import numpy as np
from flax import struct

from pytreestore.testing.strategies import HashableArray

KINDS = ("fixed", "ragged_list", "ragged_axis", "optional", "nested")
DECLARATIONS: dict[str, dict[str, Any]] = {
    "fixed": {},
    "ragged_list": {"ragged": [".bodies"]},
    "ragged_axis": {"ragged": [".trail"]},
    "optional": {"optional": [".extra"]},
    "nested": {"ragged": [".bodies", ".bodies[*].hits"]},
    "golden": {"ragged": [".bodies"], "optional": [".extra"]},  # the golden store's
}
#: the static arrays: an int32 matrix, an empty bfloat16 array and a 0-d bool
DIMS = HashableArray(np.arange(6, dtype=np.int32).reshape(2, 3))
EMPTY = HashableArray(np.zeros((0, 2), ml_dtypes.bfloat16))
FLAG = HashableArray(np.array(True))


@struct.dataclass
class Body:
    pos: Any  # float32[2]
    slots: Any  # {0: float32[], 7: int32[]}
    hits: Any = None  # list of int16[] (nested kind only)
    dims: HashableArray = struct.field(pytree_node=False, default=DIMS)
    empty: HashableArray = struct.field(pytree_node=False, default=EMPTY)


@struct.dataclass
class World:
    t: Any  # int32[]
    bodies: Any  # list of Body (2 unless ragged)
    trail: Any  # float32[n, 2] (n = 3 unless ragged)
    extra: Any  # Body or None (always there unless optional)
    layers: Any  # {0: {"w": float32[2]}, 1: {"w": float32[2]}}
    flag: HashableArray = struct.field(pytree_node=False, default=FLAG)


def _body(rng: np.random.Generator, kind: str) -> Body:
    hits = None
    if kind == "nested":
        hits = [np.int16(rng.integers(-9, 9)) for _ in range(int(rng.integers(0, 3)))]
    slots = {0: np.float32(rng.standard_normal()), 7: np.int32(rng.integers(-99, 99))}
    return Body(rng.standard_normal(2).astype(np.float32), slots, hits)


def _extra(rng: np.random.Generator, kind: str) -> Body:
    body = _body(rng, kind)
    return (
        dataclasses.replace(body, hits=[np.int16(rng.integers(-9, 9))])
        if kind == "nested"
        else body
    )


def record(kind: str, i: int) -> World:
    """Record ``i`` of ``kind``: lengths and presence vary where the kind allows."""
    rng = np.random.default_rng([7, i])
    n_bodies = int(rng.integers(0, 4)) if kind in ("ragged_list", "nested", "golden") else 2
    n_trail = int(rng.integers(0, 4)) if kind == "ragged_axis" else 3
    present = kind not in ("optional", "golden") or i % 2 == 0
    return World(
        t=np.int32(i),
        bodies=[_body(rng, kind) for _ in range(n_bodies)],
        trail=rng.standard_normal((n_trail, 2)).astype(np.float32),
        extra=_extra(rng, kind) if present else None,
        layers={k: {"w": np.full(2, k + i, np.float32)} for k in (0, 1)},
    )


def like(kind: str) -> World:
    """An example record with every part present and one element in each ragged list."""
    rng = np.random.default_rng(0)
    body = _body(rng, kind)
    if kind == "nested":
        body = dataclasses.replace(body, hits=[np.int16(1)])
    bodies = [body] if kind in ("ragged_list", "nested", "golden") else [body, body]
    return World(
        t=np.int32(0),
        bodies=bodies,
        trail=np.zeros((1 if kind == "ragged_axis" else 3, 2), np.float32),
        extra=body,
        layers={k: {"w": np.zeros(2, np.float32)} for k in (0, 1)},
    )


def layers_record(i: int) -> dict[str, Any]:
    """A flax-nnx-like optimizer state as plain dicts: int keys at two levels, a str sibling."""
    return {
        "opt_state": {
            0: {"count": np.int32(i), "mu": {0: np.arange(2, dtype=np.float32) * i}},
            -3: {"count": np.int32(-i)},
            2**40: np.float32(i / 2),
        },
        "step": np.int32(i),
    }
