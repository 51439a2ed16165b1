"""Processes for the reliability tests: writers to kill, readers to run beside them.

Importing pytreestore takes seconds here, so tests do not start one interpreter per writer.
A *zygote* (``python tests/trial_harness.py``) imports everything once and then forks one
child per job it is sent. It forks before any TensorStore or JAX work has started a thread,
so the children are clean. Each child writes its progress, one line per event, to its own log
file with ``os.write`` (whole lines survive a SIGKILL); the zygote reaps the children and
reports each exit.

Jobs (one JSON object per line on the zygote's stdin):

* ``writer``: appends ``record(i)`` for i = 0, 1, ... following a seeded random plan of
  ``append`` / ``extend`` / ``extend_batch`` / ``flush`` calls. Before each call it logs
  ``op KIND FROM TO`` (records appended before and after the call) and after it
  ``done COMMITTED``. Commits happen at flush, at chunk boundaries and at the end of an
  ``extend_batch`` or a list ``extend`` that reaches a chunk boundary (it writes its tail
  chunk too) only, so a kill in the middle of a call leaves one of
  :func:`possible_commits`.
* ``ragged_writer``: the same for a ragged store (:func:`ragged_record`), with ``append``,
  ``extend`` and ``flush`` calls only; a store created ``pending`` learns the structure of
  its lists and optional subtree from the first records that have them.
* ``reader``: polls a store while a writer appends and checks every read against
  ``record(i)``; logs ``read LEN CHECKED`` lines, or ``FAIL ...``.
* ``hold``: opens a store for appending, logs ``held``, and waits (to be killed), or logs the
  error it got.
* ``race``: opens a store taking its lock over (``break_lock=True``), appends its own
  records, waits for a start file, flushes, and logs the outcome.
* ``call``: calls a function of a test module (``target``, ``"module:function"``) with
  ``args``; the crash suites of fragments use it for writers that kill themselves.
* ``truncate_writer``: a plan of extends, flushes and truncates on a store that evolved or
  learnt ragged structures, waiting before the truncate to be killed in
  (:mod:`tests.truncate_harness`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
OPS = ("append", "extend", "generator", "batch", "flush", "truncate", "tag")


# ---- the records every writer appends ------------------------------------------------------------


def record(i: int) -> dict[str, Any]:
    """Record ``i``: a function of ``i`` only, with several dtypes and a nested node."""
    return {
        "i": np.int64(i),
        "v": np.arange(3, dtype=np.float32) * np.float32(i) + np.float32(0.5),
        "m": {"w": np.full((2, 2), i % 251, np.uint8), "flag": np.bool_(i % 3 == 0)},
        "t": (np.float16(i % 2048), np.int16(-(i % 30000))),
    }


def expected(start: int, stop: int) -> dict[str, Any]:
    """``record(start) ... record(stop - 1)`` stacked, built without a Python loop."""
    i = np.arange(start, stop, dtype=np.int64)
    return {
        "i": i,
        "v": (np.arange(3, dtype=np.float32)[None, :] * i[:, None].astype(np.float32))
        + np.float32(0.5),
        "m": {
            "w": np.broadcast_to((i % 251).astype(np.uint8)[:, None, None], (len(i), 2, 2)),
            "flag": i % 3 == 0,
        },
        "t": ((i % 2048).astype(np.float16), (-(i % 30000)).astype(np.int16)),
    }


def batch(start: int, stop: int) -> dict[str, Any]:
    return expected(start, stop)


def possible_commits(log: list[str], chunk: int) -> tuple[set[int], int]:
    """The committed counts a writer killed at the end of ``log`` may have left, and the
    last one it reported.

    A finished call reported its committed count; a call cut short may have committed at any
    chunk boundary it crossed, or (a flush, an ``extend_batch`` or a list ``extend`` reaching
    a chunk boundary) everything appended so far. Full chunks that ``append`` handed to the background writer
    may be committed after the call that filled them reported (issue 32): any chunk boundary
    up to the records appended so far.
    """
    committed, pending, appended = None, None, 0
    for line in log:
        word, *rest = line.split()
        if word == "ready":
            committed = appended = int(rest[0])
        elif word == "op":
            pending = (rest[0], int(rest[1]), int(rest[2]))
        elif word == "done":
            committed = int(rest[0])
            if pending is not None:
                kind, _, upto = pending
                appended = upto if kind == "truncate" else max(appended, upto)
            pending = None
    if committed is None:
        raise ValueError("the writer never became ready")
    options = {committed}
    options.update(range((committed // chunk + 1) * chunk, appended + 1, chunk))
    if pending is not None:
        kind, start, upto = pending
        if kind == "truncate":  # it flushes what is buffered, then commits ``upto`` records
            options.update(range((committed // chunk + 1) * chunk, start + 1, chunk))
            options.update({start, upto})
            return options, committed
        options.update(range((committed // chunk + 1) * chunk, upto + 1, chunk))
        if kind in ("flush", "tag"):  # a tag flushes first
            options.add(upto)
        # a batch (a list extend is one too) that fills a chunk with the rows buffered since
        # the tail chunk of the last commit commits its tail with its chunks: one that starts
        # on a chunk boundary after appends filled a chunk does too
        if kind in ("batch", "extend") and upto - (committed - committed % chunk) >= chunk:
            options.add(upto)
    return options, committed


def plan_op(rng: random.Random, kinds: tuple[str, ...], n: int, max_batch: int) -> tuple[str, int]:
    """The next call of a trial writer holding ``n`` records: its kind and the records it
    leaves (a truncate keeps a random prefix, and is rarer than the others)."""
    kind = rng.choice(kinds)
    if kind == "truncate" and rng.random() < 0.5:
        kind = "flush"
    if kind in ("flush", "tag"):
        return kind, n
    if kind == "truncate":
        return kind, rng.randint(max(0, n - 2 * max_batch), n)
    return kind, n + rng.randint(1, max_batch)


def run_versioning(store: Any, kind: str, upto: int, log: Log) -> bool:
    """Runs a ``truncate`` or ``tag`` call of a trial writer; whether ``kind`` was one."""
    if kind == "truncate":
        store.truncate(upto)
    elif kind == "tag":
        store.tag(f"t{os.getpid()}-{len(store)}-{time.monotonic_ns()}")
    else:
        return False
    return True


# ---- the ragged records of the ragged crash trials -----------------------------------------------

RAGGED_OPS = ("append", "extend", "flush", "truncate", "tag")
RAGGED_DECL: dict[str, Any] = {
    "ragged": ["['elems']", "['elems'][*].tags", "['elems'][*].trail", "['opt']['cells']"],
    "optional": ["['opt']"],
}


@dataclasses.dataclass
class Elem:
    """An element of a ragged list: a scalar, a nested ragged list, a ragged leading axis."""

    x: Any  # float32
    tags: list  # ragged list of int16 scalars
    trail: Any  # float32[n, 3]


def _elem_pytree() -> None:
    import jax

    jax.tree_util.register_dataclass(Elem, data_fields=["x", "tags", "trail"], meta_fields=[])


_elem_pytree()


def ragged_record(i: int) -> dict[str, Any]:
    """Ragged record ``i``: a function of ``i`` only. Records 0-2 have no elements and no
    ``opt``, records 3-5 elements without tags, so a store created from a pending ``like``
    learns its structures at records 3, 6 and (about) 3-9."""
    rng = np.random.default_rng([i, 14])
    n = 0 if i < 3 else int(rng.integers(0, 21))
    elems = []
    for _ in range(n):
        tags = (
            [] if i < 6 else [np.int16(rng.integers(-999, 999)) for _ in range(rng.integers(0, 4))]
        )
        trail = rng.standard_normal((int(rng.integers(0, 4)), 3)).astype(np.float32)
        elems.append(Elem(np.float32(rng.standard_normal()), tags, trail))
    present = i >= 3 and rng.random() < 0.6
    cells = rng.integers(-(2**31), 2**31 - 1, size=int(rng.integers(0, 5)), dtype=np.int32)
    opt = {"w": rng.standard_normal(2), "cells": cells} if present else None
    return {"i": np.int64(i), "elems": elems, "opt": opt}


def ragged_like(pending: bool) -> dict[str, Any]:
    """The ``like`` of a ragged store: full, or with every ragged structure pending."""
    if pending:
        return {"i": np.int64(0), "elems": [], "opt": None}
    elem = Elem(np.float32(0), [np.int16(0)], np.zeros((1, 3), np.float32))
    return {
        "i": np.int64(0),
        "elems": [elem],
        "opt": {"w": np.zeros(2), "cells": np.zeros(1, np.int32)},
    }


def ragged_possible_commits(log: list[str], chunk: int, learn: set[int]) -> tuple[set[int], int]:
    """Like :func:`possible_commits`, for a ragged writer: a call cut short may also have
    committed at its start (a flush before learning a structure), at a record that taught
    the store a structure (``learn``), at its end (an ``extend`` commits once, at its end,
    when it filled a chunk), or one record past a chunk boundary (an ``append`` writes a
    full chunk when the next record arrives, then commits every record it holds)."""
    options, committed = possible_commits(log, chunk)
    pending = None
    for line in log:
        word, *rest = line.split()
        if word == "op":
            pending = (int(rest[1]), int(rest[2]))
        elif word == "done":
            pending = None
    if pending is not None:
        start, upto = pending
        options.update({start, upto} | {i for i in learn if start <= i <= upto})
        # an append commits when its record starts a chunk: the one before it is written
        first = (max(committed, start) // chunk + 1) * chunk + 1
        options.update(range(first, upto + 1, chunk))
    return options, committed


def run_ragged_writer(job: dict[str, Any], log: Log) -> None:
    import pytreestore

    # the records' classes from ``tests.trial_harness``, not from ``__main__`` (the zygote)
    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record

    rng = random.Random(job["seed"])
    backend = job["backend"]
    if job["create"]:
        like = ragged_like(job["pending"])
        store = pytreestore.create(
            job["path"], like, chunk_records=job["chunk"], backend=backend, **RAGGED_DECL
        )
    else:
        store = pytreestore.open(job["path"], mode="a", backend=backend)
    n = len(store)
    log("ready", store.committed)
    for _ in range(job["ops"]):
        kind, upto = plan_op(rng, RAGGED_OPS, n, job["max_batch"])
        k = upto - n
        log("op", kind, n, upto)
        if run_versioning(store, kind, upto, log):
            pass
        elif kind == "append":
            for i in range(n, n + k):
                store.append(ragged_record(i))
        elif kind == "extend":
            store.extend(ragged_record(i) for i in range(n, n + k))
        else:
            store.flush()
        n += k
        log("done", store.committed)
    log("finished")
    time.sleep(3600)


# ---- the children ---------------------------------------------------------------------------------


class Log:
    """Whole lines appended with one ``write`` each, so a kill never leaves half a line."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def __call__(self, *words: Any) -> None:
        os.write(self.fd, (" ".join(map(str, words)) + "\n").encode())


