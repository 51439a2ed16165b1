"""Direct I/O of uncompressed local chunks (pytreestore.backends._tensorstore.direct): the bytes it writes
are the bytes TensorStore writes, what it reads equals what TensorStore reads, and damaged,
short or missing chunk files are caught or handed back to the engine."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import tensorstore as ts

import pytreestore
from pytreestore import errors
from pytreestore.backends import PartialReads
from pytreestore.backends._tensorstore import direct as _direct
from pytreestore.backends._tensorstore import direct as pieces

LIKE = {"m": np.zeros((3, 2), np.float32), "i": np.int64(0), "b": np.zeros(5, np.bool_)}


def rows(n: int, offset: int = 0) -> dict[str, np.ndarray]:
    r = np.arange(offset, offset + n)
    return {
        "m": (r[:, None, None] * 10 + np.arange(6).reshape(3, 2)).astype(np.float32),
        "i": (r * 7 - 3).astype(np.int64),
        "b": (r[:, None] + np.arange(5)) % 3 == 0,
    }


def make(path: Path, n: int = 23, codec: str | None = None, **kw) -> pytreestore.TreeStore:
    store = pytreestore.create(path, LIKE, chunk_records=4, codec=codec, **kw)
    store.extend_batch(rows(n))
    store.flush()
    return store


def engine_read(path: Path, key: str, index) -> np.ndarray:
    handle = ts.open({"driver": "zarr3", "kvstore": f"file://{path}/{key}/"}).result()
    return handle[index].read().result()


def chunk_files(path: Path) -> dict[str, bytes]:
    """Every chunk file below ``path``, by its key."""
    found = (p for p in sorted(path.rglob("*")) if p.is_file())
    return {
        str(p.relative_to(path)): p.read_bytes()
        for p in found
        if "/c/" in f"/{p.relative_to(path)}"
    }


def test_plan_takes_only_plain_chunks_of_whole_records(tmp_path: Path) -> None:
    meta = {
        "data_type": "float32",
        "shape": [0, 3, 2],
        "chunk_grid": {"configuration": {"chunk_shape": [4, 3, 2]}},
        "chunk_key_encoding": {"name": "default"},
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
    }
    column = _direct.plan(tmp_path, meta, "m")
    assert column is not None
    assert (column.chunk, column.row_nbytes, column.chunk_key(5)) == (4, 24, "c/5/0/0")
    zstd = [meta["codecs"][0], {"name": "zstd", "configuration": {"level": 3}}, {"name": "crc32c"}]
    refused = [
        dict(meta, codecs=zstd),
        dict(
            meta, codecs=[{"name": "bytes", "configuration": {"endian": "big"}}, meta["codecs"][1]]
        ),
        dict(meta, codecs=meta["codecs"][:1]),  # no checksum
        dict(meta, chunk_grid={"configuration": {"chunk_shape": [4, 3, 1]}}),  # split records
        dict(meta, chunk_key_encoding={"name": "v2"}),
        dict(meta, data_type="not a type"),
        {"shape": [0]},
    ]
    assert [_direct.plan(tmp_path, m) for m in refused] == [None] * len(refused)


def test_direct_writes_are_the_bytes_tensorstore_writes(tmp_path: Path) -> None:
    ours = make(tmp_path / "ours", n=23)
    ours.close()
    theirs = pytreestore.create(tmp_path / "theirs", LIKE, chunk_records=4, codec=None)
    for i in range(23):  # one record at a time: every chunk goes through TensorStore
        theirs.append({k: v[i] for k, v in rows(23).items()})
    theirs.close()
    mine, engine = chunk_files(tmp_path / "ours"), chunk_files(tmp_path / "theirs")
    assert len(mine) == 3 * 6 and mine.keys() == engine.keys()
    assert mine == engine
    assert not list((tmp_path / "ours").rglob("*.__lock"))


@pytest.mark.parametrize(
    "index",
    [
        slice(0, 23),
        slice(4, 12),  # whole chunks only
        slice(1, 22),  # partial chunks at both ends
        slice(21, 23),  # inside the tail chunk
        slice(2, 19, 3),
        np.array([22, 0, 5, 5, 13, 4, 21, 1]),  # unsorted, repeated
        np.array([], np.int64),
    ],
    ids=["all", "whole", "partial", "tail", "step", "gather", "empty"],
)
def test_reads_equal_tensorstore_reads(tmp_path: Path, index) -> None:
    store = make(tmp_path / "s", n=23)
    got = store.load(index, as_numpy=True)
    for key in ("m", "i", "b"):
        want = engine_read(tmp_path / "s", key, index)
        np.testing.assert_array_equal(got[key], want)
        assert got[key].dtype == want.dtype
    expected = {k: v[index] for k, v in rows(23).items()}
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])


@pytest.mark.parametrize("part", [slice(0, 1), slice(1, 3), slice(2, 3), slice(0, 3)])
@pytest.mark.parametrize("index", [slice(1, 22), slice(2, 19, 3), np.array([22, 0, 5, 5])])
def test_parts_of_the_second_axis_equal_tensorstore_reads(tmp_path: Path, index, part) -> None:
    """A part of ``m``'s second axis, read directly (each chunk checked whole): exactly
    what TensorStore reads, and a damaged chunk is still named."""
    store = make(tmp_path / "s", n=23)
    engine = store._backend
    assert isinstance(engine, PartialReads)
    got = engine.read_parts([("m", index, part), ("i", index, None)], 23)
    np.testing.assert_array_equal(got[0], engine_read(tmp_path / "s", "m", (index, part)))
    np.testing.assert_array_equal(got[1], rows(23)["i"][index])
    assert got[0].flags.c_contiguous and got[0].dtype == np.float32
    chunk = tmp_path / "s" / "m" / "c" / "1" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[5] ^= 1  # a bit rots: the checksum no longer matches
    chunk.write_bytes(bytes(data))
    with pytest.raises(errors.CorruptChunkError, match=r"chunk \(1, 0, 0\)"):
        engine.read_parts([("m", slice(0, 23), part)], 23)


def test_a_short_chunk_file_is_named(tmp_path: Path) -> None:
    store = make(tmp_path / "s")
    chunk = tmp_path / "s" / "m" / "c" / "2" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-9])
    with pytest.raises(
        errors.CorruptChunkError, match=r"chunk \(2, 0, 0\).*holds 91 bytes, not 100"
    ):
        store.load(slice(0, 12), as_numpy=True)
    np.testing.assert_array_equal(store.load(slice(0, 8), as_numpy=True)["m"], rows(8)["m"])


def test_a_longer_chunk_file_is_named(tmp_path: Path) -> None:
    store = make(tmp_path / "s")
    chunk = tmp_path / "s" / "i" / "c" / "1"
    chunk.write_bytes(chunk.read_bytes() + b"x")
    with pytest.raises(errors.CorruptChunkError, match=r"\['i'\]: chunk \(1,\) \(i/c/1\)") as info:
        store.load(np.array([5]), as_numpy=True)
    assert (info.value.chunk, info.value.key) == ((1,), "i/c/1")


def test_a_missing_chunk_is_an_error_never_zeros(tmp_path: Path) -> None:
    store = make(tmp_path / "s")
    (tmp_path / "s" / "i" / "c" / "1").unlink()
    with pytest.raises(
        errors.CorruptChunkError, match=r"column \['i'\]: chunk \(1,\) \(i/c/1\) is missing"
    ):
        store.load(slice(0, 12), as_numpy=True)
    np.testing.assert_array_equal(
        store.load(slice(0, 12), as_numpy=True, columns="['m']")["m"], rows(12)["m"]
    )
    assert not store.verify().ok


def test_compressed_columns_are_read_directly_where_the_compiled_loop_is(tmp_path: Path) -> None:
    store = make(tmp_path / "s", codec="zstd")
    np.testing.assert_array_equal(store.load(as_numpy=True)["m"], rows(23)["m"])
    plans = store._backend._direct.values()  # type: ignore[attr-defined]
    if pieces.native() is None:  # not built here: TensorStore reads them
        assert all(plan is None for plan in plans)
    else:
        assert plans and all(plan is not None and plan.codec == pieces.ZSTD for plan in plans)
    np.testing.assert_array_equal(
        store.load([7, 2, 7], as_numpy=True)["i"], rows(23)["i"][[7, 2, 7]]
    )


def test_appends_after_direct_writes_and_reopen(tmp_path: Path) -> None:
    store = make(tmp_path / "s", n=10)
    store.extend_batch(rows(9, offset=10))
    store.append({k: v[0] for k, v in rows(1, offset=19).items()})
    store.close()
    again = pytreestore.open(tmp_path / "s")
    assert len(again) == 20
    for key, want in rows(20).items():
        np.testing.assert_array_equal(again.load(as_numpy=True)[key], want)
    assert again.verify().ok


def test_the_thread_pool_works_in_a_forked_child(tmp_path: Path) -> None:
    make(tmp_path / "s")
    store = pytreestore.open(tmp_path / "s")  # a reader: a forked child may not use a writer
    np.testing.assert_array_equal(store.load(as_numpy=True)["i"], rows(23)["i"])  # pool started
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX warns that forking a multithreaded process is risky
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        ok = False
        try:
            ok = np.array_equal(store.load(as_numpy=True)["i"], rows(23)["i"])
        finally:
            os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ---- the chunk cache (open(cache_bytes=...)) ----------------------------------------------------


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_cached_gathers_see_chunks_a_writer_rewrote(tmp_path: Path, codec) -> None:
    writer = make(tmp_path / "s", n=10, codec=codec)
    reader = pytreestore.open(tmp_path / "s", cache_bytes=1 << 20)
    picks = np.array([9, 1, 8, 2])
    for _ in range(2):  # the second gather is served from the cache
        got = reader.load(picks, as_numpy=True)
        np.testing.assert_array_equal(got["m"], rows(10)["m"][picks])
    writer.extend_batch(rows(3, offset=10))  # rewrites the tail chunk, records 8-11
    writer.flush()
    reader.refresh()
    picks = np.array([11, 9, 8, 0])
    got = reader.load(picks, as_numpy=True)
    for key, want in rows(13).items():
        np.testing.assert_array_equal(got[key], want[picks])


def test_the_cache_holds_at_most_its_limit(tmp_path: Path) -> None:
    make(tmp_path / "s", n=23).close()
    store = pytreestore.open(tmp_path / "s")
    chunk = sum(c.chunks[0] * c.record_nbytes for c in store.schema.columns)  # of every column
    store.close()
    store = pytreestore.open(tmp_path / "s", cache_bytes=4 * chunk)
    cache = store._cache  # type: ignore[attr-defined]
    for k in range(5):  # gathers within one full chunk each: kept, the oldest dropped
        picks = np.array([4 * k + 3, 4 * k])
        np.testing.assert_array_equal(store.load(picks, as_numpy=True)["m"], rows(23)["m"][picks])
        assert cache.nbytes == min(k + 1, 4) * chunk
    cache.clear()
    picks = np.arange(0, 23, 2)  # needs five whole chunks, more than half the cache: not kept
    np.testing.assert_array_equal(store.load(picks, as_numpy=True)["m"], rows(23)["m"][picks])
    assert cache.nbytes == 0
    store.load(np.array([1]), as_numpy=True)
    store.close()
    assert cache.nbytes == 0


def test_cache_bytes_is_checked(tmp_path: Path) -> None:
    make(tmp_path / "s").close()
    with pytest.raises(ValueError, match="cache_bytes must be None"):
        pytreestore.open(tmp_path / "s", cache_bytes=-1)
    with pytreestore.open(tmp_path / "s", backend="zarr", cache_bytes=1 << 20) as store:
        assert store._cache is not None and store._cache.limit == 1 << 20  # type: ignore[attr-defined]
