"""Writers sharing one OCDBT store through an OCDBT coordinator on 127.0.0.1
(``pytreestore.open(path, "a", backend="ocdbt", coordinator=address)``, issue 17 part 2).

Writers are subprocesses running :func:`writer_main` from this module; every record is tagged
``(writer, i)`` and carries values derived from the tag, so that the store at the end can be
checked record by record: every record present exactly once, each writer's records in its
own order, each commit's rows from one writer, and the data intact.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import CLAIM_KEY, COMMIT_KEY, NO_VALUE
from pytreestore._log.locks import CommitClaim, holder_info
from pytreestore.backends import ConditionalWrites, Transactions, ocdbt_coordinator
from tests import interpreters
from tests.conftest import child_env

TESTS = Path(__file__).parent
CHUNK = 8


def record(writer: int, i: int, kind: str = "fixed") -> dict[str, Any]:
    """Record ``i`` of ``writer``; a ``"ragged"`` one also has a list ``p`` of 0 to 3
    elements and an optional ``o``, both derived from the tag."""
    out: dict[str, Any] = {
        "w": np.int32(writer),
        "i": np.int32(i),
        "v": np.array([writer, i, writer * 1000 + i], np.float32),
    }
    if kind == "ragged":
        out["p"] = [np.float32(writer * 1000 + i + j / 4) for j in range((writer + i) % 4)]
        out["o"] = None if i % 3 == 0 else {"q": np.int16(i)}
    return out


RAGGED: dict[str, Any] = {"ragged": ["['p']"], "optional": ["['o']"]}
RAGGED_LIKE = {**record(0, 1, "ragged"), "p": [np.float32(0)]}


# ---- subprocesses ----------------------------------------------------------------------------


def writer_main(path: str, address: str, writer: int, plan: str, kind: str = "fixed") -> None:
    """In a subprocess: opens the store shared, waits for a line on stdin, then commits the
    batches of ``plan`` (a JSON list of sizes; [] forever, in batches of 3), printing
    ``COMMITTED <records of this writer>`` after each; ``ERROR <type> <message>`` on a
    pytreestore error."""
    store = pytreestore.open(path, "a", backend="ocdbt", coordinator=address)
    print("READY", flush=True)
    sys.stdin.readline()
    sizes = json.loads(plan)
    done, step = 0, 0
    try:
        while not sizes or step < len(sizes):
            size = sizes[step] if sizes else 3
            store.extend(record(writer, done + j, kind) for j in range(size))
            store.flush()
            done, step = done + size, step + 1
            print(f"COMMITTED {done}", flush=True)
        store.close()
    except errors.PyTreeStoreError as err:
        print(f"ERROR {type(err).__name__} {err}".replace("\n", " "), flush=True)
        os._exit(3)
    print("DONE", flush=True)


def coordinator_main() -> None:
    """In a subprocess: runs a coordinator, prints its address, serves until killed."""
    with ocdbt_coordinator() as address:
        print(address, flush=True)
        while True:
            time.sleep(1)


def _python(code: str) -> subprocess.Popen[str]:
    return interpreters.popen(  # forked from the test zygote (tests/interpreters.py)
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(TESTS)!r}); {code}"],
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # a traceback shows in the lines the test asserts on
        text=True,
    )


class WriterProcess:
    def __init__(
        self, path: Path, address: str, writer: int, plan: list[int], kind: str = "fixed"
    ) -> None:
        self.writer = writer
        self.proc = _python(
            "import test_ocdbt_coordinator as t; "
            f"t.writer_main({str(path)!r}, {address!r}, {writer}, {json.dumps(plan)!r}, "
            f"{kind!r})"
        )
        self.lines: list[str] = []

    def ready(self) -> None:
        line = self.line()
        assert line == "READY", f"writer {self.writer} did not start: {line!r} {self.stderr()}"
        self._drain = threading.Thread(target=self._read_all, daemon=True)

    def _read_all(self) -> None:
        assert self.proc.stdout is not None
        for got in self.proc.stdout:
            self.lines.append(got.strip())

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self._drain.start()  # every line from now on, read as it comes

    def line(self) -> str:
        """The next line before :meth:`go`."""
        assert self.proc.stdout is not None
        got = self.proc.stdout.readline().strip()
        self.lines.append(got)
        return got

    def finish(self, timeout: float = 120) -> list[str]:
        """Every line, once the writer has exited (within ``timeout`` seconds)."""
        self.proc.wait(timeout=timeout)
        self._drain.join(timeout=60)
        self.close()
        return self.lines

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=60)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def stderr(self) -> str:
        self.proc.kill()
        return self.proc.communicate(timeout=60)[0]

    def committed(self) -> int:
        """The records this writer reported committed."""
        counts = [int(x.split()[1]) for x in self.lines if x.startswith("COMMITTED")]
        return max(counts, default=0)


def run_writers(
    path: Path, address: str, plans: list[list[int]], kind: str = "fixed"
) -> list[WriterProcess]:
    writers = [WriterProcess(path, address, w, plan, kind) for w, plan in enumerate(plans)]
    for w in writers:
        w.ready()
    for w in writers:
        w.go()
    return writers


# ---- checks ----------------------------------------------------------------------------------


def tags(store: pytreestore.TreeStore) -> list[tuple[int, int]]:
    """Every record's ``(writer, i)``, after checking its values against its tag."""
    if len(store) == 0:
        return []
    rows = store.load(slice(None), as_numpy=True)
    w, i, v = (np.asarray(rows[k]) for k in ("w", "i", "v"))
    np.testing.assert_array_equal(v, np.stack([w, i, w * 1000 + i], axis=1).astype(np.float32))
    return list(zip(w.tolist(), i.tolist()))


