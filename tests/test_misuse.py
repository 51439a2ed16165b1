"""Misuse that must lose nothing: threads sharing a store, a close that fails, lock leaks,
pickling, fork, a second writer, and opening a store twice in one process (issue 12)."""

import os
import pickle
import re
import shutil
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._location import Location
from pytreestore.backends import get_backend

pytest_plugins = ("tests.fixtures",)


class Point(NamedTuple):
    id: np.ndarray
    xy: np.ndarray


def record(i: int) -> dict[str, np.ndarray]:
    """A record whose every leaf encodes its id, so a torn record shows."""
    return {
        "id": np.int64(i),
        "v": np.full(6, i, np.float64),
        "w": np.int32(-i),
    }


LIKE = record(0)


def assert_whole(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Every row's leaves come from one record; the ids, in stored order."""
    ids = batch["id"]
    np.testing.assert_array_equal(batch["v"], np.repeat(ids[:, None], 6, axis=1).astype(float))
    np.testing.assert_array_equal(batch["w"], -ids.astype(np.int32))
    return ids


# ---- threads -------------------------------------------------------------------------------------


def test_four_threads_extending_one_store_keep_every_record_whole(tmp_path, backend):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, LIKE, chunk_records=16, backend=backend)
    threads_n, calls, per_call = 4, 20, 40
    failures: list[BaseException] = []
    seen: list[np.ndarray] = []
    done = threading.Event()

    def writer(t: int) -> None:
        try:
            for c in range(calls):
                first = (t * calls + c) * per_call
                store.extend(record(i) for i in range(first, first + per_call))
        except BaseException as err:
            failures.append(err)

    def reader() -> None:  # reads on the same object while the writers append
        try:
            while not done.wait(0.2):
                seen.append(assert_whole(store.load(as_numpy=True)))
                if len(seen) % 4 == 1:  # records(): its length is fixed as it starts
                    rows = list(store.records(as_numpy=True))
                    block = {
                        k: np.array([r[k] for r in rows]).reshape(-1, *np.shape(LIKE[k]))
                        for k in LIKE
                    }
                    seen.append(assert_whole(block))
        except BaseException as err:
            failures.append(err)

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
    watcher = threading.Thread(target=reader)
    for th in [*workers, watcher]:
        th.start()
    for th in workers:
        th.join()
    done.set()
    watcher.join()
    assert failures == [] and seen  # the reader ran, and saw only whole records
    store.close()
    total = threads_n * calls * per_call
    reopened = pytreestore.open(path, backend=backend)
    ids = assert_whole(reopened.load(as_numpy=True))
    assert sorted(ids.tolist()) == list(range(total))
    for block in seen:  # what the reader saw was a prefix of what was finally stored
        np.testing.assert_array_equal(block, ids[: len(block)])
    assert reopened.verify().ok


def test_appends_in_threads_keep_each_threads_order_and_flush_is_safe(tmp_path, backend):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, LIKE, chunk_records=8, backend=backend)

    def writer(t: int) -> None:
        for i in range(t * 100, t * 100 + 100):
            store.append(record(i))
            if i % 37 == 0:
                store.flush()

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(3)]
    for th in workers:
        th.start()
    for th in workers:
        th.join()
    store.close()
    ids = assert_whole(pytreestore.open(path, backend=backend).load(as_numpy=True))
    for t in range(3):
        mine = ids[(ids >= t * 100) & (ids < t * 100 + 100)]
        np.testing.assert_array_equal(mine, np.arange(t * 100, t * 100 + 100))


def test_close_waits_for_reads_in_other_threads_and_later_reads_are_refused(tmp_path, backend):
    store = pytreestore.create(str(tmp_path / "s"), LIKE, chunk_records=64, backend=backend)
    store.extend(record(i) for i in range(1000))
    store.flush()
    outcome: list[BaseException] = []
    reads = [0]
    started = threading.Event()

    def reader() -> None:
        try:
            while True:
                assert_whole(store.load(as_numpy=True))
                reads[0] += 1
                started.set()
        except BaseException as err:
            outcome.append(err)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for th in threads:
        th.start()
    started.wait(60)
    store.close()
    for th in threads:
        th.join()
    assert reads[0] > 0 and len(outcome) == 3
    assert all(isinstance(e, errors.ClosedStoreError) for e in outcome), outcome


# ---- a close that fails --------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs (root only; skipped where mounting is refused)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a small tmpfs")
    where = tmp_path / "disk"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fills ``disk`` to the last block; the ballast file to delete to make room again."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    return ballast


