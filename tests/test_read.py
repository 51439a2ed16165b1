"""Index normalisation: every index form a store takes, and every error it raises."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytreestore._read.index import Selection, normalize
from pytreestore.errors import StoreIndexError

TYPE_MESSAGE = "a store is indexed by an int, a slice, an int array or list, or a bool mask; got "


def arr(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def test_int_forms():
    assert normalize(0, 5) == Selection(slice(0, 1, 1), 1, True)
    assert normalize(4, 5) == Selection(slice(4, 5, 1), 1, True)
    assert normalize(-1, 5) == Selection(slice(4, 5, 1), 1, True)
    assert normalize(-5, 5) == Selection(slice(0, 1, 1), 1, True)
    assert normalize(np.int64(2), 5) == Selection(slice(2, 3, 1), 1, True)
    assert normalize(np.uint8(3), 5) == Selection(slice(3, 4, 1), 1, True)


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (slice(None), Selection(slice(0, 5, 1), 5, False)),
        (Ellipsis, Selection(slice(0, 5, 1), 5, False)),
        (slice(1, 3), Selection(slice(1, 3, 1), 2, False)),
        (slice(1, 8, 2), Selection(slice(1, 5, 2), 2, False)),
        (slice(-2, None), Selection(slice(3, 5, 1), 2, False)),
        (slice(0, 100), Selection(slice(0, 5, 1), 5, False)),
        (slice(np.int64(1), np.int32(4)), Selection(slice(1, 4, 1), 3, False)),
        (slice(3, 1), Selection(slice(0, 0, 1), 0, False)),
        (slice(10, 20), Selection(slice(0, 0, 1), 0, False)),
        (slice(None, None, -1), Selection(arr(4, 3, 2, 1, 0), 5, False)),
        (slice(3, 0, -2), Selection(arr(3, 1), 2, False)),
        (slice(0, 5, -1), Selection(arr(), 0, False)),
    ],
    ids=repr,
)
def test_slice_forms(index, expected):
    assert normalize(index, 5) == expected


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        ([0, 2], Selection(arr(0, 2), 2, False)),
        ([-1, 0, -1], Selection(arr(4, 0, 4), 3, False)),
        ((3, 1), Selection(arr(3, 1), 2, False)),
        ([], Selection(arr(), 0, False)),
        (np.array([], np.int32), Selection(arr(), 0, False)),
        (np.array([4, -5], np.int8), Selection(arr(4, 0), 2, False)),
        (np.array([1], np.uint64), Selection(arr(1), 1, False)),
        (jnp.array([2, 1]), Selection(arr(2, 1), 2, False)),
        ([True, False, True, False, False], Selection(arr(0, 2), 2, False)),
        (np.zeros(5, bool), Selection(arr(), 0, False)),
        (np.ones(5, bool), Selection(arr(0, 1, 2, 3, 4), 5, False)),
        (jnp.array([False, True, False, False, True]), Selection(arr(1, 4), 2, False)),
    ],
    ids=repr,
)
def test_array_forms(index, expected):
    got = normalize(index, 5)
    assert got == expected
    assert got.index.dtype == np.int64


def test_empty_store():
    assert normalize(slice(None), 0) == Selection(slice(0, 0, 1), 0, False)
    assert normalize([], 0) == Selection(arr(), 0, False)
    assert normalize(np.zeros(0, bool), 0) == Selection(arr(), 0, False)


@given(st.integers(0, 30), st.data())
def test_slices_select_what_python_selects(n, data):
    bound = st.none() | st.integers(-40, 40)
    index = slice(data.draw(bound), data.draw(bound), data.draw(st.none() | st.integers(-5, 5)))
    if index.step == 0:
        return
    got = normalize(index, n)
    assert got.count == len(range(n)[index])
    assert list(np.arange(n)[got.index]) == list(range(n))[index]
    assert not got.scalar


@given(st.integers(1, 30), st.data())
def test_int_lists_select_what_numpy_selects(n, data):
    index = data.draw(st.lists(st.integers(-n, n - 1), max_size=10))
    got = normalize(index, n)
    assert list(got.index) == list(np.arange(n)[np.array(index, dtype=np.int64)])
    assert got.count == len(index)


# ---- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index", "n", "message"),
    [
        (5, 5, "record index 5 is out of range for a store of 5 records"),
        (-6, 5, "record index -6 is out of range for a store of 5 records"),
        (0, 0, "record index 0 is out of range for a store of 0 records"),
        (-1, 0, "record index -1 is out of range for a store of 0 records"),
        (2**70, 5, f"record index {2**70} is out of range for a store of 5 records"),
        (np.int64(7), 5, "record index 7 is out of range for a store of 5 records"),
        ([0, 5, 9], 5, "record index 5 is out of range for a store of 5 records"),
        ([-6], 5, "record index -6 is out of range for a store of 5 records"),
        (np.array([1, -7]), 5, "record index -7 is out of range for a store of 5 records"),
        ([0], 0, "record index 0 is out of range for a store of 0 records"),
    ],
    ids=repr,
)
def test_out_of_range(index, n, message):
    with pytest.raises(StoreIndexError, match=f"^{re.escape(message)}$"):
        normalize(index, n)


@pytest.mark.parametrize(
    ("index", "shown"),
    [
        (1.0, "float 1.0"),
        (np.float64(1.0), "float64 np.float64(1.0)"),
        (1j, "complex 1j"),
        ("0", "str '0'"),
        (b"0", "bytes b'0'"),
        (None, "NoneType None"),
        ({0: 1}, "dict {0: 1}"),
        ({0}, "set {0}"),
        ([1.0, 2.0], "list [1.0, 2.0]"),
        ([0, 1.5], "list [0, 1.5]"),
        (["a"], "list ['a']"),
        ([None], "list [None]"),
        ([[0], [1, 2]], "list [[0], [1, 2]]"),
        (np.array([0.0, 1.0]), "ndarray array([0., 1.])"),
        (np.array([1 + 0j]), "ndarray array([1.+0.j])"),
    ],
    ids=repr,
)
def test_wrong_type(index, shown):
    with pytest.raises(StoreIndexError, match=f"^{re.escape(TYPE_MESSAGE + shown)}"):
        normalize(index, 5)


def test_wrong_type_message_is_truncated():
    with pytest.raises(StoreIndexError) as info:
        normalize(np.arange(100.0), 5)
    shown = str(info.value).removeprefix(TYPE_MESSAGE)
    assert shown.startswith("ndarray array([ 0.,  1.,")
    assert len(shown) == len("ndarray ") + 60


@pytest.mark.parametrize(
    ("index", "message"),
    [
        ([[0, 1]], "an index array must be 1-d, got shape (1, 2)"),
        (np.zeros((2, 2), np.int64), "an index array must be 1-d, got shape (2, 2)"),
        (np.zeros((5, 1), bool), "an index array must be 1-d, got shape (5, 1)"),
        (True, "an index array must be 1-d, got shape ()"),
        (np.bool_(False), "an index array must be 1-d, got shape ()"),
    ],
    ids=repr,
)
def test_not_one_dimensional(index, message):
    with pytest.raises(StoreIndexError, match=f"^{re.escape(message)}$"):
        normalize(index, 5)


@pytest.mark.parametrize(
    ("mask", "got"),
    [([True] * 4, 4), (np.ones(6, bool), 6), (np.zeros(0, bool), 0), ([False], 1)],
    ids=repr,
)
def test_bad_mask_length(mask, got):
    message = f"a bool mask must have one entry per record: got {got} for 5 records"
    with pytest.raises(StoreIndexError, match=f"^{re.escape(message)}$"):
        normalize(mask, 5)


@pytest.mark.parametrize(
    "index",
    [slice(0.5), slice(None, 2.0), slice(0, 3, 1.0), slice("a", None), slice(None, None, [1])],
    ids=repr,
)
def test_slice_bounds_must_be_ints(index):
    message = f"slice bounds must be ints or None, got {index!r}"
    with pytest.raises(StoreIndexError, match=f"^{re.escape(message)}$"):
        normalize(index, 5)


@pytest.mark.parametrize("index", [np.float32(1.0), np.float16(0.0), np.complex64(0)], ids=repr)
def test_numpy_float_scalars_refused(index):
    # Refused, though with the 1-d message rather than the type message (np.float64 is a
    # float subclass and gets the type message).
    with pytest.raises(StoreIndexError):
        normalize(index, 5)


def test_errors_are_index_errors():
    with pytest.raises(IndexError):
        normalize(9, 5)
    with pytest.raises(IndexError):
        normalize(1.5, 5)


# ---- known bugs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "index", [np.array([2**64 - 1], np.uint64), [2**64 - 1]], ids=["uint64", "list"]
)
def test_huge_unsigned_index_is_out_of_range(index):
    with pytest.raises(StoreIndexError, match="out of range for a store of 5 records"):
        normalize(index, 5)


def test_zero_step_is_a_store_index_error():
    with pytest.raises(StoreIndexError, match="step"):
        normalize(slice(None, None, 0), 5)


@pytest.mark.parametrize("index", [jnp.int32(3), np.array(3)], ids=["jax", "numpy"])
def test_zero_dimensional_int_array_is_an_int(index):
    assert normalize(index, 5) == Selection(slice(3, 4, 1), 1, True)
