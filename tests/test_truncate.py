"""truncate: the rows of every table at a record count, the starts of columns added after
them, and the order of its writes (issue 28, defects 1, 4, 7 and 8).

A truncate below the start of a column added later (by ``evolve(add=)``, or a structure a
ragged or optional store learnt) lowers that start; every reader and the writer's own backend
must then read the rows written after it. Its root ``zarr.json`` is written before its commit
record: a writer cut off between the two, or a reader opening there, still reads exactly what
the commit record says, and zarr readers never see rows past the commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import zarr

import pytreestore
from pytreestore._format.keys import COMMIT_KEY, ROOT_KEY
from pytreestore._open import open as _open
from tests import interpreters
from tests.conftest import child_env
from tests.trial_harness import Zygote

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ("tests.fixtures",)  # the zygote that forks the cut-off writers


def step(i: int) -> dict:
    return {"step": np.int32(i)}


def with_lr(i: int) -> dict:
    return {"step": np.int32(i), "lr": np.float32(i)}


def evolved(path: str, backend: str) -> pytreestore.TreeStore:
    """A store of 14 records whose column ``['lr']`` evolve added at record 12."""
    store = pytreestore.create(path, step(0), chunk_records=4, backend=backend)
    store.extend(step(i) for i in range(12))
    store.evolve(add={"['lr']": np.float32(0)})
    store.extend(with_lr(i) for i in range(12, 14))
    store.flush()
    return store


def lrs(store) -> list[float]:
    return store.load(as_numpy=True)["lr"].tolist()


# ---- defect 1: committed values read as the default, then written over --------------------------


def test_truncate_below_an_added_column_keeps_what_is_written_after(tmp_path, backend):
    path = str(tmp_path / "s")
    store = evolved(path, backend)
    store.truncate(9)
    store.extend(with_lr(i) for i in range(9, 14))
    assert lrs(store)[8:] == [0.0, 9.0, 10.0, 11.0, 12.0, 13.0]
    store.truncate(11)  # its tail chunk [8, 12) is rewritten from what the writer reads
    store.extend(with_lr(i) for i in range(11, 14))
    store.close()
    got = pytreestore.open(path, backend=backend)
    assert lrs(got) == [0.0] * 9 + [9.0, 10.0, 11.0, 12.0, 13.0]
    assert got.load(as_numpy=True)["step"].tolist() == list(range(14))
    assert got.verify().ok


def test_truncate_to_zero_below_an_added_column(tmp_path, backend):
    path = str(tmp_path / "s")
    store = evolved(path, backend)
    store.truncate(0)  # the column now starts at 0: every row of it is stored
    store.extend(with_lr(100 + i) for i in range(6))
    assert lrs(store) == [100.0 + i for i in range(6)]
    store.close()
    assert lrs(pytreestore.open(path, backend=backend)) == [100.0 + i for i in range(6)]


def test_truncate_below_an_added_column_renamed_since(tmp_path, backend):
    path = str(tmp_path / "s")
    store = evolved(path, backend)
    store.evolve(rename={"['lr']": "['rate']"})  # the storage key and the start stay
    store.truncate(10)
    store.extend({"step": np.int32(i), "rate": np.float32(i)} for i in range(10, 14))
    assert store.load(as_numpy=True)["rate"].tolist()[9:] == [0.0, 10.0, 11.0, 12.0, 13.0]
    store.truncate(12)
    store.close()
    got = pytreestore.open(path, backend=backend).load(as_numpy=True)["rate"]
    assert got.tolist() == [0.0] * 10 + [10.0, 11.0]


def test_truncate_below_a_column_added_again_after_a_drop(tmp_path, backend):
    path = str(tmp_path / "s")
    store = evolved(path, backend)
    store.evolve(drop=["['lr']"])
    store.extend(step(i) for i in range(14, 16))
    store.evolve(add={"['lr']": np.float32(-1)})  # a new column (a new key), at 16
    store.extend(with_lr(i) for i in range(16, 18))
    store.truncate(9)
    store.extend(with_lr(i) for i in range(9, 14))
    store.truncate(11)
    store.extend(with_lr(i) for i in range(11, 13))
    store.close()
    got = pytreestore.open(path, backend=backend)
    assert lrs(got) == [-1.0] * 9 + [9.0, 10.0, 11.0, 12.0]


def optional_store(path: str, backend: str) -> pytreestore.TreeStore:
    """A store whose optional subtree ``['extra']`` is learnt at record 12."""
    like = {"step": np.int32(0), "extra": None}
    store = pytreestore.create(path, like, optional=["['extra']"], chunk_records=4, backend=backend)
    store.extend({"step": np.int32(i), "extra": None} for i in range(12))
    store.flush()
    store.extend(extra(i) for i in range(12, 14))
    store.flush()
    return store


def extra(i: int) -> dict:
    return {"step": np.int32(i), "extra": {"lr": np.float32(i)}}


def extras(store, rows: range) -> list:
    return [None if (e := store[i]["extra"]) is None else float(e["lr"]) for i in rows]


def test_truncate_below_a_learnt_optional_subtree(tmp_path, backend):
    path = str(tmp_path / "s")
    store = optional_store(path, backend)
    store.truncate(9)
    store.extend(extra(i) for i in range(9, 14))
    assert extras(store, range(8, 14)) == [None, 9.0, 10.0, 11.0, 12.0, 13.0]
    store.truncate(11)
    store.extend(extra(i) for i in range(11, 14))
    store.close()
    got = pytreestore.open(path, backend=backend)
    assert extras(got, range(8, 14)) == [None, 9.0, 10.0, 11.0, 12.0, 13.0]


def test_truncate_below_a_structure_learnt_in_an_element_table(tmp_path, backend):
    path = str(tmp_path / "s")

    def rec(i: int, learnt: bool) -> dict:
        element = {"a": np.int8(i), "o": {"v": np.float32(i)} if learnt else None}
        return {"p": [element, element], "t": np.int32(i)}

    like = {"p": [{"a": np.int8(0), "o": None}], "t": np.int32(0)}
    store = pytreestore.create(
        path,
        like,
        ragged=["['p']"],
        optional=["['p'][*]['o']"],
        chunk_records=4,
        backend=backend,
    )
    store.extend(rec(i, False) for i in range(12))
    store.flush()
    store.extend(rec(i, True) for i in range(12, 14))  # ['o'] learnt at element row 24
    store.flush()
    store.truncate(9)  # below it: element row 18
    store.extend(rec(i, True) for i in range(9, 14))
    store.truncate(11)
    store.extend(rec(i, True) for i in range(11, 14))
    store.close()
    got = pytreestore.open(path, backend=backend)
    values = [
        [None if e["o"] is None else float(e["o"]["v"]) for e in got[i]["p"]] for i in range(8, 14)
    ]
    assert values == [[None, None]] + [[float(i)] * 2 for i in range(9, 14)]


def test_a_reader_refreshed_past_a_truncate_reads_the_rows_written_after(tmp_path, backend):
    path = str(tmp_path / "s")
    store = evolved(path, backend)
    reader = pytreestore.open(path, backend=backend)
    assert lrs(reader)[12:] == [12.0, 13.0]
    store.truncate(9)
    assert reader.refresh() == 9  # a truncate alone: the reader follows it
    store.extend(with_lr(i) for i in range(9, 14))
    store.flush()
    assert reader.refresh() == 14
    assert lrs(reader)[8:] == [0.0, 9.0, 10.0, 11.0, 12.0, 13.0]
    store.close()


# ---- defects 4 and 7: the order of a truncate's writes ---------------------------------------------


def cut_off_child(path: str, backend: str, records: int, when: str, make: str) -> None:
    """In a child forked by the zygote: ``make`` (:func:`evolved`) and ``truncate(records)``,
    exiting with ``os._exit(9)`` right ``when`` ("before" or "after") the truncate's commit
    record is written."""
    import os

    store = globals()[make](path, backend)
    engine = store._backend

    def cut(write):
        def hooked(key, data, *args):
            truncating = key == COMMIT_KEY and b'"truncate"' in data
            if truncating and when == "before":
                os._exit(9)  # the truncate's root is written, its commit record not
            out = write(key, data, *args)
            if truncating:
                os._exit(9)  # its commit record is written, nothing after it
            return out

        return hooked

    engine.write_bytes = cut(engine.write_bytes)
    if hasattr(engine, "write_bytes_if"):
        engine.write_bytes_if = cut(engine.write_bytes_if)
    store.truncate(records)


def cut_off_truncate(
    zygote: Zygote, path: str, backend: str, records: int, when: str, make: str = "evolved"
) -> None:
    """Runs :func:`cut_off_child` in a process forked by the zygote (no new interpreter)."""
    log = f"{path}.log"
    code = zygote.call(
        "tests.test_truncate:cut_off_child", path, backend, records, when, make, log=log
    )
    assert code == 9, Path(log + ".stderr").read_text()[-3000:]


def test_a_truncate_cut_off_before_its_commit_record_loses_nothing(zygote, tmp_path, backend):
    path = str(tmp_path / "s")
    cut_off_truncate(zygote, path, backend, 9, "before")
    want = [0.0] * 12 + [12.0, 13.0]
    reader = pytreestore.open(path, backend=backend)
    assert len(reader) == 14 and lrs(reader) == want  # the commit in force: 14 records
    assert reader.verify().ok
    with pytreestore.open(path, "a", backend=backend) as store:
        assert lrs(store) == want
        store.truncate(9)
        store.extend(with_lr(i) for i in range(9, 14))
    got = pytreestore.open(path, backend=backend)
    assert lrs(got) == [0.0] * 9 + [9.0, 10.0, 11.0, 12.0, 13.0]


def test_a_truncate_after_learning_cut_off_before_its_commit_record(zygote, tmp_path, backend):
    path = str(tmp_path / "s")
    cut_off_truncate(zygote, path, backend, 9, "before", make="optional_store")
    want = [None] * 4 + [12.0, 13.0]
    reader = pytreestore.open(path, backend=backend)
    assert len(reader) == 14 and extras(reader, range(8, 14)) == want
    with pytreestore.open(path, "a", backend=backend) as store:
        assert extras(store, range(8, 14)) == want
        store.truncate(9)
        store.extend(extra(i) for i in range(9, 14))
    got = pytreestore.open(path, backend=backend)
    assert extras(got, range(8, 14)) == [None, 9.0, 10.0, 11.0, 12.0, 13.0]


def test_a_writer_opening_after_the_cut_puts_back_the_committed_schema(zygote, tmp_path, backend):
    path = str(tmp_path / "s")
    cut_off_truncate(zygote, path, backend, 9, "before")
    pytreestore.open(path, "a", backend=backend).close()
    store = pytreestore.open(path, backend=backend)
    root = json.loads(store._backend.read_bytes(ROOT_KEY))["attributes"]["pytreestore"]
    commit = json.loads(store._backend.read_bytes(COMMIT_KEY))
    lr = next(c for c in store.schema.columns if c.path == "['lr']")
    assert root["digest"] == commit["schema"] and lr.start == 12


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
@pytest.mark.parametrize("when", ["before", "after"])
def test_zarr_readers_never_see_rows_past_a_truncates_commit(zygote, tmp_path, backend, when):
    path = str(tmp_path / "s")
    cut_off_truncate(zygote, path, backend, 4, when)
    records = 14 if when == "before" else 4  # what the commit record holds
    group = zarr.open_group(path, mode="r")
    assert group["step"].shape == (4,)  # never more than the commit holds
    assert group["step"][:].tolist() == [0, 1, 2, 3]
    assert len(pytreestore.open(path, backend=backend)) == records
    pytreestore.open(path, "a", backend=backend).close()
    assert zarr.open_group(path, mode="r")["step"].shape == (records,)


def hook_commit_record(store, action) -> None:
    """Calls ``action()`` right before ``store`` writes a truncate's commit record."""
    backend, done = store._backend, []

    def hooked(write):
        def call(key, data, *args):
            if key == COMMIT_KEY and b'"truncate"' in data and not done:
                done.append(key)  # once: a conditional write may write through write_bytes
                action()
            return write(key, data, *args)

        return call

    backend.write_bytes = hooked(backend.write_bytes)
    if hasattr(backend, "write_bytes_if"):
        backend.write_bytes_if = hooked(backend.write_bytes_if)


