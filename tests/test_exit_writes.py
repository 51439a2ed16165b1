"""A store never closed keeps at the interpreter's exit every record it acknowledged, and the
exit is prompt while a daemon thread still appends (issue 44, items 3 and 8).

Item 3: on the zarr backend, the chunks handed to the background writer at the exit were never
written, silently (zarr-python's files go through a ``ThreadPoolExecutor``, which refuses work
once the interpreter exits: "cannot schedule new futures after shutdown"). Item 8: a daemon
thread appending to a TensorStore store kept the exit waiting for a background job it kept
refilling (a hang), or a job still inside TensorStore as Python finalized aborted the process
("terminate called without an active exception"). Each scenario runs as its own process
(``tests/exit_writer_child.py``), one store per backend and kind of tests/parity/kinds.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import pytreestore
from tests import interpreters
from tests.conftest import child_env
from tests.exit_writer_child import ACKED, APPENDED, DAEMON_KINDS, KINDS
from tests.parity import kinds
from tests.parity.kinds import BACKENDS

CHILD = Path(__file__).parent / "exit_writer_child.py"
ABORTS = ("terminate called", "Aborted", "Fatal Python error", "core dumped", "Traceback")
STORES = [f"{backend}-{kind}" for backend in BACKENDS for kind in KINDS]
#: seconds a child may take to exit once its daemon threads were told of (was: never)
PROMPT = 20.0


def _run(where: Path, ending: str) -> subprocess.CompletedProcess[str]:
    """Runs the child script forked from the test zygote (tests/interpreters.py): it ends through
    the interpreter's own shutdown, as a fresh interpreter does."""
    args = [sys.executable, str(CHILD), str(where), ending]
    return interpreters.run(args, capture_output=True, text=True, env=child_env(), timeout=300)


def _records(where: Path, name: str) -> tuple[int, list]:
    store = pytreestore.open(where / name)
    n = len(store)
    return n, [store[i] for i in range(n)]


@pytest.fixture(scope="module")
def appended(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("appended")
    done = _run(where, "appended")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    pending = {line.split()[1]: int(line.split()[2]) for line in done.stdout.splitlines()}
    assert pending["zarr-fixed"] > 0, "the zarr writer was behind as the script ended"
    return where


@pytest.mark.parametrize("name", STORES)
def test_every_record_appended_without_close_is_committed_at_exit(appended, name):
    """Was 12 of 13 everywhere (the buffered record dropped), fewer on zarr's fixed store (the
    chunks handed over dropped too)."""
    n, got = _records(appended, name)
    assert n == APPENDED
    kinds.assert_same(got, kinds.records(name.split("-", 1)[1], APPENDED))


def _acked_then_exit(child: subprocess.Popen[str]) -> tuple[dict[str, int], float, str]:
    """The counts a ``daemon`` child printed as its main thread returned, the seconds it took
    to exit from then, and its standard error."""
    acked: dict[str, int] = {}
    assert child.stdout is not None
    for line in child.stdout:
        _, name, n = line.split()
        acked[name] = int(n)
        if len(acked) == len(BACKENDS) * len(DAEMON_KINDS):
            break
    told = time.monotonic()
    _, err = child.communicate(timeout=120)
    return acked, time.monotonic() - told, err


def test_a_daemon_thread_appending_at_exit_neither_hangs_nor_aborts_it(tmp_path):
    """Was a hang on every run (a 120 s timeout here), or an abort."""
    args = [sys.executable, "-u", str(CHILD), str(tmp_path), "daemon"]
    with interpreters.popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env()
    ) as child:
        try:
            acked, took, err = _acked_then_exit(child)
        finally:
            child.kill()
    assert child.returncode == 0 and not [a for a in ABORTS if a in err], err
    assert took < PROMPT, f"the exit took {took:.1f} s"
    for name, n in acked.items():
        count, got = _records(tmp_path, name)
        assert count >= n >= ACKED, name  # every record acknowledged before the exit began
        kinds.assert_same(got, kinds.records(name.split("-", 1)[1], count))


