"""Lists of fixed-tree elements (``pytreestore._write.lists``): the exact columns of numpy
scalar elements by one getter per field, taken only for the element's own class and exact
leaf types; any other list goes by one flatten, None when its structure differs."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.struct
import jax
import numpy as np
import pytest
from flax import nnx

from pytreestore._format.nodes import dataclass_fields
from pytreestore._tree.layout import Fixed, RaggedList, Walker
from pytreestore._tree.layout_nodes import Declarations
from pytreestore._write.lists import FlatList

F32, I8 = np.float32, np.int8


@flax.struct.dataclass
class Point:
    y: Any  # int8
    x: Any  # float32


@flax.struct.dataclass
class Tagged:
    x: Any
    tag: str = flax.struct.field(pytree_node=False, default="a")


class Pair(NamedTuple):
    y: Any
    x: Any


@jax.tree_util.register_pytree_node_class
class Custom:
    """A node with a flatten of its own (children in another order than its fields)."""

    def __init__(self, y: Any, x: Any) -> None:
        self.y, self.x = y, x

    def tree_flatten(self) -> tuple[tuple[Any, ...], None]:
        return (self.x, self.y), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[Any, ...]) -> Custom:
        return cls(children[1], children[0])


def _flat(element: Any, slots: list[int] | None = None) -> FlatList:
    """The FlatList of a ragged list of ``element`` (table columns in flatten order, or
    at ``slots``)."""
    spec = Walker(Declarations.parse(["['p']"], None)).build({"p": [element]}, (), None)
    assert isinstance(spec, Fixed) and isinstance(spec.children[0], RaggedList)
    inner = spec.children[0].element
    n = len(jax.tree_util.tree_leaves(element))
    return FlatList(inner, slots if slots is not None else list(range(n)))


def _exact(flat: FlatList, items: list) -> list[list[Any]] | None:
    """The columns of ``items``' exact values (from the values, element after element)."""
    got = flat.exact_values(items)
    if got is None:
        return None
    columns = [got[j :: flat.width] for j in range(flat.width)]
    blocks = flat.blocks(got)  # the same values, one array per column
    assert [b.tolist() for b in blocks] == [[v.item() for v in c] for c in columns]
    assert [b.dtype for b in blocks] == [np.dtype(t) for t in flat.types or ()]
    return columns


def test_exact_values_of_each_element_class():
    dicts = _flat({"y": I8(0), "x": F32(0)})  # a dict flattens in key order: x, y
    assert _exact(dicts, [{"x": F32(1), "y": I8(2)}, {"y": I8(3), "x": F32(4)}]) == [
        [F32(1), F32(4)],
        [I8(2), I8(3)],
    ]
    points = _flat(Point(I8(0), F32(0)))
    assert _exact(points, [Point(I8(5), F32(6))]) == [[I8(5)], [F32(6)]]
    pairs = _flat(Pair(I8(0), F32(0)))
    assert _exact(pairs, [Pair(I8(1), F32(2))]) == [[I8(1)], [F32(2)]]
    tuples = _flat((I8(0), F32(0)))
    assert _exact(tuples, [(I8(1), F32(2)), (I8(3), F32(4))]) == [
        [I8(1), I8(3)],
        [F32(2), F32(4)],
    ]
    scalars = _flat(F32(0))
    items = [F32(1), F32(2)]
    got = scalars.exact_values(items)
    assert got == items and got is not items  # a copy of the list


def test_columns_come_in_the_tables_order():
    points = _flat(Point(I8(0), F32(0)), slots=[1, 0])  # the table holds x, then y
    assert points.order == [1, 0]
    assert _exact(points, [Point(I8(5), F32(6))]) == [[F32(6)], [I8(5)]]
    assert points.columns([Point(5, 6.5)]) == [[6.5], [5]]


@pytest.mark.parametrize(
    "items",
    [
        [Point(I8(1), 2.0)],  # a Python float: checked and cast by the generic way
        [Point(I8(1), np.float64(2))],  # another dtype
        [Point(I8(1), np.array(2, F32))],  # a 0-d array (it could change after the call)
        [Point(I8(1), nnx.Param(F32(2)))],  # a node that converts as an array
        [Pair(I8(1), F32(2))],  # another class
        [Point(I8(1), F32(2)), {"y": I8(1), "x": F32(2)}],
        [Point(I8(1), F32(2)), F32(3)],  # a leaf where an element is
    ],
)
def test_anything_but_exact_numpy_scalars_of_the_class_goes_the_generic_way(items):
    assert _flat(Point(I8(0), F32(0))).exact_values(items) is None


def test_dicts_of_other_keys_and_tuples_of_other_lengths_are_not_exact():
    dicts = _flat({"y": I8(0), "x": F32(0)})
    assert dicts.exact_values([{"y": I8(0), "z": F32(0)}]) is None
    assert dicts.exact_values([{"y": I8(0)}]) is None
    assert dicts.columns([{"y": I8(0), "z": F32(0)}]) is None
    assert dicts.exact_values([{"y": I8(0), "x": F32(0)}, F32(1)]) is None  # no length
    assert dicts.exact_values([{"y": I8(0), "x": F32(0)}, [I8(0), F32(0)]]) is None
    tuples = _flat((I8(0), F32(0)))
    assert tuples.exact_values([(I8(0), F32(0), F32(0))]) is None
    assert tuples.exact_values([[I8(0), F32(0)]]) is None  # a list, not a tuple
    assert tuples.columns([(I8(0),)]) is None


def test_classes_without_known_getters_go_the_generic_way():
    tagged = _flat(Tagged(F32(0)))  # a static field: its value is part of the structure
    assert tagged.exact_values([Tagged(F32(1))]) is None
    assert tagged.columns([Tagged(F32(1))]) == [[F32(1)]]
    assert tagged.columns([Tagged(F32(1), tag="b")]) is None
    custom = _flat(Custom(I8(0), F32(0)))
    assert custom.exact_values([Custom(I8(1), F32(2))]) is None
    assert custom.columns([Custom(I8(1), F32(2))]) == [[F32(2)], [I8(1)]]


def test_the_columns_of_a_list_by_one_flatten():
    points = _flat(Point(I8(0), F32(0)))
    assert points.columns([Point(1, 2.5), Point(3, 4.5)]) == [[1, 3], [2.5, 4.5]]
    assert points.columns([Point(1, 2.5), Point((3,), 4.5)]) is None  # a tuple at a leaf
    assert points.of_length(2) == jax.tree_util.tree_structure([Point(0, 0)] * 2)


def test_dataclass_fields_reads_register_dataclass_only():
    assert dataclass_fields(Point) == (("y", "x"), ())
    assert dataclass_fields(Tagged) == (("x",), ("tag",))

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Plain:
        u: Any
        v: Any = dataclasses.field(metadata={"static": True}, default=0)

    assert dataclass_fields(Plain) == (("u",), ("v",))
    assert dataclass_fields(Custom) is None
    assert dataclass_fields(dict) is None
    assert dataclass_fields(Pair) is None