def ragged_tags(store: pytreestore.TreeStore) -> list[tuple[int, int]]:
    """Every record's ``(writer, i)`` of a ragged store, after checking each record, lists
    and optional part included, against the one its tag makes."""
    found = []
    for got in store:
        tag = (int(got["w"]), int(got["i"]))
        want = record(*tag, "ragged")
        assert [float(x) for x in got["p"]] == [float(x) for x in want["p"]], tag
        assert (got["o"] is None) == (want["o"] is None), tag
        if want["o"] is not None:
            assert got["o"]["q"].dtype == np.int16 and int(got["o"]["q"]) == tag[1], tag
        np.testing.assert_array_equal(got["v"], want["v"])
        found.append(tag)
    return found


def check_records(found: list[tuple[int, int]], counts: dict[int, int]) -> None:
    """Each writer's records 0..count-1 are there once each, in its order, and nothing else."""
    for writer, count in counts.items():
        mine = [i for w, i in found if w == writer]
        assert mine == list(range(count)), f"writer {writer}: {mine}"
    assert len(found) == sum(counts.values())


def check_commits(path: Path, found: list[tuple[int, int]]) -> None:
    """Every version's new rows come from one writer (no commit interleaves two)."""
    store = pytreestore.open(path)
    records = [v.records for v in store.versions() if v.readable]
    for low, high in itertools.pairwise(records):
        assert len({w for w, _ in found[low:high]}) <= 1, (low, high, found[low:high])


def engine_of(store: pytreestore.TreeStore) -> ConditionalWrites:
    """The store's backend, which writes conditionally (the claim is written through it)."""
    engine = store._backend
    assert isinstance(engine, ConditionalWrites)
    return engine


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    path = tmp_path / "shared"
    pytreestore.create(path, record(0, 0), backend="ocdbt", chunk_records=CHUNK).close()
    return path


@pytest.fixture
def coordinator() -> Iterator[str]:
    with ocdbt_coordinator() as address:
        yield address


# ---- many writers ----------------------------------------------------------------------------


def test_three_writers_every_record_once_in_order(store_path: Path, coordinator: str) -> None:
    plans = [[1, 7, 3, 9, 2, 5, 13, 1, 4, 6], [5] * 10, [8, 1, 2, 3, 4, 5, 6, 7, 8, 9]]
    writers = run_writers(store_path, coordinator, plans)
    for w in writers:
        lines = w.finish()
        assert lines[-1] == "DONE", lines
    store = pytreestore.open(store_path)
    found = tags(store)
    check_records(found, {w: sum(plan) for w, plan in enumerate(plans)})
    check_commits(store_path, found)
    assert store.verify().ok
    assert pytreestore.open(store_path, "a").committed == len(found)  # an exclusive writer again


