"""Evolved variants of the classes of :mod:`tests.parity.kinds`, for ``evolve`` tests.

A store bound to ``kinds.Step`` / ``kinds.Agent`` is evolved with ``rename_class`` to one of
these, each the kinds class with one change: a field added, dropped or renamed, at the top
(``Step*``) or inside the elements of ``.agents`` (``Agent*``, held by ``StepOf*``). They
live in a module of their own so that a fresh process can import them by name.
"""

from __future__ import annotations

from typing import Any

from flax import struct

from tests.parity import kinds


@struct.dataclass
class StepAdded:
    """``Step`` with a field ``w`` added."""

    t: Any
    x: Any
    agents: Any
    trail: Any
    storm: Any
    w: Any


@struct.dataclass
class StepDropped:
    """``Step`` without ``x``."""

    t: Any
    agents: Any
    trail: Any
    storm: Any


@struct.dataclass
class StepRenamed:
    """``Step`` with ``t`` renamed ``time``."""

    time: Any
    x: Any
    agents: Any
    trail: Any
    storm: Any


@struct.dataclass
class AgentAdded:
    """``Agent`` with a field ``mass`` added."""

    pos: Any
    energy: Any
    events: Any = None
    mass: Any = None


@struct.dataclass
class AgentDropped:
    """``Agent`` without ``energy``."""

    pos: Any
    events: Any = None


@struct.dataclass
class AgentRenamed:
    """``Agent`` with ``energy`` renamed ``power``."""

    pos: Any
    power: Any
    events: Any = None


@struct.dataclass
class StepWithoutAgents:
    """``Step`` without ``agents``."""

    t: Any
    x: Any
    trail: Any
    storm: Any


@struct.dataclass
class StepWithoutTrail:
    """``Step`` without ``trail``."""

    t: Any
    x: Any
    agents: Any
    storm: Any


@struct.dataclass
class StepWithoutStorm:
    """``Step`` without ``storm``."""

    t: Any
    x: Any
    agents: Any
    trail: Any


@struct.dataclass
class StormAdded:
    """``Storm`` with a field ``wind`` added."""

    strength: Any
    cells: Any
    wind: Any


#: the part of each kind's records that varies, and the class ``Step`` becomes without it
VARYING = {
    "fixed": (".agents", StepWithoutAgents),
    "ragged_list": (".agents", StepWithoutAgents),
    "ragged_axis": (".trail", StepWithoutTrail),
    "optional": (".storm", StepWithoutStorm),
    "nested": (".agents", StepWithoutAgents),
}


def name(cls: type) -> str:
    """``module:qualname`` of a class, as a schema names it (and ``rename_class`` takes)."""
    return f"{cls.__module__}:{cls.__qualname__}"


#: change -> (evolve's keyword arguments, the class Step becomes, the class Agent becomes)
TOP = {
    "add": ({"add": {".w": "W"}}, StepAdded, kinds.Agent),
    "drop": ({"drop": [".x"]}, StepDropped, kinds.Agent),
    "rename": ({"rename": {".t": ".time"}}, StepRenamed, kinds.Agent),
}
INSIDE = {
    "add": ({"add": {".agents[*].mass": "W"}}, kinds.Step, AgentAdded),
    "drop": ({"drop": [".agents[*].energy"]}, kinds.Step, AgentDropped),
    "rename": ({"rename": {".agents[*].energy": ".agents[*].power"}}, kinds.Step, AgentRenamed),
}
