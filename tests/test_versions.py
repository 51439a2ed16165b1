"""Versions: every commit numbered and kept, open(version=), tag, truncate, vacuum, the log's
bound, and what each refuses (issue 16, point 4)."""

from __future__ import annotations

import json
import pickle
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY, version_key
from tests.conftest import FILE_BACKENDS
from tests.data.make_golden import GOLDEN

pytest_plugins = ("tests.fixtures",)
pytestmark = pytest.mark.plain_files


def rec(i: int) -> dict:
    return {"x": np.float32(i), "v": np.arange(3, dtype=np.int32) + i}


def xs(store) -> list[float]:
    return store.load(as_numpy=True)["x"].tolist() if len(store) else []


def make(path: str, backend: str, n: int, chunk: int = 64, **options) -> pytreestore.TreeStore:
    store = pytreestore.create(path, rec(0), backend=backend, chunk_records=chunk, **options)
    store.extend(rec(i) for i in range(n))
    store.flush()
    return store


# ---- listing and reading versions ------------------------------------------------------------


def test_every_commit_is_a_numbered_version(path, backend):
    with make(path, backend, 3) as store:
        store.extend([rec(3), rec(4)])
        store.flush()
    reader = pytreestore.open(path, backend=backend)
    listed = reader.versions()
    assert [(v.version, v.records, v.operation) for v in listed] == [
        (0, 0, "create"),
        (1, 3, "append"),
        (2, 5, "append"),
    ]
    assert all(v.readable and v.time is not None and v.time.tzinfo for v in listed)
    assert listed[0].time <= listed[1].time <= listed[2].time
    assert reader.version == 2
    for v in listed:
        old = pytreestore.open(path, backend=backend, version=v.version)
        assert old.version == v.version and xs(old) == [float(i) for i in range(v.records)]


def test_version_records_are_the_commit_records(path, backend):
    make(path, backend, 2).close()
    head = json.loads(Path(path, COMMIT_KEY).read_text())
    stored = json.loads(Path(path, version_key(head["generation"])).read_text())
    assert stored == head and stored["schema"].startswith("blake2b-160:")


def test_readers_at_a_version_keep_it_while_a_writer_commits(path, backend):
    writer = make(path, backend, 4)
    pinned = pytreestore.open(path, backend=backend, version=1)
    latest = pytreestore.open(path, backend=backend)
    writer.extend(rec(i) for i in range(4, 10))
    writer.flush()
    assert pinned.refresh() == 4 and xs(pinned) == [0.0, 1.0, 2.0, 3.0]
    assert latest.refresh() == 10
    writer.close()


def test_a_pinned_reader_pickles_at_its_version(path, backend):
    writer = make(path, backend, 4)
    writer.extend([rec(4)])
    writer.flush()
    pinned = pytreestore.open(path, backend=backend, version=1)
    again = pickle.loads(pickle.dumps(pinned))
    assert again.version == 1 and len(again) == 4
    writer.close()


def test_a_store_of_an_older_format_lists_its_head(tmp_path):
    src = GOLDEN / "format-1" / "seed"
    dst = tmp_path / "old"
    shutil.copytree(src, dst)
    store = pytreestore.open(str(dst), generic=True)
    (only,) = store.versions()
    assert only.records == len(store) and only.time is None
    with pytreestore.open(str(dst), "a") as writer:
        writer.append(writer[0])
    listed = pytreestore.open(str(dst), generic=True).versions()
    assert [(v.version, v.records, v.operation) for v in listed] == [
        (only.version, only.records, None),
        (only.version + 1, only.records + 1, "append"),
    ]
    assert pytreestore.open(str(dst), version=only.version).load(as_numpy=True) is not None


# ---- tags ------------------------------------------------------------------------------------


