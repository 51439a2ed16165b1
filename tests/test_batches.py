"""Streaming batches: order, shuffles per (seed, epoch), resuming, prefetch in the background."""

from __future__ import annotations

import collections
import itertools
import re
import threading
import time
import uuid

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore._pipelines.batches import BatchIterator
from pytreestore._pipelines.order import Shuffle
from pytreestore._pipelines.prefetch import Prefetcher
from pytreestore._runtime import RUNTIME
from pytreestore.errors import ArgumentError, ShardingError
from tests.conftest import cpu_mesh


@pytest.fixture
def store(tmp_path):
    s = pytreestore.create(tmp_path / "s", {"i": np.int32(0), "v": np.zeros(2, np.float32)})
    s.extend_batch(
        {"i": np.arange(50, dtype=np.int32), "v": np.arange(100, dtype=np.float32).reshape(50, 2)}
    )
    s.flush()
    return s


def ids(batches) -> list[list[int]]:
    return [np.asarray(b["i"]).tolist() for b in batches]


def test_batches_in_order(store):
    got = ids(store.batches(16))
    assert got == [list(range(0, 16)), list(range(16, 32)), list(range(32, 48)), [48, 49]]
    assert ids(store.batches(16, drop_last=True))[-1] == list(range(32, 48))


def test_batches_are_jax_arrays_with_every_column(store):
    batch = next(iter(store.batches(4)))
    assert isinstance(batch["v"], jax.Array) and batch["v"].shape == (4, 2)
    np.testing.assert_array_equal(np.asarray(batch["v"]), np.arange(8).reshape(4, 2))


def test_start_stop_and_columns(store):
    got = list(store.batches(4, start=10, stop=-30, columns="['i']"))
    assert ids(got) == [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19]]
    assert got[0]["v"] is None


def test_len_is_batches_per_epoch(store):
    assert len(store.batches(16)) == 4
    assert len(store.batches(16, drop_last=True)) == 3
    assert len(store.batches(100, drop_last=True)) == 0


def test_shuffle_covers_every_record_once_per_epoch(store):
    got = ids(store.batches(8, shuffle=True, seed=3, epochs=2))
    first, second = list(np.concatenate(got[:7])), list(np.concatenate(got[7:]))
    assert sorted(first) == sorted(second) == list(range(50))
    assert first != second and first != list(range(50))


def test_shuffle_depends_only_on_seed_and_epoch(store):
    a = ids(store.batches(8, shuffle=True, seed=3, epochs=2))
    assert a == ids(store.batches(8, shuffle=True, seed=3, epochs=2, prefetch=0))
    assert a != ids(store.batches(8, shuffle=True, seed=4, epochs=2))
    second = store.batches(8, shuffle=True, seed=3, epochs=2, state={"epoch": 1, "batch": 0})
    assert ids(second) == a[7:]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("taken", [0, 3, 6, 7, 9, 14])
def test_resume_mid_epoch_yields_exactly_the_rest(store, shuffle, taken):
    every = ids(store.batches(8, shuffle=shuffle, seed=11, epochs=2))
    it = store.batches(8, shuffle=shuffle, seed=11, epochs=2)
    head = [np.asarray(next(it)["i"]).tolist() for _ in range(taken)]
    state = it.state()
    it.close()
    rest = ids(store.batches(8, shuffle=shuffle, seed=11, epochs=2, state=state))
    assert head + rest == every


def test_state_is_small_and_counts_epochs(store):
    it = store.batches(16, shuffle=True, seed=5, epochs=None)
    assert it.state() == {
        "epoch": 0,
        "batch": 0,
        "records": 50,
        "batch_size": 16,
        "shuffle": "uniform",  # 50 records fit in one window: a block shuffle is uniform
        "window": None,
        "seed": 5,
        "drop_last": False,
    }
    for _ in range(5):
        next(it)
    assert (it.state()["epoch"], it.state()["batch"]) == (1, 1)
    it.close()


def test_resume_with_other_settings_is_refused(store):
    state = store.batches(8, seed=1).state()
    message = "batches(state=...) was saved with other settings (batch_size: state 8, now 4"
    with pytest.raises(ValueError, match=re.escape(message)):
        store.batches(4, seed=1, state=state)


