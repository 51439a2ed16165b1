"""``TreeStore`` is generic in its record type: checked by pyright (``pyproject.toml`` includes
this file; ``assert_type`` fails the type check when a type differs) and run by pytest (where
``assert_type`` does nothing and the values are checked).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, assert_type

import numpy as np

import pytreestore
from pytreestore import TreeStore


class Point(NamedTuple):
    x: Any  # a leaf: a numpy scalar when appended, a jax.Array when read
    y: Any


def test_store_of_a_named_tuple_types_its_records_as_that_class(tmp_path):
    store = pytreestore.create(tmp_path / "s", Point(np.float32(0), np.int32(0)))
    assert_type(store, TreeStore[Point])
    store.extend(Point(np.float32(i), np.int32(i)) for i in range(3))
    one = store[1]
    assert_type(one, Point)
    assert isinstance(one, Point) and float(one.x) == 1.0 and int(one.y) == 1
    assert_type(iter(store), Iterator[Point])
    assert [int(p.y) for p in store] == [0, 1, 2]
    assert_type(store.records(), Iterator[Point])
    many = store[0:2]  # a batched record: its leaves carry a record axis
    assert_type(many, Any)
    assert many.y.tolist() == [0, 1]
    with store as same:
        assert_type(same, TreeStore[Point])


def test_an_opened_store_holds_records_of_any_type(tmp_path):
    pytreestore.create(tmp_path / "s", {"a": np.int8(0)}).close()
    reader = pytreestore.open(tmp_path / "s")
    assert_type(reader, TreeStore[Any])
    assert len(reader) == 0
