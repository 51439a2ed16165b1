"""Fragments of ragged and optional stores (issue 17 on ragged records): every table's rows
written by any process, committed in one commit with offsets rebased, structures learnt at
the commit; equal to the same records appended by one writer, on every backend.

Records are :func:`tests.trial_harness.ragged_record`: a ragged list of dataclasses, each with
a nested ragged list and a ragged leading-axis leaf, and an optional subtree holding a
ragged leaf; records 0-2 have no element and no subtree, 3-5 elements without tags, so a
store created from a pending ``like`` learns its structures from them.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import FRAGMENTS_DIR, PLACING_KEY
from pytreestore._location import Location
from pytreestore.backends import get_backend
from pytreestore.testing import assert_trees_equal
from tests import interpreters
from tests.conftest import child_env
from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record

CHUNK = 4


def make(path: str, backend: str, n: int = 0, *, pending: bool = False) -> pytreestore.TreeStore:
    store = pytreestore.create(
        path, ragged_like(pending), backend=backend, chunk_records=CHUNK, **RAGGED_DECL
    )
    store.extend(ragged_record(i) for i in range(n))
    store.flush()
    return store


def records(start: int, stop: int) -> list[dict[str, Any]]:
    return [ragged_record(i) for i in range(start, stop)]


def padded(start: int, stop: int) -> tuple[Any, Any]:
    """Records ``start`` to ``stop`` as the padded batch and mask a full store loads."""
    with pytreestore.create(
        f"memory://padded-{start}-{stop}", ragged_like(False), overwrite=True, **RAGGED_DECL
    ) as ref:
        ref.extend(records(start, stop))
        return ref.load(as_numpy=True)


def fragments_left(path: str, backend: str = "tensorstore") -> list[str]:
    """The ids of the fragments under the store, through its backend (OCDBT keys are no
    files)."""
    engine = get_backend(backend)(Location.parse(path))
    try:
        keys = engine.list_keys(FRAGMENTS_DIR + "/")
    finally:
        engine.close()
    return sorted({k[len(FRAGMENTS_DIR) + 1 :].partition("/")[0] for k in keys})


def assert_same_store(got: pytreestore.TreeStore, n: int) -> None:
    """``got`` holds records 0 .. n-1 exactly, in each read form."""
    assert len(got) == n
    for i in range(n):
        assert_trees_equal(got.load(i, as_numpy=True), ragged_record(i), err_msg=f"record {i}")
    with pytreestore.create(
        f"memory://want-{n}", ragged_like(False), overwrite=True, **RAGGED_DECL
    ) as want:
        want.extend(records(0, n))
        if n:
            assert_trees_equal(got.load(as_numpy=True), want.load(as_numpy=True))
            segments = {"ragged": "segments", "as_numpy": True}
            assert_trees_equal(got.load(**segments), want.load(**segments))
    assert got.verify().ok


def _write(path: str, backend: str, start: int, stop: int, form: str) -> pytreestore.Fragment:
    if form == "batch":
        batch, mask = padded(start, stop)
        return pytreestore.write_fragment(path, batch, mask=mask, backend=backend)
    return pytreestore.write_fragment(path, records(start, stop), backend=backend)


# ---- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("pending", [False, True], ids=["full", "pending"])
@pytest.mark.parametrize("sizes", [(4, 8, 3), (3, 0, 6), (9,)])
def test_fragments_equal_one_writers_appends(path, backend, pending, sizes):
    start = 5 if pending else 4  # a pending store has learnt some structures, not all
    store = make(path, backend, start, pending=pending)
    frags, at = [], start
    for k, n in enumerate(sizes):
        form = "batch" if k % 2 and not pending else "records"
        frags.append(_write(path, backend, at, at + n, form))
        at += n
    store.commit_fragments(frags)
    assert store.committed == at and store.schema.pending == ()
    assert_same_store(store, at)
    store.close()
    assert_same_store(pytreestore.open(path, backend=backend), at)
    assert fragments_left(path, backend) == []


def test_one_commit_records_every_tables_rows(path, backend):
    store = make(path, backend, 6)
    before = dict(store._writer.commit.tables)
    frags = [_write(path, backend, a, b, "records") for a, b in ((6, 9), (9, 14))]
    version = store.version
    store.commit_fragments(frags)
    assert store.version == version + 1
    commit = store._writer.commit
    assert commit.fragments == tuple(f.id for f in frags)
    for table, rows in commit.tables:
        assert rows == before.get(table, 0) + sum(f.rows(table) for f in frags), table
    assert store.versions()[-1].operation == "append"


def test_offsets_are_rebased_onto_the_committed_rows(tmp_path, path):
    """The store's arrays, read with zarr-python, are those of one writer's appends."""
    store = make(path, "zarr", 7)
    frags = [_write(path, "zarr", a, b, "records") for a, b in ((7, 10), (10, 16))]
    store.commit_fragments(frags)
    store.close()
    ref = str(tmp_path / "ref")
    make(ref, "zarr", 16).close()
    got, want = zarr.open_group(path, mode="r"), zarr.open_group(ref, mode="r")
    arrays = [c.key for c in pytreestore.open(path).schema.storage_columns]
    assert "elems-offsets" in arrays and "elems/-2A/tags-offsets" in arrays
    for key in arrays:
        np.testing.assert_array_equal(got[key][:], want[key][:], err_msg=key)


def test_fragments_follow_the_writers_buffered_records(path, backend):
    store = make(path, backend, 4)
    store.append(ragged_record(4))  # buffered, not committed
    f = _write(path, backend, 5, 11, "records")
    store.commit_fragments([f])
    store.extend(records(11, 13))
    store.close()
    assert_same_store(pytreestore.open(path, backend=backend), 13)


def test_an_empty_fragment_commits_nothing_but_its_id(path, backend):
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, [], backend=backend)
    assert f.records == 0 and all(rows == 0 for _, rows in f.tables or ())
    store.commit_fragments([f])
    assert_same_store(store, 4)
    assert fragments_left(path, backend) == []


def _inodes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_ino for p in root.rglob("*") if "c" in p.parts}


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_chunk_aligned_rows_are_linked_offsets_rewritten(tmp_path, backend):
    path = str(tmp_path / "s")
    store = make(path, backend, 0)
    f = _write(path, backend, 0, 8, "records")  # every table of an empty store: row 0
    found = _inodes(Path(path) / f.folder)
    store.commit_fragments([f])
    linked = [k for k in found if (Path(path) / k).exists()]
    placed = {k: (Path(path) / k).stat().st_ino for k in linked}
    shared = {k for k in linked if placed[k] == found[k]}
    assert any(k.startswith("elems/-2A/x/") for k in shared)  # an element leaf: linked
    assert any(k.startswith("i/") for k in shared)  # a record-table leaf: linked
    assert not any("offsets" in k for k in shared)  # offsets: rebased, written anew
    assert_same_store(store, 8)


def test_memory_stores_take_ragged_fragments():
    path = "memory://ragged-fragments"
    store = pytreestore.create(path, ragged_like(True), overwrite=True, **RAGGED_DECL)
    frags = [_write(path, "tensorstore", a, b, "records") for a, b in ((0, 4), (4, 9))]
    store.commit_fragments(frags)
    assert_same_store(store, 9)
    assert store._backend.list_keys(FRAGMENTS_DIR + "/") == []


# ---- structures the store has not learnt ---------------------------------------------------


def test_structures_a_fragment_shows_are_learnt_at_the_commit(path, backend):
    store = make(path, backend, 0, pending=True)
    assert set(store.schema.pending) >= {"['elems']", "['opt']"}
    early = _write(path, backend, 0, 3, "records")  # nothing to learn
    late = _write(path, backend, 3, 10, "records")  # elements, tags, the optional subtree
    reader = pytreestore.open(path, backend=backend)
    store.commit_fragments([early, late])
    assert store.schema.pending == ()
    assert_same_store(store, 10)
    assert reader.refresh() == 10  # a reader opened before learns the schema too
    assert_trees_equal(reader.load(7, as_numpy=True), ragged_record(7))
    store.extend(records(10, 12))  # appends go on with the learnt schema
    store.close()
    assert_same_store(pytreestore.open(path, backend=backend), 12)


def test_a_structure_learnt_twice_and_one_learnt_meanwhile(path, backend):
    store = make(path, backend, 0, pending=True)
    one = _write(path, backend, 0, 5, "records")
    two = _write(path, backend, 5, 9, "records")  # learns the same structures, on its own
    three = pytreestore.write_fragment(path, [], backend=backend)  # the store's schema of now
    store.commit_fragments([one, two])
    assert store.schema.pending == ()
    store.commit_fragments([three])  # written before the store learnt: still fits
    assert_same_store(store, 9)


def test_a_fragment_that_learnt_another_dtype_is_refused(path, backend):
    store = make(path, backend, 0, pending=True)
    r = ragged_record(9)
    wide = pytreestore.write_fragment(
        path,
        [{**r, "opt": {"w": np.zeros(2, np.float32), "cells": np.zeros(1, np.int32)}}],
        backend=backend,
    )
    ok = _write(path, backend, 0, 10, "records")  # opt.w is float64 here
    schema = store.schema.to_json()
    with pytest.raises(
        errors.FragmentError,
        match=re.escape("holds float32[2] at ['opt']['w'], where the store holds float64[2]"),
    ):
        store.commit_fragments([ok, wide])
    assert len(store) == 0 and store.schema.to_json() == schema  # checked before learning
    store.commit_fragments([ok])
    with pytest.raises(errors.FragmentError, match=r"\(item 0\) holds float32\[2\]"):
        store.commit_fragments([wide])
    assert_same_store(store, 10)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])  # files edited by hand
def test_a_fragment_of_another_structure_is_refused(path, backend):
    store = make(path, backend, 0, pending=True)
    f = _write(path, backend, 3, 10, "records")
    info_key = Path(path) / f.folder / "schema.json"
    info = json.loads(info_key.read_text())
    info["digest"] = "blake2b-160:" + "0" * 40
    info_key.write_text(json.dumps(info))
    with pytest.raises(errors.FragmentError, match="is not the schema"):
        store.commit_fragments([f])
    info_key.unlink()
    with pytest.raises(errors.FragmentError, match=re.escape("its schema.json is missing")):
        store.commit_fragments([f])
    assert len(store) == 0 and store.schema.pending


# ---- refusals ------------------------------------------------------------------------------


def test_bad_records_write_nothing(path, backend):
    make(path, backend, 0).close()
    bad = [ragged_record(3), {**ragged_record(4), "i": "text"}]
    with pytest.raises(
        errors.SchemaMismatchError,
        match="write_fragment\\(\\) refused record 1 \\(nothing was written\\)",
    ):
        pytreestore.write_fragment(path, bad, backend=backend)
    short = ragged_record(5)
    short["elems"][0].trail = np.zeros((2, 4), np.float32)  # [n, 3] expected
    with pytest.raises(errors.SchemaMismatchError, match="refused record 0"):
        pytreestore.write_fragment(path, [short], backend=backend)
    with pytest.raises(
        errors.SchemaMismatchError, match="write_fragment\\(path, batch, mask=mask\\)"
    ):
        pytreestore.write_fragment(path, padded(0, 4)[0], backend=backend)
    batch, mask = padded(3, 6)
    mask["elems"].x[0, :] = ~mask["elems"].x[0, :]  # not a run of True then False
    with pytest.raises(errors.SchemaMismatchError, match="is not a run of True then False"):
        pytreestore.write_fragment(path, batch, mask=mask, backend=backend)
    assert fragments_left(path, backend) == []


def test_a_pending_structure_in_a_padded_batch_is_refused(path, backend):
    """A padded batch cannot teach a structure (extend_batch cannot either): refused, never
    dropped."""
    store = make(path, backend, 0, pending=True)
    batch, mask = padded(3, 8)
    with pytest.raises(errors.SchemaMismatchError, match="has not learnt yet"):
        pytreestore.write_fragment(path, batch, mask=mask, backend=backend)
    with pytest.raises(errors.SchemaMismatchError, match="has not learnt yet"):
        store.extend_batch(batch, mask=mask)
    assert len(store) == 0 and fragments_left(path, backend) == []


def test_a_mask_for_a_fixed_store_is_refused(tmp_path):
    path = str(tmp_path / "fixed")
    pytreestore.create(path, {"x": np.int8(0)}).close()
    with pytest.raises(errors.SchemaMismatchError, match="write_fragment takes no mask="):
        pytreestore.write_fragment(path, {"x": np.arange(2)}, mask={"x": np.ones(2, bool)})


def test_fragments_of_another_store_or_committed_are_refused(path, tmp_path, backend):
    store = make(path, backend, 4)
    other = str(tmp_path / "other")
    make(other, backend).close()
    foreign = _write(other, backend, 0, 2, "records")
    with pytest.raises(errors.FragmentError, match="belongs to another store"):
        store.commit_fragments([foreign])
    f = _write(path, backend, 4, 8, "records")
    with pytest.raises(errors.FragmentError, match="is listed twice"):
        store.commit_fragments([f, f])
    store.commit_fragments([f])
    with pytest.raises(errors.FragmentError, match="committed already"):
        store.commit_fragments([pytreestore.Fragment.from_json(f.to_json())])
    assert_same_store(store, 8)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])  # files edited by hand
def test_damaged_fragments_are_refused(path, backend):
    store = make(path, backend, 4)
    f = _write(path, backend, 4, 12, "records")
    manifest = Path(path) / f.folder / "fragment.json"
    text = manifest.read_text()
    forged = pytreestore.Fragment.from_json(text.replace('"tables": {"', '"tables": {"x": 1, "'))
    manifest.write_text(forged.to_json())
    with pytest.raises(errors.FragmentError, match="differs from the description"):
        store.commit_fragments([f])
    with pytest.raises(errors.FragmentError, match="does not describe the tables of its schema"):
        store.commit_fragments([forged])
    manifest.write_text(text)
    elements = Path(path) / f.folder / "elems" / "-2A" / "x" / "c"
    next(p for p in elements.rglob("*") if p.is_file()).unlink()
    with pytest.raises(errors.FragmentError, match=f"fragment {f.id} is incomplete"):
        store.commit_fragments([f])
    assert_same_store(store, 4)
    store.close()
    assert_same_store(pytreestore.open(path, "a", backend=backend), 4)


def test_malformed_tables_in_json_are_refused(path):
    make(path, "tensorstore").close()
    good = json.loads(pytreestore.write_fragment(path, records(3, 5)).to_json())
    for bad in ([1], {"['elems']": -1}, {"['elems']": "3"}):
        with pytest.raises(errors.FragmentError, match="'tables' must map keypaths"):
            pytreestore.Fragment.from_json(json.dumps({**good, "tables": bad}))


# ---- travelling, readers, versions, vacuum -------------------------------------------------


def test_ragged_fragments_pickle_and_travel_as_json(path):
    make(path, "tensorstore").close()
    f = pytreestore.write_fragment(path, records(3, 9))
    assert pickle.loads(pickle.dumps(f)) == f
    assert pytreestore.Fragment.from_json(f.to_json()) == f
    assert f.rows("['elems']") == sum(len(r["elems"]) for r in records(3, 9))


def _write_in_child(args: tuple[str, str, int, int]) -> str:
    path, backend, start, stop = args
    return pytreestore.write_fragment(path, records(start, stop), backend=backend).to_json()


def test_fragments_written_by_other_processes(pool, path, backend):
    store = make(path, backend, 0, pending=True)
    texts = pool.map(_write_in_child, [(path, backend, 0, 6), (path, backend, 6, 13)], chunksize=1)
    store.commit_fragments([pytreestore.Fragment.from_json(t) for t in texts])
    assert_same_store(store, 13)


def test_readers_and_versions_never_see_uncommitted_rows(path, backend):
    store = make(path, backend, 4, pending=True)
    version = store.version
    f = _write(path, backend, 4, 10, "records")
    reader = pytreestore.open(path, backend=backend)
    assert len(reader) == 4 and reader.refresh() == 4
    store.commit_fragments([f])
    old = pytreestore.open(path, backend=backend, version=version)
    assert len(old) == 4 and old.schema.pending  # the version before, with its schema
    assert_trees_equal(old.load(3, as_numpy=True), ragged_record(3))
    assert reader.refresh() == 10


def test_a_commit_after_a_truncate(path, backend):
    store = make(path, backend, 9)
    store.truncate(5)
    f = _write(path, backend, 5, 11, "records")
    store.commit_fragments([f])
    assert_same_store(store, 11)
    store.close()
    assert_same_store(pytreestore.open(path, "a", backend=backend), 11)


def test_vacuum_removes_abandoned_ragged_fragments(path, backend):
    store = make(path, backend, 3)
    young = _write(path, backend, 3, 6, "records")
    old = _write(path, backend, 3, 6, "records")
    assert store.vacuum(fragments_older_than=3600).fragments == 0
    assert fragments_left(path, backend) == sorted([young.id, old.id])
    assert store.vacuum(fragments_older_than=0).fragments == 2
    assert fragments_left(path, backend) == []
    with pytest.raises(errors.FragmentError, match="has no files"):
        store.commit_fragments([young])
    assert_same_store(store, 3)


def test_like_may_be_a_record_as_create_took_it(path):
    """Regression: open(like=) of a ragged store refused the record create took (a list of
    two elements, a ragged leading axis of three rows); write_fragment and the multi-host
    and Ray paths open with it."""
    like = {**ragged_like(False), "elems": records(9, 10)[0]["elems"][:2]}
    make(path, "tensorstore", 3).close()
    f = pytreestore.write_fragment(path, records(3, 8), like=like)
    store = pytreestore.open(path, "a", like=like)
    store.commit_fragments([f])
    assert_trees_equal(store.load(4, as_numpy=True), ragged_record(4))
    store.close()
    reader = pytreestore.open(path, like={"i": np.int64(0)})  # parsed on first use
    with pytest.raises(errors.SchemaMismatchError, match="like= does not"):
        reader.schema


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])  # files edited by hand
def test_an_incomplete_fragment_after_learning_commits_no_record(path, backend):
    """The structures are learnt before the rows are placed; a fragment found incomplete
    then commits nothing, and the learnt schema stands, as after an append that learnt
    them and a crash before its flush."""
    store = make(path, backend, 3, pending=True)
    f = _write(path, backend, 3, 10, "records")
    (Path(path) / f.folder / "i" / "c" / "1").unlink()  # records 7-9's chunk of ['i']
    with pytest.raises(errors.FragmentError, match=f"fragment {f.id} is incomplete"):
        store.commit_fragments([f])
    assert store.schema.pending == ()
    assert_same_store(store, 3)
    store.extend(records(3, 10))
    store.close()
    assert_same_store(pytreestore.open(path, "a", backend=backend), 10)


def test_a_string_is_not_records(path):
    make(path, "tensorstore").close()
    with pytest.raises(errors.SchemaMismatchError, match="got a str"):
        pytreestore.write_fragment(path, "records")


def test_many_fragments_of_every_alignment(path):
    """More fragments than are placed at once (32), of sizes that start them on and off
    chunk boundaries, records and padded batches: the store of one writer's appends."""
    store = make(path, "tensorstore", 2)
    frags, at = [], 2
    for k in range(40):
        n = (1, 4, 3, 0, 8)[k % 5]
        form = "batch" if k % 3 == 1 else "records"
        frags.append(_write(path, "tensorstore", at, at + n, form))
        at += n
    store.commit_fragments(frags)
    assert_same_store(store, at)


