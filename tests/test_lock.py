"""The writer lock (``pytreestore._log.locks``): taken, refused while held, given back on
close and on a failed open, and, on S3, a lock object naming its holder that ``break_lock``
takes over."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY, LOCK_KEY
from pytreestore._location import Location
from pytreestore._log import locks as _lock
from pytreestore._log.locks import WriterLock, holder_info, holder_is_dead
from pytreestore.backends import get_backend

pytest_plugins = ("tests.fixtures",)
LIKE = {"x": np.int32(0)}
LOCKED = "is open for writing elsewhere"


# ---- flock, on local disk ------------------------------------------------------------------------


def test_a_flock_lock_is_taken_and_names_its_holder(tmp_path):
    location = Location.parse(str(tmp_path / "s"))
    lock = WriterLock.acquire(location)
    assert lock.owned
    assert (tmp_path / "s" / LOCK_KEY).read_text() == f"{os.getpid()}\n"
    with pytest.raises(errors.StoreLockedError, match=re.escape(LOCKED)) as refused:
        WriterLock.acquire(location)  # another open file description: refused like a process
    assert "open this one with mode='r'" in str(refused.value)
    assert "break_lock" not in str(refused.value)  # local locks die with their holder
    lock.release()
    lock.release()  # a second release does nothing
    WriterLock.acquire(location).release()


def test_a_store_gives_its_lock_back_on_close(tmp_path):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, LIKE)
    with pytest.raises(errors.StoreLockedError):
        pytreestore.open(path, mode="a")
    store.close()
    pytreestore.open(path, mode="a").close()


def test_a_failed_open_for_append_gives_its_lock_back(tmp_path):
    path = str(tmp_path / "s")
    pytreestore.create(path, LIKE).close()
    commit = tmp_path / "s" / COMMIT_KEY
    good = commit.read_bytes()
    commit.write_bytes(b"[]")
    with pytest.raises(errors.CorruptStoreError):
        pytreestore.open(path, mode="a")
    commit.write_bytes(good)
    pytreestore.open(path, mode="a").close()


def test_break_lock_needs_mode_a(tmp_path):
    pytreestore.create(str(tmp_path / "s"), LIKE).close()
    with pytest.raises(ValueError, match="break_lock=True takes the writer lock"):
        pytreestore.open(str(tmp_path / "s"), break_lock=True)


def test_a_memory_lock_is_held_by_name():
    location = Location.parse("memory://test-lock-memory")
    lock = WriterLock.acquire(location)
    with pytest.raises(errors.StoreLockedError, match=re.escape(LOCKED)):
        WriterLock.acquire(location)
    lock.release()
    WriterLock.acquire(location).release()


# ---- who holds a lock ----------------------------------------------------------------------------


def test_this_process_is_alive_and_a_gone_pid_is_dead():
    me = holder_info()
    assert me["pid"] == os.getpid() and not holder_is_dead(me)
    assert holder_is_dead({**me, "pid": 2**22 + 12345})  # no such process
    assert not holder_is_dead({**me, "host": "elsewhere", "pid": 2**22 + 12345})
    assert not holder_is_dead({})


def _fake_proc(root, *, pids=()):
    """A /proc that shows this boot and pid namespace, and only the processes ``pids``."""
    (root / "sys" / "kernel" / "random").mkdir(parents=True)
    (root / "sys" / "kernel" / "random" / "boot_id").write_text("a-boot\n")
    (root / "self" / "ns").mkdir(parents=True)
    (root / "self" / "ns" / "pid").symlink_to("pid:[4026531836]")
    for pid in pids:
        (root / str(pid)).mkdir()
        fields = ["S", *["0"] * 18, "4242", "0"]  # state, ..., start time (field 22)
        (root / str(pid) / "stat").write_text(f"{pid} (python) {' '.join(fields)}\n")
    return root


def test_without_proc_no_holder_is_provably_dead(tmp_path, monkeypatch):
    """No /proc (not Linux): no boot id or pid namespace to compare, so a lock is never taken
    over unasked, even from a pid that is gone."""
    monkeypatch.setattr(_lock, "PROC", str(tmp_path / "no-proc"))
    me = holder_info()
    assert (me["boot_id"], me["pid_ns"], me["pid_start"]) == ("", "", None)
    assert not holder_is_dead(me)
    assert not holder_is_dead({**me, "pid": 2**22 + 12345})


def test_a_process_proc_hides_is_alive(tmp_path, monkeypatch):
    """/proc mounted with hidepid shows the boot but not other users' processes: a holder that
    exists but is not shown cannot be told from a reused pid, so it is alive; a pid with no
    process at all is still provably gone."""
    monkeypatch.setattr(_lock, "PROC", str(_fake_proc(tmp_path / "proc")))
    me = holder_info()
    assert (me["boot_id"], me["pid_ns"]) == ("a-boot", "pid:[4026531836]")
    assert not holder_is_dead(me)  # alive, and /proc/PID/stat not shown
    assert holder_is_dead({**me, "pid": 2**22 + 12345})


def test_proc_tells_a_reused_pid_and_a_zombie(tmp_path, monkeypatch):
    proc = _fake_proc(tmp_path / "proc", pids=[os.getpid()])
    monkeypatch.setattr(_lock, "PROC", str(proc))
    me = holder_info()
    assert me["pid_start"] == 4242 and not holder_is_dead(me)
    assert holder_is_dead({**me, "pid_start": 1})  # this pid now runs another process
    stat = proc / str(os.getpid()) / "stat"
    stat.write_text(stat.read_text().replace(") S ", ") Z "))
    assert holder_is_dead(me)


# ---- the S3 lock object --------------------------------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_an_s3_lock_object_names_its_holder_and_break_lock_takes_it(s3_server, bucket, backend):
    url, kw = f"s3://{bucket}/s", {"backend": backend, "storage_options": s3_server.options}
    pytreestore.create(url, LIKE, **kw).close()
    raw = get_backend(backend)(Location.parse(url, s3_server.options))
    with pytreestore.open(url, mode="a", **kw):
        holder = json.loads(raw.read_bytes(LOCK_KEY) or b"{}")
        assert holder["pid"] == os.getpid()
        alive = {**holder, "host": "another-host"}  # a holder this host cannot prove dead
        raw.write_bytes(LOCK_KEY, json.dumps(alive).encode())
    assert raw.read_bytes(LOCK_KEY) is not None  # our release left the other holder's lock
    with pytest.raises(errors.StoreLockedError, match=r"held by pid \d+ on host 'another-host'"):
        pytreestore.open(url, mode="a", **kw)
    with pytreestore.open(url, mode="a", break_lock=True, **kw) as store:
        store.append(LIKE)
    assert raw.read_bytes(LOCK_KEY) is None
    assert len(pytreestore.open(url, **kw)) == 1


@pytest.mark.s3
def test_an_s3_lock_of_a_dead_holder_here_is_replaced(s3_server, bucket):
    url, opts = f"s3://{bucket}/s", s3_server.options
    pytreestore.create(url, LIKE, storage_options=opts).close()
    raw = get_backend("tensorstore")(Location.parse(url, opts))
    dead = {**holder_info(), "pid": 2**22 + 12345}
    raw.write_bytes(LOCK_KEY, json.dumps(dead).encode())
    pytreestore.open(url, mode="a", storage_options=opts).close()
    assert raw.read_bytes(LOCK_KEY) is None


@pytest.mark.s3
def test_without_proc_an_s3_lock_is_taken_over_only_when_asked(s3_server, bucket, monkeypatch):
    url, opts = f"s3://{bucket}/s", s3_server.options
    pytreestore.create(url, LIKE, storage_options=opts).close()
    raw = get_backend("tensorstore")(Location.parse(url, opts))
    monkeypatch.setattr(_lock, "PROC", "/no-proc-here")
    dead = {**holder_info(), "pid": 2**22 + 12345}
    raw.write_bytes(LOCK_KEY, json.dumps(dead).encode())
    with pytest.raises(errors.StoreLockedError, match="break_lock=True"):
        pytreestore.open(url, mode="a", storage_options=opts)
    assert json.loads(raw.read_bytes(LOCK_KEY) or b"{}") == dead
    pytreestore.open(url, mode="a", storage_options=opts, break_lock=True).close()
    assert raw.read_bytes(LOCK_KEY) is None