def test_tags_name_versions_and_never_move(path, backend):
    with make(path, backend, 2) as store:
        store.tag("warmup")
        store.extend([rec(2)])
        store.tag("before", version=1)
        with pytest.raises(errors.TagExistsError, match=r"'warmup' already.*version 1"):
            store.tag("warmup")
        with pytest.raises(ValueError, match="tag's name"):
            store.tag("../x")
        with pytest.raises(errors.VersionNotFoundError, match="no version 9"):
            store.tag("later", version=9)
    old = pytreestore.open(path, backend=backend, version="warmup")
    assert xs(old) == [0.0, 1.0]
    tagged = {v.version: v.tags for v in old.versions()}
    assert tagged[1] == ("before", "warmup")
    with pytest.raises(errors.VersionNotFoundError, match=r"no tag 'nope'.*'before', 'warmup'"):
        pytreestore.open(path, backend=backend, version="nope")


def test_a_reader_cannot_tag(path, backend):
    make(path, backend, 1).close()
    with pytest.raises(errors.ReadOnlyError):
        pytreestore.open(path, backend=backend).tag("x")


# ---- truncate --------------------------------------------------------------------------------


def test_truncate_makes_a_version_and_rewrites_nothing(path, backend):
    with make(path, backend, 10) as store:
        before = store.version
        store.truncate(3)
        assert len(store) == 3 and xs(store) == [0.0, 1.0, 2.0]
    assert xs(pytreestore.open(path, backend=backend)) == [0.0, 1.0, 2.0]
    undone = pytreestore.open(path, backend=backend, version=before)
    assert xs(undone) == [float(i) for i in range(10)]
    with pytreestore.open(path, "a", backend=backend) as again:  # reopening repairs nothing
        assert len(again) == 3
    assert xs(pytreestore.open(path, backend=backend, version=before))[-1] == 9.0


def test_append_after_truncate_releases_the_older_versions(path, backend):
    with make(path, backend, 10) as store:
        store.tag("ten")
        store.truncate(5)
        store.extend(rec(100 + i) for i in range(3))
    reader = pytreestore.open(path, backend=backend)
    assert xs(reader) == [0.0, 1.0, 2.0, 3.0, 4.0, 100.0, 101.0, 102.0]
    listed = reader.versions()
    assert [v.operation for v in listed][-3:] == ["truncate", "release", "append"]
    assert {v.version: v.readable for v in listed} == {0: True, 1: False, 2: True, 3: True, 4: True}
    with pytest.raises(errors.VersionNotFoundError, match=r"'ten'.*gone.*version 3.*from 5 on"):
        pytreestore.open(path, backend=backend, version="ten")
    assert xs(pytreestore.open(path, backend=backend, version=2)) == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_truncate_refuses_bad_counts(path, backend):
    with make(path, backend, 4) as store:
        for bad in (5, -1):
            with pytest.raises(errors.StoreIndexError, match=r"holds 4.*Nothing was changed"):
                store.truncate(bad)
        with pytest.raises(TypeError):
            store.truncate(2.0)  # type: ignore[arg-type]
        assert store.version == 1 and len(store) == 4
    with pytest.raises(errors.ReadOnlyError):
        pytreestore.open(path, backend=backend).truncate(1)


def test_truncate_then_pending_records_are_committed_first(path, backend):
    with make(path, backend, 2) as store:
        store.extend([rec(2), rec(3)])  # buffered
        store.truncate(3)
        assert xs(store) == [0.0, 1.0, 2.0]
    versions = pytreestore.open(path, backend=backend).versions()
    assert [(v.records, v.operation) for v in versions][-2:] == [(4, "append"), (3, "truncate")]


