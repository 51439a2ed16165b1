"""A packed store's long reads, decoded in blocks and scattered (issue 47): every kind of
store and every backend loads from its packs the same bytes as a store of the same records
with one array per leaf.

A read of a slice longer than a block (pytreestore/backends/_packed.py) reads the pack's rows
a block at a time and copies each leaf's part of the block into the leaf's rows. The tests
make a block one chunk of 4 records (``RUNTIME.reads.pack_block_bytes``) and a call two
blocks (``RUNTIME.threads.pack_blocks``), so that a load of 30 records takes several calls,
both buffers in turn and blocks that start off a chunk's edge.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore._read import slabs
from pytreestore._runtime import RUNTIME
from pytreestore.errors import CorruptChunkError
from tests.conftest import BACKENDS, copying_cpu_puts, diagonal, tiered
from tests.parity import kinds

N = 30  # records of each kind's stores: 8 chunks of 4


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of one chunk (4 records), two blocks a call."""
    monkeypatch.setattr(RUNTIME.reads, "pack_block_bytes", 1)
    monkeypatch.setattr(RUNTIME.reads, "pack_copy_bytes", 0)
    monkeypatch.setattr(RUNTIME.threads, "pack_blocks", 2)


def assert_same_bytes(got: Any, want: Any) -> None:
    """``got`` and ``want`` have one structure and leaves of one dtype, shape and bytes."""
    got_leaves, got_def = jax.tree.flatten(got)
    want_leaves, want_def = jax.tree.flatten(want)
    assert got_def == want_def
    for a, b in zip(got_leaves, want_leaves, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert a.tobytes() == b.tobytes()


def stores(root: Path, kind: str, backend: str, **options: Any) -> list[Any]:
    """A store of kind ``kind`` with one array per leaf, and a packed one of its records."""
    for name, pack in (("plain", False), ("packed", True)):
        kinds.filled(root / name, kind, backend, n=N, pack=pack, chunk_records=4, **options)
    return [pytreestore.open(root / name, cache_bytes=0) for name in ("plain", "packed")]


#: every kind on every backend in ``make test-long``; each kind and each backend in ``make test``
GRID = [(k, b) for k in kinds.KINDS for b in BACKENDS]


@pytest.mark.parametrize(("kind", "backend"), tiered(GRID, diagonal(kinds.KINDS, BACKENDS)))
def test_a_packed_load_equals_the_plain_stores(tmp_path, kind, backend, monkeypatch):
    plain, packed = stores(tmp_path, kind, backend)
    assert packed.schema.packs and not plain.schema.packs
    leaf = plain.schema.paths[0]
    for direct in (True, False):
        monkeypatch.setattr(RUNTIME.reads, "direct", direct)
        for index in (slice(None), slice(3, 27), slice(9, 10), [29, 2, 17, 2]):
            assert_same_bytes(packed.load(index, as_numpy=True), plain.load(index, as_numpy=True))
        for columns in (leaf, list(plain.schema.paths[-3:])):
            want = plain.load(columns=columns, as_numpy=True)
            assert_same_bytes(packed.load(columns=columns, as_numpy=True), want)
        assert_same_bytes(packed.load(), plain.load())  # onto the device


@pytest.mark.parametrize(
    ("backend", "codec"),
    tiered(
        [(b, c) for b in BACKENDS for c in ("zstd", None)],
        [("tensorstore", None), ("zarr", "zstd"), ("ocdbt", "zstd")],
    ),
)
def test_inner_chunked_packs(tmp_path, backend, codec, monkeypatch):
    """Packs whose chunks are shards of inner chunks of one record."""
    plain_store, packed_store = stores(
        tmp_path, "optional", backend, codec=codec, inner_chunk_bytes=64
    )
    for direct in (True, False):  # uncompressed: TensorStore's files read directly
        monkeypatch.setattr(RUNTIME.reads, "direct", direct)
        assert_same_bytes(packed_store.load(as_numpy=True), plain_store.load(as_numpy=True))
        got = packed_store.load(slice(1, 26), as_numpy=True)
        assert_same_bytes(got, plain_store.load(slice(1, 26), as_numpy=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_ragged_table_read_in_blocks(tmp_path, backend):
    """A ragged axis's table (rows of its elements, 65,536 a chunk) past one block."""
    hit = {"at": np.zeros((1, 2), np.float32), "e": np.zeros(1, np.float32)}
    like = {"t": np.int32(0), "hits": hit}
    records = [
        {
            "t": np.int32(i),
            "hits": {
                "at": np.arange(2 * n, dtype=np.float32).reshape(n, 2) + i,
                "e": np.linspace(i, -i, n, dtype=np.float32),
            },
        }
        for i, n in enumerate([30_000, 1, 0, 50_000, 7])
    ]
    for name, pack in (("plain", False), ("packed", True)):
        with pytreestore.create(
            tmp_path / name, like, backend=backend, ragged=["['hits']"], pack=pack
        ) as store:
            store.extend(records)
    plain, packed = pytreestore.open(tmp_path / "plain"), pytreestore.open(tmp_path / "packed")
    assert [(len(p.members), p.chunks) for p in packed.schema.packs] == [(2, (65_536, 3))]
    assert_same_bytes(packed.load(as_numpy=True), plain.load(as_numpy=True))
    assert_same_bytes(
        packed.load(slice(1, 4), as_numpy=True), plain.load(slice(1, 4), as_numpy=True)
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_load_in_slabs_copies_blocks_into_its_host_buffers(tmp_path, backend, monkeypatch):
    """A device load in pieces (pytreestore/_read/slabs.py) reads each piece into reused host
    buffers (``ReadsInto``); a packed column's blocks are copied into them."""
    monkeypatch.setattr(slabs, "PLATFORMS", {*slabs.PLATFORMS, "cpu"})
    monkeypatch.setattr(RUNTIME.reads, "slab_bytes", 16 << 10)
    monkeypatch.setattr(RUNTIME.reads, "slab_min_bytes", 32 << 10)
    copying_cpu_puts(monkeypatch)
    n = 2_000  # 56 bytes a record
    batch = {
        "a": np.arange(3 * n, dtype=np.float32).reshape(n, 3),
        "b": -np.arange(n, dtype=np.float32),
        "c": {"d": np.arange(n, dtype=np.int32) % 7, "e": np.ones((n, 2, 3), np.float32)},
        "f": np.arange(n, dtype=np.int32),
    }
    like = jax.tree.map(lambda c: c[0], batch)
    with pytreestore.create(
        tmp_path / "s", like, backend=backend, pack=True, chunk_records=64
    ) as store:
        store.extend_batch(batch)
    store = pytreestore.open(tmp_path / "s", cache_bytes=0)
    for _ in range(2):  # the second load reuses the first's buffers
        assert_same_bytes(store.load(), batch)
        assert_same_bytes(store.load(slice(3, 1_999)), jax.tree.map(lambda c: c[3:1_999], batch))


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])  # OCDBT: no chunk files to damage
def test_a_damaged_chunk_in_a_long_read_names_its_pack(tmp_path, backend):
    kinds.filled(tmp_path / "s", "fixed", backend, n=N, pack=True, chunk_records=4)
    (tmp_path / "s" / "_pack_float32_0" / "c" / "5" / "0").write_bytes(b"garbage")
    store = pytreestore.open(tmp_path / "s", cache_bytes=0)
    with pytest.raises(CorruptChunkError, match="_pack_float32_0"):
        store.load(as_numpy=True)
    with pytest.raises(CorruptChunkError, match="_pack_float32_0"):
        store.load(slice(0, 21), columns=".x", as_numpy=True)
    got = store.load(slice(0, 20), as_numpy=True)  # the chunks before it still read
    assert got.t.tolist() == list(range(20))


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])  # (OCDBT: local files only)
def test_a_memory_store_reads_in_blocks(tmp_path, backend):
    name = f"memory://packed-load-{backend}"
    records = kinds.records("fixed", N)
    with kinds.create(name, "fixed", backend, pack=True, chunk_records=4, overwrite=True) as store:
        store.extend(records)
    kinds.filled(tmp_path / "plain", "fixed", backend, n=N, chunk_records=4)
    got = pytreestore.open(name, backend=backend).load(slice(1, 29), as_numpy=True)
    want = pytreestore.open(tmp_path / "plain").load(slice(1, 29), as_numpy=True)
    assert_same_bytes(got, want)