def _open_options(job: dict[str, Any]) -> dict[str, Any]:
    return {"storage_options": job["storage_options"]} if job.get("storage_options") else {}


def run_writer(job: dict[str, Any], log: Log) -> None:
    import pytreestore

    rng = random.Random(job["seed"])
    opts = _open_options(job)
    if job["create"]:
        store = pytreestore.create(
            job["path"],
            record(0),
            chunk_records=job["chunk"],
            codec=job.get("codec", "zstd"),
            backend=job.get("backend", "tensorstore"),
            **opts,
        )
    else:
        store = pytreestore.open(job["path"], mode="a", **opts)
    n = len(store)
    log("ready", store.committed)
    for _ in range(job["ops"]):
        kind, upto = plan_op(rng, OPS, n, job["max_batch"])
        k = upto - n
        log("op", kind, n, upto)
        if run_versioning(store, kind, upto, log):
            pass
        elif kind == "append":
            for i in range(n, n + k):
                store.append(record(i))
        elif kind == "extend":
            store.extend([record(i) for i in range(n, n + k)])
        elif kind == "generator":
            store.extend(record(i) for i in range(n, n + k))
        elif kind == "batch":
            store.extend_batch(batch(n, n + k))
        else:
            store.flush()
        n += k
        log("done", store.committed)
        if job.get("pause"):
            time.sleep(rng.uniform(0, job["pause"]))
    log("finished")
    time.sleep(3600)


