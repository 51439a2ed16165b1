"""Recording a compiled loop (pytreestore._write.recorder, issue 46): a recorder's append and
wrapped step in a Python loop of jitted steps, ``record_scan``, and what they promise: the
store holds the loop's states exactly (values and classes), in order, on every backend and
kind of store; ``close()`` waits; a failed background write is raised, never lost; bad input
is refused before anything is written."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._tree.packing import Layout
from tests.conftest import BACKENDS, diagonal
from tests.parity import kinds


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Sim:
    pos: dict[str, Any]  # float32[3] each
    t: Any  # int32[]
    ok: Any  # bool[]
    key: Any  # a typed PRNG key


def _start() -> Sim:
    return Sim(
        {"a": jnp.arange(3, dtype=jnp.float32), "b": jnp.ones(3, jnp.float32)},
        jnp.int32(0),
        jnp.bool_(True),
        jax.random.key(0),
    )


def _step(s: Sim) -> Sim:
    pos = {"a": jnp.sin(s.pos["a"]) + s.t, "b": s.pos["b"] * 1.5}
    return Sim(pos, s.t + 1, (s.t % 3) != 0, jax.random.split(s.key)[0])


_jstep = jax.jit(_step)


def _states(n: int) -> list[Sim]:
    state, out = _start(), []
    for _ in range(n):
        state = _jstep(state)
        out.append(state)
    return out


def _assert_holds(path: str, states: list[Any]) -> None:
    """The store at ``path`` holds ``states``, in order, exactly (values and classes)."""
    with pytreestore.open(path) as reader:
        assert len(reader) == len(states)
        for i in (0, len(states) // 2, len(states) - 1):
            got, want = reader[i], states[i]
            assert jax.tree.structure(got) == jax.tree.structure(want)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                if jnp.issubdtype(w.dtype, jax.dtypes.extended):
                    g, w = jax.random.key_data(g), jax.random.key_data(w)
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_a_recorders_appends_are_the_loops_states(path, backend):
    states = _states(11)
    store = pytreestore.create(path, _start(), backend=backend)
    with store.recorder(block=4) as rec:
        state = _start()
        for _ in range(11):
            state = _jstep(state)
            rec.append(state)
        assert len(rec) == 11
    assert len(store) == 11
    store.close()
    _assert_holds(path, states)


def test_a_wrapped_step_records_its_results(path, backend):
    states = _states(9)
    store = pytreestore.create(path, _start(), backend=backend)
    rec = store.recorder(block=4)
    step = rec.wrap(_step)
    state = _start()
    for _ in range(9):
        state = step(state)
    store.close()  # closes the recorder first: its last, partial block is written
    _assert_holds(path, states)


def test_record_scan_records_every_step_and_returns_the_last_carry(path, backend):
    states = _states(10)
    store = pytreestore.create(path, _start(), backend=backend)
    end = pytreestore.record_scan(store, _step, _start(), 10, block=4)  # 4 + 4 + 2
    assert int(end.t) == 10
    np.testing.assert_array_equal(end.pos["a"], states[-1].pos["a"])
    store.close()
    _assert_holds(path, states)


def test_record_scan_records_what_record_picks(path):
    store = pytreestore.create(path, {"t": jnp.int32(0), "b": jnp.zeros(3)})
    pytreestore.record_scan(
        store, _step, _start(), 5, block=2, record=lambda s: {"t": s.t, "b": s.pos["b"]}
    )
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)
    np.testing.assert_array_equal(got["t"], np.arange(1, 6))
    np.testing.assert_array_equal(got["b"][-1], np.full(3, 1.5**5, np.float32))


def test_record_scan_traces_a_step_once_for_its_checks(path):
    """A second record_scan of the same step and carry shapes traces nothing: its checks
    (the carry kept, the records' layout) are cached, as its compiled blocks are (a guard:
    JAX's own cache of ``eval_shape`` kept this true before the checks were cached)."""
    traces = []

    def step(s: Any) -> Any:
        traces.append(1)
        return {"t": s["t"] + 1}

    store = pytreestore.create(path, {"t": jnp.int32(0)})
    end = pytreestore.record_scan(store, step, {"t": jnp.int32(0)}, 4, block=2)
    before = len(traces)
    pytreestore.record_scan(store, step, end, 4, block=2)
    assert len(traces) == before
    store.close()
    np.testing.assert_array_equal(pytreestore.open(path).load(as_numpy=True)["t"], np.arange(1, 9))


def test_records_land_in_order_across_appends_extends_and_scans(path):
    store = pytreestore.create(path, {"t": jnp.int32(0)})
    rec = store.recorder(block=3)
    for i in range(4):
        rec.append({"t": jnp.int32(i)})
    rec.extend({"t": jnp.arange(4, 9, dtype=jnp.int32)})
    rec.append({"t": jnp.int32(9)})
    rec.flush()
    pytreestore.record_scan(store, lambda s: {"t": s["t"] + 1}, {"t": jnp.int32(9)}, 3)
    store.close()
    np.testing.assert_array_equal(pytreestore.open(path).load(as_numpy=True)["t"], np.arange(13))


@pytest.mark.parametrize(("name", "backend"), diagonal(kinds.KINDS, BACKENDS))
def test_every_kind_of_store_takes_recorded_records(tmp_path, name, backend):
    """Records of every kind, their lists' lengths and optional parts varying from record to
    record: each layout is a block of its own, and every record comes back as appended."""
    records = [jax.tree.map(jnp.asarray, r) for r in kinds.records(name, 7)]
    store = kinds.create(tmp_path / "s", name, backend)
    with store.recorder(block=3) as rec:
        for r in records:
            rec.append(r)
    store.close()
    with pytreestore.open(tmp_path / "s") as reader:
        for i, want in enumerate(records):
            got = reader.load(i, as_numpy=True)
            assert jax.tree.structure(got) == jax.tree.structure(want), i
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                np.testing.assert_array_equal(g, np.asarray(w))


@pytest.mark.parametrize("name", kinds.KINDS)
def test_record_scan_on_every_kind_of_store(tmp_path, name):
    """A scan's records have fixed shapes: in a ragged store each is a record whose lists
    have the scan's lengths, in an optional store one whose optional parts are there."""
    start = jax.tree.map(jnp.asarray, kinds.like(name))

    def step(s: Any) -> Any:
        return jax.tree.map(lambda x: x + 1, s)

    store = kinds.create(tmp_path / "s", name, "tensorstore")
    pytreestore.record_scan(store, step, start, 5, block=2)
    store.close()
    with pytreestore.open(tmp_path / "s") as reader:
        got = reader.load(4, as_numpy=True)
    want = jax.tree.map(lambda x: np.asarray(x) + 5, start)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(g, w)


def test_close_waits_for_every_block(path):
    store = pytreestore.create(path, {"x": jnp.zeros(64)})
    rec = store.recorder(block=8)
    for i in range(101):
        rec.append({"x": jnp.full(64, i, jnp.float32)})
    rec.close()
    assert len(store) == 101  # written (buffered in the store), before the store commits
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)["x"]
    np.testing.assert_array_equal(got[:, 0], np.arange(101, dtype=np.float32))
    with pytest.raises(errors.ClosedStoreError, match=r"recorder of store .* is closed"):
        rec.append({"x": jnp.zeros(64)})


