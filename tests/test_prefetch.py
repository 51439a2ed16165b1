"""The prefetcher's loads side by side (pytreestore/_pipelines/prefetch.py), and the chunk
cache's claims that let two of them share a chunk's decode (pytreestore/_read/cache.py)."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

import pytreestore
from pytreestore._pipelines.prefetch import Prefetcher, auto_depth
from pytreestore._read import cache as _cache
from pytreestore._runtime import RUNTIME
from tests import interpreters
from tests.conftest import child_env


def test_results_come_in_order_though_loads_end_out_of_order():
    rng = random.Random(0)
    delays = [rng.uniform(0, 0.01) for _ in range(60)]

    def load(i):
        time.sleep(delays[i])
        return i * i

    assert list(Prefetcher(load, iter(range(60)), depth=6)) == [i * i for i in range(60)]


def test_loads_run_side_by_side_and_never_more_than_depth_ahead():
    running, most, ahead = [0], [0], []
    lock = threading.Lock()
    handed = [0]
    started = []

    def load(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            started.append(i)
            ahead.append(i - handed[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return i

    it = Prefetcher(load, iter(range(24)), depth=4)
    for got in it:
        handed[0] = got + 1
    assert most[0] == 4  # four loads at once, not one after another
    assert max(ahead) <= 4  # a load starts only when fewer than depth are ahead


def test_an_error_is_raised_at_its_position_after_the_results_before_it():
    def load(i):
        if i == 5:
            raise ValueError("no 5")
        time.sleep(0.001 * (7 - i % 7))
        return i

    it = Prefetcher(load, iter(range(20)), depth=4)
    got = []
    with pytest.raises(ValueError, match="no 5"):
        for x in it:
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    assert list(it) == []  # it has ended


def test_an_items_iterator_that_fails_is_raised_in_order():
    def items():
        yield from range(3)
        raise KeyError("items broke")

    it = Prefetcher(lambda i: i, items(), depth=3)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="items broke"):
        next(it)


def test_close_waits_for_every_load_under_way():
    inside = threading.Event()
    release = threading.Event()
    finished = []

    def load(i):
        inside.set()
        release.wait(5)
        finished.append(i)
        return i

    it = Prefetcher(load, iter(range(100)), depth=3)
    assert inside.wait(5)
    threading.Timer(0.05, release.set).start()
    it.close()
    count = len(finished)
    assert 1 <= count <= 3
    time.sleep(0.05)
    assert len(finished) == count  # nothing loads after close() returned
    assert all(job.ended for job in it._jobs)


@pytest.mark.parametrize(("nbytes", "depth"), [(1, 8), (4 << 20, 8), (64 << 20, 4), (1 << 30, 2)])
def test_auto_depth(nbytes, depth):
    assert auto_depth(nbytes, cores=13) == depth  # the TPU v5e host's cores
    assert auto_depth(nbytes, cores=1) == 2
    assert 2 <= auto_depth(nbytes) <= RUNTIME.pipelines.prefetch_loaders


def test_two_threads_reading_one_chunk_decode_it_once(tmp_path, monkeypatch):
    """The prefetcher's loads of neighbouring batches often share a chunk: the second waits
    for the first's read instead of decoding it again."""
    store = pytreestore.create(tmp_path / "s", {"x": np.zeros(8, np.float32)}, chunk_records=64)
    store.extend_batch({"x": np.arange(128 * 8, dtype=np.float32).reshape(128, 8)})
    store.flush()
    reads = []
    gate = threading.Barrier(2)
    real = _cache._read_whole

    def slow(backend, requests, records):
        reads.append([r[1] for r in requests])
        time.sleep(0.1)
        return real(backend, requests, records)

    monkeypatch.setattr(_cache, "_read_whole", slow)
    out = {}

    def read(lo):
        gate.wait()
        out[lo] = store.load(slice(lo, lo + 16), as_numpy=True)["x"]

    threads = [threading.Thread(target=read, args=(lo,)) for lo in (0, 16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [len(r) for r in reads if r] == [1]  # one read of chunk 0, by one of the two
    for lo in (0, 16):
        np.testing.assert_array_equal(out[lo], np.arange(lo * 8, (lo + 16) * 8).reshape(16, 8))


def test_a_failed_claimed_read_lets_the_waiter_read_it_itself():
    cache = _cache.ChunkCache(1 << 20)
    key = ("s", "x", 0, 4)
    mine, theirs = cache.claim([key])
    assert mine == [key] and theirs == []
    again, waiting = cache.claim([key])
    assert again == [] and [k for k, _ in waiting] == [key]
    cache.release(mine)  # the claimer failed: nothing was put
    assert waiting[0][1].is_set() and cache.get(key) is None
    assert cache.claim([key])[0] == [key]  # free to claim again


GC_IN_A_LOADER = """
import gc, time
from pytreestore._pipelines.prefetch import Prefetcher
gc.disable()
def items():
    i = 0
    while True:
        if i == 4:
            time.sleep(0.2)
            gc.collect()  # in a loader thread, taking the next item: drops the prefetcher
        yield i
        i += 1
p = Prefetcher(lambda i: (time.sleep(0.05), i)[1], items(), depth=4)
p.cycle = p  # only a collection frees it
next(p); next(p)
del p
time.sleep(1)
print("exited")
"""


def test_a_prefetcher_collected_on_its_own_loader_thread_does_not_hang_the_exit():
    """A garbage collection on a loader thread, while it takes the next item, may finalize
    the prefetcher there: its stop must not wait for loaders that wait for that thread (an
    adversarial review found the process hanging at exit)."""
    import sys

    env = child_env()
    done = interpreters.run(  # ends through the interpreter's own shutdown (tests/interpreters.py)
        [sys.executable, "-c", GC_IN_A_LOADER], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["exited"]


def test_results_ready_are_handed_out_while_the_next_item_is_made():
    """Taking the next item (a shuffle's permutation at an epoch's start, say) does not
    hold up results already loaded."""
    gate = threading.Event()

    def items():
        yield from range(3)
        gate.wait(5)  # the item after them takes long to make
        yield from range(3, 5)

    it = Prefetcher(lambda i: i, items(), depth=4)
    time.sleep(0.2)
    start = time.monotonic()
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    assert time.monotonic() - start < 1.0
    gate.set()
    assert list(it) == [3, 4]
