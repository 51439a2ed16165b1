"""The direct reader's compiled loop (pytreestore.backends._tensorstore.direct, direct_reads):
built where a C compiler is, reads every kind of chunk (plain, zstd, inner chunks of shards)
exactly as TensorStore does, keeps a shard's index only while its file is unchanged, names
every kind of damage, and where it is absent every read still gives the same bytes."""

from __future__ import annotations

import os
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._runtime import RUNTIME
from pytreestore.backends._tensorstore import direct
from pytreestore.backends._tensorstore import direct as pieces
from tests.test_direct import LIKE, rows

needs_native = pytest.mark.skipif(pieces.native() is None, reason="the compiled loop is not built")


def make(path: Path, n: int = 100, **kw) -> pytreestore.TreeStore:
    kw.setdefault("inner_chunk_bytes", 64)
    store = pytreestore.create(path, LIKE, chunk_records=32, **kw)
    store.extend_batch(rows(n))
    store.flush()
    return store


def both(store: pytreestore.TreeStore, index) -> tuple[dict, dict]:
    """``load(index)`` through the direct reader and through TensorStore."""
    try:
        RUNTIME.reads.direct = True
        mine = store.load(index, as_numpy=True)
        RUNTIME.reads.direct = False
        theirs = store.load(index, as_numpy=True)
    finally:
        RUNTIME.reads.direct = True
    return mine, theirs


def same_bytes(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert x.tobytes() == y.tobytes(), key


def test_the_compiled_loop_is_built_where_a_c_compiler_is() -> None:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) here: reads go through TensorStore")
    lib = pieces.native()
    assert lib is not None, "make install should have built _pieces (pyproject ext-modules)"
    assert lib.zstd, "libzstd was not found (the system's, or numcodecs')"


@needs_native
@pytest.mark.parametrize("codec", ["zstd", None])
@pytest.mark.parametrize("inner", [None, 64, 256])
@pytest.mark.parametrize(
    "index",
    [
        slice(0, 100),
        slice(37, 38),
        slice(31, 65),
        99,
        -1,
        np.array([5, 99, 5, 0, 64, 33]),
        np.array([7]),
        np.arange(100)[::-3],
        slice(3, 90, 7),
    ],
    ids=repr,
)
def test_every_layout_reads_what_tensorstore_reads(tmp_path: Path, codec, inner, index) -> None:
    store = make(tmp_path / "s", codec=codec, inner_chunk_bytes=inner)
    mine, theirs = both(store, index)
    same_bytes(mine, theirs)
    want = {k: v[index] for k, v in rows(100).items()}
    same_bytes(mine, want)
    plans = store._backend._direct  # type: ignore[attr-defined]
    assert all(p is not None for p in plans.values())  # the direct reader read them all
    assert {p.inner for p in plans.values()} != {None} or inner is None or codec is None


@needs_native
def test_a_rewritten_shard_is_read_again_not_from_its_kept_index(tmp_path: Path) -> None:
    store = make(tmp_path / "s", n=40)  # the second shard holds 8 records
    assert store.load(39, as_numpy=True)["i"] == rows(40)["i"][39]
    store.extend_batch(rows(20, offset=40))  # the writer rewrites that shard
    store.flush()
    reader = pytreestore.open(tmp_path / "s", cache_bytes=0)
    same_bytes(
        reader.load(slice(32, 60), as_numpy=True), {k: v[32:60] for k, v in rows(60).items()}
    )
    same_bytes(
        store.load(np.array([59, 41]), as_numpy=True), {k: v[[59, 41]] for k, v in rows(60).items()}
    )


def shard(tmp_path: Path, key: str = "i", k: int = 1) -> Path:
    return tmp_path / "s" / key / "c" / str(k)


def entries(path: Path, count: int) -> np.ndarray:
    raw = path.read_bytes()
    return np.frombuffer(raw[-4 - 16 * count : -4], "<u8").reshape(count, 2)


