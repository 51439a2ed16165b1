"""Constant leaves (functions held as leaves, as eqx.nn.MLP does): stored once in the schema,
returned by every read, and the same object required in every appended record."""

from __future__ import annotations

import re

import equinox as eqx
import jax
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format import validate as _validate
from pytreestore._format.schema import TreeSchema
from tests.peer_trees import FunctionLeaf, scale_by_two


def _mlp(final: object = jax.nn.tanh, seed: int = 0) -> eqx.nn.MLP:
    return eqx.nn.MLP(2, 3, 4, 1, final_activation=final, key=jax.random.key(seed))


def _store(tmp_path, backend: str, records: int = 3) -> tuple[pytreestore.TreeStore, list]:
    mlps = [_mlp(seed=i) for i in range(records)]
    store = pytreestore.create(tmp_path / backend, mlps[0], backend=backend)
    store.extend(mlps)
    return store, mlps


def test_schema_holds_constants_as_nodes_not_columns():
    schema = TreeSchema.from_example(_mlp())
    kids = schema.tree["children"]
    assert kids[1] == {"node": "const", "value": {"ref": "jax._src.nn.functions:relu"}}
    assert kids[2] == {"node": "const", "value": {"ref": "jax.numpy:tanh"}}
    assert schema.paths == tuple(f".layers[{i}].{f}" for i in range(2) for f in ("weight", "bias"))
    _validate.stamped(schema.to_json())  # follows pytreestore/schema.json


def test_module_level_lambda_is_stored_by_its_name():
    schema = TreeSchema.from_example(eqx.nn.MLP(2, 3, 4, 1, key=jax.random.key(0)))
    assert schema.tree["children"][2]["value"] == {"ref": "equinox.nn._mlp:_identity"}


def test_every_read_returns_the_constant_objects(tmp_path, backend):
    store, mlps = _store(tmp_path, backend)
    store.close()
    store = pytreestore.open(tmp_path / backend, backend=backend)
    one, batch = store[1], store.load(slice(0, 3), as_numpy=True)
    iterated = list(store)
    batches = list(store.batches(2))
    sharded = store.load(sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    grain = store.grain_source().__getitems__([2, 0])
    for tree in (one, batch, *iterated, *batches, sharded, *grain):
        assert tree.activation is jax.nn.relu and tree.final_activation is jax.numpy.tanh
    np.testing.assert_array_equal(one.layers[1].weight, mlps[1].layers[1].weight)
    np.testing.assert_array_equal(batch.layers[0].bias[2], mlps[2].layers[0].bias)
    np.testing.assert_array_equal(iterated[2].layers[1].bias, mlps[2].layers[1].bias)
    np.testing.assert_array_equal(sharded.layers[1].weight[2], mlps[2].layers[1].weight)
    np.testing.assert_array_equal(grain[0].layers[0].bias, mlps[2].layers[0].bias)
    generic = pytreestore.open(tmp_path / backend, backend=backend, generic=True)[0]
    assert generic["activation"] is jax.nn.relu
    x = np.ones(2, np.float32)
    got = store.map(lambda m: m(x), batch_size=2)  # constants closed over, not traced
    np.testing.assert_allclose(np.asarray(got), np.stack([m(x) for m in mlps]), rtol=1e-6)


def test_appending_another_function_is_refused(tmp_path, backend):
    store, _ = _store(tmp_path, backend, records=1)
    other = _mlp(final=jax.nn.sigmoid)
    want = (
        "record does not match the store schema at .final_activation: stored the constant "
        "jax.numpy:tanh, got jax._src.nn.functions:sigmoid."
    )
    with pytest.raises(errors.SchemaMismatchError, match=re.escape(want)):
        store.append(other)
    with pytest.raises(errors.SchemaMismatchError, match=r"extend\(\) refused record 1 .*"):
        store.extend([_mlp(), other])
    with pytest.raises(errors.SchemaMismatchError, match=re.escape(want)):
        store.extend_batch(pytreestore.stack([other]))
    store.append(_mlp(seed=5))
    store.close()
    store = pytreestore.open(tmp_path / backend, backend=backend)
    assert len(store) == 2
    np.testing.assert_array_equal(store[1].layers[0].weight, _mlp(seed=5).layers[0].weight)


def test_like_with_another_function_is_refused(tmp_path):
    store, _ = _store(tmp_path, "tensorstore", records=1)
    store.close()
    want = "at .final_activation: expected the constant jax.numpy:tanh, got the constant"
    with pytest.raises(errors.SchemaMismatchError, match=re.escape(want)):
        pytreestore.open(tmp_path / "tensorstore", like=_mlp(final=jax.nn.sigmoid)).schema
    same = pytreestore.open(tmp_path / "tensorstore", like=_mlp())[0]
    assert same.final_activation is jax.numpy.tanh


def test_refused_leaves_name_the_keypath(tmp_path):
    with pytest.raises(errors.UnsupportedTreeError, match=r"leaf at \.fn holds <function .*lambda"):
        pytreestore.create(tmp_path / "a", FunctionLeaf(np.zeros(2), lambda x: x))
    method = np.zeros(2).sum
    with pytest.raises(errors.UnsupportedTreeError, match=r"leaf at \['f'\] holds <built-in"):
        pytreestore.create(tmp_path / "b", {"f": method, "x": 0})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_selecting_only_constants_says_so(tmp_path):
    store, _ = _store(tmp_path, "zarr", records=1)
    with pytest.raises(KeyError, match=r"only constant leaves live there: \.activation = jax"):
        store.load(columns=".activation")
    part = store.load(columns=[".layers[0]"])
    assert part.layers[1].weight is None and part.activation is jax.nn.relu


def test_stack_and_unstack_keep_constants():
    trees = [FunctionLeaf(np.full(2, i, np.float32), scale_by_two) for i in range(3)]
    batch = pytreestore.stack(trees, as_numpy=True)
    assert batch.fn is scale_by_two
    np.testing.assert_array_equal(batch.w[:, 0], [0, 1, 2])
    back = pytreestore.unstack(batch)
    assert [t.fn for t in back] == [scale_by_two] * 3
    np.testing.assert_array_equal(back[2].w, [2, 2])


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"f": np.float32(1), "x": np.float32(0)}, "at ['f']: stored the constant jax._src"),
        ({"f": jax.nn.relu, "x": jax.nn.relu}, "at ['x']: expected float32[], got a custom_jvp"),
        ({"x": np.float32(0)}, "expected a dict with keys ['f', 'x'], got a dict with keys ['x']"),
        (
            {"f": (jax.nn.relu,), "x": np.float32(0)},
            "at ['f']: expected the constant jax._src.nn.functions:relu, got tuple",
        ),
    ],
)
def test_mismatches_around_constants_name_the_keypath(tmp_path, record, message):
    store = pytreestore.create(tmp_path / "s", {"f": jax.nn.relu, "x": np.float32(0)})
    with pytest.raises(errors.SchemaMismatchError, match=re.escape(message)):
        store.append(record)
    assert len(store) == 0
