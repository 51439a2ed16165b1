"""A resume state of ``batches(state=...)`` (pytreestore/_pipelines/order.py): every field
checked, in type, range and consistency with the store and the other arguments, before
anything is read; a state that passes resumes exactly the batches still to come.

Issue 44, item 12: ``window`` 0 raised a raw ``ValueError``; ``-4`` built the order from
uninitialised memory (copies of record 0, or a ``StoreIndexError`` at an address-sized index).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pytreestore
from pytreestore._pipelines import order as resume
from pytreestore.errors import ArgumentError, ArgumentTypeError

N, CHUNK, BATCH, EPOCHS = 64, 4, 4, 2
OPTIONS = {"shuffle": "block", "seed": 2, "epochs": EPOCHS, "shuffle_window": 8}


def _make(path: Any, backend: str) -> Any:
    like = {"i": np.int32(0), "v": np.zeros(2, np.float32)}
    with pytreestore.create(path, like, chunk_records=CHUNK, backend=backend) as s:
        s.extend_batch({"i": np.arange(N, dtype=np.int32), "v": np.zeros((N, 2), np.float32)})
    return pytreestore.open(path, backend=backend)


@pytest.fixture
def store(tmp_path, backend):
    return _make(tmp_path / "s", backend)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One store (TensorStore) for the property test's examples."""
    return _make(tmp_path_factory.mktemp("resume") / "s", "tensorstore")


def ids(batches: Any) -> list[list[int]]:
    return [np.asarray(b["i"]).tolist() for b in batches]


def state_at(store: Any, taken: int, **options: Any) -> dict[str, Any]:
    it = store.batches(BATCH, **{**OPTIONS, **options})
    for _ in range(taken):
        next(it)
    state = it.state()
    it.close()
    return state


def resumed(store: Any, state: Any, **options: Any) -> list[list[int]]:
    return ids(store.batches(BATCH, **{**OPTIONS, "shuffle_window": None, **options}, state=state))


@pytest.mark.parametrize("window", [0, -4, -1, np.int64(-8)])
def test_a_window_below_one_is_refused_by_name(store, window):
    state = state_at(store, 3)
    assert state["window"] == 8
    with pytest.raises(ArgumentError, match=r"\['window'\] must be None or an int >= 1"):
        store.batches(
            BATCH, **{**OPTIONS, "shuffle_window": None}, state={**state, "window": window}
        )


BAD = [
    ("epoch", -1, ArgumentError),
    ("epoch", 1.0, ArgumentTypeError),
    ("epoch", True, ArgumentTypeError),
    ("epoch", None, ArgumentTypeError),
    ("batch", -3, ArgumentError),
    ("batch", "2", ArgumentTypeError),
    ("batch", np.float32(2), ArgumentTypeError),
    ("records", -64, ArgumentError),
    ("records", 64.0, ArgumentTypeError),
    ("records", True, ArgumentTypeError),
    ("batch_size", 0, ArgumentError),
    ("batch_size", np.bool_(True), ArgumentTypeError),
    ("shuffle", "random", ArgumentError),
    ("shuffle", 1, ArgumentTypeError),
    ("shuffle", None, ArgumentTypeError),
    ("window", 8.0, ArgumentTypeError),
    ("window", "8", ArgumentTypeError),
    ("window", False, ArgumentTypeError),
    ("seed", -2, ArgumentError),
    ("seed", 2.5, ArgumentTypeError),
    ("drop_last", 0, ArgumentTypeError),
    ("drop_last", "False", ArgumentTypeError),
]


@pytest.mark.parametrize(("field", "value", "error"), BAD)
def test_each_field_of_the_wrong_type_or_range_is_refused_by_name(store, field, value, error):
    state = {**state_at(store, 5), field: value}
    with pytest.raises(error, match=rf"\[{field!r}\] must be .*, got "):
        store.batches(BATCH, **OPTIONS, state=state)