WIDE = {"id": np.int64(0), "x": np.zeros(1024, np.float32)}


def wide(i: int) -> dict[str, np.ndarray]:
    return {"id": np.int64(i), "x": np.full(1024, i, np.float32)}


def test_a_failed_close_keeps_the_store_open_and_a_retry_commits(tiny_disk, backend):
    path = str(tiny_disk / "s")
    store = pytreestore.create(path, WIDE, chunk_records=64, codec=None, backend=backend)
    store.extend(wide(i) for i in range(8))
    ballast = fill(tiny_disk)
    with pytest.raises(errors.StorageError, match="No space left on device"):
        store.close()
    assert not store.closed and len(store) == 8 and store.committed == 0
    with pytest.raises(errors.StoreLockedError):  # the lock is still held
        pytreestore.open(path, mode="a", backend=backend)
    ballast.unlink()
    store.close()
    assert store.closed
    got = pytreestore.open(path, backend=backend).load(as_numpy=True)
    np.testing.assert_array_equal(got["id"], np.arange(8))
    np.testing.assert_array_equal(got["x"][:, 0], np.arange(8, dtype=np.float32))
    pytreestore.open(path, mode="a", backend=backend).close()  # the lock was released


def test_with_block_error_and_a_failing_close_keeps_the_blocks_error(tiny_disk, backend):
    path = str(tiny_disk / "s")
    store = pytreestore.create(path, WIDE, chunk_records=64, codec=None, backend=backend)
    ballast = None
    with pytest.raises(KeyError, match="the block's own error") as caught, store:
        store.extend(wide(i) for i in range(5))
        ballast = fill(tiny_disk)
        raise KeyError("the block's own error")
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "failed as well" in notes and "No space left on device" in notes
    assert "call close() again" in notes
    assert not store.closed and len(store) == 5
    assert ballast is not None
    ballast.unlink()
    store.close()
    got = pytreestore.open(path, backend=backend).load(as_numpy=True)
    np.testing.assert_array_equal(got["id"], np.arange(5))


def test_with_block_error_still_commits_what_was_appended(tmp_path, backend):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, LIKE, chunk_records=4, backend=backend)
    with pytest.raises(RuntimeError, match="boom"), store:
        store.extend(record(i) for i in range(6))
        raise RuntimeError("boom")
    assert store.closed
    ids = assert_whole(pytreestore.open(path, backend=backend).load(as_numpy=True))
    np.testing.assert_array_equal(ids, np.arange(6))


# ---- lock leaks ----------------------------------------------------------------------------------


def test_a_huge_chunk_records_is_refused_before_anything_is_written(tmp_path, backend):
    path = tmp_path / "s"
    with pytest.raises(
        errors.ChunkSizeError, match=r"chunk_records=68719476736 .*Nothing was"
    ) as e:
        pytreestore.create(str(path), LIKE, chunk_records=2**36, backend=backend)
    assert isinstance(e.value, ValueError)
    assert re.search(r"at most \d+ here", str(e.value))
    assert not path.exists()
    with pytreestore.create(str(path), LIKE, backend=backend) as store:  # no lock was left
        store.append(record(3))
    assert pytreestore.open(str(path), backend=backend).load(0, as_numpy=True)["id"] == 3


@pytest.mark.plain_files
def test_a_failed_open_for_append_releases_the_lock(tmp_path, backend):
    path = tmp_path / "s"
    with pytreestore.create(str(path), LIKE, chunk_records=4, backend=backend) as store:
        store.extend(record(i) for i in range(6))
    key = store.schema.columns[0].key
    tail = path / key / "c" / "1"
    good = tail.read_bytes()
    tail.write_bytes(b"\x00garbage" * 5)
    with pytest.raises(errors.CorruptStoreError):
        pytreestore.open(str(path), mode="a", backend=backend)
    tail.write_bytes(good)  # repaired: the same process may now append
    with pytreestore.open(str(path), mode="a", backend=backend) as store:
        store.append(record(6))
    ids = assert_whole(pytreestore.open(str(path), backend=backend).load(as_numpy=True))
    np.testing.assert_array_equal(ids, np.arange(7))


def test_double_open_for_append_in_one_process_is_refused_until_closed(tmp_path, backend):
    path = str(tmp_path / "s")
    first = pytreestore.create(path, LIKE, backend=backend)
    with pytest.raises(errors.StoreLockedError, match="open for writing elsewhere"):
        pytreestore.open(path, mode="a", backend=backend)
    first.append(record(0))
    first.close()
    with pytreestore.open(path, mode="a", backend=backend) as second:
        second.append(record(1))
    ids = assert_whole(pytreestore.open(path, backend=backend).load(as_numpy=True))
    np.testing.assert_array_equal(ids, [0, 1])


