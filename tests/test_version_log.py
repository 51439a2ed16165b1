"""The version log's bounds and the readers they leave behind (issue 28): versions written
over stay unreadable however many truncates follow (defect 2), a reader whose version
vacuum() removed is told so (9), a version the log dropped names what it keeps (12), and a
reopened writer truncated to nothing counts nothing (6)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY
from pytreestore._log import commit_record as record
from pytreestore._log.commit_record import Commit


@pytest.fixture(params=["fixed", "ragged"])
def ragged(request) -> bool:
    return request.param == "ragged"


def memory() -> str:
    return f"memory://version-log-{uuid.uuid4().hex}"


def rec(i: int, ragged: bool) -> dict:
    if ragged:
        return {"x": np.int32(i), "p": [np.int16(i)] * (abs(i) % 3)}
    return {"x": np.int32(i)}


def create(path: str, backend: str, ragged: bool, **options) -> pytreestore.TreeStore:
    if ragged:
        options["ragged"] = True
    return pytreestore.create(path, rec(1, ragged), backend=backend, **options)


def xs(store: pytreestore.TreeStore, ragged: bool = False) -> list[int]:
    """Every record's ``x`` (and, ragged, checks ``p`` matches it)."""
    if not ragged:
        return store.load(as_numpy=True)["x"].tolist() if len(store) else []
    got = []
    for i in range(len(store)):
        r = store.load(i, as_numpy=True)
        assert [int(v) for v in r["p"]] == [int(r["x"])] * (abs(int(r["x"])) % 3)
        got.append(int(r["x"]))
    return got


# ---- defect 2: written-over versions stay gone past the commit record's history ----------------


def test_a_version_written_over_stays_gone_after_257_reruns(backend, ragged, monkeypatch):
    """The issue's repro: 257 reruns after the one that wrote over the tagged version (a
    ragged store, for speed, past a bound of 4 instead of 256)."""
    if ragged:
        monkeypatch.setattr(record, "_HISTORY", 4)
    path = memory()
    s = create(path, backend, ragged)
    s.extend(rec(i, ragged) for i in range(10))
    s.tag("ten")
    ten = s.version
    at_ten = pytreestore.open(path, backend=backend, version="ten")
    latest = pytreestore.open(path, backend=backend)
    s.truncate(5)
    cut = s.version
    s.extend(rec(1000 + i, ragged) for i in range(15))
    s.flush()
    for k in range(record._HISTORY + 1):
        s.truncate(len(s) - 1)
        s.append(rec(-k, ragged))
        s.flush()
    listed = {v.version: v for v in s.versions()}
    assert listed[ten].tags == ("ten",) and not listed[ten].readable
    for wanted in ("ten", ten):
        with pytest.raises(errors.VersionNotFoundError, match="wrote new records over its"):
            pytreestore.open(path, backend=backend, version=wanted)
    with pytest.raises(errors.StoreReplacedError, match="written over"):
        xs(latest, ragged)
    if backend == "ocdbt":  # its version= reader reads the storage generation it pinned
        assert xs(at_ten, ragged) == list(range(10))
    else:
        with pytest.raises(errors.StoreReplacedError, match="written over"):
            xs(at_ten, ragged)
    assert listed[cut].readable  # the truncate's own 5 records were never written over
    assert xs(pytreestore.open(path, backend=backend, version=cut), ragged) == list(range(5))
    assert len(json.loads(s._backend.read_bytes(COMMIT_KEY))["rewrites"]) == 2
    s.close()


