"""The casting rule of appends: what a column takes, what it refuses, and that refusals change
nothing."""

from __future__ import annotations

import re
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import SchemaMismatchError

SUFFIX = "Leaf shapes and dtypes are fixed when the store is created."
LIKE = {
    "b": np.bool_(False),
    "f32": np.float32(0),
    "i32": np.int32(0),
    "i64": np.int64(0),
    "i8": np.int8(0),
    "u8": np.uint8(0),
    "v": np.zeros(3, np.float32),
}


def record(i: int, **changes: Any) -> dict[str, Any]:
    base = {
        "b": np.bool_(i % 2),
        "f32": np.float32(i / 4),
        "i32": np.int32(-i),
        "i64": np.int64(i * 2**40),
        "i8": np.int8(i),
        "u8": np.uint8(i),
        "v": np.arange(3, dtype=np.float32) + i,
    }
    return base | changes


def expected_columns(records: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    return {k: np.stack([np.asarray(r[k], LIKE[k].dtype) for r in records]) for k in LIKE}


def assert_contents(store: pytreestore.TreeStore, records: list[dict[str, Any]]) -> None:
    assert len(store) == len(records)
    got = store.load(as_numpy=True)
    want = expected_columns(records)
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.fixture(params=[4, 5], ids=["full-buffer", "one-buffered"])
def store(request, tmp_path):
    """A store of chunk_records=4 holding 4 records (buffer full) or 5 (one buffered)."""
    s = pytreestore.create(tmp_path / "s", LIKE, chunk_records=4)
    s.records = [record(i) for i in range(request.param)]  # type: ignore[attr-defined]
    for r in s.records:  # type: ignore[attr-defined]
        s.append(r)
    yield s
    s.close()


def message(path: str, want: str, got: str, why: str = "", what: str = "record") -> str:
    return f"{what} does not match the store schema at {path}: expected {want}, got {got}. {why}{SUFFIX}"


# ---- allowed ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "value", "stored"),
    [
        ("f32", np.int32(5), 5.0),
        ("f32", np.int64(-7), -7.0),
        ("f32", 2, 2.0),
        ("f32", True, 1.0),
        ("f32", np.float64(0.1), np.float32(0.1)),
        ("i32", np.bool_(True), 1),
        ("i32", True, 1),
        ("i32", np.uint16(65535), 65535),
        ("i32", np.int64(-(2**31)), -(2**31)),
        ("i8", 100, 100),
        ("i8", -128, -128),
        ("i8", np.int32(-5), -5),
        ("i8", np.array(127, np.int64), 127),
        ("u8", 255, 255),
        ("u8", np.uint16(200), 200),
        ("i64", np.uint64(2**63 - 1), 2**63 - 1),
        ("b", True, True),
        ("v", np.array([1.5, 2.0, -3.0], np.float64), [1.5, 2.0, -3.0]),
        ("v", np.array([1, 2, 3], np.int16), [1.0, 2.0, 3.0]),
        ("v", np.array([True, False, True]), [1.0, 0.0, 1.0]),
        ("v", jnp.arange(3.0), [0.0, 1.0, 2.0]),
    ],
    ids=lambda v: repr(v) if not isinstance(v, str) else v,
)
def test_allowed(store, column, value, stored):
    store.append(record(9, **{column: value}))
    expected = [*store.records, record(9, **{column: stored})]
    assert_contents(store, expected)
    store.close()
    assert_contents(pytreestore.open(store.path), expected)


# ---- refused ------------------------------------------------------------------------------------

WRAP = "its values do not fit in {} and would wrap around. "
KIND = (
    "{src} cannot be cast to {dst} without changing its kind (numpy's same_kind rule); cast it "
    "yourself, e.g. value.astype('{dst}'). "
)
PY_KIND = "a Python {src} cannot be cast to {dst} (numpy's same_kind rule). "
NOT_NUMBER = "Columns hold numbers and bools only. "