def test_a_failed_open_for_append_on_s3_deletes_its_lock_object(s3_server, bucket, backend):
    url, kw = f"s3://{bucket}/s", {"backend": backend, "storage_options": s3_server.options}
    with pytreestore.create(url, LIKE, chunk_records=4, **kw) as store:
        store.extend(record(i) for i in range(6))
    raw = get_backend(backend)(Location.parse(url, s3_server.options))
    good = raw.read_bytes("id/c/1")
    assert good is not None
    raw.write_bytes("id/c/1", b"\x00garbage" * 5)
    with pytest.raises(errors.CorruptStoreError):
        pytreestore.open(url, mode="a", **kw)
    assert raw.read_bytes(".pytreestore/lock") is None  # no lock object left naming us
    raw.write_bytes("id/c/1", good)
    with pytreestore.open(url, mode="a", **kw) as store:
        store.append(record(6))
    reader = pytreestore.open(url, **kw)
    np.testing.assert_array_equal(assert_whole(reader.load(as_numpy=True)), np.arange(7))
    copy = pickle.loads(pickle.dumps(reader))  # a reader on S3 pickles with its options
    assert copy.reopen_options()["storage_options"]["endpoint"] == s3_server.options["endpoint"]
    np.testing.assert_array_equal(copy.load(as_numpy=True)["id"], np.arange(7))


# ---- pickling ------------------------------------------------------------------------------------


def test_a_writer_refuses_to_pickle(tmp_path, backend):
    store = pytreestore.create(str(tmp_path / "s"), LIKE, backend=backend)
    store.append(record(0))
    with pytest.raises(errors.UnpicklableStoreError, match=re.escape("mode='a'")) as e:
        pickle.dumps(store)
    assert isinstance(e.value, TypeError) and "open a reader" in str(e.value)
    store.close()  # the writer is untouched: its record is committed on close
    assert len(pytreestore.open(str(tmp_path / "s"), backend=backend)) == 1


def test_a_reader_pickles_by_location_and_options(tmp_path, backend):
    path = str(tmp_path / "s")
    writer = pytreestore.create(path, Point(np.int64(0), np.zeros(2, np.float32)), backend=backend)
    writer.extend(Point(np.int64(i), np.full(2, i, np.float32)) for i in range(3))
    writer.flush()
    cache = {"cache_bytes": 1 << 20} if backend == "tensorstore" else {}
    reader = pytreestore.open(path, backend=backend, generic=True, **cache)
    copy = pickle.loads(pickle.dumps(reader))
    options = copy.reopen_options()
    assert options["backend"] == backend and options["generic"] is True
    assert options.get("cache_bytes") == cache.get("cache_bytes")
    got = copy.load(as_numpy=True)
    assert isinstance(got, dict)  # generic: a NamedTuple comes back as a dict
    np.testing.assert_array_equal(got["id"], np.arange(3))
    writer.append(Point(np.int64(3), np.full(2, 3, np.float32)))
    writer.close()
    later = pickle.loads(pickle.dumps(reader))  # reopened: sees the newer commit
    assert len(later) == 4 and copy.mode == later.mode == "r"


def test_a_grain_source_pickles_with_its_backend_and_buffered_records(tmp_path, backend):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, LIKE, backend=backend)
    store.extend(record(i) for i in range(5))  # buffered, not yet committed
    source = pickle.loads(pickle.dumps(store.grain_source(columns="['id']")))
    assert source._store.reopen_options()["backend"] == backend
    assert len(source) == 5 and int(source[4]["id"]) == 4 and source[4]["v"] is None
    store.close()


# ---- fork ----------------------------------------------------------------------------------------


def run_in_child(body) -> int:
    """Forks; the child runs ``body`` and exits with its return value (99 on an exception,
    -9 if it is still running after a minute)."""
    with warnings.catch_warnings():  # JAX warns at every fork once its backend is up
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 99
        try:
            code = body()
        finally:
            os._exit(code)
    for _ in range(1200):  # a child that hangs (a writer's I/O after fork) is killed at 60 s
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -signal.SIGKILL