def test_unknown_and_missing_fields_are_refused(store):
    state = state_at(store, 2)
    with pytest.raises(ArgumentError, match="has the fields 'windows', which no state has"):
        store.batches(BATCH, **OPTIONS, state={**state, "windows": 8})
    with pytest.raises(ArgumentTypeError, match="has the key 3, not a field name"):
        store.batches(BATCH, **OPTIONS, state={**state, 3: 8})
    with pytest.raises(ArgumentError, match="lacks 'epoch' and 'batch', the position"):
        store.batches(BATCH, **OPTIONS, state={"seed": 2})


@pytest.mark.parametrize(
    ("shuffle", "window", "problem"),
    [
        ("block", None, "a block shuffle's state holds its window"),
        ("uniform", 8, "only a block shuffle has a window"),
        (False, 8, "only a block shuffle has a window"),
        (True, 8, "saved before block shuffles (shuffle True) has no window"),
    ],
)
def test_a_window_that_its_shuffle_has_not_is_refused(store, shuffle, window, problem):
    state = {**state_at(store, 1), "shuffle": shuffle, "window": window}
    with pytest.raises(ArgumentError, match=rf"shuffle {shuffle!r} with window {window!r}"):
        store.batches(BATCH, **OPTIONS, state=state)
    with pytest.raises(ArgumentError, match=re.escape(problem)):
        resume.checked(state)


def test_a_position_past_the_epochs_is_refused(store):
    state = state_at(store, 0)
    with pytest.raises(ArgumentError, match="epoch 3, batch 0: past the end of epochs=2"):
        store.batches(BATCH, **OPTIONS, state={**state, "epoch": 3})
    with pytest.raises(ArgumentError, match="epoch 2, batch 1: past the end of epochs=2"):
        store.batches(BATCH, **OPTIONS, state={**state, "epoch": 2, "batch": 1})
    with pytest.raises(ArgumentError, match=r"\['batch'\] is 17, outside an epoch of 16"):
        store.batches(BATCH, **OPTIONS, state={**state, "batch": 17})
    assert resumed(store, {**state, "epoch": 2}) == []  # the end of the last epoch: nothing left


def test_numpy_values_resume_as_python_ones(store):
    every = ids(store.batches(BATCH, **OPTIONS))
    state = state_at(store, 21)
    as_numpy = {
        k: np.int64(v) if type(v) is int else np.bool_(v) if type(v) is bool else v
        for k, v in state.items()
    }
    assert resumed(store, as_numpy) == resumed(store, state) == every[21:]


#: values of every kind a stored state could come back holding
VALUES = st.one_of(
    st.booleans(),
    st.none(),
    st.integers(-3, 70),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.sampled_from(["block", "uniform", "8", "True"]),
    st.builds(
        lambda t, v: t(v), st.sampled_from([np.int8, np.int64, np.uint16]), st.integers(0, 100)
    ),
    st.builds(np.bool_, st.booleans()),
    st.builds(np.float64, st.integers(0, 70)),
    st.lists(st.integers(0, 8), max_size=2),
)


@given(
    taken=st.integers(0, 2 * N // BATCH),
    field=st.sampled_from(resume.POSITION + resume.SETTINGS + ("extra",)),
    value=VALUES,
)
def test_a_fuzzed_state_is_refused_by_name_or_resumes_exactly(shared, taken, field, value):
    """Any one field replaced by any value: a clear ``ArgumentError`` naming the field, or
    exactly the batches a fresh iterator of the state's settings yields from its position."""
    state = {**state_at(shared, taken), field: value}
    try:
        got = resumed(shared, state)
    except ArgumentError as err:
        assert field in str(err), str(err)
        return
    checked = resume.checked(state)
    window = checked["window"]
    every = ids(shared.batches(BATCH, **{**OPTIONS, "shuffle_window": window}))
    at = checked["epoch"] * len(every) // EPOCHS + checked["batch"]
    assert got == every[at:]


def test_a_state_of_zero_d_arrays_resumes_as_python_values(store):
    """A state kept in a store (or a checkpoint) comes back as 0-d arrays: ``drop_last`` as a
    0-d bool array was refused."""
    every = ids(store.batches(BATCH, **OPTIONS))
    state = state_at(store, 21)
    as_arrays = {k: np.asarray(v) if type(v) in (int, bool) else v for k, v in state.items()}
    assert resumed(store, as_arrays) == every[21:]
