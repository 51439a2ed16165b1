"""Placement helpers and the pmap layout: ``load(pmap_devices=...)``."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore._read import place as _device
from pytreestore.errors import ShardingError
from tests.conftest import cpu_mesh


def make_store(path, n: int):
    store = pytreestore.create(path, {"a": np.float32(0), "b": np.zeros(3, np.int32)})
    store.extend_batch(
        {"a": np.arange(n, dtype=np.float32), "b": np.arange(3 * n, dtype=np.int32).reshape(n, 3)}
    )
    store.flush()
    return store


class TestEightDevices:
    def test_pmap_layout_is_placed_per_device(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s", 40)
        got = store.load(pmap_devices=eight_devices)
        assert got["a"].shape == (8, 5) and got["b"].shape == (8, 5, 3)
        for shard in got["b"].addressable_shards:
            k = eight_devices.index(shard.device)
            np.testing.assert_array_equal(
                np.asarray(shard.data)[0], store.load(slice(5 * k, 5 * k + 5), as_numpy=True)["b"]
            )

    def test_pmap_runs_on_the_loaded_layout(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s", 16)
        got = store.load(pmap_devices=eight_devices)
        out = jax.pmap(
            lambda r: jax.lax.psum(r["a"].sum(), "i"), axis_name="i", devices=eight_devices
        )(got)
        np.testing.assert_allclose(np.asarray(out), np.full(8, sum(range(16))))

    def test_pmap_on_some_devices_with_an_index(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s", 16)
        devices = eight_devices[2:5]
        got = store.load([15, 0, 7, 1, 2, 3], pmap_devices=devices)
        np.testing.assert_array_equal(np.asarray(got["a"]), [[15, 0], [7, 1], [2, 3]])
        out = jax.pmap(lambda r: r["a"] * 2, devices=devices)(got)
        np.testing.assert_array_equal(np.asarray(out), [[30, 0], [14, 2], [4, 6]])

    def test_pmap_count_must_divide(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s", 20)
        expected = (
            "cannot split 20 records over 8 devices (column ['a'], sharding "
            f"{_device.pmap_sharding(eight_devices)}): the record count must be a multiple of "
            "8. Load 16 records (e.g. index 0:16), or pass pad=True to pad to 24"
        )
        with pytest.raises(ShardingError, match=re.escape(expected)):
            store.load(pmap_devices=eight_devices)

    def test_pmap_pad_gives_a_mask_of_the_same_layout(self, tmp_path, eight_devices):
        store = make_store(tmp_path / "s", 20)
        got, mask = store.load(pmap_devices=eight_devices, pad=True)
        assert got["a"].shape == (8, 3) and mask.shape == (8, 3)
        np.testing.assert_array_equal(np.asarray(mask).ravel(), np.arange(24) < 20)
        total = jax.pmap(lambda r, m: (r["a"] * m).sum(), devices=eight_devices)(got, mask)
        assert float(np.asarray(total).sum()) == sum(range(20))


def test_pmap_on_one_device(tmp_path):
    store = make_store(tmp_path / "s", 4)
    got = store.load(pmap_devices=jax.local_devices()[:1])
    assert got["a"].shape == (1, 4)
    np.testing.assert_array_equal(np.asarray(jax.pmap(lambda r: r["a"] + 1)(got)), [[1, 2, 3, 4]])


def test_pmap_devices_must_be_devices():
    with pytest.raises(TypeError, match=re.escape("pmap_devices must be a non-empty sequence")):
        _device.pmap_sharding([])
    with pytest.raises(TypeError, match=re.escape("pmap_devices must be a non-empty sequence")):
        _device.pmap_sharding(["cpu:0"])


def test_column_shardings_forms():
    mesh = cpu_mesh((1,), ("data",))
    data, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    paths = [".p[0].x", ".p[0].y", ".p[1].x"]
    assert _device.column_shardings(data, paths) == [data] * 3
    by_node = _device.column_shardings({"p": [data, None]}, ["['p'][0]", "['p'][1]"])
    assert by_node == [data, rep]
    prefix = _device.column_shardings({"p": [data, None]}, ["['p'][0]['x']", "['p'][1]['y']"])
    assert prefix == [data, rep]
    picked = _device.column_shardings(lambda p: data if p.endswith("x") else None, paths)
    assert picked == [data, rep, data]


def test_column_shardings_rejects_non_shardings():
    with pytest.raises(
        TypeError, match=re.escape("sharding for column .x must be a jax.sharding.Sharding")
    ):
        _device.column_shardings(lambda p: "data", [".x"])


def test_replicated_of_other_shardings_uses_its_devices():
    single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    rep = _device.replicated(single)
    assert rep.device_set == single.device_set and rep.is_fully_replicated
    assert _device.record_axis_sharding(single).is_fully_replicated


def test_jax_s_hugepages_notice_is_not_an_error():
    """On a TPU host ``import jax`` warns that transparent hugepages are off; the suite's
    ``filterwarnings = ["error"]`` made that 8 collection errors there (issue 34). The
    notice passes; any other warning still fails a test."""
    import warnings

    warnings.warn(
        "Transparent hugepages are not enabled. TPU runtime startup and shutdown time should "
        "be significantly improved on TPU v5e and newer.",
        UserWarning,
        stacklevel=1,
    )
    with pytest.raises(UserWarning):
        warnings.warn("anything else", UserWarning, stacklevel=1)
