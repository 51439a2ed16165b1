"""``keep_last``: a store that keeps only its last records (issue 46), on every kind of store
and backend.

The release is one commit naming the row of record 0 (``first``); indices stay relative, so
``store[0]`` is the oldest kept record and appends go on after the last. ``vacuum`` deletes the
chunks that hold only released rows once no version the log keeps reads them; older versions
read what they held until then, and are refused by name after.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest
from click.testing import CliRunner
from jax.sharding import NamedSharding, PartitionSpec

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY
from pytreestore.backends import ocdbt_coordinator
from pytreestore.cli import main
from pytreestore.testing import assert_trees_equal
from tests.parity import kinds

CHUNK = 2


def _same(store: pytreestore.TreeStore, want: list) -> None:
    """``store`` holds exactly ``want``: iterated, and record by record through ``store[i]``
    from both ends."""
    assert len(store) == len(want)
    assert_trees_equal(list(store.records(as_numpy=True)), want)
    for i in (0, len(want) - 1, -1):
        if want:
            assert_trees_equal(store.load(i, as_numpy=True), want[i], err_msg=f"record {i}")


def _filled(path: Path, kind: str, backend: str, n: int = 9, **kw) -> list:
    return kinds.filled(path, kind, backend, n=n, chunk_records=CHUNK, **kw)


def _opened(path: str) -> list:
    """The records of the store at ``path``, read in another process."""
    with pytreestore.open(path) as store:
        return [len(store), store.dropped, list(store.records(as_numpy=True))]


def _chunk_files(path: Path) -> int:
    return sum(1 for p in path.rglob("*") if p.is_file() and "/c/" in p.as_posix())


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_keeps_the_last_records_and_appends_after_them(pool, tmp_path, kind, backend):
    path = tmp_path / "s"
    recs = _filled(path, kind, backend)
    more = kinds.records(kind, 3, start=9)
    with pytreestore.open(path, "a") as store:
        store.append(more[0])  # buffered: committed first
        assert store.keep_last(4) == 6
        assert (len(store), store.dropped, store.committed) == (4, 6, 4)
        _same(store, recs[6:] + more[:1])
        store.extend(more[1:])
        _same(store, recs[6:] + more)
        assert store.keep_last(99) == 0  # nothing to release: no version of its own
        assert [v.operation for v in store.versions()][-2:] == ["keep_last", "append"]
    want = recs[6:] + more
    _same(pytreestore.open(path), want)
    count, dropped, got = pool.apply(_opened, (str(path),))  # a fresh process
    assert (count, dropped) == (6, 6)
    assert_trees_equal(got, want)


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_vacuum_deletes_released_chunks_no_kept_version_reads(tmp_path, kind, backend):
    path = tmp_path / "s"
    recs = _filled(path, kind, backend, n=12)
    more = kinds.records(kind, 3, start=12)
    with pytreestore.open(path, "a", keep_versions=1) as store:
        store.keep_last(4)  # the front at a chunk boundary (row 8): the row before it stays
        store.extend(more)
        store.flush()
        before = _chunk_files(path)
        report = store.vacuum()
        assert report.chunks > 0
        assert report.reclaimed == (backend != "ocdbt")
        if backend != "ocdbt":  # OCDBT keeps the keys' bytes in its files (reclaimed=False)
            assert _chunk_files(path) == before - report.chunks
        _same(store, recs[8:] + more)
        assert store.verify().ok
        store.append(more[0])  # the writer reads back its partly filled chunks
    reopened = pytreestore.open(path)
    _same(reopened, recs[8:] + more + more[:1])
    assert reopened.verify().ok


@pytest.mark.parametrize("kind", ["fixed", "nested"])
def test_vacuum_bounds_the_chunks_of_an_endless_run(tmp_path, kind):
    path = tmp_path / "s"
    store = kinds.create(path, kind, "tensorstore", chunk_records=CHUNK, keep_versions=2)
    counts = []
    for step in range(6):
        store.extend(kinds.records(kind, 8, start=8 * step))
        store.keep_last(5)
        store.vacuum()
        counts.append(_chunk_files(path))
    assert counts[-1] == counts[2] and max(counts[2:]) == counts[2]
    _same(store, kinds.records(kind, 5, start=43))
    store.close()


@pytest.mark.parametrize("backend", kinds.BACKENDS)
def test_an_old_version_reads_until_vacuum_removes_it(tmp_path, backend):
    path = tmp_path / "s"
    recs = _filled(path, "ragged_list", backend)
    with pytreestore.open(path, "a", keep_versions=1) as store:
        before = store.version
        store.keep_last(2)
        _same(pytreestore.open(path, version=before), recs)
        store.extend(kinds.records("ragged_list", 2, start=9))
        store.vacuum()
    with pytest.raises(errors.VersionNotFoundError, match=f"no version {before}"):
        pytreestore.open(path, version=before)


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", ["fixed", "nested"])
def test_a_reader_opened_before_the_release(tmp_path, kind, backend):
    path = tmp_path / "s"
    recs = _filled(path, kind, backend, n=12)
    reader = pytreestore.open(path)
    other = pytreestore.open(path)
    with pytreestore.open(path, "a", keep_versions=1) as store:
        store.keep_last(3)
        _same(reader, recs)  # its version is kept: it reads what it held
        assert reader.refresh() == 3 and reader.dropped == 9
        _same(reader, recs[9:])
        store.append(recs[0])
        store.vacuum()  # the version `other` reads is no longer kept
    _same(reader, recs[9:])
    with pytest.raises(errors.StoreReplacedError, match="was removed"):
        other.load(slice(0, 4), as_numpy=True)


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", ["ragged_axis", "optional"])
def test_truncate_after_keep_last_and_keep_last_after_truncate(tmp_path, kind, backend):
    path = tmp_path / "s"
    recs = _filled(path, kind, backend)
    more = kinds.records(kind, 4, start=9)
    with pytreestore.open(path, "a") as store:
        store.keep_last(6)  # records 3..8
        store.tag("six")
        store.truncate(2)  # records 3, 4
        _same(store, recs[3:5])
        with pytest.raises(errors.StoreIndexError, match="it holds 2"):
            store.truncate(3)
        store.extend(more)  # written over rows 5.. of the versions before
        _same(store, recs[3:5] + more)
        store.truncate(5)
        assert store.keep_last(1) == 4
        _same(store, more[2:3])
        listed = [(v.operation, v.records, v.dropped, v.readable) for v in store.versions()]
    assert listed[-6:] == [
        ("keep_last", 6, 3, False),  # written over after the truncate
        ("truncate", 2, 3, True),
        ("release", 2, 3, True),
        ("append", 6, 3, True),
        ("truncate", 5, 3, True),
        ("keep_last", 1, 7, True),
    ]
    with pytest.raises(errors.VersionNotFoundError, match="is gone"):
        pytreestore.open(path, version="six")
    _same(pytreestore.open(path), more[2:3])


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_copy_copies_the_kept_records_only(tmp_path, kind, backend):
    path = tmp_path / "s"
    recs = _filled(path, kind, backend, n=11)
    with pytreestore.open(path, "a") as store:
        store.keep_last(5)
    assert pytreestore.copy(path, tmp_path / "c", backend=backend, chunk_records=3) == 5
    copied = pytreestore.open(tmp_path / "c")
    assert copied.dropped == 0
    _same(copied, recs[6:])
    assert copied.verify().ok


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_reads_of_every_route_see_the_front(tmp_path, kind, eight_devices):
    path = tmp_path / "s"
    recs = _filled(path, kind, "tensorstore", n=13)
    with pytreestore.open(path, "a") as store:
        store.keep_last(8)
    store = pytreestore.open(path)
    kept = recs[5:]
    index = [7, 0, 3]
    got = store.load(index, as_numpy=True, **({} if kind == "fixed" else {"ragged": "segments"}))
    want = pytreestore.create(tmp_path / "want", kinds.like(kind), **_decl(kind))
    want.extend([kept[i] for i in index])
    expected = want.load(as_numpy=True, **({} if kind == "fixed" else {"ragged": "segments"}))
    assert_trees_equal(got, expected)
    assert_trees_equal(store[2], kept[2])  # placed on the device
    lengths = store.lengths()
    for axis, values in want.lengths().items():  # lengths of the kept records only
        assert values.tolist() == lengths[axis][index].tolist()
    seen = sorted(int(t) for b in store.batches(3, shuffle=True, seed=1) for t in _ts(b))
    assert seen == list(range(5, 13))
    source = store.grain_source()
    record = source[0]
    assert len(source) == 8 and int((record[0] if isinstance(record, tuple) else record).t) == 5
    mesh = jax_mesh(eight_devices)
    sharded = store.load(slice(0, 8), sharding=mesh)
    first = sharded if kind == "fixed" else sharded[0]
    assert np.asarray(first.t).tolist() == list(range(5, 13))


def _decl(kind: str) -> dict:
    return kinds.kind(kind).declarations


def _ts(batch) -> list:
    return np.asarray((batch if isinstance(batch, kinds.Step) else batch[0]).t).tolist()


def jax_mesh(devices: list) -> NamedSharding:
    return NamedSharding(jax.sharding.Mesh(np.array(devices[:2]), ("r",)), PartitionSpec("r"))


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_batches_resume_from_a_state_after_a_release(tmp_path, kind):
    path = tmp_path / "s"
    _filled(path, kind, "zarr", n=14)
    with pytreestore.open(path, "a") as store:
        store.keep_last(10)
    store = pytreestore.open(path)
    whole = [_ts(b) for b in store.batches(2, shuffle=True, seed=3, epochs=1)]
    it = store.batches(2, shuffle=True, seed=3, epochs=1)
    head = [_ts(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(it.state()))
    it.close()
    rest = [_ts(b) for b in store.batches(2, shuffle=True, seed=3, epochs=1, state=state)]
    assert head + rest == whole
    assert sorted(t for b in whole for t in b) == list(range(4, 14))


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_fragments_committed_after_a_release(tmp_path, kind, backend):
    path = tmp_path / "s"
    recs = _filled(path, kind, backend, n=7)
    frags = [
        pytreestore.write_fragment(path, kinds.records(kind, n, start=a), backend=backend)
        for a, n in ((7, 4), (11, 3))
    ]
    with pytreestore.open(path, "a") as store:
        store.keep_last(3)
        store.commit_fragments(frags)
        _same(store, recs[4:] + kinds.records(kind, 7, start=7))
    _same(pytreestore.open(path), recs[4:] + kinds.records(kind, 7, start=7))


def test_extend_batch_appends_after_the_front(tmp_path):
    path = tmp_path / "s"
    recs = _filled(path, "fixed", "tensorstore", n=5)
    more = kinds.records("fixed", 3, start=5)
    with pytreestore.open(path, "a") as store:
        store.keep_last(1)
        store.extend_batch(jax.tree.map(lambda *leaves: np.stack(leaves), *more))
        _same(store, recs[4:] + more)


@pytest.mark.parametrize(
    ("n", "error", "message"),
    [
        (-1, errors.ArgumentError, "an int >= 0), got -1"),
        (1.5, errors.ArgumentTypeError, "got 1.5"),
        (True, errors.ArgumentTypeError, "got True"),
        ("2", errors.ArgumentTypeError, "got '2'"),
    ],
)
def test_a_bad_count_is_refused_before_anything_is_written(tmp_path, n, error, message):
    path = tmp_path / "s"
    _filled(path, "fixed", "tensorstore", n=4)
    with pytreestore.open(path, "a") as store:
        store.append(kinds.record("fixed", 4))
        version = store.version
        with pytest.raises(error, match=re.escape(message)):
            store.keep_last(n)
        assert (store.version, store.committed, len(store)) == (version, 4, 5)


def test_a_reader_and_a_shared_writer_cannot_release(tmp_path):
    path = tmp_path / "s"
    _filled(path, "fixed", "ocdbt", n=4)
    with pytest.raises(errors.ReadOnlyError, match="read-only"):
        pytreestore.open(path).keep_last(1)
    with ocdbt_coordinator() as address:
        shared = pytreestore.open(path, "a", backend="ocdbt", coordinator=address)
        with pytest.raises(errors.ReadOnlyError, match="keep_last"):
            shared.keep_last(1)
        shared.close()


def test_shared_writers_append_after_the_front(tmp_path):
    path = tmp_path / "s"
    recs = _filled(path, "fixed", "ocdbt", n=5)
    with pytreestore.open(path, "a") as store:
        store.keep_last(2)
    more = kinds.records("fixed", 2, start=5)
    with ocdbt_coordinator() as address:
        a = pytreestore.open(path, "a", backend="ocdbt", coordinator=address)
        b = pytreestore.open(path, "a", backend="ocdbt", coordinator=address)
        a.append(more[0])
        a.flush()
        b.append(more[1])
        b.close()
        a.close()
    _same(pytreestore.open(path), recs[3:] + more)


def test_the_commit_record_names_the_front(tmp_path):
    path = tmp_path / "s"
    _filled(path, "fixed", "tensorstore", n=5)
    with pytreestore.open(path, "a") as store:
        store.keep_last(2)
    record = json.loads((path / COMMIT_KEY).read_bytes())
    assert (record["records"], record["first"], record["operation"]) == (5, 3, "keep_last")
    record["first"] = 6
    (path / COMMIT_KEY).write_text(json.dumps(record))
    with pytest.raises(errors.CorruptStoreError, match=r"'first' \(6\) is past its 'records'"):
        pytreestore.open(path)


def test_the_cli_sees_the_kept_records(tmp_path):
    path = tmp_path / "s"
    _filled(path, "fixed", "tensorstore", n=6)
    with pytreestore.open(path, "a") as store:
        store.keep_last(2)

    def run(*args: str) -> str:
        result = CliRunner().invoke(main, [*args, str(path)], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    printed = json.loads(run("head", "--json", "-n", "5"))
    assert [record["t"] for record in printed] == [4, 5]
    assert "2 records" in run("info")
    assert json.loads(run("verify", "--json"))["records"] == 2
    assert json.loads(run("versions", "--json"))[-1]["operation"] == "keep_last"


def test_a_crash_inside_the_release_leaves_the_store_before_it(tmp_path, monkeypatch):
    """The process dies between the release's version record and its commit record: the
    store is as before (the version record past it is ignored, and the next writer deletes
    it); the release made again commits."""
    path = tmp_path / "s"
    recs = _filled(path, "nested", "tensorstore", n=6)
    store = pytreestore.open(path, "a")
    orphan = path / ".pytreestore" / "versions" / f"{store.version + 1:020d}.json"

    write_if = store._backend.write_bytes_if

    def dies(key: str, *args: object) -> object:
        if key == COMMIT_KEY:
            raise KeyboardInterrupt  # the process ends here
        return write_if(key, *args)

    monkeypatch.setattr(store._backend, "write_bytes_if", dies)
    with pytest.raises(KeyboardInterrupt):
        store.keep_last(2)
    monkeypatch.undo()
    store.close()  # nothing buffered: it writes nothing, and gives the lock back
    assert json.loads(orphan.read_bytes())["operation"] == "keep_last"
    reader = pytreestore.open(path)
    assert (len(reader), reader.dropped, reader.versions()[-1].operation) == (6, 0, "append")
    _same(reader, recs)
    with pytreestore.open(path, "a") as store:
        assert not orphan.exists()  # the next writer deleted it
        assert store.keep_last(2) == 4
    _same(pytreestore.open(path), recs[4:])
