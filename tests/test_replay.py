"""Replay buffers (``TreeStore.replay``, issue 46) on every kind of store and backend.

A sample is exactly records of the last ``capacity`` as the store loads them (each record of
``tests.parity.kinds`` carries its number in ``t``, so the records drawn are known and read
back with ``store.load``), draws are uniform and reproducible, a reopened store's buffer
holds the same window, and what the store changed under a buffer (a structure learnt,
records appended directly, a truncate) is seen.
"""

from __future__ import annotations

import pickle
import re
import threading
from pathlib import Path

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import (
    ArgumentError,
    ArgumentTypeError,
    ReadOnlyError,
    SchemaMismatchError,
    StoreIndexError,
    UnpicklableStoreError,
)
from tests.conftest import diagonal, tiered
from tests.parity import kinds as K

CELLS = [(k, b) for k in K.KINDS for b in K.BACKENDS]
#: every kind once and every backend (the full grid runs with -m slow)
SOME_CELLS = tiered(CELLS, diagonal(K.KINDS, K.BACKENDS))


def _decl(kind: str) -> dict[str, list[str]]:
    return K.kind(kind).declarations


def _add(buffer: pytreestore.ReplayBuffer, kind: str, records: list) -> None:
    """``records`` added as a batch (a ragged store's padded, with its mask)."""
    decl = _decl(kind)
    if not decl:
        buffer.add_batch(pytreestore.stack(records, as_numpy=True))
    else:
        buffer.add_batch(*pytreestore.stack(records, like=K.like(kind), as_numpy=True, **decl))


def _drawn(kind: str, sample: object) -> np.ndarray:
    batch = sample if K.kind(kind).is_fixed else sample[0]  # type: ignore[index]
    return np.asarray(batch.t)  # type: ignore[attr-defined]


def _at(store: object, numbers: object) -> np.ndarray:
    """The store indices of records numbered ``numbers`` since the first append (the buffer
    releases the store's front: record ``i`` is then index ``i - store.dropped``)."""
    return np.asarray(numbers, np.int64) - store.dropped  # type: ignore[attr-defined]


def _assert_same_batch(got: object, want: object) -> None:
    """Equal trees of equal leaves: dtypes, shapes, values and jax weak types."""
    got_leaves, got_def = jax.tree.flatten(got)
    want_leaves, want_def = jax.tree.flatten(want)
    assert got_def == want_def
    for a, b in zip(got_leaves, want_leaves):
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
        assert getattr(a, "weak_type", None) == getattr(b, "weak_type", None)
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(("kind", "backend"), CELLS)
def test_samples_are_records_of_the_last_capacity(path, kind, backend):
    store = K.create(path, kind, backend, chunk_records=4)
    buffer = store.replay(7, seed=0)
    records = K.records(kind, 23)
    for r in records[:5]:
        buffer.add(r)
    _add(buffer, kind, records[5:20])
    for r in records[20:]:
        buffer.add(r)
    assert len(store) + store.dropped == 23 and 7 <= len(store) < 14 and len(buffer) == 7
    sample = buffer.sample(60, as_numpy=True)
    drawn = _drawn(kind, sample)
    assert set(drawn.tolist()) == set(range(16, 23))  # 60 draws of 7: every one drawn
    _assert_same_batch(sample, store.load(_at(store, drawn), as_numpy=True))
    on_device = buffer.sample(9)
    _assert_same_batch(on_device, store.load(_at(store, _drawn(kind, on_device))))
    store.close()


@pytest.mark.parametrize(("kind", "backend"), SOME_CELLS)
def test_a_reopened_store_refills_the_same_window(path, kind, backend):
    store = K.create(path, kind, backend, chunk_records=4)
    buffer = store.replay(6)
    _add(buffer, kind, K.records(kind, 9))
    for r in K.records(kind, 4, start=9):
        buffer.add(r)
    key = jax.random.key(7)
    before = buffer.sample(40, key, as_numpy=True)
    store.close()
    reopened = pytreestore.open(path, mode="a")
    again = reopened.replay(6)
    assert len(again) == 6
    _assert_same_batch(again.sample(40, key, as_numpy=True), before)
    _add(again, kind, K.records(kind, 3, start=13))  # and appends carry on from there
    drawn = _drawn(kind, again.sample(50, as_numpy=True))
    assert set(drawn.tolist()) == set(range(10, 16))
    reopened.close()


