"""Background jobs end with their owner and before the interpreter does (issue 28, defect 5).

A script that stopped iterating ``store.batches()`` early and ended was killed with SIGABRT
("terminate called without an active exception", exit 134): the prefetch thread, kept alive
by the iterator it fed, was still inside a TensorStore read when Python finalized. Each
scenario runs as its own process (``tests/exit_child.py``): every exit status must be the
script's own and standard error free of any abort.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import _threads as background
from tests import interpreters
from tests.conftest import child_env

HERE = Path(__file__).parent
ENDINGS = ("break", "exit", "del", "caught", "raise")
ABORTS = ("terminate called", "Aborted", "Fatal Python error", "core dumped")


@pytest.fixture
def store(tmp_path):
    s = pytreestore.create(tmp_path / "s", {"i": np.int32(0)}, chunk_records=4)
    s.extend({"i": np.int32(k)} for k in range(64))
    s.flush()
    return s


class _Jobs:
    """The loading jobs of an iterator's prefetcher (several load side by side)."""

    def __init__(self, jobs: list[background.Job]) -> None:
        assert jobs, "prefetch > 0 runs background jobs"
        self.jobs = jobs

    @property
    def ended(self) -> bool:
        return all(j.ended for j in self.jobs)

    @property
    def stopping(self) -> threading.Event:
        stopped = threading.Event()
        if all(j.stopping.is_set() for j in self.jobs):
            stopped.set()
        return stopped


def _job(it: pytreestore.BatchIterator) -> _Jobs:
    return _Jobs(it._prefetcher._jobs)


def test_dropping_an_iterator_mid_way_stops_its_job(store):
    it = store.batches(2, prefetch=3, shuffle=True)
    assert np.asarray(next(it)["i"]).shape == (2,)
    job, ref = _job(it), weakref.ref(it)
    del it  # nothing else holds it: the job holds neither the iterator nor its prefetcher
    assert ref() is None
    assert job.ended and job.stopping.is_set()


def test_break_out_of_a_loop_stops_the_job(store):
    jobs = []

    def first_batch():
        it = store.batches(2, prefetch=3)
        jobs.append(_job(it))
        for batch in it:
            return np.asarray(batch["i"]).tolist()

    assert first_batch() == [0, 1]
    gc.collect()  # not needed by CPython's reference counts; other interpreters
    assert jobs[0].ended


def test_with_block_and_close_stop_the_job(store):
    with store.batches(2, prefetch=3) as it:
        assert np.asarray(next(it)["i"]).tolist() == [0, 1]
    assert _job(it).ended
    assert list(it) == []
    other = store.batches(2, prefetch=3)
    other.close()
    assert _job(other).ended and list(other) == []


def test_stop_all_ends_every_job_and_the_iterator(store):
    it = store.batches(2, prefetch=3)
    next(it)
    background.stop_all()  # what the exit hook does
    try:
        assert _job(it).ended
        got = [np.asarray(b["i"]).tolist() for b in it]  # what was prefetched, then the end
        assert len(got) <= 4 and all(len(b) == 2 for b in got)
    finally:
        background._EXITING.clear()  # this process goes on


def test_a_job_never_waits_for_itself():
    seen = []

    def work(stopping: threading.Event) -> None:
        own.join()  # returns at once on the job's own thread
        seen.append(True)

    own = background.start(work)
    own.join()
    assert seen == [True] and own.ended


FORK = """
import os, signal
from pytreestore._pipelines.prefetch import Prefetcher
from pytreestore.errors import ForkedIteratorError
assert list(Prefetcher(lambda i: i, iter(range(3)), 2)) == [0, 1, 2]  # a thread to reuse
inherited = Prefetcher(lambda i: i, iter(range(1000)), 2)
assert next(inherited) == 0
pid = os.fork()
if pid == 0:
    signal.alarm(60)  # a hang ends the child with SIGALRM
    fresh = list(Prefetcher(lambda i: 2 * i, iter(range(3)), 2))
    rest = []
    try:
        rest.extend(inherited)  # what was loaded before the fork, then an error
    except ForkedIteratorError as err:
        ok = "made before os.fork()" in str(err)
    else:
        ok = False  # it ended as if all 1000 were loaded: a silent loss
    inherited.close()
    ok = ok and fresh == [0, 2, 4] and rest == list(range(1, len(rest) + 1))
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
inherited.close()
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_starts_its_own_threads():
    env = child_env()
    done = interpreters.run(
        [sys.executable, "-c", FORK], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["child", "0"]  # was a hang: the job went to a dead thread


def _run_child(where: str, reader: str, ending: str) -> tuple[str, int, str]:
    env = child_env()
    args = [sys.executable, str(HERE / "exit_child.py"), where, reader, ending]
    done = interpreters.run(args, capture_output=True, text=True, env=env, timeout=300)
    return f"{where} {reader} {ending}", done.returncode, done.stderr


def _scenarios(tmp_path: Path, repeats: int, every: bool = True) -> list[tuple[str, str, str]]:
    """Each ending of batches, on memory:// and on files (``every``), or on one of them, in
    turn; Grain's loader left live."""
    found = []
    for k in range(repeats):
        found.append(("memory", "grain", "exit"))
        for i, where in enumerate(("memory", "file")):
            for ending in ENDINGS if every else ENDINGS[i::2]:
                folder = str(tmp_path / f"{ending}-{k}") if where == "file" else where
                if where == "file":
                    os.makedirs(folder)
                found.append((folder, "batches", ending))
    return found


def _check_exits(tmp_path: Path, repeats: int, every: bool = True) -> int:
    scenarios = _scenarios(tmp_path, repeats, every)
    with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(lambda s: _run_child(*s), scenarios))
    bad = []
    for name, code, err in results:
        expected = 1 if name.endswith(" raise") else 0
        aborted = [text for text in ABORTS if text in err]
        if code != expected or aborted or (expected and "an error inside the loop" not in err):
            bad.append(f"{name}: exit {code} (expected {expected}); stderr tail: {err[-600:]}")
    assert not bad, f"{len(bad)} of {len(results)} scripts:\n" + "\n".join(bad)
    return len(results)


def test_scripts_ending_with_live_prefetch_exit_cleanly(tmp_path):
    """Every ending once, on memory:// or on files in turn (each script is an interpreter
    starting JAX); ``make test-long`` runs every ending on both, many times."""
    pytest.importorskip("grain")
    assert _check_exits(tmp_path, repeats=1, every=False) == len(ENDINGS) + 1


@pytest.mark.slow
def test_scripts_ending_with_live_prefetch_exit_cleanly_many_times(tmp_path):
    pytest.importorskip("grain")
    repeats = int(os.environ.get("PYTREESTORE_EXIT_REPEATS", 8))
    assert _check_exits(tmp_path, repeats) == repeats * (2 * len(ENDINGS) + 1)
