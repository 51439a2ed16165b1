"""Bad input: every refusal names what was wrong and where, and leaves the store unchanged."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pytreestore
from pytreestore import errors

LIKE = {"v": np.zeros(3, np.float32), "n": np.int32(0)}


def good(i: int) -> dict:
    return {"v": np.full(3, i, np.float32), "n": np.int32(i)}


@pytest.fixture
def store(tmp_path):
    s = pytreestore.create(tmp_path / "s", LIKE, chunk_records=4)
    s.extend(good(i) for i in range(6))
    s.flush()
    yield s
    s.close()


def assert_unchanged(store) -> None:
    assert len(store) == 6
    out = store.load(as_numpy=True)
    np.testing.assert_array_equal(out["n"], np.arange(6))
    np.testing.assert_array_equal(out["v"][:, 0], np.arange(6))


BATCH_CASES = [
    (
        {"v": np.zeros((2, 3), np.float32), "n": np.zeros(3, np.int32)},
        "batch leaves disagree on the number of records (['n']: 3, ['v']: 2)",
    ),
    (
        {"v": np.zeros(3, np.float32), "n": np.int32(0)},
        "batch leaf at ['n'] has no leading record axis",
    ),
    (
        {"v": np.zeros((2, 4), np.float32), "n": np.zeros(2, np.int32)},
        "batch does not match the store schema at ['v']: expected float32[3], got float32[2,4]",
    ),
    (
        {"v": np.zeros((2, 3), np.float32), "n": np.zeros(2, np.float32)},
        "batch does not match the store schema at ['n']: expected int32[], got float32[2]",
    ),
    (
        {"v": np.zeros((2, 3), np.float32)},
        "batch does not match the store schema",
    ),
]


@pytest.mark.parametrize(("batch", "message"), BATCH_CASES)
def test_bad_batches(store, batch, message):
    with pytest.raises(errors.SchemaMismatchError, match=re.escape(message)):
        store.extend_batch(batch)
    assert_unchanged(store)


RECORD_CASES = [
    ({"v": [1.0, 2.0, 3.0], "n": 0}, "at ['v']: expected a leaf, got a list of 3"),
    ({"v": np.zeros(3, np.float32)}, "at the root: expected a dict with keys ['n', 'v']"),
    (
        {"v": np.zeros(3, np.float32), "n": 0, "extra": 1},
        "got a dict with keys ['extra', 'n', 'v']",
    ),
    ({"v": np.zeros(2, np.float32), "n": 0}, "at ['v']: expected float32[3], got float32[2]"),
    ({"v": np.zeros(3, np.float32), "n": 1.5}, "at ['n']: expected int32[], got Python float 1.5"),
    ({"v": np.zeros(3, np.float32), "n": "7"}, "at ['n']: expected int32[], got a str"),
    (
        {"v": np.array(["a", "b", "c"]), "n": 0},
        "at ['v']: expected float32[3], got str32[3]. Columns hold numbers and bools only",
    ),
    ({"v": np.zeros(3, object), "n": 0}, "at ['v']: expected float32[3], got object[3]"),
    ({"v": np.zeros(3, np.complex64), "n": 0}, "complex64 cannot be cast to float32"),
    ({"v": np.zeros(3, np.float32), "n": 2**31}, "it does not fit in int32"),
    (
        {"v": np.zeros(3, np.float32), "n": np.int64(2**40)},
        "do not fit in int32 and would wrap around",
    ),
    ({"v": np.zeros(3, np.float32), "n": None}, "at ['n']: expected a leaf, got None"),
]


@pytest.mark.parametrize(("record", "message"), RECORD_CASES)
def test_bad_records(store, record, message):
    with pytest.raises(errors.SchemaMismatchError, match=re.escape(message)):
        store.append(record)
    assert_unchanged(store)
    with pytest.raises(errors.SchemaMismatchError, match=re.escape(message)):
        store.extend([good(6), record])
    assert_unchanged(store)


def test_nan_and_inf_are_stored_exactly(store):
    store.append({"v": np.array([np.nan, np.inf, -np.inf], np.float32), "n": np.int32(6)})
    out = store.load(-1, as_numpy=True)
    np.testing.assert_array_equal(out["v"], [np.nan, np.inf, -np.inf])


INDEX_CASES = [
    (6, "record index 6 is out of range for a store of 6 records"),
    (-7, "record index -7 is out of range"),
    ([0, 9], "record index 9 is out of range"),
    (1.5, "got float 1.5"),
    ("a", "got str 'a'"),
    (np.zeros((2, 2), int), "an index array must be 1-d"),
    (np.array([True, False]), "a bool mask must have one entry per record: got 2 for 6 records"),
    (slice(0.5, 2), "slice bounds must be ints or None"),
]


@pytest.mark.parametrize(("index", "message"), INDEX_CASES)
def test_bad_indices(store, index, message):
    with pytest.raises(errors.StoreIndexError, match=re.escape(message)):
        store[index]
    with pytest.raises(IndexError):
        store.load(index)
    assert_unchanged(store)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "a store path must not be empty"),
        ("memory://", "names no store"),
        ("ftp://host/x", "unsupported URL scheme 'ftp'"),
        (42, "a store path must be a str or os.PathLike, got int"),
    ],
)
def test_bad_paths(path, message):
    with pytest.raises(errors.BadLocationError, match=re.escape(message)):
        pytreestore.create(path, LIKE)
    with pytest.raises(ValueError, match=re.escape(message)):
        pytreestore.open(path)


def test_missing_store(tmp_path):
    with pytest.raises(errors.StoreNotFoundError, match="no store at"):
        pytreestore.open(tmp_path / "nothing")
    with pytest.raises(FileNotFoundError):
        pytreestore.open("memory://never-created")


def test_bad_create_arguments(tmp_path):
    with pytest.raises(errors.SchemaMismatchError, match="has no leaves"):
        pytreestore.create(tmp_path / "a", {"empty": []})
    with pytest.raises(ValueError, match="chunk_records must be a positive int, got -1"):
        pytreestore.create(tmp_path / "b", LIKE, chunk_records=-1)
    with pytest.raises(ValueError, match="unknown codec 'lz5'"):
        pytreestore.create(tmp_path / "c", LIKE, codec="lz5")
    with pytest.raises(ValueError, match="unknown backend 'hdf5'"):
        pytreestore.create(tmp_path / "d", LIKE, backend="hdf5")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_bad_mode(tmp_path):
    pytreestore.create(tmp_path / "s", LIKE).close()
    with pytest.raises(
        ValueError, match=re.escape("mode must be 'r' (read) or 'a' (append), got 'w'")
    ):
        pytreestore.open(tmp_path / "s", mode="w")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["w", "w-", "x"])
def test_a_write_mode_points_to_create_with_overwrite(tmp_path, mode):
    """zarr's and h5py's write modes (issue 33): the refusal says how to write a store."""
    pytreestore.create(tmp_path / "s", LIKE).close()
    with pytest.raises(
        ValueError, match=re.escape("pytreestore.create(path, like, overwrite=True)")
    ):
        pytreestore.open(tmp_path / "s", mode=mode)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        pytreestore.open(tmp_path / "s", mode="q")  # type: ignore[arg-type]
    assert "create" not in str(info.value)


def test_not_a_store(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "zarr.json").write_text(
        '{"zarr_format": 3, "node_type": "group", "attributes": {}}'
    )
    with pytest.raises(errors.NotAStoreError, match="no 'pytreestore' attribute"):
        pytreestore.open(tmp_path / "x")
    (tmp_path / "x" / "zarr.json").write_text("{not json")
    with pytest.raises(errors.NotAStoreError, match=re.escape("zarr.json is not valid JSON")):
        pytreestore.open(tmp_path / "x")