def run_reader(job: dict[str, Any], log: Log) -> None:
    import pytreestore

    rng = random.Random(job["seed"])
    deadline = time.monotonic() + job["seconds"]
    store = _open_reader(job)
    last, seen, checked, reads = 0, store.version, 0, 0
    while time.monotonic() < deadline:
        try:
            n = store.refresh()
            lo = rng.choice([0, max(0, n - job["tail"]), rng.randrange(n)]) if n else 0
            got = store.load(slice(lo, n), as_numpy=True) if n else None
        except pytreestore.errors.StoreReplacedError:
            # a truncate, then an append over the records this object read: as documented,
            # the reader opens the store again (and may see fewer records)
            store = _open_reader(job)
            log("reopened", store.version)
            continue
        if n < last and not truncated_between(store, seen):
            log("FAIL", f"length went down from {last} to {n} with no truncate committed")
            return
        last, seen = n, store.version
        if n:
            bad = differences(got, expected(lo, n))
            if bad:
                log("FAIL", f"records [{lo}, {n}) differ at {bad}")
                return
            checked += n - lo
        reads += 1
        log("read", n, checked, reads)
    log("finished", last, checked, reads)


def _open_reader(job: dict[str, Any]) -> Any:
    """Opens the store for a reader, waiting for the writer to create it."""
    import pytreestore

    while True:
        try:
            return pytreestore.open(
                job["path"], cache_bytes=job.get("cache_bytes", 0), **_open_options(job)
            )
        except (FileNotFoundError, OSError, ValueError):
            time.sleep(0.01)