@needs_native
def test_a_flipped_byte_in_an_inner_chunk_names_it(tmp_path: Path) -> None:
    store = make(tmp_path / "s")
    path = shard(tmp_path)
    index = entries(path, 4)  # 32 records a shard, 8 an inner chunk (64 bytes of int64)
    data = bytearray(path.read_bytes())
    data[int(index[2, 0]) + 1] ^= 0x40
    path.write_bytes(bytes(data))
    fresh = pytreestore.open(tmp_path / "s", cache_bytes=0)
    with pytest.raises(errors.CorruptChunkError, match=r"chunk \(1,\).*inner chunk 2 of the shard"):
        fresh.load(32 + 2 * 8 + 3, as_numpy=True)
    assert fresh.load(32 + 8, as_numpy=True)["i"] == rows(100)["i"][40]  # its neighbours read
    del store


@needs_native
@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda raw: raw[:-1] + bytes([raw[-1] ^ 1]), "shard index is damaged"),
        (lambda raw: raw[:10], "shard index is damaged"),
        (lambda raw: b"", "shard index is damaged"),
    ],
    ids=["index checksum", "truncated", "empty"],
)
def test_a_damaged_shard_index_is_named(tmp_path: Path, damage, match) -> None:
    make(tmp_path / "s")
    path = shard(tmp_path)
    path.write_bytes(damage(path.read_bytes()))
    fresh = pytreestore.open(tmp_path / "s", cache_bytes=0)
    with pytest.raises(errors.CorruptChunkError, match=match):
        fresh.load(40, as_numpy=True)
    with pytest.raises(errors.CorruptChunkError, match=match):
        fresh.load(np.array([1, 40, 41, 2, 70, 71, 72, 73, 74]), as_numpy=True)


def rewrite_index(path: Path, count: int, edit) -> None:
    import google_crc32c

    raw = bytearray(path.read_bytes())
    index = entries(path, count).copy()
    edit(index)
    body = index.astype("<u8").tobytes()
    raw[-4 - 16 * count : -4] = body
    raw[-4:] = google_crc32c.value(body).to_bytes(4, "little")
    path.write_bytes(bytes(raw))


@needs_native
def test_an_index_pointing_past_the_shard_and_a_missing_inner_chunk_are_named(
    tmp_path: Path,
) -> None:
    make(tmp_path / "s")
    path = shard(tmp_path)
    rewrite_index(path, 4, lambda index: index.__setitem__((1, 1), 1 << 20))
    fresh = pytreestore.open(tmp_path / "s", cache_bytes=0)
    with pytest.raises(errors.CorruptChunkError, match="points past the end"):
        fresh.load(41, as_numpy=True)
    rewrite_index(path, 4, lambda index: index.__setitem__(3, 2**64 - 1))
    fresh = pytreestore.open(tmp_path / "s", cache_bytes=0)
    with pytest.raises(
        errors.CorruptChunkError, match="inner chunk 3 of the shard was never written"
    ):
        fresh.load(np.arange(50, 64), as_numpy=True)


@needs_native
def test_a_missing_chunk_file_is_missing_never_zeros(tmp_path: Path) -> None:
    make(tmp_path / "s")
    (shard(tmp_path, "m", 2) / "0" / "0").unlink()
    fresh = pytreestore.open(tmp_path / "s", cache_bytes=0)
    with pytest.raises(
        errors.CorruptChunkError, match=r"column \['m'\]: chunk \(2, 0, 0\).* is missing"
    ):
        fresh.load(70, as_numpy=True)
    assert fresh.load(70, as_numpy=True, columns="['i']")["i"] == rows(100)["i"][70]


@needs_native
def test_a_folder_in_place_of_a_chunk_is_named(tmp_path: Path) -> None:
    make(tmp_path / "s")
    path = shard(tmp_path)
    path.unlink()
    path.mkdir()
    fresh = pytreestore.open(tmp_path / "s", cache_bytes=0)
    with pytest.raises(errors.CorruptChunkError, match=r"chunk \(1,\)"):
        fresh.load(40, as_numpy=True)