def test_donated_and_deleted_states_are_recorded(path):
    """A record appended survives the caller donating or deleting its arrays."""
    store = pytreestore.create(path, {"x": jnp.zeros(8)})
    step = jax.jit(lambda s: {"x": s["x"] + 1}, donate_argnums=0)
    rec = store.recorder(block=4)
    state = {"x": jnp.zeros(8)}
    for _ in range(6):
        state = step(state)
        rec.append(state)  # the next step donates it
    state["x"].delete()
    wrapped = rec.wrap(lambda s: {"x": s["x"] * 2}, donate_argnums=0)
    state = wrapped({"x": jnp.ones(8)})
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)["x"][:, 0]
    np.testing.assert_array_equal(got, [1, 2, 3, 4, 5, 6, 2])


def test_a_deleted_array_is_refused_by_name(path):
    store = pytreestore.create(path, {"x": jnp.zeros(2), "y": jnp.zeros(2)})
    rec = store.recorder()
    rec.append({"x": jnp.zeros(2), "y": jnp.zeros(2)})
    y = jnp.ones(2)
    y.delete()
    with pytest.raises(errors.DeletedArrayError, match=re.escape("['y']")):
        rec.append({"x": jnp.zeros(2), "y": y})
    rec.close()
    assert len(store) == 1


