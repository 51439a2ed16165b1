"""Sharded loads: global arrays over a mesh, each device's rows read once, padding, errors.

Tests that need 8 devices sit in ``TestEightDevices`` classes (here and in test_device.py,
test_batches.py, test_map.py); every test process has 8 CPU devices (``tests/conftest.py``).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore._read import sharded as _sharded
from pytreestore.errors import ShardingError
from tests.conftest import cpu_mesh


def make_store(path, n: int = 64, chunk: int = 16) -> pytreestore.TreeStore:
    like = {"x": np.zeros(4, np.float32), "y": np.int32(0), "z": np.zeros((2, 3), np.float32)}
    store = pytreestore.create(path, like, chunk_records=chunk)
    store.extend_batch(
        {
            "x": np.arange(n * 4, dtype=np.float32).reshape(n, 4),
            "y": np.arange(n, dtype=np.int32),
            "z": np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) / 7,
        }
    )
    store.flush()
    return store


def assert_same(actual, expected) -> None:
    la, ta = jax.tree_util.tree_flatten(actual)
    lb, tb = jax.tree_util.tree_flatten(expected)
    assert ta == tb
    for a, b in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


class CountingReads:
    """Wraps a store's backend to record every (key, rows) that ``read_many`` reads."""

    def __init__(self, store: pytreestore.TreeStore) -> None:
        self.rows: list[tuple[str, list[int]]] = []
        backend = store._backend
        original = backend.read_many

        def read_many(requests, records):
            for key, index in requests:
                picked = np.arange(records)[index] if isinstance(index, slice) else index
                self.rows.append((key, [int(i) for i in picked]))
            return original(requests, records)

        backend.read_many = read_many

    def per_key(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for key, rows in self.rows:
            out.setdefault(key, []).extend(rows)
        return out


class TestEightDevices:
    @pytest.mark.parametrize(
        "spec", [P("data"), P(("data", "model")), P(None), P("data", "model"), P(None, "data")]
    )
    @pytest.mark.parametrize(
        "index", [slice(None), slice(8, 56), slice(1, 64, 2), [5, 3, 63, 0, 9, 9, 2, 40]]
    )
    def test_sharded_load_equals_plain_load(self, tmp_path, eight_devices, spec, index):
        store = make_store(tmp_path / "s")
        mesh = cpu_mesh((4, 2), ("data", "model"))
        columns = "['x']" if len(spec) > 1 else None  # 2-d specs fit only the x column
        got = store.load(index, sharding=NamedSharding(mesh, spec), columns=columns)
        assert_same(got, store.load(index, columns=columns))
        assert got["x"].sharding == NamedSharding(mesh, spec)
        assert got["x"].is_fully_addressable

    def test_each_row_range_is_read_once(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s")
        reads = CountingReads(store)
        mesh = cpu_mesh((4, 2), ("data", "model"))
        store.load(slice(0, 64), sharding=NamedSharding(mesh, P("data")))
        per_key = reads.per_key()
        assert sorted(per_key) == ["x", "y", "z"]
        for rows in per_key.values():  # the model axis replicates: 4 reads of 16, not 8
            assert sorted(rows) == list(range(64))
        assert len(reads.rows) == 3 * 4

    def test_all_reads_are_issued_in_one_batch(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s")
        calls = []
        original = store._backend.read_many
        store._backend.read_many = lambda req, n: calls.append(len(req)) or original(req, n)
        mesh = cpu_mesh((8,), ("data",))
        store.load(sharding=NamedSharding(mesh, P("data")))
        assert calls == [3 * 8]

    def test_tree_of_shardings_with_none_replicating(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s")
        mesh = cpu_mesh((4, 2), ("data", "model"))
        tree = {"x": NamedSharding(mesh, P("data", "model")), "y": None, "z": None}
        got = store.load(sharding=tree)
        assert got["x"].sharding.spec == P("data", "model")
        assert got["y"].sharding.spec == P()
        assert got["y"].sharding.mesh == mesh
        assert_same(got, store.load())

    def test_callable_sharding_by_tree_path(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s")
        mesh = cpu_mesh((8,), ("data",))
        seen = []

        def choose(path: str):
            seen.append(path)
            return NamedSharding(mesh, P("data")) if path == "['y']" else None

        got = store.load(sharding=choose)
        assert seen == ["['x']", "['y']", "['z']"]
        assert got["y"].sharding.spec == P("data")
        assert got["x"].sharding.spec == P()

    def test_jitted_reduction_over_sharded_load(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s")
        mesh = cpu_mesh((8,), ("data",))
        got = store.load(sharding=NamedSharding(mesh, P("data")))
        total = jax.jit(lambda t: jnp.sum(t["x"]) + jnp.sum(t["z"]))(got)
        plain = store.load(as_numpy=True)
        np.testing.assert_allclose(float(total), plain["x"].sum() + plain["z"].sum(), rtol=1e-6)

    def test_indivisible_count_says_what_fits(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s", n=30)
        mesh = cpu_mesh((8,), ("data",))
        sharding = NamedSharding(mesh, P("data"))
        expected = (
            f"cannot split 30 records over 8 record-axis shards (column ['x'], sharding "
            f"{sharding}): the record count must be a multiple of 8. Load 24 records (e.g. "
            "index 0:24), or pass pad=True to pad to 32 with fill values and get a mask."
        )
        with pytest.raises(ShardingError, match=re.escape(expected)):
            store.load(sharding=sharding)
        with pytest.raises(ValueError):  # ShardingError is a ValueError
            store.load(slice(0, 29), sharding=sharding)

    def test_pad_returns_records_and_mask(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s", n=30)
        mesh = cpu_mesh((4, 2), ("data", "model"))
        got, mask = store.load(sharding=NamedSharding(mesh, P("data")), pad=True)
        assert got["x"].shape == (32, 4) and mask.shape == (32,)
        np.testing.assert_array_equal(np.asarray(mask), np.arange(32) < 30)
        assert mask.sharding.spec == P("data")
        np.testing.assert_array_equal(np.asarray(got["y"])[:30], np.arange(30))
        np.testing.assert_array_equal(np.asarray(got["y"])[30:], [0, 0])
        masked = jax.jit(lambda t, m: jnp.sum(jnp.where(m, t["y"], 0)))(got, mask)
        assert int(masked) == sum(range(30))

    def test_pad_when_divisible_has_an_all_true_mask(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s", n=16)
        mesh = cpu_mesh((8,), ("data",))
        got, mask = store.load(sharding=NamedSharding(mesh, P("data")), pad=True)
        assert got["y"].shape == (16,) and bool(jnp.all(mask))

    def test_leaf_axis_the_sharding_cannot_split(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s")
        mesh = cpu_mesh((8,), ("data",))
        with pytest.raises(ShardingError, match=re.escape("cannot split column ['x'] (float32[4]")):
            store.load(columns="['x']", sharding=NamedSharding(mesh, P(None, "data")))

    def test_empty_selection(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s")
        mesh = cpu_mesh((8,), ("data",))
        got = store.load(slice(0, 0), sharding=NamedSharding(mesh, P("data")))
        assert got["z"].shape == (0, 2, 3)

    def test_backend_without_read_many(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s")
        backend = store._backend

        class OnlyRead:  # a backend offering just the Backend protocol's read
            read = backend.read

        mesh = cpu_mesh((4, 2), ("data", "model"))
        specs = list(store.schema.columns)
        selection = pytreestore._read.index.normalize(slice(3, 63, 3), 64)
        shardings = [NamedSharding(mesh, P("data"))] * 3
        arrays, _ = _sharded.load(
            OnlyRead(), specs, selection, 64, shardings, pad=False, cast=False
        )
        assert_same(arrays, [store.load(slice(3, 63, 3))[k] for k in ("x", "y", "z")])


# ---- one device suffices -------------------------------------------------------------------------


def one_device_sharding() -> NamedSharding:
    return NamedSharding(cpu_mesh((1,), ("data",)), P("data"))


def test_sharded_load_on_one_device(tmp_path):
    store = make_store(tmp_path / "s", n=10)
    got = store.load([9, 0, 4], sharding=one_device_sharding())
    assert_same(got, store.load([9, 0, 4]))


def test_unselected_columns_stay_none(tmp_path):
    store = make_store(tmp_path / "s", n=4)
    got = store.load(columns="['y']", sharding=one_device_sharding())
    assert got["x"] is None and got["z"] is None and got["y"].shape == (4,)


def test_x64_columns_follow_the_cast_rule(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"t": np.float64(0)})
    store.extend({"t": np.float64(i)} for i in range(4))
    with pytest.raises(pytreestore.errors.X64DisabledError, match="pass cast=True"):
        store.load(sharding=one_device_sharding())
    got = store.load(sharding=one_device_sharding(), cast=True)
    assert got["t"].dtype == jnp.float32


def test_conflicting_arguments(tmp_path):
    store = make_store(tmp_path / "s", n=4)
    sharding = one_device_sharding()
    cases = [
        ({"sharding": sharding, "pmap_devices": jax.devices()}, "give sharding= or pmap_devices="),
        ({"pad": True}, "pad=True needs sharding= or pmap_devices="),
        ({"sharding": sharding, "as_numpy": True}, "as_numpy=True loads to host"),
        ({"sharding": sharding, "device": jax.devices()[0]}, "drop it when giving sharding="),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=re.escape(message)):
            store.load(**kwargs)


def test_one_record_cannot_be_sharded(tmp_path):
    store = make_store(tmp_path / "s", n=4)
    with pytest.raises(ShardingError, match=re.escape("load a slice such as 2:2+1")):
        store.load(2, sharding=one_device_sharding())


def test_sharding_tree_entry_matching_no_column(tmp_path):
    store = make_store(tmp_path / "s", n=4)
    tree = {"x": one_device_sharding(), "y": None, "z": None, "w": None}
    with pytest.raises(ValueError, match=re.escape("sharding tree has entries at ['w']")):
        store.load(sharding=tree)


def test_sharding_tree_missing_a_column(tmp_path):
    store = make_store(tmp_path / "s", n=4)
    with pytest.raises(ValueError, match=re.escape("no entry for column ['z']")):
        store.load(sharding={"x": one_device_sharding(), "y": None})


def test_sharding_tree_that_replicates_everything(tmp_path):
    store = make_store(tmp_path / "s", n=4)
    with pytest.raises(TypeError, match="gives no sharding for any column"):
        store.load(sharding={"x": None, "y": None, "z": None})
