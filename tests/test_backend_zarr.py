"""The zarr backend's own guarantees: durable atomic keys, metadata-only resize, concurrent
I/O, fast open, damaged chunks, and the ml_dtypes data types it registers with zarr-python."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time

import ml_dtypes
import numpy as np
import pytest
import zarr
from zarr.core.dtype import data_type_registry

import pytreestore
from pytreestore import errors
from pytreestore._location import Location
from pytreestore.backends import ColumnLayout, ZarrBackend
from pytreestore.backends._zarr import stores as _zarr_dtypes
from pytreestore.backends._zarr.stores import durable_put
from tests import interpreters
from tests.conftest import child_env

WIDE = {f"c{i:02d}": np.float32(0) for i in range(20)}


def wide(i: int) -> dict[str, np.float32]:
    return {k: np.float32(i + j) for j, k in enumerate(WIDE)}


# ---- atomic, durable keys ------------------------------------------------------------------------


def test_durable_put_replaces_whole_and_leaves_nothing(tmp_path):
    target = tmp_path / "d" / "zarr.json"
    durable_put(target, b"first")
    durable_put(target, b"second")
    assert target.read_bytes() == b"second"
    assert os.listdir(target.parent) == ["zarr.json"]
    durable_put(target, b"third", exclusive=False)
    with pytest.raises(FileExistsError):
        durable_put(target, b"never", exclusive=True)
    assert target.read_bytes() == b"third" and os.listdir(target.parent) == ["zarr.json"]


def test_failed_write_keeps_the_old_value(tmp_path, monkeypatch):
    target = tmp_path / "k"
    durable_put(target, b"old")

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError, match="No space left"):
        durable_put(target, b"new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["k"]


def test_full_disk_is_a_storage_error(tmp_path, monkeypatch):
    store = pytreestore.create(tmp_path / "s", WIDE, backend="zarr", chunk_records=4)
    store.extend(wide(i) for i in range(3))
    store.flush()

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    store.append(wide(3))
    with pytest.raises(errors.StorageError, match="No space left on device"):
        store.flush()
    monkeypatch.undo()
    store.flush()  # a failed flush can be repeated
    store.close()
    np.testing.assert_array_equal(
        pytreestore.open(tmp_path / "s").load(as_numpy=True)["c00"], range(4)
    )


def test_opening_a_missing_store_creates_nothing(tmp_path):
    with pytest.raises(errors.StoreNotFoundError):
        pytreestore.open(tmp_path / "nothing", backend="zarr")
    assert not (tmp_path / "nothing").exists()


def test_zero_chunks_are_stored(tmp_path):
    """Like the TensorStore backend: a missing chunk always means lost data, and -0.0 stays."""
    values = np.array([0.0, -0.0, 0.0, 0.0], np.float32)
    with pytreestore.create(
        tmp_path / "s", {"x": np.float32(0)}, backend="zarr", chunk_records=2
    ) as s:
        s.extend_batch({"x": values})
    assert sorted(os.listdir(tmp_path / "s" / "x" / "c")) == ["0", "1"]
    got = pytreestore.open(tmp_path / "s", backend="zarr").load(as_numpy=True)["x"]
    assert got.tobytes() == values.tobytes()


def test_shrinking_deletes_no_chunk(tmp_path):
    backend = ZarrBackend(Location.parse(str(tmp_path / "s")))
    backend.create_columns(
        [ColumnLayout("x", np.dtype("int16"), (2,), (2, 2), None, ("record", "x_0"), 0)]
    )
    backend.resize(["x"], 8)
    backend.write(["x"], 0, [np.ones((8, 2), np.int16)])
    backend.resize(["x"], 1)
    assert sorted(os.listdir(tmp_path / "s" / "x" / "c")) == ["0", "1", "2", "3"]
    meta = json.loads((tmp_path / "s" / "x" / "zarr.json").read_text())
    assert meta["shape"] == [1, 2]


# ---- memory stores and locations -----------------------------------------------------------------


def test_memory_stores_are_shared_by_name_and_separate_from_tensorstore():
    with pytreestore.create("memory://zarr-shared", {"x": np.int8(0)}, backend="zarr") as s:
        s.append({"x": np.int8(5)})
    assert pytreestore.open("memory://zarr-shared", backend="zarr")[0]["x"] == 5
    with pytest.raises(errors.StoreNotFoundError):
        pytreestore.open("memory://zarr-shared", backend="tensorstore")


def test_gcs_is_refused_clearly_and_s3_is_the_s3_class_s_own():
    with pytest.raises(
        errors.BadLocationError,
        match=re.escape(
            "the zarr backend stores on local disk, memory:// and s3:// only, not at "
            "gs://bucket/x; use backend='tensorstore' there"
        ),
    ):
        ZarrBackend(Location.parse("gs://bucket/x"))
    with pytest.raises(
        errors.BadLocationError,
        match=re.escape(
            "ZarrBackend stores on local disk and memory://, not at s3://bucket/x; on S3 the "
            "zarr backend is ZarrS3Backend, which backend='zarr' picks for s3:// locations"
        ),
    ):
        ZarrBackend(Location.parse("s3://bucket/x", {"endpoint": "http://127.0.0.1:9"}))
    local = ZarrBackend(Location.parse("memory://zarr-local-kind"))
    assert hasattr(local, "write_bytes_if")  # local stores commit conditionally too


# ---- concurrency and fast open -------------------------------------------------------------------


class CountingStore:
    """Wraps a zarr store's ``get`` to count requests and the most in flight at once."""

    def __init__(self, store) -> None:
        self.store, self.keys, self.in_flight, self.most = store, [], 0, 0
        self._get = store.get

    async def get(self, key, *args, **kwargs):
        self.keys.append(key)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.002)
            return await self._get(key, *args, **kwargs)
        finally:
            self.in_flight -= 1