def test_truncate_before_an_evolved_column_lowers_its_start(path, backend):
    with make(path, backend, 4) as store:
        store.evolve(add={"['y']": np.int8(7)})
        evolved = store.version
        store.append({**rec(4), "y": np.int8(1)})
        store.flush()
        five = store.version
        store.truncate(2)
        assert store.load(as_numpy=True)["y"].tolist() == [7, 7]
        old = pytreestore.open(path, backend=backend, version=evolved - 1)  # before evolve
        assert "['y']" not in old.schema.paths and len(old) == 4
        before = pytreestore.open(path, backend=backend, version=five)
        assert before.load(as_numpy=True)["y"].tolist() == [7, 7, 7, 7, 1]
        store.append({**rec(8), "y": np.int8(3)})
        assert store.schema.columns[-1].start == 2
    got = pytreestore.open(path, backend=backend).load(as_numpy=True)
    assert got["y"].tolist() == [7, 7, 3] and got["x"].tolist() == [0.0, 1.0, 8.0]


def test_a_reader_whose_records_were_written_over_is_told(path, backend):
    writer = make(path, backend, 8)
    reader = pytreestore.open(path, backend=backend)
    writer.truncate(2)
    assert reader.refresh() == 2  # a truncate alone: the reader follows it
    old = pytreestore.open(path, backend=backend, version=1)
    writer.extend(rec(50 + i) for i in range(3))
    writer.flush()
    with pytest.raises(errors.StoreReplacedError, match="written over"):
        old.refresh()
    assert reader.refresh() == 5 and xs(reader) == [0.0, 1.0, 50.0, 51.0, 52.0]
    writer.close()


def test_truncate_then_append_reads_new_values_through_the_cache(path, backend):
    store = make(path, backend, 8)
    assert xs(store) == [float(i) for i in range(8)]  # cached
    assert store[6]["x"] == 6.0  # read ahead
    store.truncate(4)
    store.extend(rec(90 + i) for i in range(4))
    assert xs(store) == [0.0, 1.0, 2.0, 3.0, 90.0, 91.0, 92.0, 93.0]
    assert float(store[6]["x"]) == 92.0
    store.close()


def test_ragged_truncate(path, backend):
    like = {"p": [np.int16(0)], "t": np.zeros(2, np.float32)}
    store = pytreestore.create(path, like, backend=backend, ragged=True)
    records = [
        {"p": [np.int16(i)] * (i % 3), "t": np.full(i % 4 + 1, i, np.float32)} for i in range(9)
    ]
    store.extend(records)
    store.flush()
    store.truncate(4)
    store.extend(records[6:])
    store.close()
    got = pytreestore.open(path, backend=backend)
    expected = records[:4] + records[6:]
    assert len(got) == len(expected)
    for i, r in enumerate(expected):
        assert [int(v) for v in got[i]["p"]] == [int(v) for v in r["p"]]
        np.testing.assert_array_equal(np.asarray(got[i]["t"]), r["t"])
    tables = json.loads(Path(path, COMMIT_KEY).read_text())["tables"]
    assert tables == {
        "['p']": sum(len(r["p"]) for r in expected),
        "['t']": sum(len(r["t"]) for r in expected),
    }


# ---- the log's bound and vacuum --------------------------------------------------------------


def test_the_log_keeps_the_last_versions_and_the_tags(path, backend):
    store = pytreestore.create(path, rec(0), backend=backend, keep_versions=5)
    store.append(rec(0))
    store.flush()
    store.tag("first")
    for i in range(1, 70):
        store.append(rec(i))
        store.flush()
    store.close()
    numbers = [v.version for v in pytreestore.open(path, backend=backend).versions()]
    assert numbers[0] == 1 and len(numbers) < 70 and numbers[-1] == 70
    assert xs(pytreestore.open(path, backend=backend, version="first")) == [0.0]
    kept = "it keeps versions 1 and 60 to 70; tags 'first' (1) (store.versions() lists them)"
    with pytest.raises(errors.VersionNotFoundError, match=r"no version 2: " + re.escape(kept)):
        pytreestore.open(path, backend=backend, version=2)  # issue 28: not "1 to 70"


