"""The decoded-chunk cache (``pytreestore/_read/cache.py``): full committed chunks kept and
served without storage, the tail always read, stores kept apart by their id, the shared
cache's bound, on both backends."""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

import pytreestore
from pytreestore.errors import StoreReplacedError
from tests import interpreters
from tests.conftest import child_env
from tests.reads import count_reads


def _make(path: Path, n: int, backend: str, **options: Any) -> None:
    with pytreestore.create(
        path,
        {"a": np.int32(0), "v": np.zeros(3, np.float32)},
        backend=backend,
        chunk_records=8,
        **options,
    ) as s:
        s.extend({"a": np.int32(i), "v": np.full(3, i, np.float32)} for i in range(n))


@pytest.mark.parametrize("codec", ["zstd", None])
def test_a_full_chunk_read_once_is_served_from_memory(
    tmp_path: Path, backend: str, codec: Any
) -> None:
    _make(tmp_path / "s", 20, backend, codec=codec)
    store = pytreestore.open(tmp_path / "s", backend=backend)
    calls = count_reads(store)
    for i in (9, 3, 14, 0, 12):  # chunks 1, 0, 1, 0, 1 (records 0-15 are full chunks)
        got = store.load(i, as_numpy=True)
        assert got["a"].item() == i and got["v"].tolist() == [i] * 3
    assert len(calls) == 2
    picks = np.array([15, 1, 8])
    assert store.load(picks, as_numpy=True)["a"].tolist() == [15, 1, 8]
    assert len(calls) == 2
    for i in (19, 17, 16):  # the tail chunk: its four rows read once, then kept too
        assert store.load(i, as_numpy=True)["a"].item() == i
    assert len(calls) == 3
    store.close()


def test_a_tail_chunk_is_read_again_once_more_of_it_is_committed(
    tmp_path: Path, backend: str
) -> None:
    like = {"a": np.int32(0), "v": np.zeros(3, np.float32)}
    with pytreestore.create(tmp_path / "s", like, backend=backend, chunk_records=8) as w:
        w.extend({"a": np.int32(i), "v": np.full(3, i, np.float32)} for i in range(5))
        w.flush()
        reader = pytreestore.open(tmp_path / "s", backend=backend)
        assert reader.load(np.array([4, 0]), as_numpy=True)["a"].tolist() == [4, 0]
        w.extend({"a": np.int32(100 + i), "v": np.zeros(3, np.float32)} for i in range(6))
        w.flush()  # rewrites chunk 0: records 5-7 fill it; 8-10 start chunk 1
        calls = count_reads(reader)
        assert reader.load(np.array([4, 1]), as_numpy=True)["a"].tolist() == [4, 1]
        assert len(calls) == 0  # the five rows this reader sees, as it read them
        reader.refresh()
        assert reader.load(np.array([7, 4, 10]), as_numpy=True)["a"].tolist() == [102, 4, 105]
        assert len(calls) == 1  # chunk 0 read again (eight rows now) and chunk 1
        assert reader.load(6, as_numpy=True)["a"].item() == 101
        assert reader.load(np.array([5, 2, 9]), as_numpy=True)["a"].tolist() == [100, 2, 104]
        assert len(calls) == 1
        reader.close()


