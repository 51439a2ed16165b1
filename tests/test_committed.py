"""``store.committed`` acknowledges only what storage holds (issue 44, items 1, 2 and 9).

A record counted by ``committed`` (or by what a thread reading the writer's store sees) is in
storage: a fresh open reads it, and a writer killed with SIGKILL at that instant keeps it. On
OCDBT a commit is written into a transaction that lands after the commit is made, chunks
included; the count must wait for it (:class:`pytreestore._log.committer.Committer`).

Also here: ``write_fragment`` in a second process while the store's writer opens it for
appending again and again (opening repairs what a killed writer left: it must never take
away a file another process is writing).

Every test runs on every backend and every kind of store it applies to: fixed, a ragged list,
an optional subtree, a ragged list inside a ragged list. ``make test`` runs the three tests of
a kind and a backend on a third of the pairs each, every kind and backend in each test and
every pair in one of them (:data:`GRID`); ``make test-long`` runs every pair in each.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._log import versions
from pytreestore.testing import assert_trees_equal
from tests.conftest import BACKENDS, diagonal, tiered
from tests.trial_harness import Zygote, read_log

pytest_plugins = ("tests.fixtures",)

CHUNK = 4
WIDTH = 50_000  # 200 KB a record: a chunk's write takes a while
KINDS = ("fixed", "ragged_list", "optional", "nested")
DECLARATIONS: dict[str, dict[str, Any]] = {
    "fixed": {},
    "ragged_list": {"ragged": ["['p']"]},
    "optional": {"optional": ["['o']"]},
    "nested": {"ragged": ["['p']", "['p'][*]['h']"]},
}
#: every kind on every backend; each test takes its own third in make test (``diagonal``)
GRID = [(k, b) for k in KINDS for b in BACKENDS]
KILL_TRIALS = 1  # per backend and kind; more under the slow marker
SLOW_KILL_TRIALS = 8


def record(kind: str, i: int, width: int = WIDTH) -> dict[str, Any]:
    """Record ``i`` of ``kind``: a function of ``i`` only; lists and presence vary."""
    r: dict[str, Any] = {"i": np.int64(i), "x": np.full(width, i, np.float32)}
    if kind == "ragged_list":
        r["p"] = [np.float32(i + k) for k in range(i % 3)]
    elif kind == "optional":
        r["o"] = {"a": np.float32(i)} if i % 2 else None
    elif kind == "nested":
        r["p"] = [{"h": [np.int16(i + k) for k in range(j)]} for j in range(i % 3)]
    return r


def like(kind: str, width: int = WIDTH) -> dict[str, Any]:
    """An example record of ``kind`` with every part present, one element in each list."""
    r: dict[str, Any] = {"i": np.int64(0), "x": np.zeros(width, np.float32)}
    if kind == "ragged_list":
        r["p"] = [np.float32(0)]
    elif kind == "optional":
        r["o"] = {"a": np.float32(0)}
    elif kind == "nested":
        r["p"] = [{"h": [np.int16(0)]}]
    return r


def create(path: str, backend: str, kind: str, width: int = WIDTH) -> pytreestore.TreeStore:
    return pytreestore.create(
        path, like(kind, width), backend=backend, chunk_records=CHUNK, **DECLARATIONS[kind]
    )


def check_records(path: str, backend: str, kind: str, at_least: int, width: int = WIDTH) -> int:
    """Opens the store afresh: it holds at least ``at_least`` records, each exactly
    ``record(kind, i)``, and verifies whole; its record count."""
    with pytreestore.open(path, backend=backend) as store:
        n = len(store)
        assert n >= at_least, f"{n} records in storage where committed said {at_least}"
        for i, got in enumerate(store.records(as_numpy=True)):
            assert_trees_equal(got, record(kind, i, width))
        assert store.verify().ok
    return n


def slow_commits(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Makes each commit take ``seconds`` more after its commit record is written (a slow
    disk): on OCDBT, inside the transaction, before anything of it lands."""
    trim = versions.trim

    def slow_trim(*args: Any, **kwargs: Any) -> None:
        time.sleep(seconds)
        trim(*args, **kwargs)

    monkeypatch.setattr(versions, "trim", slow_trim)


# ---- (a) committed never runs ahead of a fresh open --------------------------------------------


