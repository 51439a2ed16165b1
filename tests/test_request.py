"""LoadRequest: a read's arguments checked and resolved once, a frozen value."""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore._format.schema import TreeSchema
from pytreestore._read import sharded as _sharded
from pytreestore._read.index import Selection
from pytreestore._read.request import LoadRequest, check_cast
from pytreestore.errors import ShardingError, StoreIndexError, UnknownColumnError
from tests.conftest import cpu_mesh

LIKE = {"a": np.float32(0), "b": {"c": np.zeros(2, np.int32), "d": np.int64(0)}}


@pytest.fixture
def schema() -> TreeSchema:
    return TreeSchema.from_example(LIKE)


def data_sharding() -> NamedSharding:
    return NamedSharding(cpu_mesh((1,), ("data",)), P("data"))


def build(schema: TreeSchema, **options) -> LoadRequest:
    return LoadRequest.build(schema, policy=False, **options)


# ---- resolution ------------------------------------------------------------------------------


def test_defaults_choose_every_column(schema):
    request = build(schema)
    assert request.chosen == (0, 1, 2)
    assert request.specs == list(schema.columns)
    assert (request.cast, request.as_numpy, request.device) == (False, False, None)
    assert (request.split, request.pad, request.pmap, request.shardings) == (
        False,
        False,
        False,
        None,
    )


def test_columns_resolve_to_indices_in_column_order(schema):
    request = build(schema, columns=["['b']['d']", "['a']"])
    assert request.chosen == (0, 2)
    assert [c.path for c in request.specs] == ["['a']", "['b']['d']"]
    assert request.record_nbytes == 4 + 8


def test_a_node_selects_every_column_below_it(schema):
    assert build(schema, columns="['b']").chosen == (1, 2)


@pytest.mark.parametrize(
    ("cast", "policy", "want"),
    [(None, True, True), (None, False, False), (False, True, False), (True, False, True)],
)
def test_cast_none_takes_the_policy(schema, cast, policy, want):
    assert LoadRequest.build(schema, policy=policy, cast=cast).cast is want


def test_one_sharding_is_resolved_per_chosen_column(schema):
    sharding = data_sharding()
    request = build(schema, columns="['b']", sharding=sharding)
    assert request.split and not request.pmap
    assert request.shardings == (sharding, sharding)


def test_a_sharding_tree_is_resolved_against_every_column(schema):
    sharding = data_sharding()
    tree = {"a": None, "b": sharding}
    request = build(schema, columns="['a']", sharding=tree)
    assert request.chosen == (0,)
    assert len(request.shardings) == 1
    assert request.shardings[0].spec == P()  # None replicates


def test_pmap_devices_resolve_to_the_pmap_sharding(schema):
    request = build(schema, pmap_devices=jax.local_devices()[:1], pad=True)
    assert request.pmap and request.pad and request.split
    assert len(request.shardings) == 3
    assert request.shardings[0].spec == P("pmap")


def test_selection_normalises_the_index(schema):
    assert build(schema).selection(-1, 5) == Selection(slice(4, 5, 1), 1, True)
    with pytest.raises(StoreIndexError, match="out of range"):
        build(schema).selection(5, 5)


# ---- a value -----------------------------------------------------------------------------------


def test_frozen(schema):
    request = build(schema)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.cast = True  # type: ignore[misc]


def test_equal_arguments_give_equal_requests(schema):
    sharding = data_sharding()
    assert build(schema, columns="['a']", sharding=sharding) == build(
        schema, columns=["['a']"], sharding=sharding
    )
    assert build(schema, columns="['a']") != build(schema, columns="['b']")
    assert build(schema) != build(schema, as_numpy=True)
    assert build(schema, cast=True) != build(schema)


# ---- validation: every error -----------------------------------------------------------------


def test_cast_must_be_a_bool(schema):
    message = "cast must be True, False or None (the store's policy), got 'yes'"
    with pytest.raises(TypeError, match=re.escape(message)):
        build(schema, cast="yes")
    with pytest.raises(TypeError, match=re.escape(message)):
        check_cast("yes")


def test_sharding_and_pmap_devices_exclude_each_other(schema):
    with pytest.raises(ValueError, match=re.escape("give sharding= or pmap_devices=, not both")):
        build(schema, sharding=data_sharding(), pmap_devices=jax.local_devices())


def test_pad_needs_a_split(schema):
    with pytest.raises(ValueError, match=re.escape("pad=True needs sharding= or pmap_devices=")):
        build(schema, pad=True)


