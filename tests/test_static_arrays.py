"""Static fields that hold arrays (in a wrapper with a static codec, as MJX keeps them) and
dicts with int keys, stored on every kind of store and both backends: read back with equal
treedefs (so jit caches hit), exact leaves, and clear refusals."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import struct

import pytreestore
from pytreestore import errors
from pytreestore.testing.strategies import HashableArray
from tests import interpreters
from tests import static_trees as st
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parent.parent


def _assert_same(got, want) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert (a.dtype, a.shape) == (b.dtype, b.shape)
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("kind", st.KINDS)
@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_static_arrays_and_int_keys_round_trip_on_every_kind(kind, backend, tmp_path):
    records = [st.record(kind, i) for i in range(6)]
    with pytreestore.create(
        tmp_path / "s", st.like(kind), backend=backend, **st.DECLARATIONS[kind]
    ) as store:
        store.extend(records)
    store = pytreestore.open(tmp_path / "s", backend=backend)  # bound from the schema alone
    for i, want in enumerate(records):
        _assert_same(store[i], want)
    got = store[3]
    assert got.flag == st.FLAG and got.layers[1]["w"].tolist() == [4.0, 4.0]
    assert [type(k) for k in got.layers] == [int, int]
    if got.bodies:
        assert got.bodies[0].dims == st.DIMS and got.bodies[0].dims.array.dtype == np.int32


def test_int_keys_are_kept_in_paths_storage_keys_and_selectors(tmp_path):
    records = [st.layers_record(i) for i in range(4)]
    with pytreestore.create(tmp_path / "s", records[0]) as store:
        store.extend(records)
    store = pytreestore.open(tmp_path / "s")
    columns = {c.path: c.key for c in store.schema.columns}
    assert columns["['opt_state'][-3]['count']"] == "opt_state/-2D3/count"
    assert columns["['opt_state'][0]['mu'][0]"] == "opt_state/0/mu/0"
    assert columns["['opt_state'][1099511627776]"] == "opt_state/1099511627776"
    for i, want in enumerate(records):
        _assert_same(store[i], want)
    part = store.load(columns="['opt_state'][0]['mu']")
    assert np.asarray(part["opt_state"][0]["mu"][0]).tolist() == [[0, k] for k in range(4)]
    assert part["opt_state"][-3]["count"] is None
    with pytest.raises(
        errors.UnknownColumnError, match=re.escape("no column at or below \"['opt_state']['0']\"")
    ):
        store.load(columns="['opt_state']['0']")
    view = pytreestore.open(tmp_path / "s", generic=True)[1]
    assert sorted(view["opt_state"], key=str) == [-3, 0, 2**40]


def test_a_str_key_where_an_int_key_is_stored_is_a_schema_mismatch(tmp_path):
    record = st.layers_record(0)
    store = pytreestore.create(tmp_path / "s", record)
    wrong = {**record, "opt_state": {str(k): v for k, v in record["opt_state"].items()}}
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.append(wrong)
    assert (
        "at ['opt_state']: expected a dict with keys [-3, 0, 1099511627776], got a dict with keys ['-3', '0', '1099511627776']"
        in str(info.value)
    )
    store.close()
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape("at ['opt_state']: expected a dict with keys [-3, 0"),
    ):
        pytreestore.open(tmp_path / "s", like=wrong)[0]


def test_a_different_static_array_on_append_is_named(tmp_path):
    store = pytreestore.create(tmp_path / "s", st.like("fixed"))
    bad = st.record("fixed", 0)
    dims = HashableArray(np.arange(6, dtype=np.int64).reshape(2, 3))
    bad = dataclasses.replace(bad, extra=dataclasses.replace(bad.extra, dims=dims))
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.append(bad)
    text = str(info.value)
    assert (
        ".extra.dims: stored HashableArray(array(int32, shape=(2, 3), [[0 1 2] [3 4 5]])), got HashableArray(array(int64, shape=(2, 3), [[0 1 2] [3 4 5]]))"
        in text
    )
    assert "0x" not in text
    store.close()


def test_a_jitted_step_does_not_retrace_on_a_record_read_back(tmp_path):
    traces = []

    @jax.jit
    def step(world):
        traces.append(1)
        return dataclasses.replace(world, t=world.t + 1)

    want = st.record("fixed", 1)
    step(want)
    with pytreestore.create(tmp_path / "s", want) as store:
        store.append(want)
    got = pytreestore.open(tmp_path / "s")[0]
    step(got)
    assert len(traces) == 1


_FRESH = """
import sys, jax, numpy as np, pytreestore
from tests import static_trees as st
from tests import interpreters
from tests.conftest import child_env
store = pytreestore.open(sys.argv[1], backend=sys.argv[2])
want = [st.record("ragged_list", i) for i in range(4)]
same = [jax.tree.structure(store[i]) == jax.tree.structure(w) and all(
    np.asarray(a).tobytes() == np.asarray(b).tobytes()
    for a, b in zip(jax.tree.leaves(store[i]), jax.tree.leaves(w))) for i, w in enumerate(want)]
print(same)
"""


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_fresh_process_reads_static_arrays_back(backend, tmp_path):
    with pytreestore.create(
        tmp_path / "s", st.like("ragged_list"), backend=backend, ragged=[".bodies"]
    ) as store:
        store.extend(st.record("ragged_list", i) for i in range(4))
    out = interpreters.run(  # forked (tests/interpreters.py): static_trees unread
        [sys.executable, "-c", _FRESH, str(tmp_path / "s"), backend],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "[True, True, True, True]"


# ---- refusals ---------------------------------------------------------------------------------


class Opaque:
    """A hashable wrapper of an array that no codec is registered for."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __hash__(self):
        return 0

    def __eq__(self, other):
        return isinstance(other, Opaque) and np.array_equal(self.array, other.array)