@pytest.mark.forked_reads
def test_a_forked_child_cannot_use_or_release_the_parents_writer(tmp_path, backend):
    path = str(tmp_path / "s")
    # uncompressed: TensorStore's own reads abort in a forked child (it does not support fork)
    store = pytreestore.create(path, LIKE, chunk_records=4, codec=None, backend=backend)
    store.extend(record(i) for i in range(3))

    def child() -> int:
        calls = [
            lambda: store.append(record(100)),
            lambda: store.extend([record(100)]),
            lambda: store.extend_batch({k: v[None] for k, v in record(100).items()}),
            store.flush,
        ]
        refused = 0
        for call in calls:
            try:
                call()
            except errors.ForkedWriterError as err:
                refused += "forked" in str(err) and "Open the store again" in str(err)
        # reads see the records committed before the fork, never flushing the parent's buffer
        committed = assert_whole(store.load(as_numpy=True)).tolist() == [0, 1, 2]
        store.close()  # drops the child's copy; must not unlock or flush the parent's
        del calls
        return 10 * committed + refused

    store.flush()
    store.append(record(3))  # buffered in the parent at the fork: the child must not write it
    assert run_in_child(child) == 14
    with pytest.raises(errors.StoreLockedError):  # the parent still holds its lock
        pytreestore.open(path, mode="a", backend=backend)
    assert store.committed == 3
    store.append(record(4))
    store.close()
    ids = assert_whole(pytreestore.open(path, backend=backend).load(as_numpy=True))
    np.testing.assert_array_equal(ids, np.arange(5))


def test_a_forked_child_leaves_the_parents_s3_lock_object(s3_server, bucket):
    url, kw = f"s3://{bucket}/s", {"backend": "zarr", "storage_options": s3_server.options}
    store = pytreestore.create(url, LIKE, **kw)
    store.append(record(0))
    raw = get_backend("zarr")(Location.parse(url, s3_server.options))
    held = raw.read_bytes(".pytreestore/lock")

    def child() -> int:
        store.close()  # the child's copy only: no flush, no delete of the lock object
        return 7

    assert held is not None and run_in_child(child) == 7
    assert raw.read_bytes(".pytreestore/lock") == held
    store.append(record(1))
    store.close()
    assert raw.read_bytes(".pytreestore/lock") is None
    np.testing.assert_array_equal(pytreestore.open(url, **kw).load(as_numpy=True)["id"], [0, 1])


# ---- a second writer -----------------------------------------------------------------------------


def test_a_second_writer_after_the_lock_file_is_deleted_cannot_lose_commits(tmp_path, backend):
    path = tmp_path / "s"
    with pytreestore.create(str(path), LIKE, chunk_records=8, backend=backend) as store:
        store.extend(record(i) for i in range(5))
    first = pytreestore.open(str(path), mode="a", backend=backend)
    (path / ".pytreestore" / "lock").unlink()
    second = pytreestore.open(str(path), mode="a", backend=backend)
    first.extend(record(i) for i in range(5, 25))
    first.flush()
    with pytest.raises(errors.CommitConflictError, match="another writer"):
        second.extend(record(i) for i in range(1000, 1020))  # commits whole chunks
        second.flush()
    first.close()
    ids = assert_whole(pytreestore.open(str(path), backend=backend).load(as_numpy=True))
    np.testing.assert_array_equal(ids, np.arange(25))
    assert pytreestore.open(str(path), backend=backend).verify().ok


def test_a_fork_while_the_background_writer_writes_leaves_both_whole(tmp_path):
    """A child forked while a full chunk is being written on the parent's background thread
    (issue 32): the child's appends are refused and its close returns at once; the parent's
    chunk lands, and every record is kept."""
    path = str(tmp_path / "s")
    store = pytreestore.create(path, LIKE, chunk_records=4, codec=None)
    backend = store._core.backend
    real, writing, release = backend.write, threading.Event(), threading.Event()

    def slow_write(keys, start, blocks):
        writing.set()
        release.wait(30)
        return real(keys, start, blocks)

    backend.write = slow_write
    for i in range(5):  # the fifth hands the first chunk to the background writer
        store.append(record(i))
    assert writing.wait(30)

    def child() -> int:
        refused = 0
        try:
            store.append(record(100))
        except errors.ForkedWriterError:
            refused = 1
        store.close()  # the parent's writer and its thread: nothing to wait for here
        return refused

    try:
        assert run_in_child(child) == 1
    finally:
        release.set()
    store.close()
    ids = assert_whole(pytreestore.open(path).load(as_numpy=True))
    np.testing.assert_array_equal(ids, np.arange(5))
