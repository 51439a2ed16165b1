"""Fragments: records written under a store by any process, appended by its writer in one
commit (issue 17, part 2): round trips, chunks placed without copying, refusals, other
processes, readers, vacuum."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import zarr

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import FRAGMENTS_DIR

pytestmark = pytest.mark.plain_files
CHUNK = 4


class Point(NamedTuple):
    x: np.ndarray
    v: np.ndarray


def rec(i: int) -> dict:
    return {
        "x": np.float32(i),
        "v": np.arange(3, dtype=np.int32) + i,
        "p": Point(np.int64(i * 10), np.full((2, 2), i, np.float16)),
    }


def batch(start: int, n: int) -> dict:
    return pytreestore.stack([rec(i) for i in range(start, start + n)])


def make(path: str, backend: str, n: int = 0, **options) -> pytreestore.TreeStore:
    store = pytreestore.create(path, rec(0), backend=backend, chunk_records=CHUNK, **options)
    store.extend(rec(i) for i in range(n))
    store.flush()
    return store


def fragments_left(path: str) -> list[str]:
    folder = Path(path) / FRAGMENTS_DIR
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def same_records(a: pytreestore.TreeStore, b: pytreestore.TreeStore) -> None:
    left, right = a.load(as_numpy=True), b.load(as_numpy=True)
    assert type(left["p"]) is Point and type(right["p"]) is Point
    for path_a, x in zip(a.schema.paths, _leaves(left)):
        y = _leaves(right)[a.schema.paths.index(path_a)]
        assert x.dtype == y.dtype, path_a
        np.testing.assert_array_equal(x, y, err_msg=path_a)


def _leaves(tree) -> list[np.ndarray]:
    import jax

    return jax.tree_util.tree_leaves(tree)


# ---- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(4, 8, 4), (3, 5, 2), (4, 3, 1, 4), (0, 4), (9,)])
def test_fragments_append_in_order_like_extend(path, tmp_path, backend, sizes):
    store = make(path, backend, 4)
    frags, start = [], 4
    for n in sizes:
        records = [rec(i) for i in range(start, start + n)]
        data = records if n % 2 else batch(start, n) if n else records
        frags.append(pytreestore.write_fragment(path, data, backend=backend))
        start += n
    store.commit_fragments(frags)
    assert store.committed == start and len(store) == start
    expected = make(str(tmp_path / "expected"), backend, start)
    same_records(store, expected)
    store.close()
    reader = pytreestore.open(path, backend=backend)
    same_records(reader, expected)
    assert reader.verify().ok
    assert fragments_left(path) == []


def test_fragments_follow_the_writers_buffered_records(path, tmp_path, backend):
    store = make(path, backend, 2)
    store.append(rec(2))  # buffered, not committed
    f = pytreestore.write_fragment(path, batch(3, 5), backend=backend)
    store.commit_fragments([f])
    store.extend(rec(i) for i in range(8, 11))
    store.close()
    expected = make(str(tmp_path / "e"), backend, 11)
    same_records(pytreestore.open(path, backend=backend), expected)


def test_one_commit_one_version_listing_the_fragments(path, backend):
    store = make(path, backend, 4)
    before = store.version
    frags = [pytreestore.write_fragment(path, batch(i, 4), backend=backend) for i in (4, 8, 12)]
    store.commit_fragments(frags)
    assert store.version == before + 1
    record = json.loads((Path(path) / ".pytreestore" / "commit.json").read_text())
    assert record["fragments"] == [f.id for f in frags] and record["records"] == 16
    assert store.versions()[-1].operation == "append"


def test_an_empty_list_commits_nothing(path, backend):
    store = make(path, backend, 2)
    version = store.version
    store.commit_fragments([])
    assert store.version == version and len(store) == 2


def test_an_empty_fragment_commits_no_record(path, backend):
    store = make(path, backend, 2)
    f = pytreestore.write_fragment(path, [], backend=backend)
    assert f.records == 0
    store.commit_fragments([f])
    assert len(store) == 2
    store.close()  # waits for the committed fragment's folder to be deleted
    assert fragments_left(path) == []


# ---- placing without copying ---------------------------------------------------------------


def _inodes(path: str, fragment: pytreestore.Fragment) -> dict[str, int]:
    root = Path(path) / fragment.folder
    return {
        str(p.relative_to(root)): p.stat().st_ino
        for p in root.rglob("*")
        if p.is_file() and "/c/" in str(p.relative_to(root)).replace("\\", "/")
    }


def test_aligned_fragments_are_linked_not_copied(path, backend):
    store = make(path, backend, 4)
    frags = [pytreestore.write_fragment(path, batch(i, 4), backend=backend) for i in (4, 8)]
    inodes = [_inodes(path, f) for f in frags]
    assert all(inodes)
    store.commit_fragments(frags)
    for row, found in zip((1, 2), inodes):
        for key, inode in found.items():
            column, _, chunk = key.partition("/c/")
            first, *rest = chunk.split("/")
            placed = Path(path) / column / "c" / str(int(first) + row) / "/".join(rest)
            assert placed.stat().st_ino == inode, key  # the same file: no byte copied


def test_misaligned_fragments_are_rewritten_correctly(path, tmp_path, backend):
    store = make(path, backend, 3)  # the store ends mid-chunk
    frags = [pytreestore.write_fragment(path, batch(i, n), backend=backend) for i, n in ((3, 4),)]
    inodes = _inodes(path, frags[0])
    store.commit_fragments(frags)
    columns = [Path(path) / c.key for c in store.schema.columns]
    placed = {p.stat().st_ino for c in columns for p in c.rglob("*") if p.is_file()}
    assert not placed & set(inodes.values())  # read and written again: new files
    same_records(store, make(str(tmp_path / "e"), backend, 7))


def test_memory_stores_take_fragments(backend):
    path = f"memory://fragments-{backend}"
    store = pytreestore.create(path, rec(0), backend=backend, chunk_records=CHUNK, overwrite=True)
    store.extend(rec(i) for i in range(4))
    frags = [
        pytreestore.write_fragment(path, batch(i, n), backend=backend)
        for i, n in ((4, 4), (8, 3), (11, 2))
    ]
    store.commit_fragments(frags)
    assert store.load(as_numpy=True)["x"].tolist() == list(range(13))
    assert store._backend.list_keys(FRAGMENTS_DIR + "/") == []


# ---- refusals ------------------------------------------------------------------------------


def test_a_fragment_of_another_store_is_refused(path, tmp_path, backend):
    store = make(path, backend, 1)
    other = str(tmp_path / "other")
    make(other, backend).close()
    f = pytreestore.write_fragment(other, [rec(0)], backend=backend)
    with pytest.raises(errors.FragmentError, match="belongs to another store"):
        store.commit_fragments([f])
    assert len(store) == 1 and store.version == 1


def test_a_fragment_of_another_schema_is_refused(path, backend):
    store = make(path, backend, 1)
    f = pytreestore.write_fragment(path, [rec(0)], backend=backend)
    store.evolve(add={".p.y": np.int8(0)} if False else {"['w']": np.int8(0)})
    with pytest.raises(errors.FragmentError, match="was written with another schema"):
        store.commit_fragments([f])
    assert len(store) == 1


def test_a_fragment_committed_twice_is_refused(path, backend):
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    store.commit_fragments([f])
    version = store.version
    with pytest.raises(
        errors.FragmentError, match=re.escape(f"was committed already, in version {version}")
    ):
        store.commit_fragments([f])
    store.close()
    again = pytreestore.open(path, "a", backend=backend)
    with pytest.raises(errors.FragmentError, match="committed already"):
        again.commit_fragments([pytreestore.Fragment.from_json(f.to_json())])
    assert len(again) == 8


def test_a_committed_fragment_whose_folder_was_left_is_still_refused(path, backend):
    """A crash after the commit record, before the folder was deleted."""
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    saved = Path(path).parent / "saved"
    shutil.copytree(Path(path) / f.folder, saved)
    store.commit_fragments([f])
    store.close()  # waits for the folder's deletion
    shutil.copytree(saved, Path(path) / f.folder)
    store = pytreestore.open(path, "a", backend=backend)
    with pytest.raises(errors.FragmentError, match="committed already"):
        store.commit_fragments([f])


def test_a_fragment_listed_twice_is_refused(path, backend):
    store = make(path, backend)
    f = pytreestore.write_fragment(path, batch(0, 4), backend=backend)
    with pytest.raises(errors.FragmentError, match="is listed twice"):
        store.commit_fragments([f, f])
    assert len(store) == 0 and fragments_left(path) == [f.id]


def test_a_fragment_whose_files_were_deleted_is_refused(path, backend):
    store = make(path, backend, 4)
    gone = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    shutil.rmtree(Path(path) / gone.folder)
    with pytest.raises(errors.FragmentError, match="has no files under the store"):
        store.commit_fragments([gone])
    part = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    chunk = next(
        p for p in (Path(path) / part.folder).rglob("*") if p.is_file() and p.parent.name == "c"
    )
    chunk.unlink()
    with pytest.raises(errors.FragmentError, match=f"fragment {part.id} is incomplete"):
        store.commit_fragments([part])
    assert len(store) == 4 and store.version == 1
    store.close()
    reader = pytreestore.open(path, backend=backend)
    assert len(reader) == 4 and reader.verify().ok


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("nope", "not a fragment's JSON"),
        ("[1]", "expected an object, got list"),
        ('{"id": "x"}', "'id' must match"),
        (None, "unknown member 'extra'"),
        (None, "'records' must be an integer >= 0, got -1"),
    ],
)
def test_malformed_fragment_json_is_refused(path, text, why):
    make(path, "tensorstore").close()
    good = json.loads(pytreestore.write_fragment(path, [rec(0)]).to_json())
    if text is None:
        good.update({"extra": 1} if "extra" in why else {"records": -1})
        text = json.dumps(good)
    with pytest.raises(errors.FragmentError, match=re.escape(why)):
        pytreestore.Fragment.from_json(text)


def test_not_a_fragment_is_refused(path, backend):
    store = make(path, backend)
    with pytest.raises(errors.FragmentError, match="item 0 is a dict"):
        store.commit_fragments([{"id": "x"}])


def test_bad_records_write_nothing(path, backend):
    make(path, backend).close()
    bad = [rec(0), {**rec(1), "x": "text"}]
    with pytest.raises(errors.SchemaMismatchError, match="refused record 1"):
        pytreestore.write_fragment(path, bad, backend=backend)
    with pytest.raises(errors.SchemaMismatchError, match="does not match the store schema"):
        pytreestore.write_fragment(path, [{"y": 1}], backend=backend)
    wrong = {**batch(0, 3), "x": np.zeros(2, np.float32)}
    with pytest.raises(errors.SchemaMismatchError):
        pytreestore.write_fragment(path, wrong, backend=backend)
    assert fragments_left(path) == []


def test_a_packed_store_refuses_fragments_clearly(path, backend):
    """Once a StorageError ("retry once storage is reachable") from inside the write."""
    like = {"a": np.float32(0), "b": np.zeros(3, np.float32)}
    pytreestore.create(path, like, backend=backend, pack=True).close()
    assert pytreestore.open(path, backend=backend).schema.packs
    records = [{"a": np.float32(i), "b": np.full(3, i, np.float32)} for i in range(2)]
    with pytest.raises(errors.FragmentError, match="fragments need one array per leaf"):
        pytreestore.write_fragment(path, records, backend=backend)
    assert fragments_left(path) == []


def test_a_reader_cannot_commit_fragments(path, backend):
    make(path, backend).close()
    f = pytreestore.write_fragment(path, [rec(0)], backend=backend)
    with pytest.raises(errors.ReadOnlyError):
        pytreestore.open(path, backend=backend).commit_fragments([f])


# ---- travelling and other processes --------------------------------------------------------


def test_fragments_pickle_and_travel_as_json(path):
    make(path, "tensorstore").close()
    f = pytreestore.write_fragment(path, batch(0, 2))
    assert pickle.loads(pickle.dumps(f)) == f
    assert pytreestore.Fragment.from_json(f.to_json()) == f
    assert len(f.to_json()) < 400 and f.records == 2


#: pickle.dumps of a Fragment by pytreestore before the fragment package (the class then
#: lived in pytreestore._fragments.fragment), fields 0..0, 1..1, 2..2, 4 records, version 1
OLD_PICKLE = (
    b"\x80\x04\x95\x12\x01\x00\x00\x00\x00\x00\x00\x8c\x1cpytreestore._commit.fragment"
    b"\x94\x8c\x08Fragment\x94\x93\x94)\x81\x94}\x94(\x8c\x02id\x94\x8c "
    + b"0" * 32
    + b"\x94\x8c\x05store\x94\x8c "
    + b"1" * 32
    + b"\x94\x8c\x06schema\x94\x8c4blake2b-160:"
    + b"2" * 40
    + b"\x94\x8c\x07records\x94K\x04\x8c\ngeneration\x94K\x01\x8c\x04time\x94\x8c\x1b"
    b"2026-01-01T00:00:00.000000Z\x94\x8c\x06tables\x94Nub."
)


def test_a_fragment_pickled_by_the_old_module_commits(path, backend):
    """A Fragment pickled when its class lived in pytreestore._commit.fragment unpickles as
    pytreestore.Fragment and commits (the pickle names the old module)."""
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    assert f.generation == 1 and f.records == 4
    old = OLD_PICKLE
    for was, now in (("0" * 32, f.id), ("1" * 32, f.store), ("2" * 40, f.schema[12:])):
        old = old.replace(was.encode(), now.encode())
    old = old.replace(b"2026-01-01T00:00:00.000000Z", f.time.encode())
    loaded = pickle.loads(old)
    assert type(loaded) is pytreestore.Fragment and loaded == f
    store.commit_fragments([loaded])
    same_records(store, make(path + "-e", backend, 8))


def _write_in_child(args: tuple[str, str, int, int]) -> str:
    path, backend, start, n = args
    return pytreestore.write_fragment(path, batch(start, n), backend=backend).to_json()


def test_fragments_written_by_other_processes(pool, path, tmp_path, backend):
    store = make(path, backend, 4)
    texts = pool.map(_write_in_child, [(path, backend, 4, 8), (path, backend, 12, 5)], chunksize=1)
    store.commit_fragments([pytreestore.Fragment.from_json(t) for t in texts])
    same_records(store, make(str(tmp_path / "e"), backend, 17))


def test_readers_never_see_uncommitted_fragments(path, backend):
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    reader = pytreestore.open(path, backend=backend)
    assert len(reader) == 4 and reader.refresh() == 4
    group = zarr.open_group(path, mode="r")
    assert sorted(name for name, _ in group.members()) == ["p", "v", "x"]
    assert group["x"].shape == (4,)
    store.commit_fragments([f])
    assert reader.refresh() == 8
    assert zarr.open_group(path, mode="r")["x"].shape == (8,)


# ---- vacuum --------------------------------------------------------------------------------


def _age_fragment(path: str, fragment_id: str, seconds: float) -> None:
    """Makes a fragment look begun ``seconds`` ago (its markers hold the time)."""
    import datetime

    folder = Path(path) / FRAGMENTS_DIR / fragment_id
    then = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds)
    stamp = then.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    (folder / "begun.json").write_text(json.dumps({"time": stamp}))


def test_vacuum_removes_abandoned_fragments_only(path, backend):
    store = make(path, backend, 4)
    young = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    old = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    _age_fragment(path, old.id, 2 * 24 * 3600)
    half = Path(path) / FRAGMENTS_DIR / ("e" * 32)  # a deletion cut short: no marker
    (half / "x" / "c").mkdir(parents=True)
    (half / "x" / "c" / "0").write_bytes(b"junk")
    os.utime(half, (0, 0))
    report = store.vacuum()
    assert report.fragments == 2
    assert fragments_left(path) == [young.id]
    store.commit_fragments([young])  # a young fragment is still whole
    with pytest.raises(errors.FragmentError, match="has no files"):
        store.commit_fragments([old])
    assert store.load(as_numpy=True)["x"].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]


def test_vacuum_threshold_is_a_keyword(path, backend):
    store = make(path, backend)
    pytreestore.write_fragment(path, batch(0, 2), backend=backend)
    assert store.vacuum(fragments_older_than=3600).fragments == 0
    assert store.vacuum(fragments_older_than=0).fragments == 1
    assert fragments_left(path) == []
    with pytest.raises(ValueError, match="fragments_older_than is an age in seconds"):
        store.vacuum(fragments_older_than=-1)


def test_vacuum_removes_a_committed_fragment_left_behind(path, backend):
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    saved = Path(path).parent / "saved"
    shutil.copytree(Path(path) / f.folder, saved)
    store.commit_fragments([f])
    store.close()  # waits for the folder's deletion
    shutil.copytree(saved, Path(path) / f.folder)  # as a crash after the commit leaves it
    store = pytreestore.open(path, "a", backend=backend)
    assert store.vacuum().fragments == 1
    assert fragments_left(path) == []
    assert len(store) == 8 and store.verify().ok


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_a_committed_fragment_is_refused_once_its_version_left_the_log(path, backend, monkeypatch):
    """A crash between the commit record and the deletion of a (misaligned, so still whole)
    fragment's folder; then keep_versions drops the version that committed it: committing it
    again is refused, not appended a second time. So is a fragment older than the log."""
    from pytreestore._fragments import commit

    store = make(path, backend, 3, keep_versions=1)
    f = pytreestore.write_fragment(path, batch(3, 4), backend=backend)
    old = pytreestore.write_fragment(path, batch(3, 2), backend=backend)
    with monkeypatch.context() as patched:  # the folder stays, as a crash leaves it
        patched.setattr(commit.Fragmenting, "_retire", lambda self, ids: None)
        patched.setattr(commit, "_unplace", lambda *args: None)
        store.commit_fragments([f])
    for i in range(7, 70):  # version 64 trims the log to the last version
        store.append(rec(i))
        store.flush()
    assert [v.version for v in store.versions()] == list(range(64, 66))
    for fragment in (f, old):
        with pytest.raises(errors.FragmentError, match=re.escape("no longer keeps version 2")):
            store.commit_fragments([fragment])
    assert store.load(as_numpy=True)["x"].tolist() == list(range(70))
    assert store.verify().ok


def test_a_fragment_whose_description_changed_is_refused(path, backend):
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    manifest = Path(path) / f.folder / "fragment.json"
    manifest.write_text(manifest.read_text().replace('"records": 4', '"records": 8'))
    with pytest.raises(errors.FragmentError, match="differs from the description"):
        store.commit_fragments([f])
    assert len(store) == 4