def test_endless_epochs_and_zero_epochs(store):
    it = store.batches(25, epochs=None)
    assert len([next(it) for _ in range(7)]) == 7
    it.close()
    assert list(store.batches(25, epochs=0)) == []


def test_bad_arguments(store):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        store.batches(0)
    with pytest.raises(ValueError, match="prefetch must be None or an int >= 0"):
        store.batches(4, prefetch=-1)


def test_prefetch_reads_ahead_in_the_background():
    loads: list[tuple[int, str]] = []

    def load(index):
        loads.append((index.start, threading.current_thread().name))
        return index.start

    it = BatchIterator(
        load,
        start=0,
        stop=100,
        batch_size=10,
        shuffle=Shuffle(None),
        seed=0,
        drop_last=False,
        prefetch=3,
        epochs=1,
        state=None,
    )
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while len(loads) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    # one handed out, three loaded ahead (side by side): no more than prefetch + 1
    assert len(loads) == 4
    assert all(name != threading.current_thread().name for _, name in loads)
    assert list(it) == list(range(10, 100, 10))
    it.close()


def test_load_errors_reach_the_caller():
    def load(item):
        if item == 2:
            raise OSError("disk on fire")
        return item

    got = Prefetcher(load, iter(range(5)), depth=2)
    assert [next(got), next(got)] == [0, 1]
    with pytest.raises(OSError, match="disk on fire"):
        next(got)
    with pytest.raises(StopIteration):
        next(got)


def test_close_stops_the_thread():
    started = threading.Event()

    def items():
        started.set()
        yield from range(1000)

    got = Prefetcher(lambda i: i, items(), depth=2)
    started.wait(5)
    got.close()
    with pytest.raises(StopIteration):
        next(got)


def test_batches_see_records_appended_before_they_start(tmp_path):
    with pytreestore.create(tmp_path / "s", {"i": np.int32(0)}) as s:
        s.extend({"i": np.int32(k)} for k in range(5))
        assert ids(s.batches(2)) == [[0, 1], [2, 3], [4]]


@pytest.fixture(params=["tensorstore", "zarr"])
def blocks(request, tmp_path):
    """64 records in chunks of 4 on each backend: a window of 8 records is two chunks."""
    like = {"i": np.int32(0), "v": np.zeros(2, np.float32)}
    s = pytreestore.create(tmp_path / "b", like, chunk_records=4, backend=request.param)
    s.extend_batch(
        {"i": np.arange(64, dtype=np.int32), "v": np.arange(128, dtype=np.float32).reshape(64, 2)}
    )
    s.close()
    return pytreestore.open(tmp_path / "b", backend=request.param)