@pytest.mark.slow  # three interpreters importing JAX: about 25 s on the 2-core machine
def test_three_writers_of_a_ragged_store(tmp_path: Path, coordinator: str) -> None:
    path = tmp_path / "ragged"
    pytreestore.create(path, RAGGED_LIKE, backend="ocdbt", chunk_records=CHUNK, **RAGGED).close()
    plans = [[1, 7, 3, 9, 2], [5] * 5, [8, 1, 2, 3, 4]]
    writers = run_writers(path, coordinator, plans, "ragged")
    for w in writers:
        lines = w.finish()
        assert lines[-1] == "DONE", lines
    store = pytreestore.open(path)
    found = ragged_tags(store)
    check_records(found, {w: sum(plan) for w, plan in enumerate(plans)})
    check_commits(path, found)
    assert store.verify().ok
    with pytreestore.open(path, "a") as exclusive:  # an exclusive writer again, after them
        exclusive.append(record(3, 0, "ragged"))
    assert ragged_tags(pytreestore.open(path))[-1] == (3, 0)


def test_a_shared_writer_refuses_to_learn_a_pending_structure(
    tmp_path: Path, coordinator: str
) -> None:
    path = tmp_path / "pending"
    like = {**RAGGED_LIKE, "p": []}
    pytreestore.create(path, like, backend="ocdbt", **RAGGED).close()
    store = pytreestore.open(path, "a", backend="ocdbt", coordinator=coordinator)
    store.append({**record(0, 0, "ragged"), "p": []})  # no element: nothing to learn
    with pytest.raises(errors.UnsupportedTreeError, match=r"\['p'\].*cannot learn it"):
        store.append(record(0, 1, "ragged"))
    store.close()
    assert pytreestore.open(path).schema.pending == ("['p']",)
    assert [int(r["i"]) for r in pytreestore.open(path)] == [0]


@pytest.mark.parametrize("commits", [16, pytest.param(40, marks=pytest.mark.slow)])
def test_reader_sees_only_whole_commits(store_path: Path, coordinator: str, commits: int) -> None:
    """A reader loads the whole store again and again while two writers each commit
    ``commits`` batches (it reads as long as they write: most of the test's cost)."""
    batch = 5
    each = batch * commits
    writers = run_writers(store_path, coordinator, [[batch] * commits, [batch] * commits])
    seen = []
    while any(w.proc.poll() is None for w in writers) or not seen:
        found = tags(pytreestore.open(store_path))
        for writer in (0, 1):
            mine = [i for w, i in found if w == writer]
            assert mine == list(range(len(mine))) and len(mine) % batch == 0, (writer, mine)
        seen.append(len(found))
    for w in writers:
        assert w.finish()[-1] == "DONE"
    assert seen == sorted(seen) and seen[-1] <= 2 * each
    assert len({n for n in seen if 0 < n < 2 * each}) >= 2  # reads while both were writing
    check_records(tags(pytreestore.open(store_path)), {0: each, 1: each})


def test_one_writer_alone_and_its_reads(store_path: Path, coordinator: str) -> None:
    with pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator) as store:
        store.extend(record(0, i) for i in range(3))  # below a chunk: buffered
        assert (store.committed, len(store)) == (0, 3)
        store.extend_batch(
            {
                "w": np.zeros(10, np.int32),
                "i": np.arange(3, 13, dtype=np.int32),
                "v": np.stack([np.zeros(10), np.arange(3, 13), np.arange(3, 13)], 1).astype(
                    np.float32
                ),
            }
        )
        assert store.committed == 13  # a chunk's worth buffered: committed
        assert int(store[12]["i"]) == 12
    check_records(tags(pytreestore.open(store_path)), {0: 13})


# ---- faults ----------------------------------------------------------------------------------


