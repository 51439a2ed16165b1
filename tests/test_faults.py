"""Faults: the S3 server going away in the middle of a flush, a full disk, and what a writer
does afterwards. Each time the writer gets a clear :class:`StorageError`, what was committed
before stays readable, and the failed call can be retried once storage is back.

(Damaged chunks and metadata are in ``test_verify.py``.)
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore.testing.s3 import OutageProxy

pytest_plugins = ("tests.fixtures",)
FAST_FAIL = {"max_retries": 2, "retry_delay": 0.02, "retry_max_delay": 0.1}
WIDE = {f"c{k}": np.zeros(8, np.float32) for k in range(24)}


def wide(i: int) -> dict[str, np.ndarray]:
    return {f"c{k}": np.full(8, i * 100 + k, np.float32) for k in range(24)}


def wide_batch(start: int, stop: int) -> dict[str, np.ndarray]:
    i = np.arange(start, stop, dtype=np.float32)[:, None]
    return {f"c{k}": np.repeat(i * 100 + k, 8, axis=1) for k in range(24)}


def assert_wide(store, n: int) -> None:
    assert len(store) == n
    got = store.load(as_numpy=True)
    for key, column in wide_batch(0, n).items():
        np.testing.assert_array_equal(got[key], column, err_msg=key)


# ---- S3 outages ----------------------------------------------------------------------------------


@pytest.fixture
def outage(s3_server):
    with OutageProxy(s3_server.port) as proxy:
        yield proxy, dict(s3_server.options, endpoint=proxy.endpoint, **FAST_FAIL)


@pytest.mark.s3
def test_s3_server_stopped_in_the_middle_of_a_flush(outage, bucket):
    proxy, opts = outage
    url = f"s3://{bucket}/outage"
    store = pytreestore.create(url, WIDE, chunk_records=512, storage_options=opts)
    store.extend_batch(wide_batch(0, 40))
    store.flush()
    rng, n, failed = random.Random(5), 40, None
    for _ in range(20):  # until the outage lands inside a flush
        store.extend_batch(wide_batch(n, n + 50))
        timer = threading.Timer(rng.uniform(0.0, 0.08), proxy.down)
        timer.start()
        try:
            store.flush()
        except errors.StorageError as err:
            failed = err
        timer.join()
        proxy.up()
        if failed:
            break
        n += 50
    assert failed is not None, "the outage never landed inside a flush"
    assert "failed" in str(failed) and "retry" in str(failed)
    assert isinstance(failed, OSError)
    # the server is back: everything committed before the failed flush is there
    reader = pytreestore.open(url, storage_options=opts)
    assert len(reader) in (n, n + 50)  # the commit record itself may have landed
    assert_wide(reader, len(reader))
    # and the failed flush can be retried
    store.flush()
    assert reader.refresh() == n + 50
    assert_wide(reader, n + 50)
    store.extend_batch(wide_batch(n + 50, n + 60))
    store.close()
    assert_wide(pytreestore.open(url, storage_options=opts), n + 60)
    assert pytreestore.open(url, storage_options=opts).verify().ok


@pytest.mark.s3
def test_s3_server_down_before_a_flush_then_back(outage, bucket):
    proxy, opts = outage
    url = f"s3://{bucket}/down"
    store = pytreestore.create(url, WIDE, chunk_records=16, storage_options=opts)
    store.extend(wide(i) for i in range(20))
    store.flush()
    store.extend(wide(i) for i in range(20, 25))
    proxy.down()
    with pytest.raises(errors.StorageError, match=r"(?s)failed: .*retry"):
        store.flush()
    with pytest.raises(errors.StorageError):
        pytreestore.open(url, storage_options=opts)
    proxy.up()
    assert_wide(pytreestore.open(url, storage_options=opts), 20)
    store.flush()
    assert_wide(pytreestore.open(url, storage_options=opts), 25)
    store.close()


@pytest.mark.s3
def test_an_extend_that_fails_on_storage_appends_nothing(outage, bucket):
    """All or none holds for storage failures too: after an extend() refused by a dead
    server, a later flush commits none of that call's records."""
    proxy, opts = outage
    url = f"s3://{bucket}/extend"
    store = pytreestore.create(url, WIDE, chunk_records=8, storage_options=opts)
    store.extend(wide(i) for i in range(5))  # 5 buffered, not committed
    proxy.down()
    with pytest.raises(errors.StorageError):
        store.extend(wide(i) for i in range(5, 30))  # crosses chunks: needs the server
    proxy.up()
    assert len(store) == 5
    store.extend(wide(i) for i in range(5, 12))
    store.close()
    assert_wide(pytreestore.open(url, storage_options=opts), 12)


# ---- a full disk -----------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs, mounted for the test (root only; skipped where mounting is refused)."""
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