def test_an_endless_extend_on_a_daemon_thread_stops_at_exit_and_keeps_what_came_before(tmp_path):
    """Was a wait of the whole exit, then an abort (the thread inside TensorStore as Python
    finalized) and the records appended before the extend lost."""
    start = time.monotonic()
    done = _run(tmp_path, "extending")
    assert done.returncode == 0, done.stderr
    assert not [a for a in ABORTS[:-1] if a in done.stderr], done.stderr
    assert "ClosedStoreError: the interpreter is exiting: extend() stopped" in done.stderr
    assert "could not commit" not in done.stderr
    for backend in BACKENDS:
        for kind in DAEMON_KINDS:
            n, got = _records(tmp_path, f"{backend}-{kind}")
            assert n == ACKED  # those extended before; none of the endless extend's
            kinds.assert_same(got, kinds.records(kind, ACKED))
    assert time.monotonic() - start < 120


def test_the_exit_lets_each_thread_it_stopped_end_before_python_finalizes(tmp_path):
    """Was an abort now and then under load (CI, cac9fb5): a stopped daemon thread still
    writing its traceback as Python finalized, "Fatal Python error: _enter_buffered_busy".
    Here each thread's excepthook sleeps first: before, none of them ended (frozen as Python
    finalized); now each ends before the exit does."""
    done = _run(tmp_path, "extending_hooked")
    assert done.returncode == 0, done.stderr
    stopped = done.stderr.count("ClosedStoreError: the interpreter is exiting")
    assert stopped == len(BACKENDS) * len(DAEMON_KINDS), done.stderr
    assert done.stderr.count("hook ended") == stopped, done.stderr


def test_a_commit_failing_at_exit_says_so_and_the_other_stores_commit(tmp_path):
    done = _run(tmp_path, "failing")
    assert done.returncode == 0
    for name in STORES:
        n, got = _records(tmp_path, name)
        kind = name.split("-", 1)[1]
        kinds.assert_same(got, kinds.records(kind, n))
        said = f"store {tmp_path / name} (never closed) could not commit"
        if name.startswith("zarr-"):
            assert said in done.stderr and f"they are lost, {n} stay committed" in done.stderr
            assert "No space left on device" in done.stderr
            assert n < APPENDED
        else:
            assert said not in done.stderr and n == APPENDED


def test_the_zarr_pool_runs_work_here_once_it_refuses_it():
    from pytreestore.backends._zarr.stores import ExitSafePool

    pool = ExitSafePool(2)
    assert pool.submit(sum, [1, 2]).result() == 3
    pool.shutdown()
    assert pool.submit(sum, [3, 4]).result() == 7  # a ThreadPoolExecutor raises RuntimeError
    failed = pool.submit(int, "x")
    assert isinstance(failed.exception(), ValueError)


#: a program's own exit hook, registered after its store was opened: it hands a last record to
#: the daemon thread appending, joins that thread, which closes the store
_HANDS_OVER = """
import atexit, queue, sys, threading
import numpy as np, pytreestore
store = pytreestore.create(sys.argv[1], {"x": np.float32(0)}, chunk_records=4, backend=sys.argv[2])
inbox = queue.Queue()
def worker():
    while (item := inbox.get()) is not None:
        store.append(item)
    store.close()
thread = threading.Thread(target=worker, daemon=True)
thread.start()
def finish():
    inbox.put({"x": np.float32(99)}); inbox.put(None)
    thread.join(timeout=20)
    print("joined" if not thread.is_alive() else "still appending")
atexit.register(finish)
for i in range(10):
    inbox.put({"x": np.float32(i)})
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_exit_hook_of_the_program_hands_a_thread_its_last_record(tmp_path, backend):
    """The store's exit hook took the store for good before the program's own hook ran, so the
    thread appending its last record waited forever (the join timed out, the record lost)."""
    path = tmp_path / "s"
    args = [sys.executable, "-c", _HANDS_OVER, str(path), backend]
    done = interpreters.run(args, capture_output=True, text=True, env=child_env(), timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "joined", done.stdout + done.stderr
    got = pytreestore.open(path).load(as_numpy=True)["x"]
    assert got.tolist() == [*range(10), 99]