def test_a_reader_opening_between_a_truncates_root_and_its_commit_record(tmp_path, backend):
    path = str(tmp_path / "s")
    store = evolved(path, backend)
    seen = []

    def read() -> None:
        reader = pytreestore.open(path, backend=backend)
        seen.append((len(reader), lrs(reader), reader.verify().ok))
        if backend != "ocdbt":  # zarr-python cannot read OCDBT
            seen.append(zarr.open_group(path, mode="r")["lr"].shape)

    hook_commit_record(store, read)
    store.truncate(9)
    assert seen[0] == (14, [0.0] * 12 + [12.0, 13.0], True)
    assert seen[1:] in ([], [(9,)])
    store.close()


def test_a_pending_ragged_reader_refreshing_between_a_truncates_root_and_its_commit(
    tmp_path, backend
):
    path = str(tmp_path / "s")
    like = {"step": np.int32(0), "extra": None, "other": None}
    optional = ["['extra']", "['other']"]
    store = pytreestore.create(path, like, optional=optional, chunk_records=4, backend=backend)
    store.extend({**like, "step": np.int32(i)} for i in range(12))
    store.flush()
    reader = pytreestore.open(path, backend=backend)  # both subtrees pending
    store.extend({**extra(i), "other": None} for i in range(12, 14))  # ['extra'] learnt at 12
    store.flush()
    seen = []

    def refresh() -> None:  # the root has ['extra'] from 9, the commit in force from 12
        seen.append((reader.refresh(), extras(reader, range(8, 14))))

    hook_commit_record(store, refresh)
    store.truncate(9)
    assert seen == [(14, [None] * 4 + [12.0, 13.0])]
    assert reader.refresh() == 9 and extras(reader, range(8, 9)) == [None]
    store.extend({**extra(i), "other": None} for i in range(9, 14))
    store.flush()
    assert reader.refresh() == 14
    assert extras(reader, range(8, 14)) == [None, 9.0, 10.0, 11.0, 12.0, 13.0]
    store.close()