@pytest.mark.parametrize("kind", K.KINDS)
def test_a_batch_larger_than_the_capacity_keeps_its_last_records(path, kind):
    store = K.create(path, kind, "tensorstore", chunk_records=4)
    buffer = store.replay(5, seed=1)
    _add(buffer, kind, K.records(kind, 3))
    _add(buffer, kind, K.records(kind, 12, start=3))
    sample = buffer.sample(40, as_numpy=True)
    assert set(_drawn(kind, sample).tolist()) == set(range(10, 15))
    _assert_same_batch(sample, store.load(_at(store, _drawn(kind, sample)), as_numpy=True))


def test_draws_are_uniform(path):
    store = pytreestore.create(path, {"t": np.int32(0)})
    buffer = store.replay(10, seed=123)
    buffer.add_batch({"t": np.arange(25, dtype=np.int32)})
    counts = np.bincount(buffer.sample(20_000, as_numpy=True)["t"] - 15, minlength=10)
    expected = 20_000 / 10
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert len(counts) == 10 and chi2 < 27.9  # 9 degrees of freedom, p = 0.001


def test_draws_are_reproducible(tmp_path):
    def buffer(name, seed):
        store = pytreestore.create(tmp_path / name, {"t": np.int32(0)})
        b = store.replay(50, seed=seed)
        b.add_batch({"t": np.arange(80, dtype=np.int32)})
        return b

    one, two, other = buffer("a", 3), buffer("b", 3), buffer("c", 4)
    draws = [one.sample(30, as_numpy=True)["t"].tolist() for _ in range(3)]
    assert draws == [two.sample(30, as_numpy=True)["t"].tolist() for _ in range(3)]
    assert draws[0] != other.sample(30, as_numpy=True)["t"].tolist()
    assert draws[0] != draws[1]  # the generator moves on
    key = jax.random.key(5)
    assert one.sample(30, key)["t"].tolist() == other.sample(30, key)["t"].tolist()
    raw = jax.random.PRNGKey(5)
    assert one.sample(30, raw)["t"].tolist() == two.sample(30, raw)["t"].tolist()
    assert one.sample(30, key)["t"].tolist() != one.sample(30, jax.random.key(6))["t"].tolist()


@pytest.mark.parametrize("kind", ["ragged_list", "optional", "nested"])
def test_a_sample_goes_back_in_with_its_mask(path, kind):
    store = K.create(path, kind, "zarr")
    buffer = store.replay(20, seed=2)
    _add(buffer, kind, K.records(kind, 6))
    batch, mask = buffer.sample(4, as_numpy=True)
    drawn = batch.t.tolist()
    buffer.add_batch(batch, mask)
    assert len(store) == len(buffer) == 10
    _assert_same_batch(store.load([6, 7, 8, 9], as_numpy=True), store.load(drawn, as_numpy=True))


def test_a_structure_learnt_on_the_way(path):
    """A list empty in every record so far: the record that first fills it teaches the
    store its element structure, and the window is read back."""
    store = pytreestore.create(path, {"t": np.int32(0), "p": []}, ragged=["['p']"])
    buffer = store.replay(4, seed=0)
    buffer.add({"t": np.int32(0), "p": []})
    buffer.add({"t": np.int32(1), "p": [np.float32(1.5), np.float32(2)]})
    for i in range(2, 6):
        buffer.add({"t": np.int32(i), "p": [np.float32(i)] * (i % 3)})
    batch, mask = buffer.sample(30, as_numpy=True)
    assert set(batch["t"].tolist()) == {2, 3, 4, 5}
    _assert_same_batch((batch, mask), store.load(_at(store, batch["t"]), as_numpy=True))


def test_records_appended_to_the_store_directly_and_a_truncate(path):
    store = pytreestore.create(path, {"t": np.int32(0)})
    buffer = store.replay(3, seed=0)
    buffer.add_batch({"t": np.arange(4, dtype=np.int32)})
    store.append({"t": np.int32(4)})
    assert len(buffer) == 3
    assert set(buffer.sample(30, as_numpy=True)["t"].tolist()) == {2, 3, 4}
    store.truncate(2)  # of records 1-4 (the add released record 0): 1 and 2 stay
    assert len(buffer) == 2
    assert set(buffer.sample(30, as_numpy=True)["t"].tolist()) == {1, 2}
    buffer.add({"t": np.int32(9)})
    assert set(buffer.sample(30, as_numpy=True)["t"].tolist()) == {1, 2, 9}