def test_open_reads_two_objects_and_first_load_reads_metadata_concurrently(tmp_path, monkeypatch):
    with pytreestore.create(tmp_path / "s", WIDE, backend="zarr", chunk_records=4) as s:
        s.extend(wide(i) for i in range(6))
    counting: list[CountingStore] = []
    original = ZarrBackend.__init__

    def init(self, location):
        original(self, location)
        counting.append(CountingStore(self._store))
        monkeypatch.setattr(self._store, "get", counting[-1].get)

    monkeypatch.setattr(ZarrBackend, "__init__", init)
    store = pytreestore.open(tmp_path / "s", backend="zarr")
    (spy,) = counting
    assert sorted(spy.keys) == [".pytreestore/commit.json", "zarr.json"]
    spy.keys.clear()
    store.load(as_numpy=True)
    metadata = [k for k in spy.keys if k.endswith("zarr.json")]
    assert sorted(metadata) == sorted(f"{k}/zarr.json" for k in WIDE)
    assert spy.most >= 10  # every column's metadata (then every chunk) requested together
    spy.keys.clear()
    store.load(as_numpy=True)
    assert not [k for k in spy.keys if k.endswith("zarr.json")]  # checked once, then trusted


def test_tensorstore_open_opens_no_column(tmp_path):
    with pytreestore.create(tmp_path / "s", WIDE, chunk_records=4) as s:
        s.extend(wide(i) for i in range(2))
    store = pytreestore.open(tmp_path / "s")
    assert store._backend._handles == {}
    store.load(as_numpy=True)
    assert len(store._backend._handles) == len(WIDE)


# ---- damaged chunks --------------------------------------------------------------------------------