def test_past_the_bound_releases_merge_and_never_read_as_valid(backend, monkeypatch):
    """Reruns from ever later records (each a release no later one implies), past a bound of
    3: every version written over is refused, at every step, and every version read holds
    exactly the records it was committed with."""
    monkeypatch.setattr(record, "_HISTORY", 3)
    path = memory()
    s = create(path, backend, False, keep_versions=None)
    rows: list[int] = []  # the values in the columns' rows now (what a read of them gets)
    held: dict[int, list[int]] = {}  # version -> its records' values when committed
    value = iter(range(10_000))

    def write(n: int) -> None:
        s.extend(rec(next(value), False) for _ in range(n))
        s.flush()
        rows[len(s) - n : len(s)] = xs(s)[len(s) - n :]

    def check() -> None:
        for v in s.versions():
            held.setdefault(v.version, rows[: v.records])
            whole = rows[: v.records] == held[v.version]
            if not whole:
                assert not v.readable, f"version {v.version} was written over"
            if v.readable:
                got = pytreestore.open(path, backend=backend, version=v.version)
                assert xs(got) == held[v.version]
            else:
                with pytest.raises(errors.VersionNotFoundError):
                    pytreestore.open(path, backend=backend, version=v.version)

    write(4)
    for start in (2, 3, 4, 5, 6, 7, 5, 8, 9, 10, 11):
        write(3)
        check()
        s.truncate(start)
        write(1)
        check()
    head = json.loads(s._backend.read_bytes(COMMIT_KEY))
    assert len(head["rewrites"]) == 3 and head["horizon"] == head["rewrites"][0][0]
    merged = [v for v in s.versions() if not v.readable and held[v.version] == rows[: v.records]]
    assert merged  # whole, but refused with the releases merged: say so
    with pytest.raises(errors.VersionNotFoundError, match="keeps only its last 3 such reruns"):
        pytreestore.open(path, backend=backend, version=merged[0].version)
    s.close()


def test_released_keeps_the_releases_no_later_one_implies(monkeypatch):
    released = record.released
    assert released((), None, (3, 5)) == (((3, 5),), None)
    assert released(((3, 5), (6, 9)), None, (8, 9)) == (((3, 5), (8, 9)), None)
    assert released(((3, 5), (6, 9)), None, (8, 1)) == (((8, 1),), None)
    monkeypatch.setattr(record, "_HISTORY", 2)
    merged = released(((3, 5), (6, 9)), None, (8, 12))
    assert merged == (((6, 5), (8, 12)), 6)
    assert released(*merged, (9, 13)) == (((8, 5), (9, 13)), 8)
    assert released(*merged, (9, 4)) == (((9, 4),), None)  # the merged pair is implied
    # an older writer's list, each release kept: the implied ones are dropped
    assert released(((1, 7), (2, 7), (3, 2)), None, (4, 6)) == (((3, 2), (4, 6)), None)


@pytest.mark.parametrize("bound", [1, 2, 3, 5])
def test_no_version_written_over_is_ever_valid_in_random_reruns(monkeypatch, bound):
    """A model of storage under random truncates and appends (each after its release, as the
    writer commits them), against the commit records alone, with a tiny bound: a version
    whose rows were written over is always gone, and one refused while whole is refused by
    the merged pair (``horizon``) only."""
    import random

    monkeypatch.setattr(record, "_HISTORY", bound)
    for seed in range(40):
        rng = random.Random(seed)
        head, rows, written = Commit(0, 0), [], iter(range(10**6))
        held = {0: (head, [])}
        for _ in range(150):
            if head.records and rng.random() < 0.5:
                cut = rng.randint(max(0, head.records - rng.choice([1, 3, 20])), head.records)
                head = head.next(cut, operation="truncate")
            else:
                if head.high is not None:
                    head = head.next(head.records, operation="release")
                    held[head.generation] = (head, rows[: head.records])
                n = rng.randint(1, 4)
                rows[head.records : head.records + n] = [next(written) for _ in range(n)]
                head = head.next(head.records + n)
            held[head.generation] = (head, rows[: head.records])
            head = Commit.from_bytes(head.to_bytes(), "model")
            assert len(head.rewrites) <= bound
            for version, (seen, values) in held.items():
                gone = head.gone(seen)
                whole = rows[: seen.records] == values
                assert whole or gone is not None, f"seed {seed}: version {version} read as valid"
                assert not whole or gone is None or gone[0] == head.horizon, (seed, version)


def test_a_commit_record_with_a_horizon_reads_back_and_is_checked(tmp_path):
    commit = Commit(5, 9, rewrites=((7, 2), (8, 4)), horizon=7)
    assert Commit.from_bytes(commit.to_bytes(), "here") == commit
    assert json.loads(commit.to_bytes())["horizon"] == 7
    assert "horizon" not in json.loads(Commit(5, 9, rewrites=((7, 2),)).to_bytes())
    bad = {**json.loads(commit.to_bytes()), "horizon": "7"}
    with pytest.raises(errors.CorruptStoreError, match=re.escape("its 'horizon' must be")):
        Commit.from_bytes(json.dumps(bad).encode(), "here")


# ---- defect 9: a reader whose version vacuum() removed -----------------------------------------


