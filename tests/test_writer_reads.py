"""Reads through a writer see its buffered records and commit nothing (issue 46).

Every kind of store on every backend: records committed, records in a chunk handed to the
background writer and not yet written (its writes held back by a backend whose chunk writes
wait for a gate), and records in the chunk being filled, read back through the writer by
int, slice, index list, mask, iteration, batches, lengths, a subset of columns and the
padded and segments forms, equal to the same reads of the closed store; no version is
committed by them, another reader sees only the committed records; a thread appending while
another reads: every read a whole prefix.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore.backends import OcdbtBackend, TensorStoreBackend, ZarrBackend, register_backend
from pytreestore.errors import SchemaMismatchError
from tests.parity import kinds

#: while clear, every chunk write of a gated backend waits (the background writer holds its
#: chunk in memory, unwritten)
GATE = threading.Event()
GATE.set()


class _Gated:
    """A backend whose column writes wait for :data:`GATE`."""

    def write(self, keys: Any, start: int, blocks: Any) -> None:
        assert GATE.wait(60), "the test never opened the gate"
        super().write(keys, start, blocks)  # type: ignore[misc]


for _name, _cls in (
    ("tensorstore", TensorStoreBackend),
    ("zarr", ZarrBackend),
    ("ocdbt", OcdbtBackend),
):
    register_backend(
        f"gated-{_name}", type(f"Gated{_cls.__name__}", (_Gated, _cls), {}), replace=True
    )

CHUNK = 8
COMMITTED = 10  # flushed: rows [0, 8) a written chunk, [8, 10) the tail, also buffered
TOTAL = 24  # [8, 16) handed to the background writer, held at the gate; [16, 24) filling


def _sharding() -> jax.sharding.NamedSharding:
    """The record axis over the 8 CPU devices of the tests (a sharded load's own route)."""
    return jax.sharding.NamedSharding(
        jax.make_mesh((8,), ("data",)), jax.sharding.PartitionSpec("data")
    )


def _reads(store: pytreestore.TreeStore, fixed: bool) -> dict[str, Any]:
    """Every read form of the test, as numpy trees."""
    mask = np.zeros(TOTAL, bool)
    mask[[1, 9, 12, 23]] = True
    out: dict[str, Any] = {
        "ints": [store.load(i, as_numpy=True) for i in (0, 7, 9, 11, 15, 16, 23, -1)],
        "getitem": jax.tree.map(np.asarray, store[13]),
        "slice": store.load(slice(3, 21), as_numpy=True),
        "list": store.load([22, 2, 14, 9, 17], as_numpy=True),
        "mask": store.load(mask, as_numpy=True),
        "iterate": list(store.records(as_numpy=True)),
        "batches": [jax.tree.map(np.asarray, b) for b in store.batches(batch_size=5)],
        "columns": store.load(slice(None), columns=".t", as_numpy=True),
        "len": len(store),
        "sharded": jax.tree.map(np.asarray, store.load(slice(0, TOTAL), sharding=_sharding())),
    }
    if not fixed:
        out["lengths"] = store.lengths()
        out["segments"] = store.load([20, 4, 12], ragged="segments", as_numpy=True)
        out["pad_to"] = store.load(slice(5, 19), pad_to=6, truncate=True, as_numpy=True)
    return out


def _assert_equal(got: Any, want: Any) -> None:
    got_leaves, got_def = jax.tree.flatten(got)
    want_leaves, want_def = jax.tree.flatten(want)
    assert got_def == want_def
    for a, b in zip(got_leaves, want_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("name", kinds.KINDS)
def test_a_writers_reads_see_buffered_records_and_commit_nothing(tmp_path, backend, name):
    path = tmp_path / "s"
    records = kinds.records(name, TOTAL)
    store = kinds.create(path, name, f"gated-{backend}", chunk_records=CHUNK)
    try:
        store.extend(records[:COMMITTED])
        store.flush()
        versions = len(store.versions())
        GATE.clear()
        for record in records[COMMITTED:]:
            store.append(record)
        assert store.committed == COMMITTED and len(store) == TOTAL
        for i in (0, 9, 12, 23):  # exact records: the stored, handed and filling rows
            kinds.assert_same(store.load(i, as_numpy=True), records[i])
        got = _reads(store, kinds.kind(name).is_fixed)
        assert len(store.versions()) == versions and store.committed == COMMITTED
        assert len(pytreestore.open(path, backend=backend)) == COMMITTED  # another reader
    finally:
        GATE.set()
    store.close()
    reopened = pytreestore.open(path, backend=backend)
    assert len(reopened) == TOTAL
    _assert_equal(got, _reads(reopened, kinds.kind(name).is_fixed))


class _Counted(TensorStoreBackend):
    """TensorStore, counting the column reads it is asked for."""

    reads = 0

    def read(self, keys: Any, index: Any, records: int) -> Any:
        _Counted.reads += 1
        return super().read(keys, index, records)

    def read_many(self, requests: Any, records: int) -> Any:
        _Counted.reads += 1
        return super().read_many(requests, records)

    def read_into(self, keys: Any, index: Any, records: int, outs: Any) -> Any:
        _Counted.reads += 1
        return super().read_into(keys, index, records, outs)


register_backend("counted-reads", _Counted, replace=True)


def test_a_read_of_buffered_rows_touches_no_storage(tmp_path):
    store = pytreestore.create(
        tmp_path / "s", {"x": np.int32(0)}, chunk_records=CHUNK, backend="counted-reads"
    )
    store.extend({"x": np.int32(i)} for i in range(CHUNK + 3))
    store.flush()
    store.append({"x": np.int32(CHUNK + 3)})
    before = _Counted.reads
    assert int(store[CHUNK + 3]["x"]) == CHUNK + 3
    assert store.load([CHUNK + 3, CHUNK], as_numpy=True)["x"].tolist() == [CHUNK + 3, CHUNK]
    assert store.load(slice(CHUNK, None), as_numpy=True)["x"].tolist() == [8, 9, 10, 11]
    assert _Counted.reads == before  # nothing read from storage, nothing committed
    assert store.committed == CHUNK + 3
    assert store.load([CHUNK + 3, 0], as_numpy=True)["x"].tolist() == [CHUNK + 3, 0]
    assert _Counted.reads > before  # row 0: from storage
    store.close()


@pytest.mark.parametrize("name", ["fixed", "ragged_list"])
def test_reads_while_another_thread_appends_see_whole_prefixes(tmp_path, name):
    store = kinds.create(tmp_path / "s", name, "tensorstore", chunk_records=16)
    records = kinds.records(name, 200)
    done = threading.Event()

    def append() -> None:
        try:
            for r in records:
                store.append(r)
        finally:
            done.set()

    writer = threading.Thread(target=append)
    writer.start()
    seen = 0
    while not done.is_set() or seen < len(records):
        n = len(store)
        batch = store.load(slice(0, n), as_numpy=True) if n else None
        got = batch if kinds.kind(name).is_fixed else (batch[0] if batch else None)
        if got is not None:
            count = len(got.t)
            assert count >= seen  # never fewer records than a read before
            assert got.t.tolist() == list(range(count))
            if count:  # the last record read whole
                np.testing.assert_array_equal(got.x[count - 1], records[count - 1].x)
            seen = count
        if done.is_set() and seen == len(records):
            break
    writer.join()
    store.close()


@pytest.mark.parametrize("name", kinds.KINDS)
def test_append_of_a_batch_points_to_extend_batch(tmp_path, name):
    store = kinds.create(tmp_path / "s", name, "tensorstore")
    records = kinds.records(name, 4)
    if kinds.kind(name).is_fixed:
        batch = jax.tree.map(lambda *leaves: np.stack(leaves), *records)
        call = "store.extend_batch(batch)."
    else:
        store.extend(records)
        batch, _ = store.load(slice(0, 4), as_numpy=True)
        call = "store.extend_batch(batch, mask), with the mask of its real values"
    before = len(store)
    with pytest.raises(SchemaMismatchError, match=re.escape(call)) as err:
        store.append(batch)
    assert "This looks like a batch of 4 records" in str(err.value)
    assert len(store) == before
    store.close()


def test_append_of_a_wrong_record_gives_no_batch_hint(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"a": np.int32(0), "b": np.zeros(2, np.float32)})
    with pytest.raises(SchemaMismatchError) as err:
        store.append({"a": np.zeros(3, np.int32), "b": np.zeros(2, np.float32)})
    assert "batch" not in str(err.value)
    with pytest.raises(SchemaMismatchError, match="batch of 32 records"):
        store.append({"a": np.zeros(32, np.int32), "b": np.zeros((32, 2), np.float32)})
    store.close()


@pytest.mark.parametrize("accelerator", [False, True])
def test_reads_of_appended_device_arrays_fetch_them_without_a_commit(
    tmp_path, monkeypatch, accelerator
):
    """jax.Array leaves appended: on the accelerator's path (forced on the CPU devices) the
    store keeps device copies until their chunk is written; a read through the writer fetches
    those of the chunk being filled, and waits for a handed chunk's, committing nothing."""
    if accelerator:
        monkeypatch.setattr("pytreestore._tree.device._on_host", lambda leaf: False)
    store = pytreestore.create(
        tmp_path / "s", {"x": np.zeros(3, np.float32), "n": np.int32(0)}, chunk_records=4
    )
    for i in range(11):
        store.append({"x": jax.numpy.full(3, i, jax.numpy.float32), "n": jax.numpy.int32(i)})
        got = store.load([i, 0, i // 2], as_numpy=True)
        assert got["n"].tolist() == [i, 0, i // 2]
        assert got["x"][:, 0].tolist() == [i, 0, i // 2]
    assert int(store[10]["n"]) == 10 and store.committed <= 8
    store.close()
    assert pytreestore.open(tmp_path / "s").load(as_numpy=True)["n"].tolist() == list(range(11))