def test_a_reader_whose_root_predates_a_truncate_and_commit_follows_it(
    tmp_path, backend, monkeypatch
):
    path = str(tmp_path / "s")
    store = evolved(path, backend)
    read_root = _open.read_root

    def late(engine, location):  # the truncate lands between the reader's two reads
        raw = read_root(engine, location)
        store.truncate(9)
        return raw

    monkeypatch.setattr(_open, "read_root", late)
    reader = pytreestore.open(path, backend=backend)  # root: ['lr'] starts at 12
    monkeypatch.undo()
    assert len(reader) == 9 and lrs(reader) == [0.0] * 9
    store.extend(with_lr(i) for i in range(9, 14))
    store.close()
    assert lrs(pytreestore.open(path, backend=backend)) == [0.0] * 9 + [9.0, 10.0, 11.0, 12.0, 13.0]


# ---- defect 8: verify after a truncate ---------------------------------------------------------


def test_verify_after_a_truncate_reports_the_kept_chunks_as_kept(tmp_path, backend):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, step(0), chunk_records=2, backend=backend)
    store.extend(step(i) for i in range(10))
    store.truncate(4)
    store.close()
    kept = ("step/c/2", "step/c/3", "step/c/4")
    for _ in range(2):  # the next open(mode="a") keeps them: older versions read them
        report = pytreestore.open(path, backend=backend).verify()
        assert report.ok and report.past_commit == () and report.kept == kept
        assert "kept for the versions before a truncate" in str(report)
        assert "removed by the next" not in str(report)
        pytreestore.open(path, "a", backend=backend).close()
    assert len(pytreestore.open(path, backend=backend, version=1)) == 10
    with pytreestore.open(path, "a", backend=backend) as store:
        store.append(step(40))  # gives the rows past 4 up (a release), and writes row 4
    report = pytreestore.open(path, backend=backend).verify()
    assert report.kept == () and report.past_commit == ("step/c/3", "step/c/4")
    pytreestore.open(path, "a", backend=backend).close()  # which removes them, as it says
    report = pytreestore.open(path, backend=backend).verify()
    assert report.ok and report.past_commit == () and report.kept == ()


