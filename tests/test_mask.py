"""``columns=`` given as a mask pytree of bools (pytreestore/_format/mask.py), on every kind of
store and both backends, through load, records, batches and a Grain source."""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.struct import dataclass

import pytreestore
from pytreestore._format.mask import is_mask, selectors
from pytreestore.errors import ArgumentError, ArgumentTypeError, UnknownColumnError
from pytreestore.testing import assert_trees_equal


@dataclass
class Body:
    pos: Any
    vel: Any


class Step(NamedTuple):
    body: Any
    t: Any
    name_len: Any


def _step(i: int) -> Step:
    body = Body(np.full(3, i, np.float32), np.full(3, -i, np.float32))
    return Step(body, np.int32(i), np.int16(i % 5))


def _off(tree: Any) -> Any:
    return jax.tree.map(lambda _: False, tree)


# ---- selectors, without a store -----------------------------------------------------------------


def test_selectors_of_leaves_and_nodes():
    paths = ("['a']", "['b']['c']", "['b']['d']", "['p'][*]['x']")
    assert selectors({"a": True, "b": False, "p": []}, paths) == ["['a']"]
    assert selectors({"a": False, "b": True}, paths) == ["['b']"]
    assert selectors(True, paths) == [""]
    assert selectors(False, paths) == []
    # a record's ragged list: any element selects; a batch's stacked element stands for [*]
    record = {"p": [{"x": False}, {"x": np.bool_(True)}]}
    assert selectors(record, paths) == ["['p'][*]['x']"]
    assert selectors({"p": {"x": jnp.asarray(True)}}, paths) == ["['p'][*]['x']"]


@pytest.mark.parametrize(
    ("columns", "mask"),
    [
        (None, False),
        (".a", False),
        ([".a", ".b"], False),
        ((".a",), False),
        ([], False),
        ([True, False], True),
        ({"a": True}, True),
        (True, True),
        (_step(0), True),
    ],
)
def test_masks_are_told_from_selectors(columns, mask):
    assert is_mask(columns) is mask


def test_a_mask_leaf_must_be_a_bool():
    paths = ("['a']", "['b']")
    with pytest.raises(ArgumentTypeError, match=r"at \['b'\] it holds ndarray.*data mask"):
        selectors({"a": True, "b": np.ones(3, bool)}, paths)
    with pytest.raises(ArgumentTypeError, match=r"at \['a'\] it holds int 1"):
        selectors({"a": 1, "b": True}, paths)


def test_a_mask_subtree_the_store_lacks_is_refused_with_its_keypath():
    with pytest.raises(UnknownColumnError, match=r"subtree at \['q'\].*columns are \['a'\]"):
        selectors({"a": True, "q": {"z": False}}, ("['a']",))
    with pytest.raises(UnknownColumnError, match=r"subtree at \['q'\]"):
        selectors({"a": True, "q": False}, ("['a']",))
    with pytest.raises(UnknownColumnError, match=r"empty dict at the root.*columns: \['a'\]"):
        selectors({}, ("['a']",))
    with pytest.raises(UnknownColumnError, match=r"empty list at \['b'\]"):
        selectors({"a": True, "b": []}, ("['a']", "['b'][0]"))  # a list of fixed length
    # empty matches empty: a ragged list with no items, a node the store holds no column under
    assert selectors({"a": True, "p": [], "e": {}}, ("['a']", "['p'][*]['x']")) == ["['a']"]


# ---- on stores ----------------------------------------------------------------------------------


def test_fixed_store_mask_of_a_record(tmp_path, backend):
    records = [_step(i) for i in range(6)]
    store = pytreestore.create(tmp_path / "s", records[0], chunk_records=4, backend=backend)
    store.extend(records)
    store.flush()
    mask = _off(records[0])._replace(body=Body(pos=True, vel=False))
    got = store.load(slice(1, 5), columns=mask, as_numpy=True)
    assert isinstance(got, Step) and isinstance(got.body, Body)
    assert got.body.vel is None and got.t is None and got.name_len is None
    np.testing.assert_array_equal(got.body.pos, np.stack([r.body.pos for r in records[1:5]]))
    # the same selection as the selector string
    want = store.load(slice(1, 5), columns=".body.pos", as_numpy=True)
    assert_trees_equal(got, want)
    # a prefix mask: a bool at a node stands for every column below it
    prefix = Step(body=True, t=False, name_len=True)
    got = store.load(2, columns=prefix, as_numpy=True)
    assert got.t is None
    assert_trees_equal(got.body, records[2].body)
    assert got.name_len == records[2].name_len
    store.close()
    reopened = pytreestore.open(tmp_path / "s", backend=backend)
    one = [r.t for r in reopened.records(columns=_off(records[0])._replace(t=True))]
    assert [int(x) for x in one] == list(range(6))