def truncated_between(store: Any, seen: int) -> bool:
    """Whether a version after ``seen``, up to the one ``store`` reads, is a truncate: the
    only commit that may leave fewer records than the one before it."""
    return any(
        v.operation == "truncate" for v in store.versions() if seen < v.version <= store.version
    )


def differences(got: Any, want: Any) -> list[str]:
    import jax

    flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
    flat_want = jax.tree_util.tree_leaves(want)
    bad = []
    for (path, a), b in zip(flat_got, flat_want):
        b = np.asarray(b)
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
            bad.append(jax.tree_util.keystr(path))
    return bad


def run_hold(job: dict[str, Any], log: Log) -> None:
    import pytreestore

    try:
        store = pytreestore.open(job["path"], mode="a", **_open_options(job))
    except Exception as err:
        log("error", type(err).__name__, str(err).replace("\n", " "))
        return
    if job.get("append"):
        store.extend([record(i) for i in range(len(store), len(store) + job["append"])])
        store.flush()
    log("held", len(store))
    time.sleep(3600)


def run_race(job: dict[str, Any], log: Log) -> None:
    """Takes the lock over, buffers its records, waits for the start file, then flushes."""
    import pytreestore

    store = pytreestore.open(job["path"], mode="a", break_lock=True, **_open_options(job))
    base = len(store)
    store.extend([record(i) for i in range(base, base + job["append"])])
    log("ready", base)
    while not os.path.exists(job["go"]):
        time.sleep(0.001)
    try:
        store.flush()
        log("committed", store.committed)
    except pytreestore.errors.CommitConflictError as err:
        log("conflict", str(err).replace("\n", " "))


def run_truncate_writer(job: dict[str, Any], log: Log) -> None:
    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    from tests.truncate_harness import run_truncate_writer as run

    run(job, log)


def run_call(job: dict[str, Any], log: Log) -> None:
    """Calls ``job["target"]`` (``"module:function"``, a module under tests/) with
    ``job["args"]``, logging ``start`` before and ``done`` after."""
    import importlib

    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    module, name = job["target"].split(":")
    function = getattr(importlib.import_module(module), name)
    log("start")
    function(*job["args"])
    log("done")


JOBS = {
    "call": run_call,
    "writer": run_writer,
    "reader": run_reader,
    "hold": run_hold,
    "race": run_race,
    "ragged_writer": run_ragged_writer,
    "truncate_writer": run_truncate_writer,
}


