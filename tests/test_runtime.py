"""The runtime object (pytreestore/_runtime.py): one place for the thread pools, cache budgets
and tuning constants (issue 45), each knob with its reason and read where it is used."""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import _runtime
from pytreestore._pipelines.prefetch import auto_depth
from pytreestore._runtime import RUNTIME, ExitSafePool, Runtime
from tests.conftest import child_env

PACKAGE = Path(pytreestore.__file__).parent
GROUPS = [f.name for f in dataclasses.fields(Runtime) if not f.name.startswith("_")]


def _knobs() -> list[tuple[str, str]]:
    """``(group, knob)`` of every knob of :data:`RUNTIME`."""
    return [
        (group, f.name) for group in GROUPS for f in dataclasses.fields(getattr(RUNTIME, group))
    ]


def test_every_knob_says_why_it_has_its_value():
    tree = ast.parse(Path(_runtime.__file__).read_text())
    lines = Path(_runtime.__file__).read_text().splitlines()
    unexplained = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for field in (n for n in cls.body if isinstance(n, ast.AnnAssign)):
            if cls.name != "Runtime" and not lines[field.lineno - 2].strip().startswith("#:"):
                unexplained.append(f"{cls.name}.{ast.unparse(field.target)}")
    assert unexplained == []
    assert len(_knobs()) >= 40


def test_every_knob_is_read_by_the_package():
    """A knob nobody reads would be a constant that lies about what tunes the package (the
    kept pools' sizes are read by the runtime itself, as it makes the pools)."""
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    unread = [
        f"{g}.{k}"
        for g, k in _knobs()
        if f"RUNTIME.{g}.{k}" not in source and f"self.{g}.{k}" not in source
    ]
    assert unread == []


def test_a_kept_pool_is_made_once_with_its_knobs_size():
    runtime = Runtime()
    runtime.threads.slab_readers = 2
    pool = runtime.slab_pool()
    assert runtime.slab_pool() is pool and pool._max_workers == 2
    assert runtime.direct_pool() is not pool
    names = list(pool.map(lambda _: threading.current_thread().name, range(4)))
    assert all(n.startswith("pytreestore-slab") for n in names)
    pool.shutdown()
    runtime.direct_pool().shutdown()


def test_a_kept_pool_is_made_afresh_after_a_fork():
    runtime = Runtime()
    pool = runtime.slab_pool()
    runtime.forget_pools()  # what os.fork's hook does in the child
    assert runtime.slab_pool() is not pool
    pool.shutdown()
    runtime.slab_pool().shutdown()


FORK = """
import os
import numpy as np, pytreestore
from pytreestore._runtime import RUNTIME
store = pytreestore.create("memory://runtime-fork", {"x": np.arange(4)})
store.extend({"x": np.arange(4) + i} for i in range(40))
store.flush()
parent = RUNTIME.slab_pool()
assert parent.submit(lambda: 1).result() == 1  # the parent's pool has threads now
pid = os.fork()
if pid == 0:
    child = RUNTIME.slab_pool()
    ok = child is not parent and child.submit(lambda: 2).result(timeout=60) == 2
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.slow  # a child interpreter importing JAX; forget_pools is tested above
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_forked_child_gets_pools_of_its_own():
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", FORK],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["child", "0"]  # was a hang: work sent to a dead thread


def test_a_call_pool_joins_its_threads_as_its_block_ends():
    with RUNTIME.call_pool(3) as pool:
        threads = set(pool.map(lambda _: threading.current_thread(), range(6)))
    assert threads and not any(t.is_alive() for t in threads)


def test_an_exit_safe_pool_does_refused_work_on_the_caller():
    pool = RUNTIME.loop_pool(1)
    assert isinstance(pool, ExitSafePool)
    pool.shutdown()
    here = threading.current_thread()
    assert pool.submit(threading.current_thread).result() is here


def test_a_thread_is_a_started_daemon():
    seen = []
    started = _runtime.thread(seen.append, (1,), "pytreestore-test")
    started.join(timeout=10)
    assert started.daemon and started.name == "pytreestore-test" and seen == [1]


def test_a_knob_changed_on_the_runtime_changes_what_reads_it(monkeypatch, tmp_path):
    assert auto_depth(4 << 20, cores=16) == 8
    monkeypatch.setattr(RUNTIME.pipelines, "prefetch_loaders", 3)
    assert auto_depth(4 << 20, cores=16) == 3
    monkeypatch.setattr(RUNTIME.pipelines, "prefetch_bytes", 8 << 20)
    assert auto_depth(4 << 20, cores=16) == 2
    # and a whole read: iteration gathers ``RUNTIME.reads.iter_block`` records at a time
    store = pytreestore.create(
        tmp_path / "s", {"x": [np.int32(0)]}, ragged=["['x']"], chunk_records=8
    )
    store.extend({"x": [np.int32(i)] * (i % 3)} for i in range(50))
    store.flush()
    monkeypatch.setattr(RUNTIME.reads, "iter_block", 7)
    assert [len(r["x"]) for r in store] == [i % 3 for i in range(50)]