# ---- the fast path ---------------------------------------------------------------------------


def commit_and_die(path: str, backend: str, texts: list[str]) -> None:
    """Commits the fragments of ``texts`` and dies (SIGKILL) after the fast path renamed
    their chunk-row folders into the store, before any row is rewritten (a child's work)."""
    from pytreestore._fragments import write as columns

    columns._write_rows = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # type: ignore[assignment]
    store = pytreestore.open(path, "a", backend=backend)
    store.commit_fragments([pytreestore.Fragment.from_json(t) for t in texts])


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_kill_after_the_renames_leaves_every_fragment_whole(tmp_path, backend):
    """Ragged fragments take the folder-rename fast path with the fixed path's intent
    record: a writer killed after the renames leaves the intent; the next writer moves the
    folders back, and the fragments commit whole."""
    path = str(tmp_path / "s")
    make(path, backend, 0).close()
    frags = [_write(path, backend, a, b, "records") for a, b in ((0, 8), (8, 13))]
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent.parent)!r}); "
        "from tests import test_ragged_fragments as t; "
        f"t.commit_and_die({path!r}, {backend!r}, {[f.to_json() for f in frags]!r})"
    )
    proc = interpreters.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env()
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    intent = json.loads((Path(path) / PLACING_KEY).read_text())
    moved = [d for _, d in intent["moves"]]
    assert any(d.startswith("elems/-2A/trail/") for d in moved)  # an element leaf's rows
    assert all(not (Path(path) / s).exists() for s, _ in intent["moves"])  # renamed away
    store = pytreestore.open(path, "a", backend=backend)  # moves them back
    assert len(store) == 0 and not (Path(path) / PLACING_KEY).exists()
    store.commit_fragments(frags)
    assert_same_store(store, 13)
    store.close()  # waits for the committed fragments' folders to go
    assert fragments_left(path, backend) == []
