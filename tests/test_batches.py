"""Streaming batches: order, shuffles per (seed, epoch), resuming, prefetch in the background."""

from __future__ import annotations

import re
import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore._pipelines.batches import BatchIterator
from pytreestore._pipelines.prefetch import Prefetcher
from pytreestore.errors import ShardingError


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
        "shuffle": True,
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
    with pytest.raises(ValueError, match="prefetch must be >= 0"):
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
        shuffle=False,
        seed=0,
        drop_last=False,
        prefetch=3,
        epochs=1,
        state=None,
    )
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while len(loads) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    # one handed out, three queued, one waiting to be queued: no more than prefetch + 2
    assert len(loads) == 5
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


class TestEightDevices:
    def test_sharded_batches(self, store, eight_devices):
        mesh = jax.make_mesh((8,), ("data",))
        sharding = NamedSharding(mesh, P("data"))
        got = list(store.batches(16, shuffle=True, seed=2, drop_last=True, sharding=sharding))
        assert [b["v"].sharding for b in got] == [sharding] * 3
        plain = ids(store.batches(16, shuffle=True, seed=2, drop_last=True))
        assert ids(got) == plain

    def test_sharded_batches_must_split(self, store, eight_devices):
        sharding = NamedSharding(jax.make_mesh((8,), ("data",)), P("data"))
        with pytest.raises(ShardingError, match=re.escape("the last batch of 2 records")):
            store.batches(16, sharding=sharding)
        with pytest.raises(ShardingError, match=re.escape("batch_size as a multiple of 8")):
            store.batches(12, sharding=sharding, drop_last=True)
