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


def test_each_map_call_sees_what_its_function_reads_now(tmp_path):
    """Each ``map`` traces ``fn`` afresh: a function that reads a global, a callable whose
    attribute changed, or an equal-but-different callable gives today's results, never a
    step compiled by an earlier call (an adversarial review found a per-function cache of
    compiled steps returning the first epoch's results)."""
    import dataclasses

    store = pytreestore.create(tmp_path / "s", {"a": np.float32(0)}, chunk_records=8)
    store.extend({"a": np.float32(i)} for i in range(4))
    store.flush()
    scale = {"now": jnp.float32(2.0)}

    def embed(r):
        return r["a"] * scale["now"]

    np.testing.assert_array_equal(np.asarray(store.map(embed, batch_size=4)), [0, 2, 4, 6])
    scale["now"] = jnp.float32(3.0)
    np.testing.assert_array_equal(np.asarray(store.map(embed, batch_size=4)), [0, 3, 6, 9])

    @dataclasses.dataclass(frozen=True)
    class Scaled:
        name: str
        w: float = dataclasses.field(compare=False, hash=False)

        def __call__(self, r):
            return r["a"] * self.w

    two, five = Scaled("m", 2.0), Scaled("m", 5.0)  # equal and same hash, other code
    np.testing.assert_array_equal(np.asarray(store.map(two, batch_size=4)), [0, 2, 4, 6])
    np.testing.assert_array_equal(np.asarray(store.map(five, batch_size=4)), [0, 5, 10, 15])


def test_a_jitted_function_keeps_its_compiled_step_from_call_to_call(tmp_path):
    """A function given wrapped in ``jax.jit`` is traced once for every ``map`` of the same
    batches, as ``jax.jit`` itself traces it once; a plain one is traced by each call."""
    store = pytreestore.create(tmp_path / "s", {"a": np.float32(0)}, chunk_records=8)
    store.extend({"a": np.float32(i)} for i in range(4))
    store.flush()
    traced = []

    def embed(r):
        traced.append(1)
        return r["a"] * 2

    jitted = jax.jit(embed)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(store.map(jitted, batch_size=4)), [0, 2, 4, 6])
    assert len(traced) == 1
    for _ in range(2):
        np.testing.assert_array_equal(np.asarray(store.map(embed, batch_size=4)), [0, 2, 4, 6])
    assert len(traced) == 3
    other = pytreestore.create(tmp_path / "t", {"a": np.float32(0), "b": np.int32(0)})
    other.extend({"a": np.float32(i), "b": np.int32(i)} for i in range(4))
    got = other.map(jax.jit(lambda r: r["a"] + r["b"]), batch_size=4)
    np.testing.assert_array_equal(np.asarray(got), [0, 2, 4, 6])


def test_a_kept_step_lets_its_function_go(tmp_path):
    import gc
    import weakref

    from pytreestore._pipelines import prefetch as _map

    store = pytreestore.create(tmp_path / "s", {"a": np.float32(0)}, chunk_records=8)
    store.extend({"a": np.float32(i)} for i in range(4))
    jitted = jax.jit(lambda r: r["a"] * 3)
    np.testing.assert_array_equal(np.asarray(store.map(jitted, batch_size=4)), [0, 3, 6, 9])
    gone = weakref.ref(jitted)
    assert jitted in _map._KEPT
    del jitted
    gc.collect()
    assert gone() is None  # the kept step held no strong reference to it


def test_jax_clear_caches_drops_the_kept_steps(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"a": np.float32(0)}, chunk_records=8)
    store.extend({"a": np.float32(i)} for i in range(4))
    scale = {"now": 2.0}
    jitted = jax.jit(lambda r: r["a"] * scale["now"])
    np.testing.assert_array_equal(np.asarray(store.map(jitted, batch_size=4)), [0, 2, 4, 6])
    scale["now"] = 3.0
    np.testing.assert_array_equal(np.asarray(store.map(jitted, batch_size=4)), [0, 2, 4, 6])
    jax.clear_caches()  # as for jitted itself, the way to see the new value
    np.testing.assert_array_equal(np.asarray(store.map(jitted, batch_size=4)), [0, 3, 6, 9])
