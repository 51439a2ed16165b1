"""The background writer of full chunks (pytreestore._write.background) and what a store's
appends keep when it fails: order, back-pressure, a failure reported once by the next call,
the retry, and nothing acknowledged lost (issue 32)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._write.background import ChunkWrites


class _Boom(Exception):
    pass


def test_jobs_run_in_order_and_drain_waits_for_them():
    writes, done = ChunkWrites(limit=2), []
    for i in range(20):
        writes.submit(lambda i=i: (time.sleep(0.001), done.append(i)))
    writes.drain()
    assert done == list(range(20))
    assert len(writes) == 0


def test_submit_waits_while_more_than_the_limit_wait():
    gate, writes, seen = threading.Event(), ChunkWrites(limit=2), []
    writes.submit(lambda: (gate.wait(), seen.append("a")))
    writes.submit(lambda: seen.append("b"))
    third = threading.Thread(target=writes.submit, args=(lambda: seen.append("c"),))
    third.start()
    third.join(0.2)
    assert third.is_alive(), "a third chunk was taken while two waited"
    gate.set()
    third.join(10)
    assert not third.is_alive()
    writes.drain()
    assert seen == ["a", "b", "c"]


def test_a_failure_is_reported_once_and_the_next_call_retries_it():
    writes, attempts, done = ChunkWrites(), [], []

    def flaky() -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise _Boom("disk full")
        done.append("first")

    writes.submit(flaky)
    writes.submit(lambda: done.append("second"))
    with pytest.raises(_Boom, match="disk full"):
        writes.drain()  # reports the failure: the head is tried again from then on
    writes.drain()
    writes.check()  # nothing more to report
    assert done == ["first", "second"] and len(attempts) == 2


def test_discard_hands_back_the_jobs_of_a_stopped_queue():
    writes = ChunkWrites()
    first, second = (lambda: (_ for _ in ()).throw(_Boom("x"))), (lambda: None)
    writes.submit(first)
    writes.submit(second)
    with pytest.raises(_Boom):
        writes.drain()
    assert writes.discard() == [first, second]  # tried again meanwhile: it failed again
    assert len(writes) == 0
    writes.drain()  # nothing left, nothing raised


# ---- a store's appends over a failing disk ------------------------------------------------


def _failing_writes(store, fails: list[int]):
    """Makes the store's chunk writes raise StorageError while ``fails[0] > 0`` (counting
    down one per failed write)."""
    backend = store._core.backend
    real = backend.write

    def write(keys, start, blocks):
        if fails[0] > 0:
            fails[0] -= 1
            raise errors.StorageError("No space left on device (injected); retry later")
        return real(keys, start, blocks)

    backend.write = write  # type: ignore[method-assign]


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_a_background_write_failure_loses_nothing(tmp_path, backend):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"n": np.int64(0)}, chunk_records=4, backend=backend)
    fails = [1]
    _failing_writes(store, fails)
    appended, failures = 0, 0
    for i in range(40):
        try:
            store.append({"n": np.int64(i)})
        except errors.StorageError as err:
            failures += 1
            assert "injected" in str(err)
            store.append({"n": np.int64(i)})  # the next call retries the chunk, then appends
        appended += 1
    store.flush()
    assert failures <= 1 and fails == [0]
    assert store.committed == appended == 40
    with pytreestore.open(path) as reader:
        np.testing.assert_array_equal(reader.load(as_numpy=True)["n"], np.arange(40))
    store.close()


def test_close_over_a_failing_disk_keeps_the_store_open_then_succeeds(tmp_path):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"n": np.int64(0)}, chunk_records=4)
    fails = [10**9]
    for i in range(4):
        store.append({"n": np.int64(i)})
    _failing_writes(store, fails)
    for i in range(4, 11):  # hands the first chunk over; its write fails in the background
        try:
            store.append({"n": np.int64(i)})
        except errors.StorageError:
            store.append({"n": np.int64(i)})
    with pytest.raises(errors.StorageError, match="injected"):
        store.close()
    assert not store.closed and len(store) == 11
    fails[0] = 0
    store.close()
    with pytreestore.open(path) as reader:
        np.testing.assert_array_equal(reader.load(as_numpy=True)["n"], np.arange(11))


def test_appends_from_threads_with_background_writes_keep_every_record(tmp_path):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"t": np.int32(0), "i": np.int32(0)}, chunk_records=8)
    stop, seen = threading.Event(), []

    def append(t: int) -> None:
        for i in range(300):
            store.append({"t": np.int32(t), "i": np.int32(i)})

    def read() -> None:  # what a read sees is a prefix: each thread's records in order
        while not stop.is_set():
            got = store.load(as_numpy=True)
            seen.append(
                all(
                    np.array_equal(got["i"][got["t"] == t], np.arange((got["t"] == t).sum()))
                    for t in range(4)
                )
            )

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=append, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    reader.join()
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)
    assert len(got["t"]) == 1200 and all(seen)
    for t in range(4):  # each thread's records, in its own order
        np.testing.assert_array_equal(got["i"][got["t"] == t], np.arange(300))


def test_the_committed_count_follows_the_background_writer(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"n": np.int64(0)}, chunk_records=4)
    for i in range(12):
        store.append({"n": np.int64(i)})
    deadline = time.monotonic() + 60
    while store.committed < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.committed == 8 and len(store) == 12  # the third chunk is still filling
    store.flush()
    assert store.committed == 12
    store.close()