def child(job: dict[str, Any]) -> None:
    log = Log(job["log"])
    try:
        JOBS[job["kind"]](job, log)
    except BaseException:
        log("FAIL", traceback.format_exc().replace("\n", " | "))
        os._exit(1)
    os._exit(0)


# ---- the zygote ------------------------------------------------------------------------------------


def zygote() -> None:
    """Reads jobs from stdin, forks a child for each, replies ``pid N`` and ``exit N STATUS``.

    It starts no thread, so every fork is of a single-threaded process.
    """
    import selectors

    import pytreestore  # noqa: F401  (imported once, here, before any fork)

    def say(line: str) -> None:
        os.write(1, (line + "\n").encode())

    say("ready")
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    pending = b""
    while True:
        ready = selector.select(timeout=0.005)
        _reap(say)
        if not ready:
            continue
        data = os.read(0, 65536)
        if not data:
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            job = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _become_child(job)
            say(f"pid {pid}")


def _reap(say: Any) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        say(f"exit {pid} {status}")


def _become_child(job: dict[str, Any]) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(job["log"] + ".stderr", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(err, 2)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    child(job)


class Zygote:
    """The test side of the zygote: :meth:`start` jobs, :meth:`kill` them, :meth:`wait`."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        # as tests/conftest.py's child_env: this checkout first on the PYTHONPATH (the zygote
        # runs as a script; an installed pytreestore may be another checkout's, or none, as on
        # an accelerator's host), and JAX on the CPU (the test process may hold the chip)
        path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
        full = {
            **os.environ,
            "PYTHONPATH": path,
            "JAX_PLATFORMS": "cpu",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "trial_harness.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=full,
            text=True,
            bufsize=1,
        )
        self.exits: dict[int, int] = {}
        assert self._line() == "ready"

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the trial zygote died")
        return line.strip()

    def start(self, **job: Any) -> int:
        """Forks a child for ``job`` and returns its pid."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        while True:
            word, *rest = self._line().split()
            if word == "pid":
                return int(rest[0])
            self.exits[int(rest[0])] = int(rest[1])

    def kill(self, pid: int) -> int:
        """SIGKILLs child ``pid`` and waits until the zygote has reaped it; its wait status."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return self.wait(pid)

    def call(self, target: str, *args: Any, log: str, kill_after: float | None = None) -> int:
        """Runs ``target(*args)`` (``"module:function"``) in a forked child and waits for it.

        Args:
            target: the function, ``"tests.some_module:function"``.
            *args: its arguments (JSON values).
            log: the child's log file (its stderr goes to ``log + ".stderr"``).
            kill_after: if given, SIGKILL the child this many seconds after it started.

        Returns:
            Its exit as :attr:`subprocess.Popen.returncode` gives it: ``-9`` if it was killed.
        """
        pid = self.start(kind="call", target=target, args=list(args), log=log)
        if kill_after is None:
            status = self.wait(pid)
        else:
            wait_for(log, "start")
            time.sleep(kill_after)
            status = self.kill(pid)
        return os.waitstatus_to_exitcode(status)

    def wait(self, pid: int, timeout: float = 120.0) -> int:
        """Waits for child ``pid`` to exit; its wait status."""
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            if time.monotonic() > deadline:
                raise TimeoutError(f"child {pid} did not exit in {timeout} s")
            word, *rest = self._line().split()
            if word == "exit":
                self.exits[int(rest[0])] = int(rest[1])
        return self.exits.pop(pid)

    def close(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self.proc.terminate()
        self.proc.wait(timeout=10)


def read_log(path: str | os.PathLike[str]) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []


def wait_for(path: str | os.PathLike[str], word: str, timeout: float = 60.0) -> list[str]:
    """Waits until the log at ``path`` has a line starting with ``word`` (or ``FAIL``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = read_log(path)
        if any(line.split()[0] in (word, "FAIL") for line in lines if line):
            return lines
        time.sleep(0.005)
    raise TimeoutError(f"no {word!r} in {path} after {timeout} s: {read_log(path)[-3:]}")


if __name__ == "__main__":
    zygote()