@struct.dataclass
class Holder:
    x: object
    box: object = struct.field(pytree_node=False, default=None)


def test_a_wrapper_without_a_codec_is_refused_by_its_contents(tmp_path):
    with pytest.raises(errors.UnsupportedTreeError) as info:
        pytreestore.create(tmp_path / "s", Holder(np.float32(0), Opaque(np.arange(3))))
    text = str(info.value)
    assert (
        "Holder at the root has static field .box that cannot be stored: Opaque(array=array(int64, shape=(3,), [0 1 2])) of type Opaque"
        in text
    )
    assert "0x" not in text and "register_static_codec" in text
    assert not (tmp_path / "s").exists()


def test_a_bare_array_in_static_data_is_refused(tmp_path):
    with pytest.raises(
        errors.UnsupportedTreeError, match="is a bare numpy array: JAX can neither hash nor compare"
    ):
        pytreestore.create(tmp_path / "s", Holder(np.float32(0), np.zeros(2, np.float32)))


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((3, abs, abs), "register_static_codec takes a class, got 3"),
        ((tuple, abs, abs), "tuple values are stored as static values already"),
        ((np.ndarray, abs, abs), "ndarray values are stored as static values already"),
        ((Opaque, 1, abs), "takes an encode and a decode function"),
    ],
    ids=["not-a-class", "tuple", "ndarray", "not-callable"],
)
def test_register_static_codec_refuses_bad_arguments(args, text):
    with pytest.raises(errors.ArgumentTypeError, match=re.escape(text)):
        pytreestore.register_static_codec(*args)


def test_register_static_codec_refuses_a_local_class():
    class Local:
        pass

    with pytest.raises(
        errors.ArgumentTypeError, match=re.escape("is not importable as tests.test_static_arrays:")
    ):
        pytreestore.register_static_codec(Local, lambda v: 0, lambda v: Local())


def test_a_registered_codec_stores_a_user_wrapper(tmp_path):
    pytreestore.register_static_codec(Opaque, lambda o: o.array, Opaque)
    want = Holder(np.float32(2), Opaque(np.array([[1.5]], np.float16)))
    with pytreestore.create(tmp_path / "s", want) as store:
        store.append(want)
    root = json.loads((tmp_path / "s" / "zarr.json").read_text())["attributes"]["pytreestore"]
    assert root["tree"]["aux"]["tuple"][0]["wrapped"]["type"] == "tests.test_static_arrays:Opaque"
    got = pytreestore.open(tmp_path / "s")[0]
    assert got.box == want.box and got.box.array.dtype == np.float16
    assert jax.tree.structure(got) == jax.tree.structure(want)


@pytest.mark.parametrize(
    ("edit", "error", "text"),
    [
        (lambda v: v["ndarray"].update(dtype="float128"), errors.CorruptStoreError, "schema"),
        (lambda v: v["ndarray"].update(shape=[4, 3]), errors.CorruptStoreError, "need 12"),
        (
            lambda v: v["ndarray"].update(data="AAAA"),
            errors.CorruptStoreError,
            "array data holds 3 bytes, its dtype bool and shape () need 1",
        ),
    ],
    ids=["dtype", "shape", "bytes"],
)
def test_a_damaged_static_array_is_refused_on_open(edit, error, text, tmp_path):
    with pytreestore.create(tmp_path / "s", st.like("fixed")) as store:
        store.append(st.record("fixed", 0))
    meta = tmp_path / "s" / "zarr.json"
    doc = json.loads(meta.read_text())
    inner = doc["attributes"]["pytreestore"]["tree"]["aux"]["tuple"][0]["wrapped"]["value"]
    edit(inner)
    meta.write_text(json.dumps(doc))
    with pytest.raises(error, match=re.escape(text)):
        pytreestore.open(tmp_path / "s")[0]


def test_an_unknown_codec_is_refused_on_open(tmp_path):
    with pytreestore.create(tmp_path / "s", st.like("fixed")) as store:
        store.append(st.record("fixed", 0))
    meta = tmp_path / "s" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["pytreestore"]["tree"]["aux"]["tuple"][0]["wrapped"]["type"] = (
        "tests.static_trees:Body"
    )
    meta.write_text(json.dumps(doc))
    with pytest.raises(
        errors.ClassResolutionError,
        match=re.escape("no static codec is registered for tests.static_trees:Body"),
    ):
        pytreestore.open(tmp_path / "s")[0]
    assert pytreestore.open(tmp_path / "s", generic=True)[0]["t"] == 0


def test_an_int_and_a_str_key_of_one_storage_key_are_refused(tmp_path):
    import collections

    both = {"x": collections.OrderedDict([(0, np.float32(0)), ("0", np.float32(1))])}
    with pytest.raises(
        errors.UnsupportedTreeError,
        match=re.escape("leaves at ['x'][0] and ['x']['0'] map to the same storage key 'x/0'"),
    ):
        pytreestore.create(tmp_path / "s", both)


def test_evolve_adds_and_drops_int_keys(tmp_path):
    record = {"x": {0: np.float32(0), 1: np.float32(1)}}
    with pytreestore.create(tmp_path / "s", record) as store:
        store.append(record)
    with pytreestore.open(tmp_path / "s", "a") as store:
        store.evolve(add={"['x'][5]": np.int16(3)}, drop=["['x'][1]"])
        with pytest.raises(errors.SchemaMismatchError, match="cannot sort a str key among them"):
            store.evolve(add={"['x']['a']": np.int16(3)})
    got = pytreestore.open(tmp_path / "s")[0]
    assert list(got["x"]) == [0, 5] and int(got["x"][5]) == 3