# ---- kill trials: truncates and appends after an evolve, killed at a random moment -------------

TRIAL = """
import random, sys, numpy as np, pytreestore
sys.path.insert(0, {tests!r})
from test_truncate import evolved, with_lr

store = evolved({path!r}, {backend!r})
store.truncate(9)
store.extend(with_lr(i) for i in range(9, 14))
store.flush()
rng, n = random.Random({seed}), 14
print("READY", flush=True)
while True:
    n = rng.randint(9, n)
    store.truncate(n)
    grown = n + rng.randint(1, 9)
    store.extend(with_lr(i) for i in range(n, grown))
    store.flush()
    n = grown
"""


def kill_trial(path: str, backend: str, seed: int) -> None:
    """Kills a writer cycling truncate and extend after an evolve at a random moment; the
    store must open, hold exactly records ``i`` of a prefix, and take appends."""
    import random
    import time

    code = TRIAL.format(tests=str(ROOT / "tests"), path=path, backend=backend, seed=seed)
    with interpreters.popen(  # forked from the test zygote (tests/interpreters.py)
        [sys.executable, "-c", textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=child_env(),
    ) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "READY"
            time.sleep(random.Random(seed).uniform(0.0, 1.5))
        finally:
            child.kill()
            child.wait()
    reader = pytreestore.open(path, backend=backend)
    n = len(reader)
    assert n >= 9
    assert reader.load(as_numpy=True)["step"].tolist() == list(range(n))
    assert lrs(reader) == [0.0] * 9 + [float(i) for i in range(9, n)]
    if backend != "ocdbt":
        assert zarr.open_group(path, mode="r")["step"].shape[0] <= n
    with pytreestore.open(path, "a", backend=backend) as store:
        store.truncate(9)
        store.extend(with_lr(i) for i in range(9, 12))
    assert lrs(pytreestore.open(path, backend=backend)) == [0.0] * 9 + [9.0, 10.0, 11.0]


@pytest.mark.parametrize("seed", [1])
def test_kill_trials_of_truncate_after_evolve(tmp_path, backend, seed):
    kill_trial(str(tmp_path / "s"), backend, seed)


@pytest.mark.slow
def test_kill_trials_of_truncate_after_evolve_long(tmp_path, backend):
    for seed in range(2, 22):
        kill_trial(str(tmp_path / f"s{seed}"), backend, seed)