@pytest.mark.parametrize(("kind", "backend"), tiered(GRID, diagonal(KINDS, BACKENDS, 0)))
def test_committed_never_counts_what_a_fresh_open_does_not_read(
    tmp_path: Path, backend: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_commits(monkeypatch, 0.15)
    path = str(tmp_path / "s")
    store = create(path, backend, kind, width=8)
    seen: list[tuple[int, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            committed = store.committed  # first: a fresh open after it reads at least that
            with pytreestore.open(path, backend=backend) as fresh:
                seen.append((committed, len(fresh)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(3 * CHUNK + 1):
            store.append(record(kind, i, 8))
        store.flush()
    finally:
        stop.set()
        watcher.join()
    store.close()
    ahead = [(c, n) for c, n in seen if n < c]
    assert not ahead, f"committed said c while a fresh open read n, (c, n): {ahead}"
    assert max(c for c, _ in seen) > 0, "the watcher saw no commit"
    assert check_records(path, backend, kind, 3 * CHUNK + 1, width=8) == 3 * CHUNK + 1


# ---- (b) a writer killed the instant committed rises keeps what it counted ---------------------


def kill_when_committed(path: str, backend: str, kind: str, after: int, out: str) -> None:
    """In a child: appends until ``store.committed`` passes ``after``; a thread watching it
    writes the count to ``out`` and SIGKILLs the process that instant."""
    store = create(path, backend, kind)

    def watch() -> None:
        while True:
            n = store.committed
            if n > after:
                fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, f"{n}\n".encode())
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
    for i in range(after + 4 * CHUNK):
        store.append(record(kind, i))
    store.flush()
    time.sleep(30)  # the watcher kills it


@pytest.mark.parametrize(
    "trial",
    [
        pytest.param(t, marks=pytest.mark.slow) if t >= KILL_TRIALS else t
        for t in range(SLOW_KILL_TRIALS)
    ],
)
@pytest.mark.parametrize("kind", KINDS)
def test_a_writer_killed_as_committed_rises_keeps_every_record_it_counted(
    zygote: Zygote, tmp_path: Path, backend: str, kind: str, trial: int
) -> None:
    path, out, log = tmp_path / "s", tmp_path / "committed", str(tmp_path / "child.log")
    after = (trial % 3) * CHUNK + trial // 3  # the first commit, or a later one
    target = "tests.test_committed:kill_when_committed"
    code = zygote.call(target, str(path), backend, kind, after, str(out), log=log)
    assert code == -signal.SIGKILL, (code, read_log(log)[-3:], read_log(log + ".stderr")[-20:])
    counted = int(out.read_text())
    assert counted > after
    check_records(str(path), backend, kind, counted)


# ---- (c) a reader thread of the writer's store never sees a commit that has not landed ---------


APPENDS = 10 * CHUNK + 2


@pytest.mark.parametrize(("kind", "backend"), tiered(GRID, diagonal(KINDS, BACKENDS, 1)))
def test_a_reader_thread_loading_during_appends_never_fails(
    tmp_path: Path, backend: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_commits(monkeypatch, 0.04)
    path = str(tmp_path / "s")
    store = create(path, backend, kind, width=8)
    failures: list[BaseException] = []
    loads = [0]
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():  # bounded: until the appends end
            try:
                got = store.load(as_numpy=True)
                tree = got[0] if isinstance(got, tuple) else got  # a ragged store: (batch, mask)
                np.testing.assert_array_equal(tree["i"], np.arange(len(tree["i"])))
            except BaseException as err:
                failures.append(err)
            loads[0] += 1

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(APPENDS):  # no pause: the writer's lock is mostly held, so a read
            store.append(record(kind, i, 8))  # takes the commit the writer has, unflushed
    finally:
        stop.set()
        reader.join()
    store.close()
    assert not failures, f"{len(failures)} of {loads[0]} loads failed: {failures[:2]}"
    check_records(path, backend, kind, APPENDS, width=8)


# ---- (d) write_fragment beside a writer that opens the store again and again -------------------

FRAGMENTS = 10


def write_fragments(path: str, backend: str, kind: str, out: str) -> None:
    """In a child: ``FRAGMENTS`` fragments of one record each (record ``1000 + k``), their
    descriptions or errors written to ``out`` as JSON."""
    results = []
    for k in range(FRAGMENTS):
        try:
            records = [record(kind, 1000 + k, 8)]
            fragment = pytreestore.write_fragment(path, records, backend=backend)
            results.append({"fragment": fragment.to_json()})
        except errors.PyTreeStoreError as err:
            results.append({"error": str(err)[:300]})
    Path(out).write_text(json.dumps(results))


@pytest.mark.parametrize(("kind", "backend"), tiered(GRID, diagonal(KINDS, BACKENDS, 2)))
def test_write_fragment_beside_a_writer_reopening_the_store(
    zygote: Zygote, tmp_path: Path, backend: str, kind: str
) -> None:
    path, out, log = str(tmp_path / "s"), str(tmp_path / "out.json"), str(tmp_path / "c.log")
    create(path, backend, kind, width=8).close()
    appended = [0]
    stop = threading.Event()

    def writer() -> None:  # opens for appending, appends one record, closes: again and again
        while not stop.is_set():
            with pytreestore.open(path, "a", backend=backend) as store:
                store.append(record(kind, appended[0], 8))
            appended[0] += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        target = "tests.test_committed:write_fragments"
        code = zygote.call(target, path, backend, kind, out, log=log)
    finally:
        stop.set()
        thread.join()
    assert code == 0, (read_log(log)[-3:], read_log(log + ".stderr")[-20:])
    results = json.loads(Path(out).read_text())
    failed = [r["error"] for r in results if "error" in r]
    assert not failed, f"{len(failed)} of {FRAGMENTS} fragments failed: {failed[:3]}"
    assert appended[0] > 0
    with pytreestore.open(path, "a", backend=backend) as store:
        assert len(store) == appended[0]
        store.commit_fragments([pytreestore.Fragment.from_json(r["fragment"]) for r in results])
    with pytreestore.open(path, backend=backend) as store:
        assert store.verify().ok
        got = list(store.records(as_numpy=True))
    want = [*range(appended[0]), *range(1000, 1000 + FRAGMENTS)]
    assert len(got) == len(want)
    for i, tree in zip(want, got):
        assert_trees_equal(tree, record(kind, i, 8))
