"""Appending jax.Arrays without waiting for them (pytreestore._tree.device, issue 32): the
values fetched when their chunk is written are exact, and an array deleted (donated) before
that is refused by name, never read, with the records before it kept."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._tree.device import DeletedLeaf, DeviceLeaves, fetch


def _like():
    return {"x": np.zeros(3, np.float32), "n": np.int32(0), "host": np.float64(0)}


@jax.jit
def _step(state):
    return {"x": state["x"] * 2 + 1, "n": state["n"] + 1}


def _expected(count: int) -> dict[str, np.ndarray]:
    x, rows = np.zeros(3, np.float32), []
    for _ in range(count):
        x = x * 2 + 1
        rows.append(np.minimum(x, 1e30))
    return {"x": np.stack(rows), "n": np.arange(1, count + 1, dtype=np.int32)}


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
@pytest.mark.parametrize("chunk", [4, 1000])
def test_jitted_states_come_back_exact(tmp_path, backend, chunk):
    path = tmp_path / "s"
    store = pytreestore.create(path, _like(), chunk_records=chunk, backend=backend)
    state = {"x": jnp.zeros(3, jnp.float32), "n": jnp.int32(0)}
    for i in range(30):
        state = _step(state)
        state = {"x": jnp.minimum(state["x"], 1e30), "n": state["n"]}
        store.append({**state, "host": float(i)})  # device leaves and a host leaf
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)
    want = _expected(30)
    np.testing.assert_array_equal(got["x"], want["x"])
    np.testing.assert_array_equal(got["n"], want["n"])
    np.testing.assert_array_equal(got["host"], np.arange(30, dtype=np.float64))


def test_device_arrays_of_another_dtype_are_cast_at_once(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"x": np.zeros(2, np.float32)})
    store.append({"x": jnp.arange(2, dtype=jnp.int32)})  # same_kind-castable: copied now
    with pytest.raises(errors.SchemaMismatchError, match=r"\['x'\].*float32\[2\]"):
        store.append({"x": jnp.arange(3, dtype=jnp.float32)})
    store.close()
    np.testing.assert_array_equal(pytreestore.open(tmp_path / "s")[0]["x"], [0, 1])


def test_a_donated_state_is_refused_at_the_next_append(tmp_path):
    step = jax.jit(lambda s: {"x": s["x"] + 1, "n": s["n"] + 1}, donate_argnums=0)
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.zeros(3, np.float32), "n": np.int32(0)})
    state = step({"x": jnp.zeros(3, jnp.float32), "n": jnp.int32(0)})
    store.append({"x": np.ones(3, np.float32), "n": np.int32(100)})  # a host record first
    store.append(state)
    state = step(state)  # donates the state appended just before
    if not jax.tree.leaves(store._core.writer.tables[None].filler.device.kept)[2].is_deleted():
        pytest.skip("this JAX backend did not donate the buffers")
    with pytest.raises(errors.DeletedArrayError) as info:
        store.append(state)
    text = str(info.value)
    assert "record 1" in text and "donate" in text and "jnp.copy" in text
    assert len(store) == 1  # the donated record dropped, this call's not appended
    store.append(jax.tree.map(jnp.copy, state))  # the documented fix
    step(state)
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)
    np.testing.assert_array_equal(got["n"], [100, 2])
    np.testing.assert_array_equal(got["x"][1], [2, 2, 2])


def test_an_array_deleted_before_the_append_is_refused(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"x": np.zeros(3, np.float32)})
    x = jnp.ones(3, jnp.float32)
    x.delete()
    with pytest.raises(errors.DeletedArrayError, match="Nothing was appended"):
        store.append({"x": x})
    assert len(store) == 0
    store.close()


def test_an_array_deleted_before_flush_drops_it_and_what_follows(tmp_path):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.zeros(3, np.float32)}, chunk_records=100)
    arrays = [jnp.full(3, i, jnp.float32) for i in range(5)]
    for a in arrays:
        store.append({"x": a})
    arrays[2].delete()
    with pytest.raises(errors.DeletedArrayError, match=r"record 2.*3 record\(s\) from 2 on"):
        store.flush()
    assert len(store) == 2 and store.committed == 2  # those before it: committed
    store.append({"x": np.full(3, 9, np.float32)})
    store.append({"x": jnp.full(3, 10, jnp.float32)})  # kept again, and fetched
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)["x"][:, 0]
    np.testing.assert_array_equal(got, [0, 1, 9, 10])


def test_an_array_deleted_in_a_chunk_handed_over_cuts_there(tmp_path):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.zeros(3, np.float32)}, chunk_records=4)
    arrays = [jnp.full(3, i, jnp.float32) for i in range(4)]
    for a in arrays:
        store.append({"x": a})
    arrays[1].delete()  # not the last record's: the next append's watch does not see it
    store.append({"x": np.full(3, 4, np.float32)})  # hands the chunk over
    with pytest.raises(errors.DeletedArrayError, match=r"record 1.*4 record\(s\) from 1 on"):
        store.flush()
    assert len(store) == 1 and store.committed == 1
    for i in range(1, 6):
        store.append({"x": np.full(3, 10 + i, np.float32)})
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)["x"][:, 0]
    np.testing.assert_array_equal(got, [0, 11, 12, 13, 14, 15])


def test_close_commits_the_records_before_a_deleted_array(tmp_path):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.zeros(3, np.float32)}, chunk_records=100)
    arrays = [jnp.full(3, i, jnp.float32) for i in range(4)]
    for a in arrays:
        store.append({"x": a})
    arrays[3].delete()
    with pytest.raises(errors.DeletedArrayError, match="record 3"):
        store.close()
    assert store.closed
    got = pytreestore.open(path).load(as_numpy=True)["x"][:, 0]
    np.testing.assert_array_equal(got, [0, 1, 2])


def test_extend_of_device_arrays_copies_them_at_once(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"x": np.zeros(2, np.float32)}, chunk_records=3)
    arrays = [jnp.full(2, i, jnp.float32) for i in range(7)]
    store.extend({"x": a} for a in arrays)
    for a in arrays:
        a.delete()  # extend copied them: nothing is kept
    store.close()
    got = pytreestore.open(tmp_path / "s").load(as_numpy=True)["x"][:, 0]
    np.testing.assert_array_equal(got, np.arange(7))


def test_ragged_stores_copy_device_leaves_at_once(tmp_path):
    path = tmp_path / "s"
    store = pytreestore.create(
        path, {"p": [np.float32(0)], "v": np.zeros(2, np.float32)}, ragged=["['p']"]
    )
    for i in range(5):
        v = jnp.full(2, i, jnp.float32)
        store.append({"p": [jnp.float32(i)] * i, "v": v})
        v.delete()
    store.close()
    got = pytreestore.open(path)
    assert [len(r["p"]) for r in got] == list(range(5))
    np.testing.assert_array_equal(got.load(as_numpy=True, ragged="pad")[0]["v"][:, 0], np.arange(5))


def test_fetch_fills_rows_in_order_and_names_a_deleted_one():
    leaves = DeviceLeaves()
    arrays = [jnp.full(2, i, jnp.int32) for i in range(4)]
    for row, a in enumerate(arrays):
        leaves.keep(row, 0, a)
        leaves.arrived(row, leaves.kept[-1])
    arrays[2].delete()
    buf = np.zeros((4, 2), np.int32)
    kept = leaves.take()
    with pytest.raises(DeletedLeaf) as info:
        fetch([buf], kept, [".x"], 0)
    assert info.value.row == 2
    np.testing.assert_array_equal(buf[:2, 0], [0, 1])


def test_forget_drops_a_refused_record_and_moves_the_watch_back():
    leaves = DeviceLeaves()
    first, second = jnp.zeros(1), jnp.ones(1)
    leaves.keep(0, 0, first)
    leaves.arrived(0, leaves.kept[0])
    leaves.keep(1, 0, second)
    leaves.arrived(1, leaves.kept[1])
    leaves.forget(1)
    assert leaves.kept == [(0, 0, first)] and leaves.watch == (0, 0, first)
    first.delete()
    leaves.keep(1, 0, second)
    with pytest.raises(DeletedLeaf) as info:
        leaves.arrived(1, leaves.kept[1])
    assert info.value.row == 0


def test_stacked_fetch_of_an_accelerator_fills_every_row_exactly(monkeypatch):
    """The path of arrays off the host (columns stacked on their device, groups padded),
    forced here on CPU; a deleted array falls back to the in-order fetch, which names it."""
    monkeypatch.setattr("pytreestore._tree.device._on_host", lambda leaf: False)
    monkeypatch.setattr("pytreestore._tree.device.STACK", 8)
    kept = [(r, 0, jnp.full(3, r, jnp.float32)) for r in range(21)]  # stacked
    kept += [(r, 1, jnp.int8(r)) for r in range(0, 14, 2)]  # 7: one by one
    buffers = [np.zeros((21, 3), np.float32), np.zeros(21, np.int8)]
    fetch(buffers, kept, [".a", ".b"], 0)
    np.testing.assert_array_equal(buffers[0][:, 2], np.arange(21))
    evens = (np.arange(21) % 2 == 0) & (np.arange(21) < 14)
    np.testing.assert_array_equal(buffers[1], np.where(evens, np.arange(21), 0))
    kept[13][2].delete()
    with pytest.raises(DeletedLeaf) as info:
        fetch([np.zeros((21, 3), np.float32), np.zeros(21, np.int8)], kept, [".a", ".b"], 0)
    assert (info.value.row, info.value.column) == (13, 0)
