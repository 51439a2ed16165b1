"""The generated row fill (pytreestore._tree.convert): the same rows and refusals as the loop
it replaces, on every kind of column, and no code past MAX_COLUMNS."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.schema import TreeSchema
from pytreestore._tree import convert as fillcode
from pytreestore._tree.convert import RowFiller, casters

LIKE = {
    "b": np.bool_(False),
    "i8": np.int8(0),
    "i64": np.int64(0),
    "f16": np.float16(0),
    "bf16": np.zeros((), ml_dtypes.bfloat16),
    "f32": np.float32(0),
    "c64": np.complex64(0),
    "v": np.zeros((2, 3), np.float32),
    "u": np.zeros(4, np.uint16),
}

GOOD = {
    "b": True,
    "i8": -5,
    "i64": 2**40,
    "f16": 1.5,
    "bf16": np.asarray(2.0, ml_dtypes.bfloat16),
    "f32": np.float32(3.25),
    "c64": 1 + 2j,
    "v": np.arange(6, dtype=np.float32).reshape(2, 3),
    "u": np.arange(1, 5, dtype=np.uint16),
}


def _fillers(schema: TreeSchema) -> tuple[RowFiller, RowFiller]:
    make = [np.zeros((3, *c.shape), c.dtype) for c in schema.columns]
    generated = RowFiller(casters(schema.columns), make)
    looped = RowFiller(casters(schema.columns), [np.zeros_like(b) for b in make])
    looped._fill = None  # the loop the generated code replaces
    assert generated._fill is not None
    return generated, looped


def test_generated_and_looped_fills_write_the_same_rows():
    schema = TreeSchema.from_example(LIKE)
    generated, looped = _fillers(schema)
    leaves = schema.column_leaves([GOOD[k] for k in sorted(GOOD)])
    for filler in (generated, looped):
        filler.fill(leaves, 1)
    for a, b, c in zip(generated.buffers, looped.buffers, schema.columns):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == c.dtype


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("i8", 300),  # a Python int out of range
        ("f16", 1e6),  # a Python float that would overflow float16
        ("f32", np.float64(1e300)),  # a numpy float64 that would become inf
        ("v", np.zeros((3, 2), np.float32)),  # a wrong shape
        ("u", np.array([1.5, 2, 3, 4])),  # a kind that cannot be cast
        ("b", "yes"),  # not a number
    ],
)
def test_generated_and_looped_fills_refuse_alike_and_keep_other_rows(key, value):
    schema = TreeSchema.from_example(LIKE)
    generated, looped = _fillers(schema)
    good = schema.column_leaves([GOOD[k] for k in sorted(GOOD)])
    bad = schema.column_leaves([value if k == key else GOOD[k] for k in sorted(GOOD)])
    messages = []
    for filler in (generated, looped):
        filler.fill(good, 0)
        with pytest.raises(errors.SchemaMismatchError) as info:
            filler.fill(bad, 1)
        messages.append(str(info.value))
    assert messages[0] == messages[1] and f"['{key}']" in messages[0]
    for a, b in zip(generated.buffers, looped.buffers):
        np.testing.assert_array_equal(a[0], b[0])


def test_a_python_float_in_range_goes_into_a_narrow_float_column(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"h": np.float16(0), "v": np.zeros(2, np.float16)})
    store.append({"h": 65504.0, "v": np.array([1.0, 2.0], np.float16)})
    with pytest.raises(errors.SchemaMismatchError, match="too large for float16"):
        store.append({"h": 70000.0, "v": np.zeros(2, np.float16)})
    with pytest.raises(errors.SchemaMismatchError, match=r"\['v'\]"):
        store.append({"h": 1.0, "v": 1.0})  # a scalar is not a float16[2]
    store.append({"h": float("nan"), "v": np.array([np.inf, -1], np.float32)})
    store.close()
    got = pytreestore.open(tmp_path / "s").load(as_numpy=True)
    np.testing.assert_array_equal(got["h"], np.array([65504, np.nan], np.float16))
    np.testing.assert_array_equal(got["v"], np.array([[1, 2], [np.inf, -1]], np.float16))


def test_records_wider_than_the_limit_use_the_loop(tmp_path):
    width = fillcode.MAX_COLUMNS + 1
    like = {f"k{i:04d}": np.int32(0) for i in range(width)}
    schema = TreeSchema.from_example(like)
    filler = RowFiller(casters(schema.columns), [np.zeros(2, np.int32) for _ in range(width)])
    assert filler._fill is None
    store = pytreestore.create(tmp_path / "s", like)
    store.append({k: np.int32(i) for i, k in enumerate(like)})
    store.close()
    got = pytreestore.open(tmp_path / "s")[0]
    assert [int(got[k]) for k in like] == list(range(width))


def test_no_code_for_no_column():
    assert fillcode.compile_fill([], "none") is None