def test_a_failed_root_write_warns_and_keeps_the_shared_commit(
    store_path: Path, coordinator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared writer has no transaction (its backend does not declare Transactions): as on
    the file backends, the commit record is written when the root write fails, so the commit
    stands and warns, and is never retried into duplicates."""
    from tests.faults import fail_root_writes  # not at the top: writer subprocesses import this

    store = pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator)
    assert not isinstance(store._backend, Transactions)
    full = errors.StorageError("writing zarr.json: [Errno 28] No space left on device")
    fail_root_writes(monkeypatch, store._backend, full)
    store.extend(record(0, i) for i in range(3))
    with pytest.warns(RuntimeWarning, match="3 records are committed, but the root zarr.json"):
        store.flush()
    monkeypatch.undo()
    store.close()
    check_records(tags(pytreestore.open(store_path)), {0: 3})


def test_coordinator_killed_mid_commit(store_path: Path) -> None:
    server = _python("import test_ocdbt_coordinator as t; t.coordinator_main()")
    assert server.stdout is not None
    address = server.stdout.readline().strip()
    writers = run_writers(store_path, address, [[], []])
    try:
        deadline = time.monotonic() + 60
        while min(w.committed() for w in writers) < 6:  # both writers are committing
            assert time.monotonic() < deadline, [w.lines for w in writers]
            assert not any(x.startswith("ERROR") for w in writers for x in w.lines)
            time.sleep(0.01)
        server.send_signal(signal.SIGKILL)
        server.communicate(timeout=60)
        started = time.monotonic()
        for w in writers:
            lines = w.finish(timeout=90)  # leases run out, then every write fails: no hang
            assert lines[-1].startswith("ERROR StorageError "), lines[-3:]
            assert f"through the OCDBT coordinator at {address} failed" in lines[-1], lines[-1]
            assert "UNAVAILABLE" in lines[-1] or "DEADLINE_EXCEEDED" in lines[-1], lines[-1]
        assert time.monotonic() - started < 90
    finally:
        server.kill()
        server.communicate(timeout=60)
        for w in writers:
            w.close()
    store = pytreestore.open(store_path)
    found = tags(store)
    for w in writers:  # every record reported committed is there, once, in order
        mine = [i for tag, i in found if tag == w.writer]
        assert mine == list(range(len(mine))) and len(mine) >= w.committed()
    assert store.verify().ok
    # a new coordinator: the claim the killed commit left (its holder exited) is taken over
    with (
        ocdbt_coordinator() as again,
        pytreestore.open(store_path, "a", backend="ocdbt", coordinator=again) as shared,
    ):
        shared.append(record(7, 0))
    assert tags(pytreestore.open(store_path))[-1] == (7, 0)


def test_a_writer_killed_mid_commit_holds_nobody_up(store_path: Path, coordinator: str) -> None:
    victim, survivor = run_writers(store_path, coordinator, [[], [4] * 40])
    try:
        deadline = time.monotonic() + 120  # (a loaded 2-core machine: its first commits)
        while victim.committed() < 9:  # killed somewhere in its commits, claim held or not
            assert time.monotonic() < deadline, victim.lines
            time.sleep(0.005)
        victim.proc.send_signal(signal.SIGKILL)
        victim.finish(timeout=60)
        assert survivor.finish()[-1] == "DONE", survivor.lines[-3:]
    finally:  # a failure above leaves no writer running into the next tests
        victim.close()
        survivor.close()
    store = pytreestore.open(store_path)
    found = tags(store)
    mine = [i for w, i in found if w == 0]
    assert mine == list(range(len(mine))) and len(mine) >= victim.committed()
    check_records([t for t in found if t[0] == 1], {1: 160})
    check_commits(store_path, found)
    assert store.verify().ok


def test_a_writer_goes_on_once_its_coordinator_is_back(store_path: Path) -> None:
    with ocdbt_coordinator() as address:
        store = pytreestore.open(store_path, "a", backend="ocdbt", coordinator=address)
        store.append(record(0, 0))
        store.flush()
    port = int(address.rpartition(":")[2])
    store.append(record(0, 1))
    with pytest.raises(errors.StorageError, match=re.escape(f"coordinator at {address} failed")):
        store.flush()
    assert (store.committed, len(store)) == (1, 2)  # the record stays buffered
    started = time.monotonic()
    with ocdbt_coordinator(port=port):
        store.append(record(0, 2))
        while not store.closed:  # gRPC connects again within seconds; until then, errors
            assert time.monotonic() - started < 30
            with contextlib.suppress(errors.StorageError):
                store.close()  # the claim its failed commit left is its own: never waited on
            time.sleep(0.2)
    check_records(tags(pytreestore.open(store_path)), {0: 3})


def test_only_a_writer_alone_repairs(store_path: Path, coordinator: str) -> None:
    with pytreestore.open(store_path, "a") as first:
        first.extend(record(0, i) for i in range(3))
    keys = [c.key for c in pytreestore.open(store_path).schema.columns]

    def grow_past_the_commit() -> pytreestore.TreeStore:  # what a killed writer leaves
        reader = pytreestore.open(store_path)
        reader._backend.resize(keys, 20)
        return reader

    def lengths(store: pytreestore.TreeStore) -> set[int]:
        return {shape[0] for shape in store._backend.column_shapes(keys)}

    reader = grow_past_the_commit()
    with pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator) as alone:
        assert lengths(reader) == {3}  # repaired while alone
        grow_past_the_commit()
        with pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator):
            assert lengths(reader) == {20}  # beside another writer: left alone
        alone.append(record(0, 3))
    check_records(tags(pytreestore.open(store_path)), {0: 4})
    assert pytreestore.open(store_path).verify().ok


def test_commit_that_failed_after_landing_is_not_written_twice(
    store_path: Path, coordinator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator)
    engine = engine_of(store)
    real = engine.write_bytes_if
    failures = iter([True])

    def lands_then_fails(key: str, data: bytes | None, token: bytes) -> bytes | None:
        got = real(key, data, token)
        if key == COMMIT_KEY and next(failures, False):
            raise errors.StorageError("the coordinator went away after the write")
        return got

    monkeypatch.setattr(engine, "write_bytes_if", lands_then_fails)
    store.extend(record(0, i) for i in range(3))
    store.flush()  # read back under the claim: it landed, so the flush stands (no retry)
    assert not next(failures, False)  # the failure was injected
    assert store.committed == 3
    store.extend(record(0, i) for i in range(3, 5))
    store.close()
    check_records(tags(pytreestore.open(store_path)), {0: 5})


def test_claim_of_a_dead_writer_is_taken_over(store_path: Path, coordinator: str) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    claim = {**holder_info(), "pid": dead.pid, "expires": time.time() + 3600}
    store = pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator)
    assert engine_of(store).write_bytes_if(CLAIM_KEY, json.dumps(claim).encode(), NO_VALUE)
    store.append(record(0, 0))
    store.close()
    check_records(tags(pytreestore.open(store_path)), {0: 1})


def test_claim_of_a_live_writer_waits_then_conflicts(store_path: Path, coordinator: str) -> None:
    store = pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator)
    engine = engine_of(store)
    with (
        CommitClaim.take(engine, "here", wait=1.0),
        pytest.raises(errors.CommitConflictError, match=r"held by pid \d+ on host"),
    ):
        CommitClaim.take(engine, str(store_path), wait=0.2)
    with CommitClaim.take(engine, "here", wait=1.0):  # given back: free again
        pass
    store.close()


# ---- without a coordinator, and bad input ------------------------------------------------------

LOCKED = "is open for writing elsewhere"


def test_without_coordinator_the_second_writer_gets_the_lock_error(
    store_path: Path, coordinator: str
) -> None:
    with pytreestore.open(store_path, "a") as first:
        with pytest.raises(errors.StoreLockedError, match=re.escape(LOCKED)):
            pytreestore.open(store_path, "a")
        with pytest.raises(errors.StoreLockedError, match=re.escape(LOCKED)):
            pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator)
        first.append(record(0, 0))
    with (
        pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator),
        pytest.raises(errors.StoreLockedError, match=re.escape(LOCKED)),
    ):
        pytreestore.open(store_path, "a")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "r"}, "coordinator= is for writers (mode='a')"),
        ({"backend": "tensorstore"}, "pass backend='ocdbt', not 'tensorstore'"),
        ({"version": 1}, "version= opens a store as it was, read-only"),
        ({"generic": True}, "generic= cannot be used with coordinator="),
        ({"coordinator": "localhost"}, "coordinator must be the address of an OCDBT coordinator"),
        ({"coordinator": 5000}, "'HOST:PORT' (for example '127.0.0.1:5000'"),
    ],
)
def test_bad_options_are_refused(store_path: Path, options: dict[str, Any], message: str) -> None:
    given = {"mode": "a", "coordinator": "127.0.0.1:1", **options}
    with pytest.raises(ValueError, match=re.escape(message)):
        pytreestore.open(store_path, **given)
    assert pytreestore.open(store_path).committed == 0


def test_a_store_of_another_backend_or_none_is_refused(tmp_path: Path, coordinator: str) -> None:
    plain = tmp_path / "plain"
    pytreestore.create(plain, {"x": 0}, backend="tensorstore").close()
    with pytest.raises(errors.NotAStoreError, match=re.escape("holds no OCDBT store")):
        pytreestore.open(plain, "a", backend="ocdbt", coordinator=coordinator)
    with pytest.raises(errors.StoreNotFoundError, match="no store at"):
        pytreestore.open(tmp_path / "nothing", "a", backend="ocdbt", coordinator=coordinator)
    assert not (tmp_path / "nothing").exists()
    with pytreestore.open(plain, "a") as store:  # nothing was left locked or written
        store.append({"x": 1})


def test_memory_stores_and_other_writers_methods_are_refused(
    store_path: Path, coordinator: str
) -> None:
    pytreestore.create("memory://shared-no", {"x": 0}, backend="ocdbt").close()
    with pytest.raises(errors.BadLocationError, match="on local disk only"):
        pytreestore.open("memory://shared-no", "a", backend="ocdbt", coordinator=coordinator)
    with pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator) as store:
        store.append(record(0, 0))
        with pytest.raises(errors.ReadOnlyError, match=re.escape("need its only writer")):
            store.evolve(add={"['z']": 0})
        with pytest.raises(errors.ReadOnlyError, match=re.escape("need its only writer")):
            store.truncate(0)
    check_records(tags(pytreestore.open(store_path)), {0: 1})


def test_a_shared_writer_refuses_fragments_before_writing(
    store_path: Path, coordinator: str
) -> None:
    """commit_fragments needs the store's only writer: refused by name, before the shared
    writer's buffered records are committed or the fragment touched."""
    fragment = pytreestore.write_fragment(store_path, [record(1, 0)])
    with pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator) as store:
        store.append(record(0, 0))  # buffered
        with pytest.raises(
            errors.ReadOnlyError, match=re.escape("commit_fragments() need its only writer")
        ):
            store.commit_fragments([fragment])
        assert len(pytreestore.open(store_path)) == 0  # the buffered record waits for close
    check_records(tags(pytreestore.open(store_path)), {0: 1})
    with pytreestore.open(store_path, "a", backend="ocdbt") as store:
        store.commit_fragments([fragment])  # the fragment is whole: its only writer takes it
    check_records(tags(pytreestore.open(store_path)), {0: 1, 1: 1})


