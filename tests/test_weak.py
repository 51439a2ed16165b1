"""weak_type kept per column (pytreestore._format.dtypes) and restored on every jax read path:
each test asserts the leaves' ``weak_type`` and that a jitted function traced on the
original record is not traced again on the one read back."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore._format.columns import ColumnSpec
from pytreestore._format.dtypes import is_weak
from tests.conftest import cpu_mesh
from tests.data import make_golden


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class EnvState:  # gymnax-like: a weakly typed time step beside array state
    time: jax.Array
    pos: jax.Array
    scale: jax.Array


def state(i: int) -> EnvState:
    return EnvState(
        time=jnp.asarray(i),  # weak int32
        pos=jnp.full(2, i, jnp.float32),  # strong
        scale=jnp.asarray(0.5) * i,  # weak float32
    )


WEAK = {"time": True, "pos": False, "scale": True}


def weak_of(tree) -> list:
    return [is_weak(x) for x in jax.tree.leaves(tree)]


def traces(original, loaded) -> int:
    """How many times a jitted function traces on ``original`` then ``loaded``."""
    count = []

    @jax.jit
    def step(s):
        count.append(1)
        return jax.tree.map(lambda x: x * 2, s)

    step(original)
    step(loaded)
    return len(count)


def assert_like(loaded, original):
    assert weak_of(loaded) == weak_of(original)
    assert [x.dtype for x in jax.tree.leaves(loaded)] == [
        jnp.asarray(x).dtype for x in jax.tree.leaves(original)
    ]
    assert traces(original, loaded) == 1


@pytest.fixture
def store(backend, path):
    with pytreestore.create(path, state(0), backend=backend, chunk_records=16) as s:
        s.extend(state(i) for i in range(80))  # 80 >= JIT_MIN: loops read a placed block
    return pytreestore.open(path, backend=backend)


def test_is_weak_follows_jax():
    values = [0.5, 1, 1j, True, np.float32(0.5), np.zeros(2), jnp.asarray(0.5), jnp.float32(1)]
    assert [is_weak(v) for v in values] == [
        jax.numpy.asarray(v).weak_type if not isinstance(v, np.ndarray | np.generic) else False
        for v in values
    ]


def test_schema_records_weak_type(store):
    assert {c.path: c.weak_type for c in store.schema.columns} == {
        f".{k}": v for k, v in WEAK.items()
    }
    columns = store.schema.to_json()["columns"]
    assert [c.get("weak_type") for c in columns] == [True, None, True]  # time, pos, scale
    assert ColumnSpec.from_json(columns[1]).weak_type is False  # absent: strong


def test_bad_weak_type_is_refused():
    column = {"path": ".x", "key": "x", "dtype": "int32", "shape": [], "chunks": [2]}
    with pytest.raises(ValueError, match=re.escape("its weak_type 'yes' is not true or false")):
        ColumnSpec.from_json({**column, "weak_type": "yes"})


def test_store_getitem_and_loop(store):
    assert_like(store[5], state(5))
    for i in range(6, 70):  # store[i] in a loop: served from the read-ahead block
        assert weak_of(store[i]) == weak_of(state(0))
    assert int(store[69].time) == 69 and traces(state(0), store[69]) == 1


def test_small_store_loop_places_each_record(path):
    s = pytreestore.create(path, state(0))
    s.extend(state(i) for i in range(5))  # fewer than JIT_MIN: placed record by record
    for i in range(5):
        assert_like(s[i], state(i))


def test_load_records_and_batches(store):
    batch = store.load(slice(0, 4))
    assert_like(batch, jax.tree.map(lambda *x: jnp.stack(x), *[state(i) for i in range(4)]))
    for i, record in enumerate(store.records()):
        if i in (0, 79):
            assert_like(record, state(i))
    for b in store.batches(8):
        assert weak_of(b) == weak_of(state(0))


def test_sharded_and_pmap_loads(store):
    mesh = cpu_mesh((1,), ("data",))
    sharded = store.load(slice(0, 8), sharding=NamedSharding(mesh, P("data")))
    assert weak_of(sharded) == weak_of(state(0))
    assert weak_of(store.load(slice(0, 8), pmap_devices=jax.devices())) == weak_of(state(0))
    assert weak_of(store.load(3, device=jax.devices()[0])) == weak_of(state(0))


def test_map_sees_weak_leaves(store):
    bf16 = jnp.ones((), jnp.bfloat16)
    out = store.map(lambda s: (s.scale * bf16, s.pos * bf16), batch_size=8)
    assert out[0].dtype == jnp.bfloat16  # weak float32 * bfloat16 -> bfloat16, as before
    assert out[1].dtype == jnp.float32


@pytest.mark.parametrize("batch_size", [8, 7])  # 7: the last batch is cut on the host
def test_map_keeps_the_results_weak_types_in_memory_and_in_an_out_store(store, path, batch_size):
    def fn(s):
        return {"t": s.time + 1, "p": s.pos * 2, "w": s.scale * jnp.float32(2)}

    direct = jax.vmap(fn)(store.load(slice(0, 8)))
    assert weak_of(direct) == [False, True, False]  # p: strong; t: weak; w: strong
    assert weak_of(store.map(fn, batch_size=batch_size)) == weak_of(direct)
    out = store.map(fn, batch_size=batch_size, out=f"{path}-out")
    assert weak_of(pytreestore.open(f"{path}-out")[3]) == weak_of(direct)
    assert traces(jax.tree.map(lambda x: x[3], direct), out[3]) == 1


def test_promotion_as_before_the_store(store):
    bf16 = jnp.ones(2, jnp.bfloat16)
    assert (store[3].scale * bf16).dtype == (state(3).scale * bf16).dtype == jnp.bfloat16


def test_python_scalars_read_back_as_jit_sees_them(backend, path):
    record = {"t": 3, "x": 0.25, "z": 1 + 2j, "b": True, "a": np.float32(1)}
    with pytreestore.create(path, record, backend=backend) as s:
        s.append(record)
    loaded = pytreestore.open(path, backend=backend)[0]
    assert weak_of(loaded) == [False, False, True, True, True]  # a, b strong; t, x, z weak
    assert traces(record, loaded) == 1


def test_as_numpy_has_no_weak_type(store):
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(store.load(2, as_numpy=True)))


def test_declared_weak_type_wins(path):
    s = pytreestore.create(path, {"w": 0.5, "s": np.float32(0)})
    s.append({"w": np.float32(1), "s": 2.0})  # strong into weak, weak into strong
    assert weak_of(s[0]) == [False, True]  # s, w
    assert float(s[0]["w"]) == 1.0 and float(s[0]["s"]) == 2.0


# ---- ragged stores: every kind ------------------------------------------------------------------

KINDS = {
    "ragged list": (
        lambda i: {"p": [{"a": np.int32(j), "b": 0.5 * j} for j in range(i % 3)], "n": i},
        {"ragged": ["['p']"]},
    ),
    "leading axis": (
        lambda i: {"x": jnp.arange(i % 3 + 1) * 0.5, "n": i},  # a weak array, ragged axis
        {"ragged": ["['x']"]},
    ),
    "optional": (
        lambda i: {"o": {"v": 0.5 * i} if i % 2 else None, "n": np.int32(i)},
        {"optional": ["['o']"]},
    ),
    "nested ragged": (
        lambda i: {"p": [{"q": [0.5 * k for k in range(j + 1)]} for j in range(i % 3)]},
        {"ragged": ["['p']", "['p'][*]['q']"]},
    ),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_ragged_reads_keep_weak_type(kind, backend, path):
    make, declared = KINDS[kind]
    with pytreestore.create(path, make(1), backend=backend, **declared) as s:
        s.extend(make(i) for i in range(70))
    s = pytreestore.open(path, backend=backend)
    for i in (1, 2, 5):
        assert_like(s[i], make(i))
    for i in range(6, 70):  # the read-ahead block, its records gathered on the device
        assert weak_of(s[i]) == weak_of(make(i))
    assert traces(make(68), s[68]) == 1
    for i, record in enumerate(s.records()):
        assert weak_of(record) == weak_of(make(i))
    want = pytreestore.stack([make(i) for i in range(4)], **declared)
    batch, mask = s.load(slice(0, 4))
    assert weak_of(batch) == [c.weak_type for c in s.schema.columns]
    assert not any(weak_of(mask))
    values, segments = s.load(slice(0, 4), ragged="segments")
    assert weak_of(values) == weak_of(batch) and not any(weak_of(segments))
    assert jax.tree.structure(batch) == jax.tree.structure(want[0])


# ---- stored formats ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_golden_weak_store(backend, tmp_path):
    shutil.copytree(make_golden.CURRENT / "weak", tmp_path / "weak")
    s = pytreestore.open(tmp_path / "weak", backend=backend)
    for i in range(3):
        assert_like(s[i], make_golden.weak_record(i))
    schema = json.loads((tmp_path / "weak" / "zarr.json").read_text())
    columns = schema["attributes"]["pytreestore"]["columns"]
    assert {c["path"]: c.get("weak_type", False) for c in columns} == {
        "['gain']": True,
        "['n']": False,
        "['scale']": True,
        "['time']": True,
        "['x']": False,
    }


def test_older_stores_read_strongly_typed(tmp_path):
    shutil.copytree(make_golden.GOLDEN / "format-2" / "seed", tmp_path / "seed")
    s = pytreestore.open(tmp_path / "seed")
    assert not any(c.weak_type for c in s.schema.columns) and not any(weak_of(s[0]))


def test_evolve_and_copy_keep_weak_type(path):
    s = pytreestore.create(path, {"t": 0, "x": np.float32(0)})
    s.extend({"t": i, "x": np.float32(i)} for i in range(3))
    s.evolve(add={"['g']": 0.5, "['h']": np.float32(1)}, rename={"['t']": "['time']"})
    s.append({"time": 3, "x": np.float32(3), "g": 1.5, "h": np.float32(2)})
    s.close()
    pytreestore.copy(path, path + "-copy")
    for store in (pytreestore.open(path), pytreestore.open(path + "-copy")):
        record = store[3]
        assert {k: v.weak_type for k, v in record.items()} == {
            "time": True,
            "x": False,
            "g": True,
            "h": False,
        }
        assert float(store[0]["g"]) == 0.5 and float(record["g"]) == 1.5


def test_stack_keeps_weak_types_as_jnp_stack_does():
    records = [state(i) for i in range(3)]
    stacked = pytreestore.stack(records)
    assert weak_of(stacked) == weak_of(jax.tree.map(lambda *x: jnp.stack(x), *records))
    make, declared = KINDS["ragged list"]
    batch, mask = pytreestore.stack([make(i) for i in range(1, 4)], **declared)
    assert {k: is_weak(v) for k, v in batch["p"].items()} == {"a": False, "b": True}
    assert is_weak(batch["n"]) and not any(weak_of(mask))
