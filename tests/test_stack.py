"""stack / unstack / split_leaves (pytreestore._tree.stack): in-memory array-of-structs <->
struct-of-arrays, with the store's validation and dtypes."""

from __future__ import annotations

import re

import jax
import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._tree.stack import is_constant, split_leaves


def test_ragged_leaf_is_refused_naming_record_and_keypath() -> None:
    records = [{"a": np.zeros(3, np.float32)}, {"a": np.zeros(4, np.float32)}]
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape(
            "stack() refused record 1: record does not match the store schema at ['a']: "
            "expected float32[3], got float32[4]"
        ),
    ):
        pytreestore.stack(records)


def test_ragged_structure_is_refused_naming_every_path() -> None:
    with pytest.raises(errors.SchemaMismatchError) as info:
        pytreestore.stack([{"a": [1, 2], "b": 0.0}, {"a": [1], "b": (0.0,)}])
    message = str(info.value)
    assert message.startswith("record 1 does not match the store schema:")
    assert "at ['a']: expected a list of 2, got a list of 1" in message
    assert "at ['b']: expected a leaf, got a tuple of 1" in message


def test_unstack_refuses_leaves_of_different_lengths() -> None:
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape("one common leading record axis; got lengths [3, 4]"),
    ):
        pytreestore.unstack({"a": np.zeros(3), "b": np.zeros(4)})


def test_unstack_refuses_a_scalar_leaf() -> None:
    with pytest.raises(errors.SchemaMismatchError, match="common leading record axis"):
        pytreestore.unstack({"a": np.zeros(3), "b": np.float32(1)})


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "uint16", "int64", "float16", "bfloat16", "float8_e4m3fn"]
)
def test_dtypes_are_kept(dtype: str) -> None:
    dt = np.dtype(getattr(ml_dtypes, dtype, dtype))
    records = [{"x": np.ones(2, dt)}, {"x": np.zeros(2, dt)}]
    batch = pytreestore.stack(records, as_numpy=True)
    assert batch["x"].dtype == dt and batch["x"].shape == (2, 2)
    back = pytreestore.unstack(batch)
    assert [r["x"].dtype for r in back] == [dt, dt]
    np.testing.assert_array_equal(back[1]["x"].astype(np.float32), np.zeros(2, np.float32))


def test_python_scalars_take_the_store_dtypes() -> None:
    batch = pytreestore.stack([{"i": 1, "f": 2.0, "b": True}] * 3)
    assert (batch["i"].dtype, batch["f"].dtype, batch["b"].dtype) == (
        np.dtype("int32"),
        np.dtype("float32"),
        np.dtype("bool"),
    )
    assert isinstance(batch["i"], jax.Array)


def test_empty_needs_like_and_gives_empty_columns() -> None:
    with pytest.raises(ValueError, match=re.escape("stack() needs at least one record")):
        pytreestore.stack([])
    batch = pytreestore.stack([], like={"a": np.zeros(2, np.int16)}, as_numpy=True)
    assert batch["a"].shape == (0, 2) and batch["a"].dtype == np.int16
    assert pytreestore.unstack(batch) == []


def test_stack_then_unstack_round_trips_and_keeps_the_leaf_kind() -> None:
    records = [{"p": (np.float32(i), np.arange(3, dtype=np.int32) + i)} for i in range(4)]
    batch = pytreestore.stack(records, as_numpy=True)
    back = pytreestore.unstack(batch)
    assert all(isinstance(r["p"][1], np.ndarray) for r in back)
    for want, got in zip(records, back):
        np.testing.assert_array_equal(got["p"][1], want["p"][1])
        assert float(got["p"][0]) == float(want["p"][0])
    assert all(isinstance(r["p"][1], jax.Array) for r in pytreestore.unstack(jax.device_put(batch)))


def test_constant_leaves_repeat_in_every_record() -> None:
    batch = pytreestore.stack([{"f": jax.nn.relu, "w": 1.0}, {"f": jax.nn.relu, "w": 2.0}])
    assert batch["f"] is jax.nn.relu
    back = pytreestore.unstack(batch)
    assert [r["f"] for r in back] == [jax.nn.relu, jax.nn.relu]
    assert [float(r["w"]) for r in back] == [1.0, 2.0]


def test_split_leaves() -> None:
    rows = split_leaves(np.arange(4).reshape(2, 2))
    assert [r.tolist() for r in rows] == [[0, 1], [2, 3]]
    none_rows = split_leaves(None)
    assert list(zip(none_rows, range(3))) == [(None, 0), (None, 1), (None, 2)]
    assert is_constant(jax.nn.relu) and not is_constant(np.float32(1)) and not is_constant(None)