def test_a_reader_whose_version_vacuum_removed_is_told_to_open_again(tmp_path, backend, ragged):
    path = str(tmp_path / "s")
    s = create(path, backend, ragged, chunk_records=4, keep_versions=1)
    s.extend(rec(i, ragged) for i in range(10))
    s.flush()
    at_ten = pytreestore.open(path, backend=backend, version=s.version)
    latest = pytreestore.open(path, backend=backend)
    s.truncate(2)
    assert s.vacuum().chunks > 0
    expected = (
        f"opened (version {at_ten.version}, 10 records) was removed: the store no longer keeps it"
    )
    with pytest.raises(errors.StoreReplacedError, match=re.escape(expected)) as caught:
        xs(latest, ragged)
    assert "vacuum() removed" in str(caught.value)
    assert "Open the store again" in str(caught.value)
    assert "damaged outside pytreestore" not in str(caught.value)
    if backend == "ocdbt":  # a version= reader reads the generation it pinned: still whole
        assert xs(at_ten, ragged) == list(range(10))
    else:
        with pytest.raises(errors.StoreReplacedError, match=re.escape(expected)):
            xs(at_ten, ragged)
    assert xs(pytreestore.open(path, backend=backend), ragged) == [0, 1]
    s.close()


# ---- defect 12: a version the log dropped ------------------------------------------------------


def test_a_version_the_log_dropped_names_what_it_keeps(backend):
    path = memory()
    s = create(path, backend, False, keep_versions=5)
    for i in range(140):
        s.append(rec(i, False))
        s.flush()
        if i in (0, 100):
            s.tag(f"at-{i}")
    s.close()
    kept = (
        "it keeps versions 1, 101 and 124 to 140; tags 'at-0' (1), 'at-100' (101) "
        "(store.versions() lists them)"
    )
    for wanted in (5, 300):
        with pytest.raises(errors.VersionNotFoundError, match=re.escape(kept)):
            pytreestore.open(path, backend=backend, version=wanted)


def test_a_long_list_of_kept_versions_is_shortened(tmp_path):
    path = str(tmp_path / "s")
    s = create(path, "tensorstore", False)
    for i in range(20):
        s.append(rec(i, False))
        s.flush()
    s.close()
    for n in range(1, 20, 2):  # versions 0, 2, 4, ... 20 are left: 11 runs
        Path(path, ".pytreestore", "versions", f"{n:020d}.json").unlink()
    with pytest.raises(
        errors.VersionNotFoundError,
        match=re.escape("it keeps versions 0, 2, 4, 6, ... 4 more runs ..., 16, 18 and 20 ("),
    ):
        pytreestore.open(path, version=3)


# ---- defect 6: a reopened writer truncated to nothing ------------------------------------------


def test_a_reopened_writer_truncated_to_nothing_counts_nothing(tmp_path, backend, ragged):
    path = str(tmp_path / "s")
    with create(path, backend, ragged) as s:
        s.extend(rec(i, ragged) for i in range(5))
    s = pytreestore.open(path, "a", backend=backend)
    s.truncate(0)
    assert (len(s), s.committed) == (0, 0)
    assert "records=0," in repr(s)
    assert pytreestore.copy(s, str(tmp_path / "copy")) == 0
    assert len(pytreestore.open(str(tmp_path / "copy"))) == 0
    s.append(rec(7, ragged))
    assert (len(s), s.committed) == (1, 0)
    s.close()
    assert xs(pytreestore.open(path, backend=backend), ragged) == [7]


# ---- a commit of fragments holding no record writes no row: nothing is given up ----------------


def test_fragments_of_no_record_after_a_truncate_keep_the_older_versions(tmp_path, backend, ragged):
    path = tmp_path / "s"
    with create(path, backend, ragged) as store:
        store.extend(rec(i, ragged) for i in range(10))
        store.flush()
        ten = store.version
        store.truncate(5)
        store.commit_fragments([pytreestore.write_fragment(path, [], backend=backend)])
        assert len(store) == 5
        old = pytreestore.open(path, version=ten, backend=backend)  # still whole
        assert xs(old, ragged) == list(range(10))
        store.commit_fragments([pytreestore.write_fragment(path, [rec(50, ragged)])])
        with pytest.raises(errors.VersionNotFoundError, match="wrote new records over"):
            pytreestore.open(path, version=ten, backend=backend)
    assert xs(pytreestore.open(path, backend=backend), ragged) == [0, 1, 2, 3, 4, 50]
