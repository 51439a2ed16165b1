"""StoreSpec (``pytreestore._spec``): how a reader and a Grain source pickle and reopen,
keeping their backend, ``storage_options`` and ``cache_bytes`` (once a bug: a GrainSource
pickled only its path)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import pytreestore
from pytreestore._location import Location
from pytreestore._spec import StoreSpec

pytest_plugins = ("tests.fixtures",)
LIKE = {"id": np.int32(0), "v": np.zeros(2, np.float32)}


def rec(i: int) -> dict[str, np.ndarray]:
    return {"id": np.int32(i), "v": np.full(2, i, np.float32)}


def test_a_spec_pickles_and_gives_open_its_arguments():
    spec = StoreSpec.of(
        Location.parse("s3://bkt/p", {"endpoint": "http://127.0.0.1:1", "max_retries": 3}),
        "zarr",
        cache_bytes=0,
        generic=True,
        opener=pytreestore.open,
    )
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and again.opener is pytreestore.open
    options = again.options()
    assert options["mode"] == "r" and options["backend"] == "zarr" and options["generic"]
    assert options["storage_options"]["max_retries"] == 3
    assert StoreSpec.of(Location.parse("memory://x"), "zarr").options()["storage_options"] is None


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_grain_source_of_a_local_store_keeps_its_backend_and_cache(tmp_path, backend):
    path = str(tmp_path / "s")
    with pytreestore.create(path, LIKE, backend=backend) as store:
        store.extend(rec(i) for i in range(4))
    cache = {"cache_bytes": 1 << 20} if backend == "tensorstore" else {}
    reader = pytreestore.open(path, backend=backend, **cache)
    source = pickle.loads(pickle.dumps(reader.grain_source(columns="['id']")))
    options = source._store.reopen_options()
    assert options["backend"] == backend
    assert options["cache_bytes"] == cache.get("cache_bytes")
    assert len(source) == 4 and int(source[3]["id"]) == 3 and source[3]["v"] is None


@pytest.mark.s3
@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_grain_source_on_s3_keeps_its_storage_options(s3_server, bucket, backend):
    url = f"s3://{bucket}/s"
    opts = dict(s3_server.options, max_retries=4)
    with pytreestore.create(url, LIKE, backend=backend, storage_options=opts) as store:
        store.extend(rec(i) for i in range(3))
        source = pickle.loads(pickle.dumps(store.grain_source()))  # of a writer: flushed first
    reopened = source._store.reopen_options()
    assert reopened["backend"] == backend
    assert reopened["storage_options"]["endpoint"] == s3_server.options["endpoint"]
    assert reopened["storage_options"]["max_retries"] == 4
    np.testing.assert_array_equal(source._getitems([2, 0])[0]["v"], [2, 2])
    reader = pickle.loads(
        pickle.dumps(pytreestore.open(url, backend=backend, storage_options=opts))
    )
    assert reader.reopen_options() == reopened and len(reader) == 3


def test_a_created_stores_cast_policy_survives_pickling(tmp_path):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, {"t": np.float64(0)}, cast=True)
    store.append({"t": np.float64(1)})
    source = pickle.loads(pickle.dumps(store.grain_source()))
    assert source._store.reopen_options()["cast"] is True
    store.close()
