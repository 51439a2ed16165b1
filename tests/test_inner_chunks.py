"""Inner chunks (issue 31): each chunk a zarr v3 ``sharding_indexed`` shard of inner chunks
sized by bytes, on every backend and kind of store; plain zarr reads them; the cache keeps
inner chunks; damage is found; old stores stay plain."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore._format.columns import INNER_CHUNK_BYTES, ColumnSpec, inner_records
from pytreestore.errors import ArgumentError, ArgumentTypeError, CorruptStoreError
from tests.data import make_golden

N = 300
LIKE = {"w": np.zeros(6, np.float32), "i": np.int32(0), "big": np.zeros((2, 3), np.float64)}


def records(n: int, start: int = 0) -> dict[str, np.ndarray]:
    k = np.arange(start, start + n)
    return {
        "w": (k[:, None] * 10 + np.arange(6)).astype(np.float32),
        "i": k.astype(np.int32),
        "big": (k[:, None, None] + np.arange(6).reshape(2, 3) / 8).astype(np.float64),
    }


def codecs(path: Path | str, key: str) -> list[dict]:
    return json.loads((Path(path) / key / "zarr.json").read_text())["codecs"]


@pytest.mark.parametrize(
    ("dtype", "shape", "chunks", "target", "inner"),
    [
        ("float32", (30,), (4096, 30), 32 << 10, 256),  # 120 bytes a record: 273 -> 256
        ("float32", (30,), (4096, 30), 100, 1),  # below one record: one record
        ("int8", (), (64,), 32 << 10, None),  # the chunk would be one inner chunk
        ("int8", (), (64,), 32, 32),  # two inner chunks of 32
        ("float32", (30,), (4096, 30), None, None),  # no target: plain
        ("float32", (30,), (4096, 30), 0, None),
        ("float32", (4, 30), (8, 2, 30), 64, None),  # leaf axes split: plain
        ("float32", (), (10,), 16, None),  # 4 records do not divide 10
    ],
)
def test_inner_records_rule(dtype, shape, chunks, target, inner):
    column = ColumnSpec("['x']", "x", np.dtype(dtype), shape, chunks)
    assert inner_records(column, target) == inner


@pytest.mark.parametrize("options", [{}, {"inner_chunk_bytes": "auto"}])
def test_a_compressed_store_has_8_kib_inner_chunks_by_default(path, options):
    with pytreestore.create(path, LIKE, chunk_records=4096, **options) as s:
        s.extend_batch(records(N))
    schema = pytreestore.open(path).schema
    assert schema.inner_chunk_bytes == 8 << 10 == INNER_CHUNK_BYTES
    sharded = codecs(path, "w")
    assert [c["name"] for c in sharded] == ["sharding_indexed"]
    config = sharded[0]["configuration"]
    assert config["chunk_shape"] == [256, 6]  # 8 KiB // 24 bytes is 341: 256
    assert [c["name"] for c in codecs(path, "big")] == ["sharding_indexed"]  # 48 bytes: 512
    assert [c["name"] for c in config["codecs"]] == ["bytes", "zstd", "crc32c"]
    assert [c["name"] for c in config["index_codecs"]] == ["bytes", "crc32c"]


@pytest.mark.parametrize(
    ("options", "has"),
    [({"codec": None}, None), ({"codec": None, "inner_chunk_bytes": "auto"}, None),
     ({"inner_chunk_bytes": 0}, None), ({"inner_chunk_bytes": None}, None),
     ({"codec": None, "inner_chunk_bytes": 64}, 64), ({"inner_chunk_bytes": 64}, 64)],
)  # fmt: skip
def test_plain_chunks_when_asked_or_uncompressed(path, options, has):
    with pytreestore.create(path, LIKE, chunk_records=128, **options) as s:
        s.extend_batch(records(N))
    assert pytreestore.open(path).schema.inner_chunk_bytes == has
    names = [c["name"] for c in codecs(path, "w")]
    assert (names == ["sharding_indexed"]) == (has is not None)


@pytest.mark.parametrize(
    ("value", "error"),
    [("big", ArgumentTypeError), (1.5, ArgumentTypeError), (True, ArgumentTypeError),
     (-1, ArgumentError)],
)  # fmt: skip
def test_bad_inner_chunk_bytes_are_refused_before_anything_is_written(path, value, error):
    with pytest.raises(error, match="inner_chunk_bytes must be 'auto', None or an int >= 0"):
        pytreestore.create(path, LIKE, inner_chunk_bytes=value)
    assert not Path(path).exists()


def test_records_read_back_exactly_on_every_backend(path, backend):
    options = {"chunk_records": 128, "inner_chunk_bytes": 96, "backend": backend}
    with pytreestore.create(path, LIKE, **options) as s:
        s.extend_batch(records(100))
        for k in range(100, 140):  # one at a time, over a shard's edge, flushed in between
            s.append({name: leaf[0] for name, leaf in records(1, k).items()})
            if k % 13 == 0:
                s.flush()
    with pytreestore.open(path, "a", backend=backend) as s:
        s.extend_batch(records(N - 140, 140))
    expected = records(N)
    for cache in (0, None):
        s = pytreestore.open(path, backend=backend, cache_bytes=cache)
        for name, column in s.load(as_numpy=True).items():
            np.testing.assert_array_equal(column, expected[name])
        idx = np.array([299, 3, 150, 127, 128, 3, 0])
        for name, column in s.load(idx, as_numpy=True).items():
            np.testing.assert_array_equal(column, expected[name][idx])
        for i in (0, 63, 64, 131, 299):
            one = s.load(i, as_numpy=True)
            assert all(np.array_equal(one[k], expected[k][i]) for k in one)
        window = s.load(slice(60, 70), as_numpy=True)
        np.testing.assert_array_equal(window["w"], expected["w"][60:70])
        assert s.verify().ok


def test_plain_zarr_reads_the_shards(path):
    import zarr

    with pytreestore.create(path, LIKE, chunk_records=128, inner_chunk_bytes=96) as s:
        s.extend_batch(records(N))
    array = zarr.open_array(str(Path(path) / "w"), mode="r")
    assert array.shards == (128, 6) and array.chunks == (4, 6)
    np.testing.assert_array_equal(array[:N], records(N)["w"])


def test_the_other_backend_appends_to_the_shards(path):
    with pytreestore.create(path, LIKE, chunk_records=128, inner_chunk_bytes=96) as s:
        s.extend_batch(records(70))
    with pytreestore.open(path, "a", backend="zarr") as s:
        s.extend_batch(records(100, 70))
    got = pytreestore.open(path).load(as_numpy=True)
    for name, column in records(170).items():
        np.testing.assert_array_equal(got[name], column)


def test_the_cache_keeps_inner_chunks_not_chunks(path, monkeypatch):
    from pytreestore._read import cache

    with pytreestore.create(path, LIKE, chunk_records=128, inner_chunk_bytes=96) as s:
        s.extend_batch(records(N))
    asked = []
    real = cache._read_whole

    def spy(backend, requests, count):
        asked.extend((key, where.stop - where.start) for key, where in requests)
        return real(backend, requests, count)

    monkeypatch.setattr(cache, "_read_whole", spy)
    s = pytreestore.open(path, cache_bytes=1 << 20)
    assert s.load(200, as_numpy=True)["i"] == 200
    # w: 24 bytes a record, 4 in 96; i: 4 bytes, 16 (24 would not be a power of two);
    # big: 48 bytes a record, 2
    assert sorted(asked) == [("big", 2), ("i", 16), ("w", 4)]


@pytest.mark.plain_files
def test_a_damaged_inner_chunk_is_found(path, backend):
    with pytreestore.create(
        path, LIKE, chunk_records=128, inner_chunk_bytes=96, backend=backend
    ) as s:
        s.extend_batch(records(N))
    shard = Path(path) / "w" / "c" / "1" / "0"
    raw = bytearray(shard.read_bytes())
    raw[5] ^= 0xFF  # inside the first inner chunk of chunk 1 (records 128-131)
    shard.write_bytes(bytes(raw))
    s = pytreestore.open(path, backend=backend, cache_bytes=0)
    assert s.load(200, as_numpy=True)["w"][0] == 2000  # another inner chunk reads well
    with pytest.raises(pytreestore.errors.CorruptChunkError, match=r"chunk \(1, 0\)"):
        s.load(129, as_numpy=True)
    report = s.verify()
    assert not report.ok and "w/c/1/0" in str(report)


@pytest.mark.plain_files
def test_a_cut_shard_is_found(path, backend):
    with pytreestore.create(
        path, LIKE, chunk_records=128, inner_chunk_bytes=96, backend=backend
    ) as s:
        s.extend_batch(records(N))
    shard = Path(path) / "i" / "c" / "0"
    shard.write_bytes(shard.read_bytes()[:-7])  # the index's end and checksum gone
    s = pytreestore.open(path, backend=backend, cache_bytes=0)
    with pytest.raises(pytreestore.errors.CorruptChunkError, match="chunk"):
        s.load(5, as_numpy=True)
    assert not s.verify().ok


def test_evolve_and_copy_keep_or_move_the_layout(path, tmp_path):
    with pytreestore.create(path, LIKE, chunk_records=128, inner_chunk_bytes=96) as s:
        s.extend_batch(records(N))
        s.evolve(add={"['z']": np.zeros(3, np.float32)})
    assert [c["name"] for c in codecs(path, "z")] == ["sharding_indexed"]
    assert pytreestore.open(path).load(5, as_numpy=True)["z"].tolist() == [0, 0, 0]
    kept, plain = tmp_path / "kept", tmp_path / "plain"
    pytreestore.copy(path, kept)
    pytreestore.copy(path, plain, inner_chunk_bytes=0)
    assert pytreestore.open(kept).schema.inner_chunk_bytes == 96
    assert pytreestore.open(plain).schema.inner_chunk_bytes is None
    assert [c["name"] for c in codecs(plain, "w")] == ["bytes", "zstd", "crc32c"]
    for where in (kept, plain):
        got = pytreestore.open(where).load(as_numpy=True)
        np.testing.assert_array_equal(got["w"], records(N)["w"])


def test_a_store_from_before_stays_plain_and_copies_to_inner_chunks(tmp_path):
    old = tmp_path / "old"
    shutil.copytree(make_golden.GOLDEN / "format-2" / "seed", old)
    with pytreestore.open(old, "a") as s:
        s.extend([s[0]] * 5)
    assert pytreestore.open(old).schema.inner_chunk_bytes is None
    new = tmp_path / "new"
    pytreestore.copy(old, new, inner_chunk_bytes="auto", chunk_records=64)
    assert pytreestore.open(new).schema.inner_chunk_bytes == INNER_CHUNK_BYTES
    a, b = pytreestore.open(old).load(as_numpy=True), pytreestore.open(new).load(as_numpy=True)
    assert all(np.array_equal(x, y) for x, y in zip(jax_leaves(a), jax_leaves(b)))


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


@pytest.mark.parametrize("value", [0, -3, "32k", 1.5, True])
def test_a_damaged_inner_chunk_bytes_is_refused_on_open(path, value):
    with pytreestore.create(path, LIKE) as s:
        s.append({k: v[0] for k, v in records(1).items()})
    root = Path(path) / "zarr.json"
    doc = json.loads(root.read_text())
    doc["attributes"]["pytreestore"]["inner_chunk_bytes"] = value
    root.write_text(json.dumps(doc))
    with pytest.raises(CorruptStoreError):
        pytreestore.open(path).load(0)


def test_a_packed_store_appends_past_a_dropped_leaf_in_a_partly_written_shard(path, backend):
    """A pack with a member dropped by ``evolve`` is written by reading the pack's old rows
    in the tail chunk (older versions still read the dropped member there): with inner
    chunks, the shard's inner chunks past the last write are absent, which is no damage."""
    like = {"a": np.int32(0), "b": np.zeros(2, np.float32), "d": np.float32(0)}

    def batch(n: int, start: int = 0, drop: bool = False) -> dict[str, np.ndarray]:
        k = np.arange(start, start + n)
        out = {"a": k.astype(np.int32), "d": k.astype(np.float32)}
        return out if drop else {**out, "b": np.stack([k, k + 1], 1).astype(np.float32)}

    options = {"chunk_records": 32, "inner_chunk_bytes": 64, "pack": True, "backend": backend}
    with pytreestore.create(path, like, **options) as s:
        s.extend_batch(batch(50))
        s.evolve(drop=["['b']"])
        s.extend_batch(batch(30, 50, drop=True))
        s.flush()
        s.append({"a": np.int32(80), "d": np.float32(80)})
    s = pytreestore.open(path, backend=backend, cache_bytes=0)
    got = s.load(as_numpy=True)
    np.testing.assert_array_equal(got["d"], np.arange(81, dtype=np.float32))
    np.testing.assert_array_equal(got["a"], np.arange(81, dtype=np.int32))
    assert "b" not in got and s.verify().ok
    version = min(v.version for v in s.versions() if v.records == 50)  # before the drop
    before = pytreestore.open(path, backend=backend, version=version, cache_bytes=0)
    np.testing.assert_array_equal(before.load(as_numpy=True)["b"], batch(50)["b"])