def test_the_claim_object_follows_the_shipped_json_schema(store_path: Path) -> None:
    import jsonschema

    schema = json.loads((Path(pytreestore.__file__).parent / "schema.json").read_text())
    claim_schema = {**schema["$defs"]["claim"], "$defs": schema["$defs"]}
    store = pytreestore.open(store_path)
    engine = engine_of(store)
    with CommitClaim.take(engine, str(store_path), wait=1.0):
        raw = engine.read_bytes_versioned(CLAIM_KEY)[0]
    assert raw is not None
    jsonschema.validate(json.loads(raw), claim_schema)
    assert engine.read_bytes_versioned(CLAIM_KEY)[0] is None


def test_a_shared_writer_takes_the_schema_the_commit_names(
    store_path: Path, coordinator: str
) -> None:
    """An evolve whose commit record never came left its schema in the root: a shared
    writer opening then commits with the schema the commit record names, as every reader
    reads (it committed the evolve nobody made)."""
    from tests.test_evolve import _fail_the_evolve_commit_once

    store = pytreestore.create(store_path, {"step": np.int32(0)}, backend="ocdbt", overwrite=True)
    store.extend({"step": np.int32(i)} for i in range(3))
    store.flush()
    _fail_the_evolve_commit_once(store._backend)
    with pytest.raises(errors.StorageError):
        store.evolve(add={"['lr']": np.float32(7)})
    store.close()
    with pytreestore.open(store_path, "a", backend="ocdbt", coordinator=coordinator) as shared:
        assert [c.path for c in shared.schema.columns] == ["['step']"]
        shared.append({"step": np.int32(3)})
    got = pytreestore.open(store_path, backend="ocdbt")
    assert [c.path for c in got.schema.columns] == ["['step']"]
    assert got.load(as_numpy=True)["step"].tolist() == [0, 1, 2, 3]