def test_damaged_chunk_is_named(tmp_path):
    with pytreestore.create(
        tmp_path / "s", {"x": np.float32(0)}, backend="zarr", chunk_records=2
    ) as s:
        s.extend_batch({"x": np.arange(6, dtype=np.float32)})
    chunk = tmp_path / "s" / "x" / "c" / "1"
    raw = bytearray(chunk.read_bytes())
    raw[3] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    store = pytreestore.open(tmp_path / "s", backend="zarr")
    np.testing.assert_array_equal(store.load(slice(0, 2), as_numpy=True)["x"], [0, 1])
    with pytest.raises(
        errors.CorruptChunkError, match=re.escape("chunk (1,) (x/c/1) is damaged")
    ) as info:
        store.load(slice(2, 4), as_numpy=True)
    assert info.value.chunk == (1,) and info.value.key == "x/c/1"
    with pytest.raises(errors.CorruptChunkError, match="a chunk is damaged"):
        store.load(as_numpy=True)
    report = store.verify()
    assert [(p.key, p.chunk) for p in report.problems] == [("x/c/1", (1,))]


# ---- shards rewritten beside a read ----------------------------------------------------------------

#: a process rewriting one file in a loop, the way a writer's flush rewrites a store's tail
#: shard: each time a temporary file renamed over it, alternating between two versions
REWRITER = """
import os, sys, time
shard, end = sys.argv[1], time.monotonic() + float(sys.argv[4])
versions = [open(v, "rb").read() for v in sys.argv[2:4]]
print("ready", flush=True)
k = 0
while time.monotonic() < end:
    tmp = f"{shard}.{k}.partial"
    with open(tmp, "wb") as f:
        f.write(versions[k % 2])
    os.replace(tmp, shard)
    k += 1
print(k, flush=True)
"""


def _rows(start: int, stop: int) -> dict[str, np.ndarray]:
    k = np.arange(start, stop)
    return {"x": (k[:, None] + np.arange(8) / 8).astype(np.float32)}


def _inner_chunk_store(path):
    """A store of inner chunks of 8 records whose one shard has two versions, as a writer's
    flushes leave it: 20 records (its third inner chunk partly filled), then 24. Returns the
    shard's path and the files of its two versions."""
    like = {"x": np.zeros(8, np.float32)}
    shard = path / "s" / "x" / "c" / "0" / "0"
    with pytreestore.create(
        path / "s", like, backend="zarr", chunk_records=4096, inner_chunk_bytes=256
    ) as s:
        s.extend_batch(_rows(0, 20))
        s.flush()
        (path / "old").write_bytes(shard.read_bytes())
        s.extend_batch(_rows(20, 24))
    (path / "new").write_bytes(shard.read_bytes())
    return shard, path / "old", path / "new"