def test_jax_leaves_and_typed_keys(path):
    like = {"obs": np.zeros(3, np.float32), "key": jax.random.key(0), "r": 0.0}
    store = pytreestore.create(path, like)
    buffer = store.replay(8, seed=0)
    for i in range(5):
        buffer.add({"obs": jax.numpy.full(3, i, np.float32), "key": jax.random.key(i), "r": i})
    sample = buffer.sample(12)
    _assert_same_batch(sample, store.load(_at(store, np.asarray(sample["obs"][:, 0]).astype(int))))
    assert jax.dtypes.issubdtype(sample["key"].dtype, jax.dtypes.prng_key)


@pytest.mark.parametrize(("kind", "backend"), SOME_CELLS)
def test_a_thread_adds_while_another_samples(path, kind, backend):
    store = K.create(path, kind, backend, chunk_records=8)
    buffer = store.replay(16, seed=0, keep_all=True)  # every sample still in the store
    _add(buffer, kind, K.records(kind, 4))
    records = K.records(kind, 60, start=4)
    failed: list[BaseException] = []

    def adding():
        try:
            for i in range(0, 60, 3):
                _add(buffer, kind, records[i : i + 3])
        except BaseException as err:  # reported by the main thread
            failed.append(err)

    thread = threading.Thread(target=adding)
    thread.start()
    seen = []
    while thread.is_alive() or not seen:
        sample = buffer.sample(8, as_numpy=True)
        seen.append(sample)
    thread.join()
    assert not failed
    assert len(store) == 64 and len(buffer) == 16
    for sample in seen[:: max(len(seen) // 5, 1)]:
        _assert_same_batch(sample, store.load(_at(store, _drawn(kind, sample)), as_numpy=True))


def test_bad_arguments_are_refused(path):
    store = pytreestore.create(path, {"t": np.int32(0)})
    with pytest.raises(ArgumentError, match=re.escape("capacity, the records a sample draws")):
        store.replay(0)
    with pytest.raises(ArgumentTypeError, match="capacity"):
        store.replay(2.5)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="seed"):
        store.replay(4, seed=-1)
    buffer = store.replay(4)
    with pytest.raises(StoreIndexError, match="holds no record yet"):
        buffer.sample(3)
    buffer.add({"t": np.int32(1)})
    with pytest.raises(ArgumentError, match=re.escape("sample() takes k")):
        buffer.sample(0)
    with pytest.raises(ArgumentTypeError, match="key"):
        buffer.sample(2, key="seven")
    with pytest.raises(ArgumentTypeError, match="as_numpy"):
        buffer.sample(2, as_numpy="yes")  # type: ignore[arg-type]
    with pytest.raises(SchemaMismatchError):
        buffer.add({"t": np.int32(1), "u": np.int32(2)})
    with pytest.raises(SchemaMismatchError):
        buffer.add_batch({"t": np.zeros((2, 3), np.int32)})
    assert len(store) == len(buffer) == 1  # nothing of a refused record kept
    store.close()
    with pytest.raises(ReadOnlyError):
        pytreestore.open(path).replay(4)


def test_a_ragged_batch_needs_its_mask(path):
    store = K.create(path, "ragged_list", "tensorstore")
    buffer = store.replay(4)
    batch, _ = pytreestore.stack(
        K.records("ragged_list", 3), like=K.like("ragged_list"), **_decl("ragged_list")
    )
    with pytest.raises(SchemaMismatchError, match="mask"):
        buffer.add_batch(batch)
    assert len(store) == len(buffer) == 0


def test_pickling_is_refused(path):
    buffer = pytreestore.create(path, {"t": np.int32(0)}).replay(4)
    with pytest.raises(UnpicklableStoreError, match=re.escape("pytreestore.open(path)")):
        pickle.dumps(buffer)


def test_retention_runs_every_capacity_records(path):
    """``_retain`` (the one place of retention) keeps the store's last ``capacity`` records
    once per ``capacity`` records added, and vacuum frees the chunks of the others; with
    ``keep_all`` the store keeps every record."""
    store = pytreestore.create(path, {"t": np.int32(0)}, chunk_records=4, keep_versions=1)
    kept = pytreestore.create(f"{path}-all", {"t": np.int32(0)}, chunk_records=4)
    buffer, every = store.replay(10), kept.replay(10, keep_all=True)
    for i in range(7):
        batch = {"t": np.arange(4 * i, 4 * i + 4, dtype=np.int32)}
        buffer.add_batch(batch)
        every.add_batch(batch)
    assert (len(store), store.dropped, len(buffer)) == (14, 14, 10)  # released at 12 and 24
    assert store.load(as_numpy=True)["t"].tolist() == list(range(14, 28))
    assert (len(kept), kept.dropped, len(every)) == (28, 0, 10)
    assert sorted(set(buffer.sample(200, as_numpy=True)["t"].tolist())) == list(range(18, 28))
    chunks = [p for p in (Path(path) / "t").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert len(chunks) == 4, chunks  # chunks 3-6 (rows 12-27); 0-2 freed by vacuum
    store.close()
    kept.close()


def _episodes(n: int, seed: int) -> tuple[list[dict], dict, dict]:
    """``n`` records of ``obs`` float32[len, 2] (len 0-4) beside fixed leaves, and their
    padded batch and mask (the pair ``add_batch`` takes)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5, n)
    obs = rng.standard_normal((n, 4, 2)).astype(np.float32)
    real = np.arange(4)[None, :] < lengths[:, None]
    batch = {"obs": obs * real[..., None], "a": np.arange(n, dtype=np.int32), "d": real[:, 0]}
    mask = {"obs": real, "a": np.ones(n, bool), "d": np.ones(n, bool)}
    records = [
        {"obs": obs[i, : lengths[i]], "a": np.int32(i), "d": np.bool_(real[i, 0])} for i in range(n)
    ]
    return records, batch, mask


@pytest.mark.parametrize("backend", K.BACKENDS)
def test_a_padded_batch_of_ragged_leading_axes_is_taken_without_a_walk(
    tmp_path, backend, monkeypatch
):
    """Leaves with ragged leading axes of their own go from the padded batch to the tables at
    once (:mod:`pytreestore._write.padded`): the store and the window hold exactly what
    appending the records one by one gives."""
    records, batch, mask = _episodes(11, seed=5)
    like = {"obs": np.zeros((1, 2), np.float32), "a": np.int32(0), "d": np.bool_(False)}
    want = pytreestore.create(tmp_path / "want", like, ragged=["['obs']"], backend=backend)
    want.extend(records)
    store = pytreestore.create(
        tmp_path / "got", like, ragged=["['obs']"], backend=backend, chunk_records=4
    )
    buffer = store.replay(6, seed=0, keep_all=True)  # the store compared whole below
    buffer.add(records[0])

    def walked(*args):
        raise AssertionError("the padded batch was walked record by record")

    monkeypatch.setattr("pytreestore._write.records.unpad_records", walked)
    buffer.add_batch({k: v[1:] for k, v in batch.items()}, {k: v[1:] for k, v in mask.items()})
    monkeypatch.undo()
    _assert_same_batch(
        store.load(slice(None), as_numpy=True), want.load(slice(None), as_numpy=True)
    )
    sample = buffer.sample(40, as_numpy=True)
    assert set(sample[0]["a"].tolist()) == set(range(5, 11))
    _assert_same_batch(sample, store.load(_at(store, sample[0]["a"]), as_numpy=True))
    store.close()
    _assert_same_batch(
        pytreestore.open(tmp_path / "got").load(slice(None), as_numpy=True),
        want.load(slice(None), as_numpy=True),
    )


def test_a_padded_batch_the_fast_path_cannot_take_is_refused_by_the_walk(path):
    _, batch, mask = _episodes(5, seed=6)
    like = {"obs": np.zeros((1, 2), np.float32), "a": np.int32(0), "d": np.bool_(False)}
    store = pytreestore.create(path, like, ragged=["['obs']"])
    buffer = store.replay(4)
    holes = {**mask, "obs": mask["obs"].copy()}
    holes["obs"][2] = [False, True, False, False]
    with pytest.raises(SchemaMismatchError, match=re.escape("row 2 of the mask at ['obs']")):
        buffer.add_batch(batch, holes)
    with pytest.raises(SchemaMismatchError, match="float32"):
        store.extend_batch({**batch, "obs": batch["obs"].astype(np.complex64)}, mask)
    assert len(store) == 0 and len(buffer) == 0
