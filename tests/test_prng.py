"""Typed PRNG key leaves: stored as key data plus the implementation, read back as typed keys."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore import errors
from tests.conftest import cpu_mesh


def _record(i: int) -> dict:
    return {
        "key": jax.random.key(i),
        "keys": jax.random.split(jax.random.key(100 + i), 3),
        "rbg": jax.random.key(i, impl="rbg"),
        "x": np.float32(i),
    }


def _data(key) -> list:
    return np.asarray(jax.random.key_data(key)).tolist()


def _same_keys(got, want) -> bool:
    return (
        jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key)
        and str(jax.random.key_impl(got)) == str(jax.random.key_impl(want))
        and _data(got) == _data(want)
    )


@pytest.fixture
def store(backend, tmp_path):
    with pytreestore.create(tmp_path / "s", _record(0), backend=backend) as s:
        s.extend(_record(i) for i in range(5))
    return pytreestore.open(tmp_path / "s", backend=backend)


def test_key_columns_name_their_implementation(store):
    specs = {c.path: c for c in store.schema.columns}
    assert (specs["['key']"].key_impl, specs["['key']"].dtype, specs["['key']"].shape) == (
        "threefry2x32",
        np.dtype("uint32"),
        (2,),
    )
    assert specs["['keys']"].shape == (3, 2)
    assert (specs["['rbg']"].key_impl, specs["['rbg']"].shape) == ("rbg", (4,))
    assert specs["['x']"].key_impl is None
    assert "key_impl" not in specs["['x']"].to_json()


def test_keys_come_back_typed_everywhere(store):
    # issue 11: create failed with a bare "TypeError: Cannot interpret 'key<fry>' as a data type"
    assert _same_keys(store[3]["key"], jax.random.key(3))
    assert _same_keys(store[3]["rbg"], jax.random.key(3, impl="rbg"))
    want = jax.random.split(jax.random.key(103), 3)
    assert _same_keys(store.load(3)["keys"], want)
    batch = store[1:3]
    assert batch["keys"].shape == (2, 3) and batch["key"].shape == (2,)
    assert _same_keys(batch["key"][1], jax.random.key(2))
    for i, record in enumerate(store):
        assert _same_keys(record["key"], jax.random.key(i))
    assert all(
        _same_keys(r["rbg"], jax.random.key(i, impl="rbg")) for i, r in enumerate(store.records())
    )
    batches = list(store.batches(2))
    assert [b["key"].shape for b in batches] == [(2,), (2,), (1,)]
    assert _same_keys(batches[2]["key"][0], jax.random.key(4))
    drawn = store.map(lambda r: {"u": jax.random.uniform(r["key"])}, batch_size=2)["u"]
    assert np.allclose(drawn, [jax.random.uniform(jax.random.key(i)) for i in range(5)])
    mesh = cpu_mesh((1,), ("d",))
    sharded = store.load(sharding=NamedSharding(mesh, P("d")))
    assert _same_keys(sharded["key"][4], jax.random.key(4))


def test_as_numpy_gives_key_data(store):
    got = store.load(as_numpy=True)
    assert got["key"].dtype == np.uint32 and got["key"].shape == (5, 2)
    assert got["key"][2].tolist() == _data(jax.random.key(2))
    assert got["rbg"].shape == (5, 4)
    assert store.load(1, as_numpy=True)["keys"].tolist() == _data(
        jax.random.split(jax.random.key(101), 3)
    )


def test_wrong_keys_are_refused_and_nothing_is_appended(tmp_path):
    store = pytreestore.create(tmp_path / "s", _record(0))
    raw = dict(_record(1), key=np.zeros(2, np.uint32))
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape("expected a PRNG key array (threefry2x32) at ['key'], got ndarray"),
    ):
        store.append(raw)
    other = dict(_record(1), key=jax.random.key(1, impl="rbg"))
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape("expected a threefry2x32 PRNG key at ['key'], got a rbg key"),
    ):
        store.append(other)
    with pytest.raises(errors.SchemaMismatchError, match=re.escape("got a PRNG key array (rbg)")):
        store.append(dict(_record(1), x=jax.random.key(0, impl="rbg")))
    with pytest.raises(errors.SchemaMismatchError, match="extend\\(\\) refused record 1"):
        store.extend([_record(1), raw])
    assert len(store) == 0
    store.extend_batch(
        {
            "key": jax.random.split(jax.random.key(7), 2),
            "keys": jax.random.split(jax.random.key(8), (2, 3)),
            "rbg": jax.random.split(jax.random.key(9, impl="rbg"), 2),
            "x": np.zeros(2, np.float32),
        }
    )
    assert _same_keys(store[1]["key"], jax.random.split(jax.random.key(7), 2)[1])
    store.close()