@pytest.mark.parametrize("reader", ["zarr", "tensorstore"])
def test_a_shard_rewritten_beside_reads_gives_every_read_whole(tmp_path, reader):
    """Issue 44, item 10: a shard's index and its inner chunks are separate reads; with
    zarr-python, a rename between them paired the old index with the new inner chunks, a
    false CorruptChunkError. Each read now reads the file it first opened. (TensorStore reads
    the inner chunks only if the shard's generation is the index's.)"""
    shard, old, new = _inner_chunk_store(tmp_path)
    args = [sys.executable, "-c", REWRITER, str(shard), str(old), str(new), "3"]
    rewriter = interpreters.popen(args, stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert rewriter.stdout is not None and rewriter.stdout.readline() == "ready\n"
        store = pytreestore.open(tmp_path / "s", backend=reader, cache_bytes=0)
        end, reads, damaged = time.monotonic() + 2.5, 0, []
        while time.monotonic() < end:
            i = 16 + reads % 4  # the partly filled inner chunk, which the versions differ in
            try:
                got = store.load(i, as_numpy=True)["x"]
            except errors.CorruptChunkError as err:
                damaged.append(str(err))
            else:
                np.testing.assert_array_equal(got, _rows(i, i + 1)["x"][0])
            reads += 1
    finally:
        rewrites = int(rewriter.communicate(timeout=30)[0])
    assert rewrites > 100 and reads > 100
    assert damaged == [], f"{len(damaged)} of {reads} reads: {damaged[0]}"


def test_a_damaged_inner_chunk_still_raises(tmp_path):
    shard, _, _ = _inner_chunk_store(tmp_path)
    raw = bytearray(shard.read_bytes())
    raw[160] ^= 0xFF  # in the second inner chunk (records 8-15)
    shard.write_bytes(bytes(raw))
    store = pytreestore.open(tmp_path / "s", backend="zarr", cache_bytes=0)
    np.testing.assert_array_equal(store.load(17, as_numpy=True)["x"], _rows(17, 18)["x"][0])
    with pytest.raises(errors.CorruptChunkError, match=re.escape("(x/c/0/0) is damaged")):
        store.load(9, as_numpy=True)
    assert [p.key for p in store.verify().problems] == ["x/c/0/0"]


# ---- ml_dtypes in zarr-python ----------------------------------------------------------------------


def test_register_is_idempotent_and_leaves_other_registrations_alone():
    _zarr_dtypes.register()
    before = dict(data_type_registry.contents)
    _zarr_dtypes.register()
    assert data_type_registry.contents == before
    for name in _zarr_dtypes.NAMES:
        assert data_type_registry.contents[name] is _zarr_dtypes.DTYPES[name]


@pytest.mark.parametrize("name", _zarr_dtypes.NAMES)
def test_zarr_python_writes_and_reads_every_ml_dtype(tmp_path, name):
    _zarr_dtypes.register()
    dtype = np.dtype(getattr(ml_dtypes, name))
    values = (
        np.arange(256, dtype=np.uint8).view(dtype)
        if dtype.itemsize == 1
        else np.arange(-8, 8).astype(dtype)
    )
    array = zarr.create_array(
        str(tmp_path / "a"), shape=values.shape, chunks=(5,), dtype=dtype, fill_value=1
    )
    array[:] = values
    assert json.loads((tmp_path / "a" / "zarr.json").read_text())["data_type"] == name
    again = zarr.open_array(str(tmp_path / "a"), mode="r")
    assert again.dtype == dtype and np.asarray(again[:]).tobytes() == values.tobytes()


@pytest.mark.parametrize(
    ("name", "fill", "bits"),
    [
        ("bfloat16", "0x3fc0", 0x3FC0),  # 1.5, as the zarr v3 spec writes hex fill values
        ("bfloat16", "NaN", None),
        ("float8_e4m3fn", "0x38", 0x38),  # 1.0
        ("float8_e5m2", "-Infinity", 0xFC),
        ("float8_e4m3fn", 0.5, 0x30),
    ],
)
def test_fill_values(name, fill, bits):
    zdtype = _zarr_dtypes.DTYPES[name]()
    value = zdtype.from_json_scalar(fill, zarr_format=3)
    if bits is None:
        assert np.isnan(value)
    else:
        assert int(np.array(value).view(f"uint{8 * zdtype.item_size}")) == bits
    assert (
        zdtype.from_json_scalar(
            zdtype.to_json_scalar(value, zarr_format=3), zarr_format=3
        ).tobytes()
        == value.tobytes()
    )


def test_bad_fill_values_are_refused():
    zdtype = _zarr_dtypes.DTYPES["bfloat16"]()
    with pytest.raises(ValueError, match="expected 4 hex digits"):
        zdtype.from_json_scalar("0x3f", zarr_format=3)
    with pytest.raises(TypeError, match="invalid bfloat16 fill value"):
        zdtype.from_json_scalar([1], zarr_format=3)


def test_ml_dtype_store_reads_with_tensorstore(tmp_path):
    like = {n: np.zeros(2, getattr(ml_dtypes, n)) for n in _zarr_dtypes.NAMES}
    batch = {
        n: np.arange(32, dtype=np.uint8)[: 8 * d.itemsize].reshape(4, 2 * d.itemsize).view(d)
        for n, d in ((n, np.dtype(getattr(ml_dtypes, n))) for n in _zarr_dtypes.NAMES)
    }
    with pytreestore.create(tmp_path / "s", like, backend="zarr") as s:
        s.extend_batch(batch)
    got = pytreestore.open(tmp_path / "s", backend="tensorstore").load(as_numpy=True)
    for name in _zarr_dtypes.NAMES:
        assert got[name].tobytes() == batch[name].tobytes(), name
