"""The fast paths and placements of loads on every kind of store and backend (issue 45's rows
of the parity matrix): slab loads, loads into reused host buffers, sharded loads over 8
simulated CPU devices, ``pmap_devices=``, ``pad=`` and a sharding per column.

A fixed store's load gives the stacked records; every other kind's gives ``(batch, mask)``
padded along each ragged axis, the same pair ``pytreestore.stack`` makes of the records
appended, which every value here is compared with exactly. Split loads place a ragged
store's padded leaves as a fixed store's columns: records first, each leaf (and its mask)
by its column's sharding, the record axis padded with ``pad=`` (mask False there) and laid
out per device with ``pmap_devices=``.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore._read import slabs
from pytreestore._read import slabs as hostpool
from pytreestore._runtime import RUNTIME
from pytreestore.errors import ShardingError
from tests.conftest import copying_cpu_puts, cpu_mesh
from tests.parity import kinds

MATRIX = [(k, b) for k in kinds.KINDS for b in kinds.BACKENDS]
RECORDS = 64


@pytest.fixture(scope="module", params=MATRIX, ids=[f"{k}-{b}" for k, b in MATRIX])
def filled(request, tmp_path_factory):
    """A closed store of each kind and backend holding :data:`RECORDS` records in chunks of
    8, and those records."""
    name, backend = request.param
    path = tmp_path_factory.mktemp(f"{name}-{backend}") / "store"
    records = kinds.filled(path, name, backend, n=RECORDS, chunk_records=8)
    return path, name, backend, records


def _open(filled) -> pytreestore.TreeStore:
    path, _, backend, _ = filled
    return pytreestore.open(path, backend=backend, cache_bytes=0)


def _stacked(name: str, records: list) -> object:
    """What a load of ``records`` gives, as numpy: the batch, or ``(batch, mask)``."""
    declared = kinds.kind(name).declarations
    return pytreestore.stack(records, like=kinds.like(name), as_numpy=True, **declared)


def _assert_equal(got: object, want: object) -> None:
    """Same structure, dtypes and values (device arrays fetched to the host)."""
    kinds.assert_same(jax.tree.map(np.asarray, got), want)


def _padded(want: object, total: int) -> object:
    """``want`` with zero (False) records added up to ``total``."""

    def pad(a: np.ndarray) -> np.ndarray:
        out = np.zeros((total, *a.shape[1:]), a.dtype)
        out[: len(a)] = a
        return out

    return jax.tree.map(pad, want)


@pytest.fixture
def on_cpu(monkeypatch):
    """The slab path on for CPU devices, with slabs of 2 KiB (several per load below);
    counts the pieces of each slab load."""
    monkeypatch.setattr(slabs, "PLATFORMS", {*slabs.PLATFORMS, "cpu"})
    monkeypatch.setattr(RUNTIME.reads, "slab_bytes", 2 << 10)
    monkeypatch.setattr(RUNTIME.reads, "slab_min_bytes", 2 << 10)
    monkeypatch.setattr(RUNTIME.reads, "whole_column_bytes", 256)
    calls: list[int] = []
    load = slabs.load

    def counted(read, pieces, columns, device):
        calls.append(len(pieces))
        return load(read, pieces, columns, device)

    monkeypatch.setattr(slabs, "load", counted)
    return calls


def test_slab_loads(filled, on_cpu):
    _, name, _, records = filled
    got = _open(filled).load(slice(3, RECORDS))
    assert on_cpu and on_cpu[-1] > 2, "the load went through the slab path in pieces"
    _assert_equal(got, _stacked(name, records[3:]))
    assert all(not a.committed for a in jax.tree.leaves(got))  # device=None commits nothing


def test_reused_buffer_loads(filled, on_cpu, monkeypatch):
    _, name, _, records = filled
    copying_cpu_puts(monkeypatch)  # the CPU copies what it is given, as an accelerator does
    fresh = hostpool.HostBuffers()
    monkeypatch.setattr(hostpool, "pool", lambda: fresh)
    taken: list[int] = []
    take = fresh.take
    monkeypatch.setattr(fresh, "take", lambda n: taken.append(id(b := take(n))) or b)
    store = _open(filled)
    _assert_equal(store.load(slice(0, RECORDS)), _stacked(name, records))
    first, made, count = set(taken), fresh.made, len(taken)
    for lo, hi in [(0, RECORDS), (5, 40), (0, RECORDS)]:
        _assert_equal(store.load(slice(lo, hi)), _stacked(name, records[lo:hi]))
    # how many pieces are read side by side varies with the machine's load, so a later load
    # may need a buffer more than the first did; it reads into the first load's buffers too
    assert made > 0 and first & set(taken[count:]), "later loads reuse the buffers"
    assert fresh.made <= RUNTIME.caches.host_buffers and fresh.free_buffers() > 0


def test_sharded_loads(filled, eight_devices):
    _, name, _, records = filled
    sharding = NamedSharding(cpu_mesh((8,), ("data",)), P("data"))
    got = _open(filled).load(slice(8, RECORDS), sharding=sharding)
    _assert_equal(got, _stacked(name, records[8:]))
    for leaf in jax.tree.leaves(got):
        assert leaf.sharding == sharding and len(leaf.addressable_shards) == 8


def test_pmap_loads(filled, eight_devices):
    _, name, _, records = filled
    got = _open(filled).load(slice(0, RECORDS), pmap_devices=eight_devices)
    want = _stacked(name, records)
    _assert_equal(got, jax.tree.map(lambda a: a.reshape(8, RECORDS // 8, *a.shape[1:]), want))
    for leaf in jax.tree.leaves(got):
        for i, shard in enumerate(sorted(leaf.addressable_shards, key=lambda s: s.index[0].start)):
            assert shard.device == eight_devices[i] and shard.data.shape[0] == 1


@pytest.mark.parametrize("how", ["sharding", "pmap"])
def test_pad_loads(filled, eight_devices, how):
    _, name, _, records = filled
    store = _open(filled)
    sharding = NamedSharding(cpu_mesh((8,), ("data",)), P("data"))
    place = {"sharding": sharding} if how == "sharding" else {"pmap_devices": eight_devices}
    with pytest.raises(ShardingError, match="cannot split 61 records over 8"):
        store.load(slice(0, 61), **place)
    got = store.load(slice(0, 61), pad=True, **place)
    want = _stacked(name, records[:61])
    if kinds.kind(name).is_fixed:  # the records, and one mask over them
        want = (_padded(want, 64), np.arange(64) < 61)
    else:  # the pair padded along the record axis: its mask False in the padding
        want = _padded(want, 64)
    if how == "pmap":
        want = jax.tree.map(lambda a: a.reshape(8, 8, *a.shape[1:]), want)
    _assert_equal(got, want)


def test_per_column_shardings(filled, eight_devices):
    _, name, _, records = filled
    mesh = cpu_mesh((4, 2), ("data", "model"))
    split = {".x": NamedSharding(mesh, P("data", "model")), ".t": None}

    def sharding(path: str):
        return split.get(path, NamedSharding(mesh, P("data")))

    got = _open(filled).load(slice(0, 16), sharding=sharding)
    _assert_equal(got, _stacked(name, records[:16]))
    batch, mask = got if not kinds.kind(name).is_fixed else (got, None)
    assert batch.x.sharding.spec == P("data", "model")
    assert batch.t.sharding.is_fully_replicated
    assert batch.storm.cells.sharding.spec == P("data")
    if mask is not None:  # a mask is split as its leaf's records (and list axes) are
        assert mask.x.sharding.spec == P("data") and mask.t.sharding.is_fully_replicated
        assert mask.trail.sharding.spec == P("data")


@pytest.mark.parametrize("kind", [k for k in kinds.KINDS if k != "fixed"])
def test_segments_form_refuses_pmap_pad_and_per_column(tmp_path, kind, eight_devices):
    store = kinds.create(tmp_path / "s", kind, "tensorstore")
    store.extend(kinds.records(kind, 16))
    mesh = cpu_mesh((8,), ("data",))
    sharding = NamedSharding(mesh, P())
    values, _ = store.load(ragged="segments", sharding=sharding)  # one: every flat array
    assert values.t.sharding == sharding
    for place in (
        {"pmap_devices": eight_devices},
        {"sharding": sharding, "pad": True},
        {"sharding": {".t": NamedSharding(mesh, P("data"))}.get},
    ):
        with pytest.raises(ShardingError, match="ragged='segments' gives each leaf flat"):
            store.load(ragged="segments", **place)
    store.close()