def _ragged_records() -> list[dict[str, Any]]:
    out = []
    for k in range(5):
        out.append(
            {
                "a": np.float32(k),
                "p": [
                    {"x": np.full(2, 10 * k + j, np.float32), "z": np.int32(j)} for j in range(k)
                ],
                "o": None if k % 2 else {"y": np.int32(k)},
                "r": np.full((k, 3), k, np.float32),
                "g": [{"e": [np.float32(j + m) for m in range(j)]} for j in range(k % 3)],
            }
        )
    return out


@pytest.fixture
def ragged(tmp_path, backend):
    records = _ragged_records()
    store = pytreestore.create(
        tmp_path / "r",
        like=records[2],
        ragged=["['p']", "['r']", "['g']", "['g'][*]['e']"],
        optional=["['o']"],
        chunk_records=2,
        backend=backend,
    )
    store.extend(records)
    store.flush()
    return store, records


def test_ragged_store_mask_of_a_record(ragged):
    store, records = ragged
    mask = _off(records[3])  # a record whose list has 3 items and whose optional is None
    mask["p"][1]["z"] = True  # any item stands for every item
    mask["r"] = True
    got = store.load([1, 4], columns=mask, as_numpy=True)
    want = store.load([1, 4], columns=["['p'][*]['z']", "['r']"], as_numpy=True)
    assert_trees_equal(got, want)
    batch, _ = got
    assert batch["a"] is None and batch["p"]["x"] is None and batch["o"]["y"] is None
    np.testing.assert_array_equal(batch["p"]["z"][1][:4], np.arange(4, dtype=np.int32))
    np.testing.assert_array_equal(batch["r"][0][:1], np.full((1, 3), 1, np.float32))


def test_ragged_store_mask_of_a_padded_batch(ragged):
    store, records = ragged
    batch, _ = store.load(as_numpy=True)
    mask = _off(batch)
    mask["o"] = True
    mask["g"]["e"] = True  # nested ragged: the stacked element of a stacked element
    got, _ = store.load(columns=mask, as_numpy=True)
    assert got["p"]["x"] is None and got["a"] is None
    np.testing.assert_array_equal(got["o"]["y"], [0, 0, 2, 0, 4])
    np.testing.assert_array_equal(got["g"]["e"], batch["g"]["e"])
    # one record at a time: the record's own classes, the unselected leaves None
    for i, rec in enumerate(store.records(columns=mask, as_numpy=True)):
        assert rec["a"] is None
        assert (rec["o"] is None) == (records[i]["o"] is None)
        assert [[float(v) for v in g["e"]] for g in rec["g"]] == [
            [float(v) for v in g["e"]] for g in records[i]["g"]
        ]


def test_ragged_mask_in_batches_and_a_grain_source(ragged):
    store, records = ragged
    mask = _off(records[2])
    mask["a"] = True
    batches = list(store.batches(2, columns=mask))
    assert all(b[0]["p"]["x"] is None for b in batches)
    firsts = np.concatenate([np.asarray(b[0]["a"]) for b in batches])
    np.testing.assert_array_equal(firsts, [r["a"] for r in records])
    source = store.grain_source(columns=mask)
    again = pickle.loads(pickle.dumps(source))
    assert [float(again[i][0]["a"]) for i in range(len(records))] == [0, 1, 2, 3, 4]
    assert again[0][0]["p"]["x"] is None


def test_a_wrong_mask_refuses_before_reading(ragged):
    store, records = ragged
    mask = _off(records[2])
    mask["extra"] = {"q": True}
    with pytest.raises(UnknownColumnError, match=r"\['extra'\]"):
        store.load(columns=mask)
    # an all-False mask selects nothing, as columns=[] does: both refused alike
    for nothing in (_off(records[2]), []):
        with pytest.raises(ArgumentError, match="selects no column"):
            store.load(columns=nothing, as_numpy=True)