def test_a_refused_block_is_raised_with_the_records_not_written(tmp_path):
    """A ragged store checks a block as it is written: the refusal is raised by the next
    call, naming the records; those before it are in the store, none after it."""
    store = kinds.create(tmp_path / "s", "ragged_list", "tensorstore")
    good = [jax.tree.map(jnp.asarray, r) for r in kinds.records("ragged_list", 4)]
    bad = good[0].replace(x=jnp.zeros(5, jnp.float32))  # the store's x is float32[4]
    rec = store.recorder(block=2)
    for r in good:
        rec.append(r)
    rec.append(bad)
    rec.append(good[0])
    with pytest.raises(errors.SchemaMismatchError, match="could not write its records 4 to 4"):
        rec.flush()
    with pytest.raises(errors.ClosedStoreError, match="stopped at the failure"):
        rec.append(good[0])
    store.close()  # the recorder reported its failure: it closes with the store
    assert len(pytreestore.open(tmp_path / "s")) == 4


def test_a_storage_failure_is_raised_then_retried(path, backend):
    store = pytreestore.create(path, {"n": jnp.int32(0)}, chunk_records=4, backend=backend)
    fails = [1]
    real = store._core.backend.write

    def write(keys, start, blocks):
        if fails[0] > 0:
            fails[0] -= 1
            raise errors.StorageError("No space left on device (injected); retry later")
        return real(keys, start, blocks)

    store._core.backend.write = write  # type: ignore[method-assign]
    rec = store.recorder(block=4)
    raised = 0
    for i in range(24):
        try:
            rec.append({"n": jnp.int32(i)})
        except errors.StorageError as err:
            raised += 1
            assert "injected" in str(err)
            rec.append({"n": jnp.int32(i)})
    try:
        rec.close()
    except errors.StorageError:
        raised += 1
        rec.close()
    assert raised == 1 and fails == [0]
    store.close()
    np.testing.assert_array_equal(pytreestore.open(path).load(as_numpy=True)["n"], np.arange(24))


def test_bad_input_is_refused_before_anything_is_written(path):
    store = pytreestore.create(path, {"x": jnp.zeros(3)})
    with pytest.raises(errors.SchemaMismatchError):
        pytreestore.record_scan(store, lambda s: s, {"x": jnp.zeros(4)}, 3)
    with pytest.raises(errors.ArgumentError, match="step must return a carry of the structure"):
        pytreestore.record_scan(store, lambda s: {"x": s["x"][:2]}, {"x": jnp.zeros(3)}, 3)
    with pytest.raises(errors.ArgumentError, match="steps must be an int >= 0"):
        pytreestore.record_scan(store, lambda s: s, {"x": jnp.zeros(3)}, -1)
    with pytest.raises(errors.ArgumentError, match="block must be a positive int"):
        store.recorder(block=0)
    rec = store.recorder()
    with pytest.raises(errors.SchemaMismatchError):
        rec.append({"x": jnp.zeros(2)})
    with pytest.raises(errors.ArgumentError, match=re.escape("inside jax.jit")):
        jax.jit(lambda x: rec.append({"x": x}))(jnp.zeros(3))
    rec.close()
    store.close()
    assert len(pytreestore.open(path)) == 0
    with pytest.raises(errors.ReadOnlyError):
        pytreestore.open(path).recorder()


def test_a_layout_packs_one_row_of_bytes_and_unpacks_exactly():
    tree = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.int32(7),
        "c": np.array([True, False]),
        "d": np.float16(-0.0),
        "e": np.array([np.nan, np.inf], np.float32),
        "f": np.array([-128, 127], np.int8),
        "g": np.array([1, -2], ml_dtypes.bfloat16),
    }
    layout = Layout.of(tree)
    assert layout.width == (13,)  # words: a 6, b 1, c 1, d 1, e 2, f 1, g 1
    rows = [np.stack([np.asarray(r)] * 2) for r in layout.pack(jax.tree.leaves(tree))]
    back = layout.unpack(rows, 2)
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(tree), strict=True):
        assert got.dtype == np.asarray(want).dtype
        assert got.tobytes() == np.stack([want, want]).tobytes()  # bit for bit