def test_a_replaced_store_never_serves_the_old_chunks(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _make(path, 16, "tensorstore")
    old = pytreestore.open(path)
    assert old.load(3, as_numpy=True)["a"].item() == 3  # chunk 0 kept
    with pytreestore.create(
        path, {"a": np.int32(0), "v": np.zeros(3, np.float32)}, chunk_records=8, overwrite=True
    ) as s:
        s.extend({"a": np.int32(-i), "v": np.zeros(3, np.float32)} for i in range(16))
    with pytest.raises(StoreReplacedError):
        old.load(3, as_numpy=True)
    new = pytreestore.open(path)
    assert new.load(3, as_numpy=True)["a"].item() == -3
    new.close()


def test_a_column_added_by_evolve_reads_its_default_through_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "s"
    _make(path, 16, "tensorstore")
    with pytreestore.open(path, mode="a") as s:
        assert s.load(2, as_numpy=True)["a"].item() == 2
        s.evolve(add={"['b']": np.float32(0.25)})
    reader = pytreestore.open(path)
    got = reader.load(np.array([2, 9]), as_numpy=True)
    assert got["b"].tolist() == [0.25, 0.25] and got["a"].tolist() == [2, 9]
    reader.close()


def test_threads_gathering_through_one_cache(tmp_path: Path) -> None:
    _make(tmp_path / "s", 200, "tensorstore")
    store = pytreestore.open(tmp_path / "s", cache_bytes=4 << 10)  # a few chunks: evictions
    errors: list[BaseException] = []

    def gather(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(50):
                picks = rng.choice(200, 5, replace=False)
                got = store.load(picks, as_numpy=True)
                assert got["a"].tolist() == picks.tolist()
                assert got["v"][:, 1].tolist() == picks.astype(np.float32).tolist()
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=gather, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    store.close()


def test_cached_rows_are_copies(tmp_path: Path) -> None:
    _make(tmp_path / "s", 16, "tensorstore")
    store = pytreestore.open(tmp_path / "s")
    got = store.load(np.array([1, 2]), as_numpy=True)
    got["v"][:] = -1
    one = store.load(1, as_numpy=True)
    one["v"][:] = -1
    assert store.load(np.array([2, 1]), as_numpy=True)["v"][:, 0].tolist() == [2, 1]
    store.close()


def test_stores_opened_without_cache_bytes_share_one_cache(tmp_path: Path) -> None:
    for name in "ab":
        with pytreestore.create(tmp_path / name, {"a": np.int32(0)}) as s:
            s.extend({"a": np.int32(i)} for i in range(10))
    a, b = pytreestore.open(tmp_path / "a"), pytreestore.open(tmp_path / "b")
    cache = lambda s: cast(Any, s)._cache  # noqa: E731
    own = pytreestore.open(tmp_path / "a", cache_bytes=1 << 20)
    none = pytreestore.open(tmp_path / "a", cache_bytes=0)
    try:
        assert cache(a) is cache(b) is not None
        assert cache(own) is not cache(a)
        assert cache(none) is None
        a.close()
        assert cache(b).limit == 256 << 20  # closing one store keeps the shared cache
        assert b.load(3, as_numpy=True)["a"].item() == 3
    finally:
        for s in (b, own, none):
            s.close()


def test_a_rewritten_chunk_is_read_again_through_the_shared_cache(tmp_path: Path) -> None:
    with pytreestore.create(tmp_path / "s", {"a": np.int32(0)}, codec=None, chunk_records=8) as w:
        w.extend({"a": np.int32(i)} for i in range(5))
        w.flush()
        reader = pytreestore.open(tmp_path / "s")
        assert reader.load([4, 0], as_numpy=True)["a"].tolist() == [4, 0]
        w.extend({"a": np.int32(10 + i)} for i in range(2))
        w.flush()  # rewrites the tail chunk
        reader.refresh()
        assert reader.load([6, 5, 0], as_numpy=True)["a"].tolist() == [11, 10, 0]
        reader.close()


def _with_bound(value: str, script: str, path: Path) -> str:
    """What ``script`` (given ``path``) prints in another process (forked from the test zygote,
    tests/interpreters.py, that has opened no store) whose environment sets
    ``PYTREESTORE_CACHE_BYTES`` to ``value``."""
    env = {**child_env(), "PYTREESTORE_CACHE_BYTES": value}
    out = interpreters.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return out.stdout


@pytest.mark.parametrize(("value", "limit"), [("0", None), ("4096", 4096)])
def test_the_shared_cache_bound_comes_from_the_environment(
    tmp_path: Path, value: str, limit: int | None
) -> None:
    with pytreestore.create(tmp_path / "s", {"a": np.int32(0)}) as s:
        s.extend({"a": np.int32(i)} for i in range(10))
    script = (
        "import sys, pytreestore\n"
        "s = pytreestore.open(sys.argv[1])\n"
        "assert s.load(9, as_numpy=True)['a'].item() == 9\n"
        "c = s._cache\n"
        "print(None if c is None else c.limit)\n"
    )
    assert _with_bound(value, script, tmp_path / "s").strip() == str(limit)


def test_a_malformed_cache_bound_is_a_clear_error(tmp_path: Path) -> None:
    with pytreestore.create(tmp_path / "s", {"a": np.int32(0)}) as s:
        s.append({"a": np.int32(1)})
    script = (
        "import sys, pytreestore\n"
        "from pytreestore.errors import PyTreeStoreError\n"
        "try:\n"
        "    pytreestore.open(sys.argv[1]).load(0)\n"
        "except PyTreeStoreError as err:\n"
        "    print('refused:', err)\n"
    )
    out = _with_bound("lots", script, tmp_path / "s")
    assert "refused: PYTREESTORE_CACHE_BYTES must be a whole number of bytes" in out


def test_cache_bytes_is_checked() -> None:
    bad_values: list[Any] = [-1, 1.5, True, "1"]
    for bad in bad_values:
        with pytest.raises(ValueError, match="cache_bytes must be None"):
            pytreestore.open("memory://nowhere", cache_bytes=bad)


def test_a_forked_child_reads_through_the_cache_even_if_its_lock_was_held(tmp_path: Path) -> None:
    import os

    _make(tmp_path / "s", 16, "tensorstore", codec=None)  # misses read by the direct path
    store = pytreestore.open(tmp_path / "s")
    assert store.load(3, as_numpy=True)["a"].item() == 3  # chunk 0 cached
    cache = cast(Any, store)._cache
    cache._lock.acquire()  # as if another thread were inside the cache when the fork came
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # JAX warns that forking a multithreaded process is risky
            pid = os.fork()
        if pid == 0:  # the child: the cached chunk, and a chunk it reads itself
            ok = store.load(5, as_numpy=True)["a"].item() == 5
            ok = ok and store.load(np.array([12, 1]), as_numpy=True)["a"].tolist() == [12, 1]
            os._exit(0 if ok else 3)
    finally:
        cache._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.close()


def test_a_store_copied_as_files_keeps_its_id_but_not_the_originals_chunks(tmp_path: Path) -> None:
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    with pytreestore.create(a, {"x": np.int32(0)}, chunk_records=8) as s:
        s.extend({"x": np.int32(i)} for i in range(4))
    shutil.copytree(a, b)  # the same store id in both
    with pytreestore.open(a, mode="a") as w:
        w.extend({"x": np.int32(100 + i)} for i in range(4))
    with pytreestore.open(b, mode="a") as w:
        w.extend({"x": np.int32(200 + i)} for i in range(4))
    ra, rb = pytreestore.open(a), pytreestore.open(b)
    assert ra.load(5, as_numpy=True)["x"].item() == 101
    assert rb.load(5, as_numpy=True)["x"].item() == 201
    assert rb.load(np.array([6, 1]), as_numpy=True)["x"].tolist() == [202, 1]


def test_a_store_restored_from_a_backup_is_read_anew(tmp_path: Path) -> None:
    import shutil

    path, backup = tmp_path / "s", tmp_path / "backup"
    with pytreestore.create(path, {"x": np.int32(0)}, chunk_records=8) as s:
        s.extend({"x": np.int32(i)} for i in range(4))
    shutil.copytree(path, backup)
    with pytreestore.open(path, mode="a") as w:
        w.extend({"x": np.int32(100 + i)} for i in range(4))
    before = pytreestore.open(path)
    assert before.load(5, as_numpy=True)["x"].item() == 101
    before.close()
    shutil.rmtree(path)
    shutil.copytree(backup, path)  # the same id, record count and generation after appends
    with pytreestore.open(path, mode="a") as w:
        w.extend({"x": np.int32(200 + i)} for i in range(4))
    after = pytreestore.open(path)
    assert after.load(5, as_numpy=True)["x"].item() == 201
    assert after[4:8]["x"].tolist() == [200, 201, 202, 203]


def test_a_closed_store_leaves_nothing_in_the_shared_cache(tmp_path: Path) -> None:
    _make(tmp_path / "s", 16, "tensorstore")
    store = pytreestore.open(tmp_path / "s")
    cache = cast(Any, store)._cache
    before = cache.nbytes
    store.load(np.array([1, 12]), as_numpy=True)
    assert cache.nbytes > before
    store.close()
    assert cache.nbytes == before