REFUSED = [
    # float -> int
    ("i32", np.float32(1.0), "int32[]", "float32[]", KIND.format(src="float32", dst="int32")),
    ("i8", np.float64(2.0), "int8[]", "float64[]", KIND.format(src="float64", dst="int8")),
    ("i32", 1.0, "int32[]", "Python float 1.0", PY_KIND.format(src="float", dst="int32")),
    # int -> bool
    ("b", np.int32(1), "bool[]", "int32[]", KIND.format(src="int32", dst="bool")),
    ("b", np.uint8(0), "bool[]", "uint8[]", KIND.format(src="uint8", dst="bool")),
    ("b", 1, "bool[]", "Python int 1", PY_KIND.format(src="int", dst="bool")),
    # complex -> float, float -> complex is fine but complex -> int is not
    (
        "f32",
        np.complex64(1),
        "float32[]",
        "complex64[]",
        KIND.format(src="complex64", dst="float32"),
    ),
    ("f32", 1j, "float32[]", "Python complex 1j", PY_KIND.format(src="complex", dst="float32")),
    ("i32", 2 + 0j, "int32[]", "Python complex (2+0j)", PY_KIND.format(src="complex", dst="int32")),
    # integers that do not fit: never wrap around
    ("i8", 300, "int8[]", "Python int 300", "it does not fit in int8. "),
    ("i8", -129, "int8[]", "Python int -129", "it does not fit in int8. "),
    ("u8", -1, "uint8[]", "Python int -1", "it does not fit in uint8. "),
    ("i32", 2**31, "int32[]", "Python int 2147483648", "it does not fit in int32. "),
    ("i8", np.array(300, np.int32), "int8[]", "int32[]", WRAP.format("int8")),
    ("i8", np.uint8(200), "int8[]", "uint8[]", WRAP.format("int8")),
    ("u8", np.uint16(256), "uint8[]", "uint16[]", WRAP.format("uint8")),
    # signed -> unsigned is not same_kind, even for values that would fit
    ("u8", np.int32(1), "uint8[]", "int32[]", KIND.format(src="int32", dst="uint8")),
    ("u8", np.int64(-1), "uint8[]", "int64[]", KIND.format(src="int64", dst="uint8")),
    ("i64", np.uint64(2**64 - 1), "int64[]", "uint64[]", WRAP.format("int64")),
    ("i32", np.int64(2**31), "int32[]", "int64[]", WRAP.format("int32")),
    # wrong shape
    ("v", np.zeros(4, np.float32), "float32[3]", "float32[4]", ""),
    ("v", np.zeros((1, 3), np.float32), "float32[3]", "float32[1,3]", ""),
    ("v", np.float32(1), "float32[3]", "float32[]", ""),
    ("v", 1.0, "float32[3]", "Python float 1.0", ""),
    ("f32", np.zeros(1, np.float32), "float32[]", "float32[1]", ""),
    ("f32", jnp.zeros(2), "float32[]", "float32[2]", ""),
    # not numbers
    ("f32", "abc", "float32[]", "a str", ""),
    ("f32", b"abc", "float32[]", "a bytes", ""),
    ("f32", object(), "float32[]", "a object", ""),
    ("v", np.array(["a", "b", "c"]), "float32[3]", "str32[3]", NOT_NUMBER),
    ("v", np.array([1.0, None, 2.0], dtype=object), "float32[3]", "object[3]", NOT_NUMBER),
    ("f32", np.datetime64(1, "s"), "float32[]", "datetime64[s][]", NOT_NUMBER),
]


#: the refusal whose record ragged= would accept names that entry, as stack() does
FIX = "got float32[4] (declare ragged=[\"['v']\"] to allow a leading axis of varying length)."


def _with_fix(text: str, got: str) -> str:
    return text.replace("got float32[4].", FIX) if got == "float32[4]" else text


def _id(case: tuple) -> str:
    column, value = case[0], case[1]
    return f"{column}<-{type(value).__name__}:{value!r:.20}"


