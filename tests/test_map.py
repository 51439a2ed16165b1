"""Out-of-core map: jit(vmap(fn)) batch by batch, stacked or appended to another store."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from tests.conftest import cpu_mesh


@pytest.fixture
def store(tmp_path):
    s = pytreestore.create(
        tmp_path / "in", {"x": np.zeros(3, np.float32), "k": np.int32(0)}, chunk_records=8
    )
    s.extend_batch(
        {"x": np.arange(75, dtype=np.float32).reshape(25, 3), "k": np.arange(25, dtype=np.int32)}
    )
    s.flush()
    return s


def energy(record):
    return {"e": jnp.sum(record["x"] ** 2), "twice": record["k"] * 2}


def test_map_equals_vmap_over_everything(store):
    got = store.map(energy, batch_size=7)
    expected = jax.vmap(energy)(store[:])
    for key in ("e", "twice"):
        np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(expected[key]))


def test_map_compiles_once_for_a_short_last_batch(store):
    traces = []

    def fn(record):
        traces.append(record["k"].shape)
        return record["k"] + 1

    got = store.map(fn, batch_size=10)
    assert np.asarray(got).tolist() == list(range(1, 26))
    assert len(traces) == 1


def test_map_default_batch_is_a_chunk(store):
    got = store.map(lambda r: r["k"])
    assert np.asarray(got).tolist() == list(range(25))


def test_map_with_columns(store):
    got = store.map(lambda r: r["k"] * 3 if r["x"] is None else 0, columns="['k']", batch_size=8)
    assert np.asarray(got).tolist() == [3 * k for k in range(25)]


def test_map_appends_to_an_out_store(store, tmp_path):
    out = pytreestore.create(tmp_path / "out", {"e": np.float32(0), "twice": np.int32(0)})
    returned = store.map(energy, batch_size=4, out=out)
    assert returned is out and len(out) == 25 and out.committed == 25
    np.testing.assert_array_equal(np.asarray(out[:]["twice"]), np.arange(25) * 2)


def test_map_creates_an_out_store_at_a_path(store, tmp_path):
    out = store.map(energy, batch_size=6, out=tmp_path / "made")
    reopened = pytreestore.open(tmp_path / "made")
    assert len(reopened) == 25
    np.testing.assert_allclose(np.asarray(reopened[:]["e"]), np.asarray(store.map(energy)["e"]))
    out.close()


def test_map_over_an_empty_store(tmp_path):
    empty = pytreestore.create(tmp_path / "e", {"x": np.zeros(3, np.float32)})
    got = empty.map(lambda r: {"s": r["x"].sum(), "v": r["x"] * 2})
    assert got["s"].shape == (0,) and got["v"].shape == (0, 3)


def test_map_progress_bar(store, capsys):
    store.map(energy, batch_size=5, progress=True)
    err = capsys.readouterr().err
    assert re.search(r"map: 100%.*25(\.0)?/25(\.0)?", err), err


def test_map_bad_batch_size(store):
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        store.map(energy, batch_size=0)


class TestEightDevices:
    def test_sharded_map(self, store, eight_devices):
        sharding = NamedSharding(cpu_mesh((8,), ("data",)), P("data"))
        got = store.map(energy, batch_size=8, sharding=sharding)
        expected = jax.vmap(energy)(store[:])
        np.testing.assert_array_equal(np.asarray(got["twice"]), np.asarray(expected["twice"]))


def test_a_second_map_with_the_same_function_compiles_nothing(tmp_path):
    """``map`` keeps its compiled steps per function while the function lives: a second
    call with the same ``fn`` traces nothing (it traced once per call before, which on an
    accelerator is a compile per call); the kept entry does not keep ``fn`` alive."""
    import gc
    import weakref

    store = pytreestore.create(tmp_path / "s", {"x": np.float32(0)})
    store.extend({"x": np.float32(i)} for i in range(10))
    store.flush()
    traces = []

    def f(r):
        traces.append(1)
        return r["x"] * 2

    first = store.map(f, batch_size=4)
    n = len(traces)
    second = store.map(f, batch_size=4)
    assert len(traces) == n
    np.testing.assert_array_equal(np.asarray(first), np.arange(10) * 2)
    np.testing.assert_array_equal(np.asarray(second), np.asarray(first))
    ref = weakref.ref(f)
    del f
    gc.collect()
    assert ref() is None
