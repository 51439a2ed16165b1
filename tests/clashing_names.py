"""Classes bound under a name that imports as another class (issue 28, defect 3).

Each ``*Alias`` here is a class whose ``module:qualname`` names the class defined after (or
before) it, so a store that recorded it by that name would read its records back as the other
class. pickle refuses each of them; so does a store.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from typing import Any, NamedTuple

import equinox as eqx
import jax
from flax import struct


class Point(NamedTuple):
    x: Any
    y: Any


PointAlias = collections.namedtuple("Point", ["x", "y"])  # recorded as ...:Point


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Weights:
    w: Any


WeightsAlias = Weights


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Weights:  # a second class under the first one's name
    w: Any


@struct.dataclass
class Box:
    v: Any


BoxAlias = Box


@struct.dataclass
class Box:
    v: Any


class Linear(eqx.Module):
    w: Any


LinearAlias = Linear


class Linear(eqx.Module):
    w: Any


class Custom:
    """A node registered with its own flatten."""

    def __init__(self, a: Any) -> None:
        self.a = a


jax.tree_util.register_pytree_with_keys(
    Custom,
    lambda c: (((jax.tree_util.GetAttrKey("a"), c.a),), None),
    lambda aux, kids: Custom(*kids),
)
CustomAlias = Custom


class Custom:
    def __init__(self, a: Any) -> None:
        self.a = a


jax.tree_util.register_pytree_with_keys(
    Custom,
    lambda c: (((jax.tree_util.GetAttrKey("a"), c.a),), None),
    lambda aux, kids: Custom(*kids),
)


class Mode(enum.Enum):
    TRAIN = 1


ModeAlias = Mode


class Mode(enum.Enum):
    TRAIN = 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class WithStatic:
    """A node whose static field holds a class, an Enum member or a function."""

    x: Any
    static: Any = dataclasses.field(metadata={"static": True})


def relu(x: Any) -> Any:
    return x


relu_alias = relu


def relu(x: Any) -> Any:
    return x


def made_in_a_function() -> type:
    """A namedtuple made in a function: its name imports as nothing (like a local class)."""
    return collections.namedtuple("NowhereToBeFound", ["x"])
