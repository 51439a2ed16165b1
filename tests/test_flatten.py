"""The block flattener (pytreestore/_tree/flatten.py): exactly tree_flatten's leaves for
records of its structure, and None for every record the treedef comparison refuses."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from hypothesis import given
from hypothesis import strategies as st
from jax.tree_util import tree_flatten, tree_structure

from pytreestore._tree.flatten import block_flattener, dataclass_fields
from pytreestore.testing import strategies as pts
from tests.trees import Keyed, Pair, Plain, WithStatic, deep_record


class Other(NamedTuple):
    """A NamedTuple with the fields of :class:`tests.trees.Pair`, of another class."""

    left: Any
    right: Any


class Flat(dict):
    """A dict subclass: a leaf to JAX."""


@struct.dataclass
class Static:
    value: Any
    scale: float = struct.field(pytree_node=False, default=1.0)


@struct.dataclass
class SubStatic(Static):
    """A subclass registered in its own right: another node class than :class:`Static`."""


@dataclasses.dataclass
class Registered:
    x: Any
    tag: Any


jax.tree_util.register_dataclass(Registered, data_fields=["x"], meta_fields=["tag"])


def _mixed(i: int) -> Any:
    return {
        "b": i,
        "a": np.float32(i),
        "c": np.arange(3, dtype=np.int32) + i,
        "d": (i, [np.zeros(2) + i, True], ()),
        "e": [],
    }


#: record makers of every node kind a block flattener takes
STRUCTURES: dict[str, Callable[[int], Any]] = {
    "dict with str keys, lists, tuples, empty containers": _mixed,
    "dict with int keys": lambda i: {3: i, 1: np.int32(i), 2: [i, float(i)], 10: {0: i}},
    "NamedTuples": lambda i: Pair(np.int32(i), Pair(i, (np.float32(i),))),
    "flax dataclass with static fields": lambda i: WithStatic({"x": i}, name="run", sizes=(1, 2)),
    "one static field": lambda i: Static([np.int8(i)], scale=0.5),
    "register_dataclass": lambda i: Plain(i, [i, Registered(np.int64(i), tag=("t", 1))]),
    "None leaves and subtrees": lambda i: {
        "a": None,
        "b": [None, i],
        "c": (None,),
        "d": Pair(None, i),
    },
    "7 levels": lambda i: deep_record(i, 7),
    "a leaf at the root": np.float32,
    "jax arrays": lambda i: {"a": jnp.ones(2) * i, "b": (jnp.int32(i),)},
    "leaves of several classes": lambda i: {
        "x": [i, np.int8(i), np.zeros((), np.int32), True][i % 4]
    },
}


def _leaves_by_column(records: list[Any]) -> list[list[Any]]:
    rows = [tree_flatten(r)[0] for r in records]
    return [[row[k] for row in rows] for k in range(len(rows[0]))]


def _same_objects(got: list[list[Any]], want: list[list[Any]]) -> bool:
    return len(got) == len(want) and all(
        len(g) == len(w) and all(a is b for a, b in zip(g, w)) for g, w in zip(got, want)
    )


@pytest.mark.parametrize("make", STRUCTURES.values(), ids=STRUCTURES.keys())
def test_columns_are_tree_flattens_leaves(make):
    records = [make(i) for i in range(7)]
    treedef = tree_structure(records[0])
    flat = block_flattener(treedef)
    assert flat is not None
    assert flat.num_leaves == treedef.num_leaves
    columns = flat.columns(records)
    assert columns is not None
    assert _same_objects(columns, _leaves_by_column(records))


def _swap_key(i: int) -> Any:
    record = _mixed(i)
    record["z"] = record.pop("e")
    return record


def _drop(key: str) -> Callable[[int], Any]:
    def make(i: int) -> Any:
        record = _mixed(i)
        del record[key]
        return record

    return make


def _with(key: str, value: Any) -> Callable[[int], Any]:
    return lambda i: {**_mixed(i), key: value}


#: (record maker, a record maker differing from it as the treedef comparison sees it)
MISMATCHES: dict[str, tuple[Callable[[int], Any], Callable[[int], Any]]] = {
    "a key missing": (_mixed, _drop("c")),
    "a key added": (_mixed, _with("f", 1)),
    "a key renamed": (_mixed, _swap_key),
    "an int key for a str key": (lambda i: {"1": i}, lambda i: {1: i}),
    "str keys for int keys": (lambda i: {1: i, 2: i}, lambda i: {"1": i, "2": i}),
    "an OrderedDict for a dict": (
        lambda i: {"a": i, "b": i},
        lambda i: collections.OrderedDict(a=i, b=i),
    ),
    "a dict subclass for a dict": (lambda i: {"a": {"x": i}}, lambda i: {"a": Flat(x=i)}),
    "a list for a tuple": (_mixed, _with("d", [1, [np.zeros(2), True], ()])),
    "a tuple for a list": (_mixed, _with("e", ())),
    "a longer list": (_mixed, _with("e", [1])),
    "a shorter tuple": (_mixed, _with("d", (1, [np.zeros(2), True]))),
    "another NamedTuple with the same fields": (
        lambda i: Pair(i, i),
        lambda i: Other(i, i),
    ),
    "a NamedTuple for a tuple": (lambda i: (i, i), lambda i: Pair(i, i)),
    "a tuple for a NamedTuple": (lambda i: Pair(i, i), lambda i: (i, i)),
    "a static field that differs": (
        lambda i: WithStatic(i, name="run"),
        lambda i: WithStatic(i, name="walk"),
    ),
    "a static tuple that differs": (
        lambda i: WithStatic(i, sizes=(1, 2)),
        lambda i: WithStatic(i, sizes=(1, 3)),
    ),
    "the one static field differs": (lambda i: Static(i), lambda i: Static(i, scale=2.0)),
    "a register_dataclass meta field differs": (
        lambda i: Registered(i, tag="a"),
        lambda i: Registered(i, tag="b"),
    ),
    "None for a subtree": (_mixed, _with("d", None)),
    "None for a leaf": (_mixed, _with("b", None)),
    "a subtree for None": (
        lambda i: {"a": None, "b": i},
        lambda i: {"a": [i], "b": i},
    ),
    "a leaf for None": (lambda i: {"a": None, "b": i}, lambda i: {"a": i, "b": i}),
    "a list for a leaf": (_mixed, _with("b", [1])),
    "an empty tuple for a leaf": (_mixed, _with("b", ())),
    "a leaf for a subtree": (_mixed, _with("d", 3)),
    "a registered custom node for a leaf": (_mixed, _with("b", Keyed(1, 2))),
    "a dataclass for a leaf": (_mixed, _with("b", Static(1))),
    "a static field 5 levels down": (lambda i: deep_record(i, 7), lambda i: _renamed(i)),
}


def _renamed(i: int) -> Any:
    """``deep_record(i)`` with the static ``name`` of its innermost WithStatic changed."""

    def inner(x: Any) -> bool:
        return isinstance(x, WithStatic) and x.name == "l1"

    return jax.tree.map(
        lambda x: x.replace(name="renamed") if inner(x) else x, deep_record(i, 7), is_leaf=inner
    )


@pytest.mark.parametrize("where", [0, 3, 6])
@pytest.mark.parametrize("good, bad", MISMATCHES.values(), ids=MISMATCHES.keys())
def test_a_block_with_any_record_of_another_structure_is_refused(good, bad, where):
    records = [good(i) for i in range(7)]
    treedef = tree_structure(records[0])
    records[where] = bad(where)
    assert tree_structure(records[where]) != treedef  # a mismatch as JAX sees it
    flat = block_flattener(treedef)
    assert flat is not None
    assert flat.columns(records) is None


def test_a_dataclass_of_another_class_is_refused_though_its_treedef_compares_equal():
    # JAX compares dataclass nodes by their fields, not their class; the flattener refuses,
    # and extend() flattens such a block record by record (the treedef comparison decides)
    records = [Static(i) for i in range(3)]
    treedef = tree_structure(records[0])
    records[1] = SubStatic(1)
    assert tree_structure(records[1]) == treedef
    flat = block_flattener(treedef)
    assert flat is not None
    assert flat.columns(records) is None


@pytest.mark.parametrize(
    "record",
    [
        Keyed(1, 2),
        {"a": [Keyed(np.int32(1), 2)]},
        collections.OrderedDict(a=1, b=2),
    ],
    ids=["custom node", "custom node inside", "OrderedDict"],
)
def test_a_class_with_its_own_flatten_gives_no_flattener(record):
    assert block_flattener(tree_structure(record)) is None


def test_an_equinox_module_gives_no_flattener():
    eqx = pytest.importorskip("equinox")

    class Linear(eqx.Module):
        weight: Any
        size: int = eqx.field(static=True)

    assert block_flattener(tree_structure(Linear(np.zeros(2), 2))) is None


def test_no_treedef_gives_no_flattener():
    assert block_flattener(None) is None


def test_dataclass_fields_are_those_registered():
    assert dataclass_fields(WithStatic) == (("value",), ("name", "sizes"))
    assert dataclass_fields(Registered) == (("x",), ("tag",))
    assert dataclass_fields(Plain) == (("a", "b"), ())
    assert dataclass_fields(Keyed) is None
    assert dataclass_fields(Pair) is None
    assert dataclass_fields(dict) is None


def test_a_static_field_that_cannot_be_compared_refuses_the_block():
    records = [Registered(i, tag=np.arange(2)) for i in range(3)]
    flat = block_flattener(tree_structure(records[0]))
    assert flat is not None
    assert flat.columns(records) is None  # comparing arrays raises: the caller flattens each


# ---- random structures -------------------------------------------------------------------------


@given(st.data())
def test_random_structures_flatten_as_tree_flatten_does(data):
    schema = data.draw(pts.tree_schemas(), label="schema")
    records = data.draw(pts.records(schema, 5), label="records")
    flat = block_flattener(tree_structure(schema.like))
    assert flat is not None
    columns = flat.columns(records)
    assert columns is not None
    assert _same_objects(columns, _leaves_by_column(records))


@given(st.data())
def test_a_record_of_another_random_structure_is_refused_exactly(data):
    schema = data.draw(pts.tree_schemas(), label="schema")
    other = data.draw(pts.tree_schemas(), label="other schema")
    records = data.draw(pts.records(schema, 4), label="records")
    stranger = data.draw(pts.records(other, 1), label="other record")[0]
    records.insert(data.draw(st.integers(0, 4), label="at"), stranger)
    treedef = tree_structure(schema.like)
    flat = block_flattener(treedef)
    assert flat is not None
    columns = flat.columns(records)
    if tree_structure(stranger) == treedef:
        assert columns is not None
        assert _same_objects(columns, _leaves_by_column(records))
    else:
        assert columns is None
