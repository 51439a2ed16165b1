"""The commit protocol (``pytreestore._log.protocol``): the initial commit, clearing, the
lock handshake on open, the token and the conditional commit, on real stores."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY, INCOMPLETE_KEY, ROOT_KEY
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log import protocol
from pytreestore._log.committer import Commit, Committer, commit_token
from pytreestore.backends import get_backend

LIKE = {"a": {"b": np.int32(0)}, "v": np.zeros(3, np.float32)}


def engine_at(path: str | Path, backend: str = "tensorstore"):
    location = Location.parse(str(path))
    return location, get_backend(backend)(location)


def schema() -> TreeSchema:
    return TreeSchema.from_example(LIKE, chunk_records=4)


# ---- the initial commit --------------------------------------------------------------------------


@pytest.mark.plain_files
def test_the_initial_commit_writes_an_empty_whole_store(tmp_path, backend):
    location, engine = engine_at(tmp_path / "s", backend)
    commit, lock = protocol.start_store(engine, location, schema(), overwrite=False)
    lock.release()
    root = tmp_path / "s"
    record = json.loads((root / COMMIT_KEY).read_text())
    assert (record["records"], record["generation"]) == (0, 0)
    assert re.fullmatch("[0-9a-f]{32}", record["store"]) and record["store"] == commit.store
    document = json.loads((root / ROOT_KEY).read_text())
    assert document["node_type"] == "group"
    assert [c["key"] for c in document["attributes"]["pytreestore"]["columns"]] == ["a/b", "v"]
    group = json.loads((root / "a" / ROOT_KEY).read_text())  # the group between root and a/b
    assert group == {"zarr_format": 3, "node_type": "group", "attributes": {}}
    assert not (root / INCOMPLETE_KEY).exists()
    assert protocol.group_keys(schema()) == [f"a/{ROOT_KEY}"]
    assert len(pytreestore.open(str(root), backend=backend)) == 0


def test_an_unfinished_store_keeps_its_incomplete_marker_until_finished(tmp_path):
    location, engine = engine_at(tmp_path / "s")
    _, lock = protocol.start_store(engine, location, schema(), overwrite=False, finished=False)
    assert engine.read_bytes(INCOMPLETE_KEY) == b""
    protocol.finish_store(engine)
    assert engine.read_bytes(INCOMPLETE_KEY) is None
    lock.release()


def test_every_create_has_its_own_store_id(tmp_path):
    ids = []
    for _ in range(2):
        pytreestore.create(str(tmp_path / "s"), LIKE, overwrite=True).close()
        ids.append(json.loads((tmp_path / "s" / COMMIT_KEY).read_text())["store"])
    assert ids[0] != ids[1]


def test_a_create_refused_by_the_lock_leaves_the_store_alone(tmp_path):
    path = str(tmp_path / "s")
    with pytreestore.create(path, LIKE) as writer:
        writer.append(LIKE)
        writer.flush()
        with pytest.raises(errors.StoreLockedError):
            pytreestore.create(path, LIKE, overwrite=True)
    assert len(pytreestore.open(path)) == 1


# ---- clearing ------------------------------------------------------------------------------------


def test_clearing_refuses_a_store_without_overwrite(tmp_path):
    pytreestore.create(str(tmp_path / "s"), LIKE).close()
    location, engine = engine_at(tmp_path / "s")
    with pytest.raises(errors.StoreExistsError, match="already holds a store; pass overwrite=True"):
        protocol.clear_for_create(engine, location, overwrite=False)
    protocol.clear_for_create(engine, location, overwrite=True)
    assert engine.is_empty()


def test_clearing_takes_what_only_an_incomplete_marker_marks(tmp_path):
    marker = tmp_path / "s" / INCOMPLETE_KEY  # what a create or copy cut off early left
    marker.parent.mkdir(parents=True)
    marker.write_bytes(b"")
    (tmp_path / "s" / "x").mkdir()
    location, engine = engine_at(tmp_path / "s")
    with pytest.raises(errors.StoreExistsError, match="already holds a store"):
        protocol.clear_for_create(engine, location, overwrite=False)
    store = pytreestore.create(str(tmp_path / "s"), LIKE, overwrite=True)
    store.close()
    assert not marker.exists() and not (tmp_path / "s" / "x").exists()


def test_clearing_never_deletes_what_is_not_a_store(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")
    location, engine = engine_at(tmp_path / "s")
    for overwrite, message in [(False, "already holds other data"), (True, "refusing to delete")]:
        with pytest.raises(errors.StoreExistsError, match=message):
            protocol.clear_for_create(engine, location, overwrite=overwrite)
    assert (tmp_path / "s" / "notes.txt").read_text() == "mine"


def test_clearing_an_empty_location_does_nothing(tmp_path):
    location, engine = engine_at(tmp_path / "new")
    protocol.clear_for_create(engine, location, overwrite=False)
    assert engine.is_empty()


@pytest.mark.plain_files
@pytest.mark.parametrize("left", [["lock"], ["lock", "incomplete.__lock"], ["lock", ".x.partial"]])
def test_what_a_create_killed_before_its_marker_left_counts_as_a_store(tmp_path, backend, left):
    """Its lock (and a partial write of the marker), nothing else: overwrite=True replaces it."""
    meta = tmp_path / "s" / ".pytreestore"
    meta.mkdir(parents=True)
    for name in left:
        (meta / name).write_bytes(b"12345\n")
    location, engine = engine_at(tmp_path / "s", backend)
    assert protocol.cut_off_create(engine)
    with pytest.raises(errors.StoreExistsError, match="already holds a store; pass overwrite"):
        protocol.clear_for_create(engine, location, overwrite=False)
    with pytreestore.create(str(tmp_path / "s"), LIKE, overwrite=True, backend=backend) as s:
        s.append(LIKE)
    assert len(pytreestore.open(str(tmp_path / "s"), backend=backend)) == 1


@pytest.mark.plain_files
def test_pytreestore_files_beside_other_data_are_no_cut_off_create(tmp_path, backend):
    meta = tmp_path / "s" / ".pytreestore"
    (meta / "versions").mkdir(parents=True)  # a folder: more than a create before its marker
    (meta / "lock").write_bytes(b"1\n")
    location, engine = engine_at(tmp_path / "s", backend)
    assert not protocol.cut_off_create(engine)
    (meta / "versions").rmdir()
    (tmp_path / "s" / "notes.txt").write_text("mine")  # something else beside it
    assert not protocol.cut_off_create(engine)
    with pytest.raises(errors.StoreExistsError, match="refusing to delete"):
        protocol.clear_for_create(engine, location, overwrite=True)
    assert not protocol.cut_off_create(engine_at("memory://cut-off-create")[1])


# ---- opening: the lock handshake and check_starts ------------------------------------------------


def test_attach_for_append_takes_the_writer_lock_and_a_reader_none(tmp_path):
    path = str(tmp_path / "s")
    pytreestore.create(path, LIKE).close()
    location, engine = engine_at(path)
    commit, found, lock = protocol.attach(engine, location, lambda c: schema(), append=True)
    assert lock is not None and commit.records == 0 and found.paths == schema().paths
    other_location, other = engine_at(path)
    with pytest.raises(errors.StoreLockedError):
        protocol.attach(other, other_location, lambda c: schema(), append=True)
    assert protocol.attach(other, other_location, lambda c: schema(), append=False)[2] is None
    lock.release()
    third_location, third = engine_at(path)
    again = protocol.attach(third, third_location, lambda c: schema(), append=True)[2]
    assert again is not None
    again.release()


def test_a_failed_attach_gives_the_lock_back(tmp_path):
    path = str(tmp_path / "s")
    pytreestore.create(path, LIKE).close()
    (tmp_path / "s" / COMMIT_KEY).write_text("{not json")
    with pytest.raises(errors.CorruptStoreError, match="is not a valid commit record"):
        pytreestore.open(path, mode="a")
    (tmp_path / "s" / COMMIT_KEY).write_bytes(Commit(0, 0).to_bytes())
    pytreestore.open(path, mode="a").close()  # the failed open released the lock


def test_check_starts_refuses_a_column_that_starts_past_the_commit(tmp_path):
    location = Location.parse(str(tmp_path / "s"))
    evolved = TreeSchema.from_example({"x": np.int32(0)})
    bad = dataclasses.replace(evolved, columns=(dataclasses.replace(evolved.columns[0], start=5),))
    protocol.check_starts(bad, 5, location)
    with pytest.raises(errors.CorruptStoreError, match=r"starts at record 5, but only 4"):
        protocol.check_starts(bad, 4, location)


# ---- the token and the conditional commit --------------------------------------------------------


def test_two_writers_can_never_both_commit(tmp_path, backend):
    path = str(tmp_path / "s")
    pytreestore.create(path, LIKE, backend=backend).close()
    location, engine = engine_at(path, backend)
    seen = Commit.read(engine, str(location))
    first, second = Committer(engine, seen), Committer(engine_at(path, backend)[1], seen)
    assert first.advance(3) == seen.next(3)
    with pytest.raises(errors.CommitConflictError, match="another writer committed"):
        second.advance(5)
    assert Commit.read(engine, path) == seen.next(3)  # the loser wrote nothing
    with pytest.raises(errors.CommitConflictError):
        second.check()
    first.check()


def test_the_token_advances_with_every_commit(tmp_path, backend):
    path = str(tmp_path / "s")
    pytreestore.create(path, LIKE, backend=backend).close()
    _, engine = engine_at(path, backend)
    committer = Committer(engine, Commit.read(engine, path))
    tokens = [commit_token(engine, committer.commit, path)]
    for records in (4, 8, 9):
        committer.advance(records)
        tokens.append(commit_token(engine, committer.commit, path))
    assert len(set(tokens)) == 4
    assert Commit.read(engine, path).generation == 3
    with pytest.raises(errors.CommitConflictError, match=r"\(9 records now, 4 then\)"):
        commit_token(engine, Commit(4, 1), path)


def test_a_matching_record_written_by_another_is_still_a_conflict(tmp_path):
    """Only a writer whose own earlier attempt may have landed (it raised StorageError)
    accepts a record equal to the one it is writing; any other change is a conflict."""
    path = str(tmp_path / "s")
    pytreestore.create(path, LIKE).close()
    _, engine = engine_at(path)
    committer = Committer(engine, Commit.read(engine, path))
    landed = committer.commit.next(2)
    engine.write_bytes(COMMIT_KEY, landed.to_bytes())  # as if our first attempt got through
    with pytest.raises(errors.CommitConflictError):
        committer.advance(2)  # not known to be uncertain: another writer, as far as it knows


def test_the_first_commit_of_a_bare_location_creates_the_record(tmp_path):
    location, engine = engine_at(tmp_path / "bare")
    committer = Committer(engine, Commit(0, 0))
    committer.advance(1)
    assert Commit.read(engine, str(location)) == Commit(1, 1)


def test_two_store_writers_conflict_when_the_lock_is_bypassed(tmp_path, backend):
    """Two TreeStore writers of one store (the second let in by a lock given back under the
    first): the second's commit is refused, the first's records survive."""
    path = str(tmp_path / "s")
    first = pytreestore.create(path, {"x": np.int32(0)}, chunk_records=2, backend=backend)
    first._lock.release()
    second = pytreestore.open(path, mode="a", backend=backend)
    first.extend({"x": np.int32(i)} for i in range(3))
    first.flush()
    second.append({"x": np.int32(7)})
    with pytest.raises(errors.CommitConflictError):
        second.flush()
    got = pytreestore.open(path, backend=backend).load(as_numpy=True)["x"]
    np.testing.assert_array_equal(got, [0, 1, 2])