def test_vacuum_removes_only_what_no_kept_version_needs(path, backend):
    store = make(path, backend, 10, chunk=4)  # 3 chunks per column
    ten = store.version
    store.evolve(drop=["['v']"])
    store.truncate(2)
    assert store.vacuum().chunks == 0  # the version of 10 records still needs them
    assert xs(pytreestore.open(path, backend=backend, version=ten)) == [float(i) for i in range(10)]
    store.append({"x": np.float32(7)})
    report = store.vacuum()  # the versions of 8 and 10 records are gone: 3 records are kept
    assert report.versions == 3  # versions 1, 2 (8 and 10 records) and 3 (evolve, 10)
    assert report.chunks == 5  # x: chunks 1 and 2; ['v']: all 3 (version 0 has it, empty)
    assert (report.arrays, report.schemas) == (0, 0)
    assert xs(pytreestore.open(path, backend=backend, version=0)) == []
    store.close()
    again = pytreestore.open(path, backend=backend)
    assert xs(again) == [0.0, 1.0, 7.0] and again.verify().ok
    with pytreestore.open(path, "a", backend=backend, keep_versions=2) as store:
        assert store.vacuum() == type(report)(versions=2, schemas=1, arrays=1, chunks=0)
    assert [v.version for v in pytreestore.open(path, backend=backend).versions()] == [5, 6]
    assert xs(pytreestore.open(path, backend=backend)) == [0.0, 1.0, 7.0]
    assert not [p for p in Path(path, "v").rglob("*") if p.is_file()]


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_a_reader_of_a_column_vacuum_removed_is_told_to_open_again(path, backend):
    """A reader opened before a drop whose array vacuum() then removed: the error says so
    and what to do, without TensorStore's own text."""
    make(path, backend, 3, keep_versions=1).close()
    reader = pytreestore.open(path, backend=backend)
    with pytreestore.open(path, "a", backend=backend, keep_versions=1) as store:
        store.evolve(drop=["['v']"])
        store.append({"x": np.float32(3)})
        assert store.vacuum().arrays == 1
    with pytest.raises(errors.StoreReplacedError, match=re.escape("vacuum() removed")) as caught:
        reader.load(as_numpy=True)  # issue 28: was CorruptStoreError
    assert "Open the store again" in str(caught.value)
    assert "Error opening" not in str(caught.value)
    assert xs(pytreestore.open(path, backend=backend)) == [0.0, 1.0, 2.0, 3.0]


def test_keep_versions_is_checked(path, backend):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="keep_versions"):
            pytreestore.create(path, rec(0), backend=backend, keep_versions=bad)
    make(path, backend, 1).close()
    with pytest.raises(ValueError, match="mode='r'"):
        pytreestore.open(path, "a", backend=backend, version=0)
    with pytest.raises(ValueError, match="version must be"):
        pytreestore.open(path, backend=backend, version=-1)


# ---- damage and races ------------------------------------------------------------------------


def test_a_damaged_version_record_is_named(path, backend):
    with make(path, backend, 3) as store:
        store.append(rec(3))
    target = f"{path}/{version_key(1)}"
    with open(target, "w") as f:
        f.write('{"records": "many"')
    with pytest.raises(errors.CorruptStoreError, match=r"versions/0+1\.json|version 1"):
        pytreestore.open(path, backend=backend, version=1)
    with open(target, "w") as f:
        f.write(json.dumps({"format_version": 3, "records": 3, "generation": 7}))
    with pytest.raises(errors.CorruptStoreError, match="record of version 7, not its own"):
        pytreestore.open(path, backend=backend).versions()
    assert len(pytreestore.open(path, backend=backend)) == 4  # the latest still reads


