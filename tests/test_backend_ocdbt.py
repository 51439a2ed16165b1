"""The OCDBT backend (pytreestore/backends/_tensorstore/ocdbt.py): stores inside one OCDBT
database, each commit one atomic OCDBT generation, versions read from OCDBT snapshots.

The conformance suite runs on it in tests/test_conformance.py; these are what only it does.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY, NO_VALUE, version_key
from pytreestore._location import Location
from pytreestore._log import commit_record as snapshots
from pytreestore.backends import (
    OcdbtBackend,
    OcdbtDatabase,
    Snapshots,
    Transactions,
    default_backend,
    register_backend,
)
from pytreestore.testing import assert_trees_equal
from tests.test_backend_tensorstore import held

pytest_plugins = ("tests.fixtures",)

_DTYPES = ["float32", "int8", "uint64", "bool", "complex64", "float16", "bfloat16"]


def _leaf(name: str, i: int) -> np.ndarray:
    dtype = ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)
    return (np.arange(3) + i).astype(dtype)


def _record(i: int) -> dict:
    return {name: _leaf(name, i) for name in _DTYPES} | {"n": np.int32(i)}


def _generations(path: Path) -> int:
    return OcdbtBackend(Location.parse(str(path))).latest_generation()


@pytest.mark.parametrize("where", ["file", "memory"])
def test_every_dtype_round_trips(tmp_path: Path, where: str) -> None:
    path = str(tmp_path / "s") if where == "file" else "memory://test-ocdbt-dtypes"
    with pytreestore.create(path, _record(0), backend="ocdbt", chunk_records=4) as store:
        store.extend(_record(i) for i in range(6))
        store.extend_batch(pytreestore.stack([_record(i) for i in range(6, 11)], as_numpy=True))
    reader = pytreestore.open(path)  # found to be OCDBT without backend=
    assert isinstance(reader._backend, OcdbtBackend)
    got = reader.load(as_numpy=True)
    for name in _DTYPES:
        want = np.stack([_leaf(name, i) for i in range(11)])
        assert got[name].dtype == want.dtype
        assert got[name].tobytes() == want.tobytes()
    np.testing.assert_array_equal(got["n"], range(11))


def test_a_commit_is_one_ocdbt_generation(tmp_path: Path) -> None:
    """Every column's resize, the tail chunk, the version record, the commit record and the
    root land in one generation: no generation shows a part of a commit."""
    path = tmp_path / "s"
    like = {f"c{i}": np.float32(0) for i in range(5)}
    with pytreestore.create(str(path), like, backend="ocdbt", chunk_records=4) as store:
        before = _generations(path)
        store.append({k: np.float32(1) for k in like})
        store.flush()
        assert _generations(path) == before + 1
        store.extend_batch({k: np.arange(9, dtype=np.float32) for k in like})  # chunks and tail
        assert _generations(path) == before + 2
    engine = OcdbtBackend(Location.parse(str(path)))
    generation = snapshots.generation_of(engine, 2)
    assert generation is not None and generation == before + 2
    at = engine.at_generation(generation)
    assert at.column_shapes(list(like)) == [(10,)] * 5  # every column resized in it (the
    # tail chunk is written with the whole ones: all 10 records are committed)
    assert at.read_bytes(version_key(2)) is not None
    assert at.read(list(like), slice(0, 10), 10)[0].tolist() == [1, *range(9)]


def test_a_failed_block_commits_nothing(tmp_path: Path) -> None:
    backend = OcdbtBackend(Location.parse(str(tmp_path / "s")))
    backend.write_bytes("kept", b"0")
    with pytest.raises(RuntimeError, match="cut"), backend.transaction():
        backend.write_bytes("kept", b"1")
        backend.write_bytes("new", b"1")
        assert backend.read_bytes("kept") == b"1"  # the block reads its own writes
        raise RuntimeError("cut")
    assert (backend.read_bytes("kept"), backend.read_bytes("new")) == (b"0", None)


def test_a_stale_conditional_write_fails_the_whole_block(tmp_path: Path) -> None:
    """Two writers whose conditional writes both pass the early check: the one whose block
    commits second gets CommitConflictError, and nothing of its block lands."""
    location = Location.parse(str(tmp_path / "s"))
    first, second = OcdbtBackend(location), OcdbtBackend(location)
    token = first.write_bytes_if(COMMIT_KEY, b"0", NO_VALUE)
    assert token is not None
    conflict = pytest.raises(errors.CommitConflictError, match="Nothing of this commit landed")
    with conflict, second.transaction():
        assert second.write_bytes_if(COMMIT_KEY, b"second", token) is not None
        second.write_bytes("second-chunk", b"y")
        mine = first.write_bytes_if(COMMIT_KEY, b"first", token)  # commits in between
        assert mine is not None
    third = OcdbtBackend(location)
    assert (third.read_bytes(COMMIT_KEY), third.read_bytes("second-chunk")) == (b"first", None)
    assert second.write_bytes_if(COMMIT_KEY, b"late", token) is None


def test_tokens_of_a_block_are_real_after_it_commits(tmp_path: Path) -> None:
    backend = OcdbtBackend(Location.parse(str(tmp_path / "s")))
    with backend.transaction():
        token = backend.write_bytes_if("k", b"1", NO_VALUE)
    assert token is not None
    with backend.transaction():
        again = backend.write_bytes_if("k", b"2", token)
    assert again is not None and backend.write_bytes_if("k", b"3", again) is not None
    assert backend.write_bytes_if("k", b"4", token) is None
    assert backend.read_bytes("k") == b"3"


def _numbers(store: pytreestore.TreeStore) -> list[int]:
    return [int(v) for v in store.load(as_numpy=True)["n"]]


def test_a_version_reads_its_ocdbt_snapshot(tmp_path: Path) -> None:
    """open(version=N) reads the generation that committed N: its rows are pinned by OCDBT,
    so a chunk lost later does not touch it."""
    path = str(tmp_path / "s")
    with pytreestore.create(path, {"n": np.int32(0)}, backend="ocdbt", chunk_records=2) as s:
        s.extend_batch({"n": np.arange(4, dtype=np.int32)})
        s.flush()
        s.extend_batch({"n": np.arange(4, 6, dtype=np.int32)})
    OcdbtBackend(Location.parse(path)).delete_keys(["n/c/0"])  # damage after the fact
    with pytest.raises(errors.CorruptChunkError, match=re.escape("n/c/0")):
        pytreestore.open(path).load(as_numpy=True)
    old = pytreestore.open(path, version=1)
    assert _numbers(old) == [0, 1, 2, 3]
    pinned = old._backend
    assert isinstance(pinned, OcdbtDatabase) and pinned.version is not None
    with pytest.raises(errors.PyTreeStoreError, match="read-only"):
        pinned.write_bytes("x", b"1")


def test_open_finds_ocdbt_and_other_backends_say_how_to_read_it(tmp_path: Path) -> None:
    path = tmp_path / "s"
    pytreestore.create(str(path), {"n": np.int32(0)}, backend="ocdbt").close()
    assert default_backend(Location.parse(str(path))) == "ocdbt"
    assert default_backend(Location.parse(str(tmp_path / "none"))) == "tensorstore"
    assert sorted(os.listdir(path)) == [".pytreestore", "d", "manifest.ocdbt"]
    for backend in ("zarr", "tensorstore"):
        with pytest.raises(errors.NotAStoreError, match="in an OCDBT database") as info:
            pytreestore.open(str(path), backend=backend)
        assert "backend='ocdbt'" in str(info.value) and "pytreestore.copy(" in str(info.value)


def test_copy_converts_both_ways(tmp_path: Path) -> None:
    source = str(tmp_path / "file")
    records = [_record(i) for i in range(9)]
    with pytreestore.create(source, records[0], chunk_records=4) as store:
        store.extend(records)
    to_ocdbt, back = str(tmp_path / "ocdbt"), str(tmp_path / "back")
    assert pytreestore.copy(source, to_ocdbt, backend="ocdbt") == 9
    assert pytreestore.copy(to_ocdbt, back, backend="zarr") == 9
    assert isinstance(pytreestore.open(to_ocdbt)._backend, OcdbtBackend)
    import zarr

    from pytreestore.backends._zarr import stores as _zarr_dtypes

    _zarr_dtypes.register()
    for leaf in ("bfloat16", "n"):  # the copy back is plain zarr again
        want = np.stack([r[leaf] for r in records])
        assert np.asarray(zarr.open_array(f"{back}/{leaf}", mode="r")[:]).tobytes() == (
            want.tobytes()
        )
    want = pytreestore.open(source).load(as_numpy=True)
    assert_trees_equal(pytreestore.open(back).load(as_numpy=True), want)
    assert_trees_equal(pytreestore.open(to_ocdbt).load(as_numpy=True), want)


def test_evolve_truncate_and_ragged(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    with pytreestore.create(path, {"n": np.int32(0)}, backend="ocdbt", chunk_records=3) as s:
        s.extend({"n": np.int32(i)} for i in range(5))
    with pytreestore.open(path, "a") as s:
        s.evolve(add={"['m']": np.float32(-1)})
        s.append({"n": np.int32(5), "m": np.float32(0.5)})
    with pytreestore.open(path, "a") as s:
        s.truncate(4)
        s.append({"n": np.int32(9), "m": np.float32(2)})
    got = pytreestore.open(path).load(as_numpy=True)
    np.testing.assert_array_equal(got["n"], [0, 1, 2, 3, 9])
    np.testing.assert_array_equal(got["m"], [-1, -1, -1, -1, 2])
    ragged = str(tmp_path / "r")
    lists = [{"p": [np.float32(j) for j in range(k)]} for k in (2, 0, 3, 1)]
    with pytreestore.create(ragged, lists[0], backend="ocdbt", ragged=True) as s:
        s.extend(lists)
    reader = pytreestore.open(ragged)
    assert [[float(v) for v in reader.load(i, as_numpy=True)["p"]] for i in range(4)] == [
        [float(j) for j in range(k)] for k in (2, 0, 3, 1)
    ]


def test_repair_removes_what_a_killed_writer_left(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with pytreestore.create(str(path), {"n": np.int32(0)}, backend="ocdbt") as s:
        s.append({"n": np.int32(1)})
    leftovers = [path / "manifest.ocdbt.__lock", path / "d" / "0123abcd.__lock"]
    for leftover in leftovers:
        leftover.write_bytes(b"half a write")
    with pytreestore.open(str(path), "a") as s:
        s.append({"n": np.int32(2)})
    assert not any(p.exists() for p in leftovers)
    assert _numbers(pytreestore.open(str(path))) == [1, 2]


def test_repair_keeps_the_files_of_a_write_in_flight(tmp_path: Path) -> None:
    """write_fragment writes into the database without the writer lock (issue 44): the lock
    files of its writes in flight (the shared manifest's, a data file's) are kept."""
    path = tmp_path / "s"
    with pytreestore.create(str(path), {"n": np.int32(0)}, backend="ocdbt") as s:
        s.append({"n": np.int32(1)})
    busy = [path / "manifest.ocdbt.__lock", path / "d" / "0123abcd.__lock"]
    left = path / "d" / "4567ef01.__lock"
    for name in [*busy, left]:
        name.write_bytes(b"half a write")
    engine = OcdbtBackend(Location.parse(str(path)))
    with held(busy[0]), held(busy[1]):
        assert engine.remove_partial_writes([], 0) == [str(left)]
        assert all(p.read_bytes() == b"half a write" for p in busy)
    assert sorted(engine.remove_partial_writes([], 0)) == sorted(map(str, busy))


def test_two_writers_never_both_commit(tmp_path: Path) -> None:
    """The second writer's lock taken over (break_lock's effect): one commit wins."""
    path = str(tmp_path / "s")
    with pytreestore.create(path, {"n": np.int32(0)}, backend="ocdbt") as s:
        s.append({"n": np.int32(0)})
    first = pytreestore.open(path, "a")
    (Path(path) / ".pytreestore" / "lock").unlink()  # the lock broken behind its back
    second = pytreestore.open(path, "a")
    first.append({"n": np.int32(1)})
    second.append({"n": np.int32(2)})
    second.flush()
    with pytest.raises(errors.CommitConflictError, match="another writer"):
        first.flush()
    assert first.committed == 1  # its commit was undone with the transaction
    second.close()
    assert _numbers(pytreestore.open(path)) == [0, 2]


def test_a_wide_tree_is_a_handful_of_files(tmp_path: Path) -> None:
    path = tmp_path / "s"
    like = {f"leaf{i:03d}": np.zeros(8, np.float32) for i in range(300)}
    batch = {k: np.ones((16, 8), np.float32) for k in like}
    with pytreestore.create(str(path), like, backend="ocdbt") as store:
        store.extend_batch(batch)
    files = [f for _, _, names in os.walk(path) for f in names]
    # as files, the 300 columns would be over 600 (a zarr.json and a chunk each). OCDBT batches
    # the writes in flight together: 13-19 files on an idle machine, up to 34 under load
    assert len(files) <= len(like) // 5, files
    assert_trees_equal(pytreestore.open(str(path)).load(as_numpy=True), batch)


def test_extra_ocdbt_options_pass_through(tmp_path: Path) -> None:
    options = {"config": {"max_inline_value_bytes": 512}}
    register_backend(
        "ocdbt-test-options", functools.partial(OcdbtBackend, ocdbt_options=options), replace=True
    )
    path = str(tmp_path / "s")
    with pytreestore.create(path, {"n": np.int32(0)}, backend="ocdbt-test-options") as s:
        s.append({"n": np.int32(3)})
    base = ts.KvStore.open({"driver": "file", "path": path + "/"}).result()
    assert ts.ocdbt.dump(base).result()["config"]["max_inline_value_bytes"] == 512
    assert _numbers(pytreestore.open(path)) == [3]
    with pytest.raises(errors.PyTreeStoreError, match=re.escape("may not set ['version']")):
        OcdbtBackend(Location.parse(path), ocdbt_options={"version": 1})


def test_capabilities() -> None:
    backend = OcdbtBackend(Location.parse("memory://test-ocdbt-caps"))
    assert isinstance(backend, Transactions) and isinstance(backend, Snapshots)


@pytest.mark.s3
def test_on_s3(s3_server, bucket) -> None:
    url, opts = f"s3://{bucket}/ocdbt", s3_server.options
    like = {"n": np.int32(0), "b": _leaf("bfloat16", 0)}
    with pytreestore.create(url, like, backend="ocdbt", chunk_records=2, storage_options=opts) as s:
        s.extend({"n": np.int32(i), "b": _leaf("bfloat16", i)} for i in range(3))
        s.flush()
        reader = pytreestore.open(url, storage_options=opts)  # found to be OCDBT
        assert isinstance(reader._backend, OcdbtBackend)
        assert _numbers(reader) == [0, 1, 2]
        s.extend({"n": np.int32(i), "b": _leaf("bfloat16", i)} for i in range(3, 5))
        s.flush()
        reader.refresh()
        assert _numbers(reader) == [0, 1, 2, 3, 4]  # a reader sees the new commit
    assert _numbers(pytreestore.open(url, version=2, storage_options=opts)) == [0, 1, 2]
    got = pytreestore.open(url, storage_options=opts).load(as_numpy=True)["b"]
    assert got.tobytes() == np.stack([_leaf("bfloat16", i) for i in range(5)]).tobytes()
    with pytest.raises(errors.NotAStoreError, match="in an OCDBT database"):
        pytreestore.open(url, backend="zarr", storage_options=opts)


def test_many_transactional_resizes_in_one_context(tmp_path: Path) -> None:
    """One backend, one ts.Context, commit after commit: each resizes every column in its own
    transaction (a handle left bound to a committed transaction would fail the next one with
    "Transaction not open"; the backend binds its handles to each block anew)."""
    path = str(tmp_path / "s")
    like = {"a": np.int32(0), "b": np.zeros(2, np.float32)}
    with pytreestore.create(path, like, backend="ocdbt", chunk_records=3) as store:
        for i in range(20):
            store.append({"a": np.int32(i), "b": np.full(2, i, np.float32)})
            store.flush()
    assert [v.records for v in pytreestore.open(path).versions()] == list(range(21))
    got = pytreestore.open(path).load(as_numpy=True)
    np.testing.assert_array_equal(got["a"], range(20))
    np.testing.assert_array_equal(got["b"][:, 1], range(20))
    for version in (5, 13):
        assert _numbers_of(pytreestore.open(path, version=version)) == list(range(version))


def _numbers_of(store: pytreestore.TreeStore) -> list[int]:
    return [int(v) for v in store.load(as_numpy=True)["a"]]


def test_cli_copy_and_evolve_by_path(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pytreestore.cli import main

    source, plain, again = (str(tmp_path / n) for n in ("ocdbt", "plain", "again"))
    with pytreestore.create(source, {"n": np.int32(0)}, backend="ocdbt") as s:
        s.extend({"n": np.int32(i)} for i in range(7))
    runner = CliRunner()
    for src, dst, backend in ((source, plain, "tensorstore"), (plain, again, "ocdbt")):
        result = runner.invoke(main, ["copy", src, dst, "--backend", backend])
        assert result.exit_code == 0, result.output
        assert "copied 7 records" in result.output
    assert not (Path(plain) / "manifest.ocdbt").exists()
    assert (Path(again) / "manifest.ocdbt").exists()
    assert _numbers(pytreestore.open(plain)) == _numbers(pytreestore.open(again)) == list(range(7))
    pytreestore.evolve(again, add={"['m']": np.float32(2)})  # finds the OCDBT store itself
    assert pytreestore.open(again).load(as_numpy=True)["m"].tolist() == [2.0] * 7


def _bytes_on_disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.parametrize("backend", ["tensorstore", "ocdbt"])
def test_what_vacuum_frees_and_what_a_copy_frees(tmp_path: Path, backend: str) -> None:
    """vacuum() frees space on the file backend; on OCDBT it removes the same keys from the
    latest generation only (their bytes stay, readable at older generations: TensorStore
    has no garbage collection of old generations) and says so; a copy to a new OCDBT store
    holds the latest version alone, many times smaller after many commits."""
    path = tmp_path / "s"
    like = {f"l{i}": np.zeros(16, np.float32) for i in range(10)}
    with pytreestore.create(path, like, backend=backend, chunk_records=4, keep_versions=5) as s:
        for i in range(60):
            s.append({k: np.full(16, i, np.float32) for k in like})
            s.flush()
        s.truncate(10)
        for i in range(100, 105):  # written over the truncated rows: older versions gone
            s.append({k: np.full(16, i, np.float32) for k in like})
            s.flush()
        before, generation = _bytes_on_disk(path), None
        if backend == "ocdbt":
            generation = _generations(path)
        report = s.vacuum()
    assert report.versions > 0 and report.chunks > 0
    assert report.reclaimed is (backend == "tensorstore")
    if generation is None:
        assert _bytes_on_disk(path) < before
        return
    assert _bytes_on_disk(path) >= before  # nothing left the files
    removed = "l0/c/5/0"  # rows 20-23: past the 15 records every kept version holds
    old = OcdbtBackend(Location.parse(str(path))).at_generation(generation)
    assert old.read_bytes(removed) is not None  # still there, one generation back
    assert OcdbtBackend(Location.parse(str(path))).read_bytes(removed) is None
    assert pytreestore.copy(path, tmp_path / "copy", backend="ocdbt") == 15
    assert 10 * _bytes_on_disk(tmp_path / "copy") < _bytes_on_disk(path)
    got = pytreestore.open(tmp_path / "copy").load(as_numpy=True)
    assert_trees_equal(got, pytreestore.open(path).load(as_numpy=True))
    assert got["l3"][:, 0].tolist() == [*range(10), *range(100, 105)]


@pytest.mark.parametrize("used", [False, True], ids=["lazy", "used"])
def test_a_reader_of_a_database_replaced_since_gets_store_replaced(
    tmp_path: Path, used: bool
) -> None:
    """create(overwrite=True) puts a new OCDBT database (another uuid) where a reader's was:
    TensorStore's "Configuration mismatch on uuid" is StoreReplacedError, not a retryable
    StorageError or a damaged chunk."""
    path = tmp_path / "s"
    like = {"x": np.zeros(3, np.float32)}
    with pytreestore.create(path, like, backend="ocdbt") as store:
        store.extend({"x": np.full(3, i, np.float32)} for i in range(6))
    reader = pytreestore.open(path)
    if used:
        assert len(reader.load(as_numpy=True)["x"]) == 6
    with pytreestore.create(path, like, backend="ocdbt", overwrite=True) as store:
        store.extend({"x": np.full(3, 100 + i, np.float32)} for i in range(2))
    with pytest.raises(errors.StoreReplacedError, match="replaced by another") as caught:
        reader.load(as_numpy=True)
    assert "Configuration mismatch" not in str(caught.value)
    assert str(path) in str(caught.value) and "pytreestore.open()" in str(caught.value)
    assert pytreestore.open(path).load(as_numpy=True)["x"][:, 0].tolist() == [100, 101]