def test_a_block_shuffle_reads_each_chunk_once_per_epoch(blocks, monkeypatch):
    from pytreestore._read import cache

    reads: list[tuple[str, int]] = []
    real = cache._read_whole

    def counted(backend, requests, records):
        reads.extend((key, where.start) for key, where in requests)
        return real(backend, requests, records)

    monkeypatch.setattr(cache, "_read_whole", counted)
    it = blocks.batches(4, shuffle=True, seed=7, shuffle_window=8, epochs=2)
    got = []
    for batch in it:
        i = np.asarray(batch["i"])
        np.testing.assert_array_equal(np.asarray(batch["v"]), np.stack([2 * i, 2 * i + 1], 1))
        got.append(i.tolist())
    first, second = got[:16], got[16:]
    for epoch in (first, second):
        assert sorted(list(itertools.chain.from_iterable(epoch))) == list(range(64))
        for batch in epoch:  # a batch holds records of at most two windows: 4 chunks
            assert len({k // 4 for k in batch}) <= 4
    assert first != second
    chunks = {(key, start) for key in ("i", "v") for start in range(0, 64, 4)}
    times = collections.Counter(reads)  # every chunk of both columns, at most once an epoch
    assert set(times) == chunks and set(times.values()) <= {1, 2}  # (kept across an epoch's end)


def test_a_uniform_shuffle_is_exact_on_any_store(blocks):
    expected = np.random.default_rng((3, 0)).permutation(64).tolist()
    got = ids(blocks.batches(16, shuffle="uniform", seed=3))
    assert list(itertools.chain.from_iterable(got)) == expected


@pytest.mark.parametrize("shuffle", ["block", "uniform", False])
@pytest.mark.parametrize("taken", [0, 5, 16, 21])
def test_resume_any_shuffle_mid_epoch(blocks, shuffle, taken):
    window = 8 if shuffle == "block" else None
    options = {"shuffle": shuffle, "seed": 2, "epochs": 2, "shuffle_window": window}
    every = ids(blocks.batches(4, **options))
    it = blocks.batches(4, **options)
    for _ in range(taken):
        next(it)
    state = it.state()
    it.close()
    assert (state["shuffle"], state["window"]) == (shuffle, window)
    rest = ids(blocks.batches(4, **{**options, "shuffle_window": None}, state=state))
    assert rest == every[taken:]


def test_a_state_from_before_block_shuffles_is_a_uniform_one(blocks):
    old = {"epoch": 0, "batch": 3, "records": 64, "batch_size": 4, "shuffle": True,
           "seed": 1, "drop_last": False}  # fmt: skip
    with pytest.raises(ArgumentError, match="shuffle: state 'uniform', now 'block'"):
        blocks.batches(4, shuffle=True, seed=1, shuffle_window=8, state=old)
    rest = ids(blocks.batches(4, shuffle="uniform", seed=1, state=old))
    assert rest == ids(blocks.batches(4, shuffle="uniform", seed=1))[3:]


def test_a_range_shuffled_in_one_window_resumes_after_a_ragged_store_grows(tmp_path, monkeypatch):
    """A range that fitted one window was shuffled uniformly; records appended past ``stop``
    change a ragged store's bytes per record, and with them the default window, but the
    same arguments still resume the same order."""
    monkeypatch.setattr(RUNTIME.pipelines, "shuffle_window_bytes", 2048)

    def record(i: int, rows: int) -> dict:
        return {"t": np.int32(i), "x": np.full((rows, 4), i, np.float32)}

    path = tmp_path / "s"
    with pytreestore.create(path, record(0, 1), ragged=["['x']"], chunk_records=8) as s:
        s.extend([record(i, 1) for i in range(40)])
    options = {"shuffle": True, "stop": 40, "seed": 1, "epochs": 2}
    every = [b[0]["t"].tolist() for b in pytreestore.open(path).batches(4, **options)]
    it = pytreestore.open(path).batches(4, **options)
    next(it)
    state = it.state()
    it.close()
    assert (state["shuffle"], state["window"]) == ("uniform", None)
    with pytreestore.open(path, "a") as s:
        s.extend([record(i, 20) for i in range(40, 80)])  # 20 rows each: a smaller window
    rest = pytreestore.open(path).batches(4, **options, state=state)
    assert [b[0]["t"].tolist() for b in rest] == every[1:]


def test_a_block_order_is_the_same_in_memory(blocks):
    memory = pytreestore.create(
        f"memory://block-order-{uuid.uuid4().hex}", {"i": np.int32(0)}, chunk_records=4
    )
    memory.extend_batch({"i": np.arange(64, dtype=np.int32)})
    options = {"shuffle": True, "seed": 9, "shuffle_window": 8}
    assert ids(memory.batches(4, **options)) == ids(blocks.batches(4, **options))


class TestEightDevices:
    def test_sharded_batches(self, store, eight_devices):
        mesh = cpu_mesh((8,), ("data",))
        sharding = NamedSharding(mesh, P("data"))
        got = list(store.batches(16, shuffle=True, seed=2, drop_last=True, sharding=sharding))
        assert [b["v"].sharding for b in got] == [sharding] * 3
        plain = ids(store.batches(16, shuffle=True, seed=2, drop_last=True))
        assert ids(got) == plain

    def test_sharded_block_shuffled_batches(self, blocks, eight_devices):
        sharding = NamedSharding(cpu_mesh((8,), ("data",)), P("data"))
        options = {"shuffle": True, "seed": 4, "shuffle_window": 8}
        got = list(blocks.batches(8, sharding=sharding, **options))
        assert [b["i"].sharding for b in got] == [sharding] * 8
        assert ids(got) == ids(blocks.batches(8, **options))

    def test_sharded_batches_must_split(self, store, eight_devices):
        sharding = NamedSharding(cpu_mesh((8,), ("data",)), P("data"))
        with pytest.raises(ShardingError, match=re.escape("the last batch of 2 records")):
            store.batches(16, sharding=sharding)
        with pytest.raises(ShardingError, match=re.escape("batch_size as a multiple of 8")):
            store.batches(12, sharding=sharding, drop_last=True)