def test_a_version_record_a_crashed_writer_left_is_dropped(path, backend):
    make(path, backend, 2).close()
    orphan = f"{path}/{version_key(2)}"
    with open(orphan, "w") as f:
        f.write(json.dumps({"format_version": 3, "records": 9, "generation": 2}))
    assert [v.version for v in pytreestore.open(path, backend=backend).versions()] == [0, 1]
    with pytreestore.open(path, "a", backend=backend) as store:
        store.append(rec(2))
    head = pytreestore.open(path, backend=backend)
    assert head.version == 2 and head.versions()[-1].records == 3


def test_two_writers_cannot_both_make_a_version(path, backend):
    from pytreestore._location import Location
    from pytreestore._log.commit_record import Commit
    from pytreestore._log.committer import Committer
    from pytreestore.backends import get_backend

    make(path, backend, 1).close()
    location = Location.parse(path)
    engines = [get_backend(backend)(location) for _ in range(2)]
    seen = Commit.read(engines[0], path)
    committers = [Committer(e, seen) for e in engines]
    results: list[object] = []

    def commit(c: Committer) -> None:
        try:
            results.append(c.advance(seen.records + 1))
        except errors.CommitConflictError as err:
            results.append(err)

    threads = [threading.Thread(target=commit, args=(c,)) for c in committers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(r).__name__ for r in results) == ["Commit", "CommitConflictError"]
    assert pytreestore.open(path, backend=backend).version == seen.generation + 1


# ---- object storage ----------------------------------------------------------------------------


@pytest.mark.s3
@pytest.mark.parametrize("engine", FILE_BACKENDS)
def test_versions_on_s3_are_put_if_absent(engine, s3_server):
    from pytreestore._location import Location
    from pytreestore._log import versions as _versions
    from pytreestore._log.commit_record import Commit
    from pytreestore.backends import get_backend

    path = f"s3://{s3_server.make_bucket()}/s"
    opts = {"storage_options": s3_server.options}
    with pytreestore.create(path, rec(0), backend=engine, **opts) as store:
        store.extend(rec(i) for i in range(5))
        store.flush()
        store.tag("five")
        store.truncate(2)
    location = Location.parse(path, s3_server.options)
    backend = get_backend(engine)(location)
    head = Commit.read(backend, path)
    rival = head.next(9)
    assert _versions.publish(backend, rival)  # the next version's key is free: it is written
    assert not _versions.publish(backend, head.next(7))  # taken: a second writer cannot
    backend.delete_keys([version_key(rival.generation)])
    with pytest.raises(errors.TagExistsError):
        pytreestore.open(path, "a", backend=engine, **opts).tag("five")
    old = pytreestore.open(path, backend=engine, version="five", **opts)
    assert xs(old) == [float(i) for i in range(5)]
    assert [v.operation for v in pytreestore.open(path, backend=engine, **opts).versions()] == [
        "create",
        "append",
        "truncate",
    ]


def test_the_versions_command(path, backend):
    from click.testing import CliRunner

    from pytreestore.cli import main

    with make(path, backend, 3) as store:
        store.tag("three")
        store.truncate(1)
        store.append(rec(1))
    text = CliRunner().invoke(main, ["versions", path])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert len(lines) == 5 and "[three]" in lines[1] and "(gone" in lines[1]
    assert lines[2].split()[1] == "1" and "truncate" in lines[2]
    listed = json.loads(CliRunner().invoke(main, ["versions", "--json", path]).output)
    assert [v["operation"] for v in listed] == ["create", "append", "truncate", "release", "append"]
    assert listed[1]["tags"] == ["three"] and listed[1]["readable"] is False
    Path(path, version_key(2)).write_text("{")
    broken = CliRunner().invoke(main, ["versions", path])
    assert broken.exit_code == 2 and "not a valid commit record" in broken.output


def test_a_generic_view_truncates_and_tags(path, backend):
    make(path, backend, 5).close()
    with pytreestore.open(path, "a", backend=backend, generic=True) as store:
        store.truncate(2)
        store.tag("two")
    assert xs(pytreestore.open(path, backend=backend, version="two")) == [0.0, 1.0]