def test_without_the_compiled_loop_every_read_gives_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make(tmp_path / "z", codec="zstd")
    make(tmp_path / "n", codec=None, inner_chunk_bytes=None)
    index = np.array([99, 3, 3, 64])
    want = {k: v[index] for k, v in rows(100).items()}
    monkeypatch.setattr(pieces, "native", lambda: None)
    for name in ("z", "n"):
        store = pytreestore.open(tmp_path / name, cache_bytes=0)
        same_bytes(store.load(index, as_numpy=True), want)
        backend = store._backend  # type: ignore[attr-defined]
        assert all(backend.reads_plan(k, h) is None for k, h in backend._handles.items())


@needs_native
def test_the_plan_refuses_what_the_loop_does_not_read(tmp_path: Path) -> None:
    base = {
        "shape": [0, 2],
        "data_type": "int32",
        "chunk_grid": {"configuration": {"chunk_shape": [8, 2]}},
        "chunk_key_encoding": {"name": "default"},
    }
    crc = {"name": "crc32c"}
    plain = {"name": "bytes", "configuration": {"endian": "little"}}
    zstd = {"name": "zstd", "configuration": {"level": 3, "checksum": False}}
    blosc = {
        "name": "blosc",
        "configuration": {
            "cname": "lz4",
            "clevel": 5,
            "shuffle": "shuffle",
            "typesize": 4,
            "blocksize": 0,
        },
    }

    def shard_of(codecs, **extra):
        config = {
            "chunk_shape": [4, 2],
            "codecs": codecs,
            "index_codecs": [plain, crc],
            **extra,
        }
        return [{"name": "sharding_indexed", "configuration": config}]

    def planned(codecs, **meta):
        return direct.plan(tmp_path, {**base, **meta, "codecs": codecs}, "k")

    assert planned([plain, zstd, crc]).codec == pieces.ZSTD
    assert planned(shard_of([plain, zstd, crc])).inner == 4
    assert planned([plain, zstd]) is None  # no checksum: the engine reads it
    assert planned([plain, blosc, crc]) is None
    assert planned(shard_of([plain, zstd, crc], index_location="start")) is None
    assert planned([{"name": "bytes", "configuration": {"endian": "big"}}, crc]) is None
    assert (
        planned([plain, zstd, crc], chunk_grid={"configuration": {"chunk_shape": [8, 1]}}) is None
    )


@needs_native
def test_reads_on_threads_while_the_writer_rewrites_its_last_shard(tmp_path: Path) -> None:
    import threading

    store = make(tmp_path / "s", n=10)
    reader = pytreestore.open(tmp_path / "s", cache_bytes=0)
    stop = threading.Event()
    bad: list[str] = []

    def read() -> None:
        rng = np.random.default_rng(threading.get_ident() % 1000)
        while not stop.is_set():
            n = len(reader)
            index = rng.integers(0, n, 5)
            got = reader.load(index, as_numpy=True)["i"]
            if not np.array_equal(got, index * 7 - 3):
                bad.append(f"{index} -> {got}")

    threads = [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for step in range(30):
        store.extend_batch(rows(3, offset=10 + 3 * step))
        store.flush()
    stop.set()
    for t in threads:
        t.join()
    assert not bad, bad[:3]
    assert os.path.exists(tmp_path / "s" / "i" / "c" / "2")


@pytest.mark.parametrize("inner", [64, None])
def test_inner_chunks_read_directly_skip_the_decoded_chunk_cache(tmp_path: Path, inner) -> None:
    """A store read by the direct reader keeps nothing in its cache (each read decodes only
    the inner chunks it needs); plain chunks, and every column without the loop, are cached."""
    make(tmp_path / "s", codec="zstd", inner_chunk_bytes=inner)
    store = pytreestore.open(tmp_path / "s", cache_bytes=1 << 20)
    same_bytes(store.load(5, as_numpy=True), {k: v[5] for k, v in rows(100).items()})
    first = store._core.cache.nbytes  # type: ignore[attr-defined]  # the columns learnt
    for i in (70, 40, 5, 99):  # never one after another: no read-ahead block
        same_bytes(store.load(i, as_numpy=True), {k: v[i] for k, v in rows(100).items()})
    same_bytes(store.load([9, 1], as_numpy=True), {k: v[[9, 1]] for k, v in rows(100).items()})
    grew = store._core.cache.nbytes > first  # type: ignore[attr-defined]
    assert grew != (inner is not None and pieces.native() is not None)