@pytest.mark.parametrize("backend", ["tensorstore", "ocdbt"])
def test_a_full_disk_during_a_flush(small_disk, backend):
    """Nothing committed is lost and the failed call can be retried; on OCDBT the failed
    commit (its root included) lands not at all."""
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (200 << 10))
    path = str(small_disk / "store")
    like = {"x": np.zeros(1024, np.float32), "n": np.int64(0)}
    store = pytreestore.create(path, like, chunk_records=32, codec=None, backend=backend)
    rng, n, failed, call = np.random.default_rng(0), 0, None, None
    while failed is None and n < 10_000:
        batch = {"x": rng.random((24, 1024), dtype=np.float32), "n": np.arange(n, n + 24)}
        for call in (functools.partial(store.extend_batch, batch), store.flush):
            try:
                call()
            except errors.StorageError as err:
                failed = err
                break
        else:
            n += 24
    assert failed is not None, "the disk never filled"
    assert "No space left on device" in str(failed) and "retry" in str(failed)
    committed = store.committed
    reader = pytreestore.open(path)
    assert len(reader) == committed
    got = reader.load(as_numpy=True, columns="['n']")["n"]
    np.testing.assert_array_equal(got, np.arange(committed))
    assert reader.verify().ok
    if backend == "ocdbt":  # the root is part of each commit: in step with the last one
        root = json.loads(reader._backend.read_bytes("zarr.json") or b"")
        assert root["consolidated_metadata"]["metadata"]["n"]["shape"] == [committed]
    ballast.unlink()  # make room, and retry the call that failed
    call()
    store.flush()
    assert reader.refresh() == n + 24
    np.testing.assert_array_equal(reader.load(as_numpy=True)["n"], np.arange(n + 24))
    store.close()
    assert pytreestore.open(path).verify().ok
    assert not list(Path(path).rglob("*.__lock"))  # no temporary files left behind


def test_an_unreachable_endpoint_fails_fast_and_clearly(tmp_path):
    from pytreestore.testing.s3 import free_port

    opts = {"endpoint": f"http://127.0.0.1:{free_port()}", "region": "us-east-1", **FAST_FAIL}
    start = time.monotonic()
    with pytest.raises(errors.StorageError, match=r"Could not connect|Failed to connect"):
        pytreestore.open("s3://some-bucket/x", storage_options=opts)
    assert time.monotonic() - start < 10


@pytest.mark.s3
def test_an_extend_cut_off_after_some_chunks_appends_nothing(outage, bucket):
    """The server goes away while an extend() is writing chunks: the rows buffered before the
    call are restored from memory (storage is not there to read them from), and none of the
    call's records are ever committed."""
    proxy, opts = outage
    url = f"s3://{bucket}/cut"
    store = pytreestore.create(url, WIDE, chunk_records=4, storage_options=opts)
    store.extend(wide(i) for i in range(6))  # 4 committed, 2 buffered

    def records():
        for i in range(6, 40):
            if i == 20:
                proxy.down()  # chunks up to record 16 are written by now
            yield wide(i)

    with pytest.raises(errors.StorageError):
        store.extend(records())
    proxy.up()
    assert len(store) == 6
    store.extend(wide(i) for i in range(6, 9))
    store.close()
    assert_wide(pytreestore.open(url, storage_options=opts), 9)


def test_partial_writes_of_a_killed_writer_are_removed_on_open(tmp_path):
    """TensorStore's file kvstore writes a key through ``<key>.__lock``; a writer killed in
    between leaves the file, which the next write of that key would reuse untruncated."""
    path = tmp_path / "s"
    with pytreestore.create(path, WIDE, chunk_records=4) as store:
        store.extend(wide(i) for i in range(6))
    chunk = path / "c3" / "c" / "1" / "0"
    (chunk.parent / "0.__lock").write_bytes(3 * chunk.read_bytes())
    (path / "c3" / "zarr.json.__lock").write_bytes(b"x" * 5000)
    (path / ".pytreestore" / "commit.json.__lock").write_bytes(b'{"records": 99999}' * 9)
    with pytreestore.open(path, mode="a") as store:
        store.extend(wide(i) for i in range(6, 11))
    assert not list(path.rglob("*.__lock"))
    reader = pytreestore.open(path)
    assert_wide(reader, 11)
    assert reader.verify().ok


# ---- issue 12: object-storage timeouts (a closed port, and a server that never answers) -------


@pytest.fixture
def silent_server():
    """A socket on 127.0.0.1 that accepts connections and never sends a byte."""
    import socket

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def test_timeouts_default_to_failing_within_a_minute():
    from pytreestore._location import GCSOptions, S3Options

    for cls in (S3Options, GCSOptions):
        opts = cls()
        assert (opts.connect_timeout, opts.request_timeout, opts.total_timeout) == (10, 30, 45)
    with pytest.raises(errors.BadLocationError, match="must be a number of seconds > 0"):
        pytreestore.open("s3://some-bucket/x", storage_options={"total_timeout": 0})


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_closed_port_fails_within_the_total_timeout(monkeypatch, backend):
    from pytreestore.testing.s3 import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    opts = {"endpoint": f"http://127.0.0.1:{free_port()}", "region": "us-east-1"}
    opts["total_timeout"] = 0.5  # TensorStore alone would retry 32 times, for minutes
    with pytest.raises(errors.StorageError, match=r"total_timeout|error sending request") as info:
        pytreestore.open("s3://some-bucket/x", backend=backend, storage_options=opts)
    assert "retry the call" in str(info.value)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_server_that_never_answers_fails_within_the_total_timeout(
    monkeypatch, silent_server, backend
):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    opts = {"endpoint": silent_server, "region": "us-east-1", "request_timeout": 1}
    opts["total_timeout"] = 1
    with pytest.raises(errors.StorageError, match=r"total_timeout|Timeout|error sending request"):
        pytreestore.create("s3://some-bucket/x", {"x": 0}, backend=backend, storage_options=opts)
