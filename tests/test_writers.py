"""One writer per store: a second writer is refused, a dead writer's lock is broken safely,
and two writers can never both commit, even when the lock is broken by force.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._log.locks import LOCK_KEY
from tests.trial_harness import differences, expected, read_log, record, wait_for

pytest_plugins = ("tests.fixtures",)
LOCKED = "is open for writing elsewhere"


def hold(zygote, tmp_path, path, name="holder", opts=None, append=0):
    log = tmp_path / f"{name}.log"
    pid = zygote.start(kind="hold", path=path, log=str(log), storage_options=opts, append=append)
    lines = wait_for(log, "held")
    assert lines[-1].startswith("held"), lines
    return pid


def make(path, opts=None, n=3, chunk=4):
    with pytreestore.create(path, record(0), chunk_records=chunk, storage_options=opts) as s:
        s.extend(record(i) for i in range(n))


def assert_records(path, n, opts=None):
    store = pytreestore.open(path, storage_options=opts)
    assert len(store) == n
    assert not differences(store.load(as_numpy=True), expected(0, n))


# ---- local disk ------------------------------------------------------------------------------------


def test_a_second_writer_process_is_refused_locally(zygote, tmp_path):
    path = str(tmp_path / "s")
    make(path)
    pid = hold(zygote, tmp_path, path)
    with pytest.raises(errors.StoreLockedError, match=re.escape(LOCKED)):
        pytreestore.open(path, mode="a")
    assert len(pytreestore.open(path)) == 3  # readers are never refused
    zygote.kill(pid)


def test_this_process_holding_the_lock_refuses_a_child(zygote, tmp_path):
    path = str(tmp_path / "s")
    make(path)
    writer = pytreestore.open(path, mode="a")
    log = tmp_path / "child.log"
    pid = zygote.start(kind="hold", path=path, log=str(log))
    assert zygote.wait(pid) == 0
    word, kind, message = read_log(log)[-1].split(" ", 2)
    assert (word, kind) == ("error", "StoreLockedError") and LOCKED in message
    writer.close()


def test_a_killed_writer_leaves_no_stale_lock_locally(zygote, tmp_path):
    path = str(tmp_path / "s")
    make(path)
    pid = hold(zygote, tmp_path, path, append=5)
    zygote.kill(pid)
    with pytreestore.open(path, mode="a") as store:  # no wait, no manual cleanup
        assert len(store) == 8
        store.append(record(8))
    assert_records(path, 9)
    assert (tmp_path / "s" / LOCK_KEY).read_text().strip().isdigit()


def test_two_writers_in_one_process_are_refused(tmp_path):
    for path in (str(tmp_path / "s"), "memory://two-writers"):
        first = pytreestore.create(path, {"x": 0})
        with pytest.raises(errors.StoreLockedError, match=re.escape(LOCKED)):
            pytreestore.open(path, mode="a")
        first.close()
        pytreestore.open(path, mode="a").close()  # released by close


def test_commits_are_checked_even_without_the_lock(tmp_path):
    """If the lock fails (a network file system without flock), the commit check still
    keeps two writers from both committing."""
    path = str(tmp_path / "s")
    make(path, n=2)
    a = pytreestore.open(path, mode="a")
    a._lock.release()  # as if the file system had not kept the lock
    b = pytreestore.open(path, mode="a")
    b.extend([record(2), record(3)])
    b.flush()
    a.append(record(99))
    with pytest.raises(errors.CommitConflictError, match="another writer"):
        a.flush()
    assert_records(path, 4)
    b.close()


# ---- S3 ---------------------------------------------------------------------------------------------


@pytest.mark.s3
def test_a_second_writer_is_refused_on_s3_naming_the_holder(zygote, tmp_path, s3_server, bucket):
    path, opts = f"s3://{bucket}/s", s3_server.options
    make(path, opts)
    pid = hold(zygote, tmp_path, path, opts=opts)
    with pytest.raises(errors.StoreLockedError, match=rf"held by pid {pid} on host .* since "):
        pytreestore.open(path, mode="a", storage_options=opts)
    assert len(pytreestore.open(path, storage_options=opts)) == 3
    zygote.kill(pid)


@pytest.mark.s3
def test_a_killed_writers_lock_on_s3_is_broken_safely(zygote, tmp_path, s3_server, bucket):
    path, opts = f"s3://{bucket}/s", s3_server.options
    make(path, opts)
    pid = hold(zygote, tmp_path, path, opts=opts, append=4)
    zygote.kill(pid)
    with pytreestore.open(path, mode="a", storage_options=opts) as store:
        assert len(store) == 7
        store.append(record(7))
        holder = store._backend.read_bytes(LOCK_KEY)
        assert f'"pid": {pid},' not in holder.decode()
    assert_records(path, 8, opts)
    assert store._backend.read_bytes(LOCK_KEY) is None  # released on close


@pytest.mark.s3
def test_break_lock_takes_over_and_the_old_writer_cannot_commit(s3_server, bucket):
    path, opts = f"s3://{bucket}/s", s3_server.options
    make(path, opts, n=2)
    old = pytreestore.open(path, mode="a", storage_options=opts)
    with pytest.raises(errors.StoreLockedError):
        pytreestore.open(path, mode="a", storage_options=opts)
    with pytest.raises(ValueError, match="break_lock=True takes the writer lock"):
        pytreestore.open(path, break_lock=True, storage_options=opts)
    new = pytreestore.open(path, mode="a", break_lock=True, storage_options=opts)
    new.extend([record(2), record(3)])
    new.flush()
    old.append(record(50))
    with pytest.raises(errors.CommitConflictError, match="another writer"):
        old.flush()
    new.close()
    with pytest.raises(errors.CommitConflictError):
        old.close()  # closes all the same, and leaves the new holder's lock alone
    assert old.closed
    assert_records(path, 4, opts)


@pytest.mark.s3
def test_an_unreadable_lock_object_is_held_until_broken(s3_server, bucket):
    path, opts = f"s3://{bucket}/s", s3_server.options
    make(path, opts)
    backend = pytreestore.open(path, storage_options=opts)._backend
    backend.write_bytes(LOCK_KEY, b"\x00garbage")
    with pytest.raises(errors.StoreLockedError, match="lock object cannot be read"):
        pytreestore.open(path, mode="a", storage_options=opts)
    pytreestore.open(path, mode="a", break_lock=True, storage_options=opts).close()


@pytest.mark.s3
def test_racing_writers_on_s3_exactly_one_commits(zygote, tmp_path, s3_server, bucket):
    """Four processes take the lock over one after another (break_lock=True), then all
    flush at the same moment from the same commit: exactly one commits. The others fail at
    their resize (another writer grew the columns) or at the commit record."""
    path, opts = f"s3://{bucket}/race", s3_server.options
    make(path, opts, n=5, chunk=64)  # nothing commits before the start: no chunk fills
    go = tmp_path / "go"
    logs, pids = [], []
    for w in range(4):
        log = tmp_path / f"race{w}.log"
        pids.append(
            zygote.start(
                kind="race",
                path=path,
                log=str(log),
                go=str(go),
                append=3 + w,
                storage_options=opts,
            )
        )
        wait_for(log, "ready")
        logs.append(log)
    go.touch()
    for pid in pids:
        assert zygote.wait(pid) == 0
    outcomes = [read_log(log)[-1].split()[0] for log in logs]
    assert sorted(outcomes) == ["committed", "conflict", "conflict", "conflict"], outcomes
    winner = outcomes.index("committed")
    store = pytreestore.open(path, storage_options=opts)
    assert len(store) == 5 + 3 + winner
    np.testing.assert_array_equal(store.load(as_numpy=True)["i"][:5], np.arange(5))


def test_commits_are_checked_when_the_lock_is_lost_mid_write(tmp_path):
    """Same, with the loser's records crossing the winner's: the loser fails at its resize."""
    path = str(tmp_path / "s")
    make(path, n=2, chunk=64)
    a = pytreestore.open(path, mode="a")
    a._lock.release()
    b = pytreestore.open(path, mode="a")
    a.extend([record(i) for i in range(2, 5)])
    b.extend([record(i) for i in range(2, 9)])
    b.flush()
    with pytest.raises(errors.CommitConflictError, match="has grown since this writer"):
        a.flush()
    assert_records(path, 9)
    b.close()