@pytest.mark.parametrize(("column", "value", "want", "got", "why"), REFUSED, ids=map(_id, REFUSED))
def test_append_refused(store, column, value, want, got, why):
    text = _with_fix(message(f"['{column}']", want, got, why), got)
    with pytest.raises(SchemaMismatchError, match=f"^{re.escape(text)}$"):
        store.append(record(9, **{column: value}))
    assert_contents(store, store.records)
    store.append(record(10))  # the store still takes good records afterwards
    store.close()
    assert_contents(pytreestore.open(store.path), [*store.records, record(10)])


@pytest.mark.parametrize(("column", "value", "want", "got", "why"), REFUSED, ids=map(_id, REFUSED))
def test_extend_refused_appends_none(store, column, value, want, got, why):
    text = _with_fix(message(f"['{column}']", want, got, why), got)
    prefix = "extend() refused record 6 (none of this call's records were appended): "
    batch = [record(20 + i) for i in range(6)] + [record(9, **{column: value}), record(30)]
    with pytest.raises(SchemaMismatchError, match=f"^{re.escape(prefix + text)}$"):
        store.extend(batch)
    assert_contents(store, store.records)
    store.close()
    assert_contents(pytreestore.open(store.path), store.records)


@pytest.mark.parametrize(
    ("column", "block", "want", "got", "why"),
    [
        ("i8", np.array([1, 300, 2, 3, 4, 5]), "int8[]", "int64[6]", WRAP.format("int8")),
        (
            "i32",
            np.zeros(6, np.float32),
            "int32[]",
            "float32[6]",
            KIND.format(src="float32", dst="int32"),
        ),
        ("b", np.zeros(6, np.int8), "bool[]", "int8[6]", KIND.format(src="int8", dst="bool")),
        ("v", np.zeros((6, 4), np.float32), "float32[3]", "float32[6,4]", ""),  # + the fix
        (
            "v",
            np.zeros((6, 3), np.complex64),
            "float32[3]",
            "complex64[6,3]",
            KIND.format(src="complex64", dst="float32"),
        ),
    ],
)
def test_extend_batch_refused(store, column, block, want, got, why):
    text = message(f"['{column}']", want, got, why, what="batch")
    if got == "float32[6,4]":  # each record's leading axis varies: ragged= would accept it
        text += (
            "\nThe batch's first record differs at:\n  at ['v']: expected float32[3], got "
            "float32[4] (declare ragged=[\"['v']\"] to allow a leading axis of varying length)"
        )
    good = expected_columns([record(20 + i) for i in range(6)])
    with pytest.raises(SchemaMismatchError, match=f"^{re.escape(text)}$"):
        store.extend_batch(good | {column: block})
    assert_contents(store, store.records)
    store.extend_batch(good)
    assert_contents(store, [*store.records, *(record(20 + i) for i in range(6))])


def test_extend_batch_casts(store):
    batch = expected_columns([record(20 + i) for i in range(6)])
    batch |= {"f32": np.arange(6, dtype=np.int64), "i8": np.arange(6, dtype=np.int64)}
    store.extend_batch(batch)
    got = store.load(slice(-6, None), as_numpy=True)
    assert got["f32"].dtype == np.float32 and got["f32"].tolist() == list(range(6))
    assert got["i8"].dtype == np.int8 and got["i8"].tolist() == list(range(6))


def test_big_endian_values_are_converted(store):
    store.append(record(9, v=np.array([1.0, 2.0, 3.0], ">f4"), i32=np.array(7, ">i4")))
    assert_contents(store, [*store.records, record(9, v=[1.0, 2.0, 3.0], i32=7)])


def test_big_endian_example_makes_native_columns(tmp_path):
    like = {"v": np.zeros(2, ">f8"), "i": np.array(0, ">u2")}
    with pytreestore.create(tmp_path / "s", like) as store:
        assert [c.dtype.str for c in store.schema.columns] == ["<u2", "<f8"]
        store.append({"v": np.array([0.5, -1.0], ">f8"), "i": np.array(513, ">u2")})
    got = pytreestore.open(tmp_path / "s").load(as_numpy=True)
    assert got["v"].dtype == np.dtype("<f8") and got["v"].tolist() == [[0.5, -1.0]]
    assert got["i"].dtype == np.dtype("<u2") and got["i"].tolist() == [513]
