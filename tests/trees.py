"""Importable example classes for the tests (stores reopen them by module path)."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import struct


@struct.dataclass
class Params:
    x: Any
    y: Any


@struct.dataclass
class AllParams:
    p: list[Params]


def seed_records() -> list[AllParams]:
    return [
        AllParams([Params(4, 2), Params(4, 3)]),
        AllParams([Params(3, 5), Params(2, 4)]),
        AllParams([Params(3, 2), Params(6, 3)]),
    ]


def some_func(params: AllParams) -> jax.Array:
    a, b = params.p
    return a.x * b.y - b.x * a.y


@struct.dataclass
class WithStatic:
    value: Any
    name: str = struct.field(pytree_node=False, default="run")
    sizes: tuple = struct.field(pytree_node=False, default=(1, 2))


class Pair(NamedTuple):
    left: Any
    right: Any


@dataclasses.dataclass
class Plain:
    a: Any
    b: Any


jax.tree_util.register_dataclass(Plain, data_fields=["a", "b"], meta_fields=[])


class Keyed:
    """A class registered with keys, the way equinox modules are."""

    def __init__(self, w: Any, b: Any) -> None:
        self.w, self.b = w, b


jax.tree_util.register_pytree_with_keys(
    Keyed,
    lambda k: (((jax.tree_util.GetAttrKey("w"), k.w), (jax.tree_util.GetAttrKey("b"), k.b)), None),
    lambda aux, children: Keyed(*children),
)


def deep_record(i: int = 0, depth: int = 7) -> Any:
    """A 7-level record: lists of dataclasses holding NamedTuples, dicts and arrays."""
    node: Any = {"leaf": np.full((2, 3), i, np.float32), "flag": np.bool_(i % 2)}
    for level in range(depth - 1):
        if level % 3 == 0:
            node = Pair(node, np.int32(i + level))
        elif level % 3 == 1:
            node = [
                WithStatic(node, name=f"l{level}"),
                Plain(np.float32(i), np.arange(3, dtype=np.int32) + i),
            ]
        else:
            node = {"inner": node, "step": np.int16(level)}
    return node


def wide_record(i: int = 0, n: int = 300) -> dict[str, Any]:
    """Hundreds of leaves in a few levels."""
    return {
        f"g{g}": [Params(np.float32(i + j), np.int32(j)) for j in range(n // 20)] for g in range(10)
    }


# ---- ragged records (format 3) -------------------------------------------------------------


@struct.dataclass
class Hit:
    """An element of a ragged list, itself holding a ragged leading axis (``samples``)."""

    pos: Any
    samples: Any


@struct.dataclass
class Calib:
    gain: Any
    offset: Any


@struct.dataclass
class Event:
    """A ragged record: ``hits`` a ragged list of dataclasses, ``trace`` a leaf with a ragged
    leading axis, ``track`` a node whose leaves share one, ``calib`` an optional subtree."""

    hits: list[Hit]
    trace: Any
    track: dict[str, Any]
    calib: Calib | None
    run: Any


#: the declarations of a store of :class:`Event` records
EVENT_RAGGED = [".hits", ".hits[*].samples", ".trace", ".track"]
EVENT_OPTIONAL = [".calib"]