def test_device_and_sharding_exclude_each_other(schema):
    with pytest.raises(ValueError, match=re.escape("drop it when giving sharding=")):
        build(schema, sharding=data_sharding(), device=jax.devices()[0])


def test_as_numpy_and_sharding_exclude_each_other(schema):
    with pytest.raises(ValueError, match=re.escape("as_numpy=True loads to host")):
        build(schema, pmap_devices=jax.local_devices(), as_numpy=True)


def test_a_split_read_refuses_an_int_index(schema):
    request = build(schema, sharding=data_sharding())
    with pytest.raises(ShardingError, match=re.escape("one record (3) does not have")):
        request.selection(3, 10)
    with pytest.raises(ShardingError):
        request.selection(np.int64(3), 10)


def test_unknown_column(schema):
    with pytest.raises(UnknownColumnError, match=re.escape("no column at or below '.nope'")):
        build(schema, columns=".nope")


def test_a_selector_must_be_a_string(schema):
    with pytest.raises(TypeError, match=re.escape("tree-path strings, or a mask")):
        build(schema, columns=[3])  # a list that is no list of strings is read as a mask


def test_a_sharding_must_be_a_sharding(schema):
    with pytest.raises(TypeError, match=re.escape("must be a jax.sharding.Sharding or None")):
        build(schema, sharding=lambda path: "data")


def test_a_sharding_for_no_column(schema):
    with pytest.raises(TypeError, match=re.escape("gives no sharding for any column")):
        build(schema, sharding=lambda path: None)


def test_a_sharding_tree_entry_that_names_no_column(schema):
    tree = {"a": data_sharding(), "b": None, "z": None}
    with pytest.raises(ValueError, match=re.escape("entries at ['z'] that match no column")):
        build(schema, sharding=tree)


def test_a_sharding_tree_without_an_entry_for_a_column(schema):
    with pytest.raises(ValueError, match=re.escape("no entry for column ['b']['c']")):
        build(schema, sharding={"a": data_sharding(), "b": {"d": None}})


def test_pmap_devices_must_be_devices(schema):
    with pytest.raises(TypeError, match=re.escape("pmap_devices must be a non-empty sequence")):
        build(schema, pmap_devices=["cpu"])


def test_batches_that_the_sharding_cannot_split(schema):
    mesh = cpu_mesh((1,), ("data",))
    request = build(schema, sharding=NamedSharding(mesh, P("data")))
    request.check_batches(4, 10, drop_last=False)  # one device splits anything
    build(schema).check_batches(3, 10, drop_last=False)  # unsplit: nothing to check


# ---- resolved once per pipeline ----------------------------------------------------------------


@pytest.fixture
def store():
    with pytreestore.create("memory://test-request", LIKE, overwrite=True, cast=True) as s:
        s.extend_batch(
            {
                "a": np.arange(10, dtype=np.float32),
                "b": {"c": np.zeros((10, 2), np.int32), "d": np.arange(10)},
            }
        )
        yield s


@pytest.fixture
def counted(monkeypatch):
    calls = {"select": 0, "resolve": 0}
    select, resolve = TreeSchema.select, _sharded.resolve

    def counting_select(self, columns):
        calls["select"] += 1
        return select(self, columns)

    def counting_resolve(*args):
        calls["resolve"] += 1
        return resolve(*args)

    monkeypatch.setattr(TreeSchema, "select", counting_select)
    monkeypatch.setattr(_sharded, "resolve", counting_resolve)
    return calls


def test_batches_resolve_once(store, counted):
    batches = list(store.batches(2, columns="['b']", sharding=data_sharding(), prefetch=0))
    assert len(batches) == 5
    assert counted == {"select": 1, "resolve": 1}


def test_map_resolves_once(store, counted):
    out = store.map(
        lambda r: r["b"]["d"] * 2, batch_size=3, columns="['b']", sharding=data_sharding()
    )
    np.testing.assert_array_equal(np.asarray(out), np.arange(10) * 2)
    assert counted == {"select": 1, "resolve": 1}


def test_records_resolve_once(store, counted):
    assert len(list(store.records(as_numpy=True))) == 10
    assert counted["select"] == 1


def test_a_grain_source_resolves_once(store, counted):
    source = store.grain_source(columns="['a']")
    assert [float(source[i]["a"]) for i in range(3)] == [0.0, 1.0, 2.0]
    assert counted["select"] == 1
