"""Appending jax.Arrays without waiting for them (pytreestore._tree.device, issues 32 and 44):
an append that returned keeps its record whatever the caller does with its arrays afterwards
(a step donating them, ``.delete()``), the values come back exact, an array that cannot be
fetched (a failed computation) drops exactly the records the error names, and one column's
arrays on several devices are stored like any others.

Every test runs on the path of CPU arrays (copied into their rows at ``append``) and on the
accelerator's path (copied on their device at ``append``, fetched when the chunk is written),
forced here on the CPU devices."""

from __future__ import annotations

import re
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import pytreestore
from pytreestore import errors
from pytreestore._runtime import RUNTIME
from pytreestore._tree.device import DeviceLeaves, LostLeaf, fetch
from tests.parity import kinds

BACKENDS = ("tensorstore", "ocdbt", "zarr")
PATHS = ("host", "accelerator")


@pytest.fixture(params=PATHS)
def path_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``host``: CPU arrays as they are; ``accelerator``: the accelerator's path forced."""
    if request.param == "accelerator":
        monkeypatch.setattr("pytreestore._tree.device._on_host", lambda leaf: False)
    return request.param


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk", [4, 1000])
def test_jitted_states_come_back_exact(tmp_path, backend, chunk, path_kind):
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk", [4, 1000])
def test_a_donating_loop_keeps_every_record(tmp_path, backend, chunk, path_kind):
    """``store.append(state); state = step(state)`` with the step donating its state: every
    record appended is kept (7787639 dropped all but the first)."""
    step = jax.jit(lambda s: {"x": s["x"] * 0.5 + 1, "n": s["n"] + 1}, donate_argnums=0)
    path = tmp_path / "s"
    store = pytreestore.create(
        path, {"x": np.zeros(3, np.float32), "n": np.int32(0)}, chunk_records=chunk, backend=backend
    )
    state, donated = {"x": jnp.zeros(3, jnp.float32), "n": jnp.int32(0)}, 0
    for _ in range(41):
        store.append(state)
        old, state = state, step(state)
        donated += old["x"].is_deleted()
    store.close()
    assert donated > 0  # the step did donate
    got = pytreestore.open(path).load(as_numpy=True)
    np.testing.assert_array_equal(got["n"], np.arange(41, dtype=np.int32))
    x, want = np.zeros(3, np.float32), []
    for _ in range(41):
        want.append(x)
        x = x * np.float32(0.5) + np.float32(1)
    np.testing.assert_array_equal(got["x"], np.stack(want))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", kinds.KINDS)
def test_arrays_deleted_after_their_append_are_kept(tmp_path, backend, name, path_kind):
    """Every kind of store: a record of device arrays, each deleted once appended, is kept
    exactly (chunks of 4: some written in the background, the last by ``close``)."""
    path = tmp_path / "s"
    want = kinds.records(name, 11)
    store = kinds.create(path, name, backend, chunk_records=4)
    for record in want:
        on_device = jax.tree.map(jnp.asarray, record)
        store.append(on_device)
        for leaf in jax.tree.leaves(on_device):
            leaf.delete()
    store.close()
    got = pytreestore.open(path)
    assert len(got) == 11
    for i, record in enumerate(want):
        kinds.assert_same(jax.tree.map(np.asarray, got[i]), record)


def test_device_arrays_of_another_dtype_are_cast_at_once(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"x": np.zeros(2, np.float32)})
    store.append({"x": jnp.arange(2, dtype=jnp.int32)})  # same_kind-castable: copied now
    with pytest.raises(errors.SchemaMismatchError, match=r"\['x'\].*float32\[2\]"):
        store.append({"x": jnp.arange(3, dtype=jnp.float32)})
    store.close()
    np.testing.assert_array_equal(pytreestore.open(tmp_path / "s")[0]["x"], [0, 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_array_deleted_before_the_append_is_refused(tmp_path, backend, path_kind):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.zeros(3, np.float32)}, backend=backend)
    store.append({"x": jnp.ones(3, jnp.float32)})
    x = jnp.ones(3, jnp.float32)
    x.delete()
    with pytest.raises(errors.DeletedArrayError, match=r"record 1's .*\['x'\].*Nothing was"):
        store.append({"x": x})
    assert len(store) == 1
    store.append({"x": jnp.full(3, 2, jnp.float32)})
    store.close()
    np.testing.assert_array_equal(pytreestore.open(path).load(as_numpy=True)["x"][:, 0], [1, 2])


def test_extend_of_device_arrays_copies_them_at_once(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"x": np.zeros(2, np.float32)}, chunk_records=3)
    arrays = [jnp.full(2, i, jnp.float32) for i in range(7)]
    store.extend({"x": a} for a in arrays)
    for a in arrays:
        a.delete()  # extend copied them: nothing is kept
    store.close()
    got = pytreestore.open(tmp_path / "s").load(as_numpy=True)["x"][:, 0]
    np.testing.assert_array_equal(got, np.arange(7))


# ---- arrays whose computation failed -------------------------------------------------------


def _boom(x: np.ndarray) -> np.ndarray:
    raise ValueError("the step failed")


_slow = jax.jit(lambda m: lax.fori_loop(0, 40, lambda i, v: jnp.tanh(v @ v), m)[0, :3])
_fail = jax.jit(lambda x: jax.pure_callback(_boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x))


@pytest.fixture
def failed() -> Iterator[jax.Array]:
    """A float32[3] array whose computation failed: ``np.asarray`` of it raises. Its input is
    still being computed when it is dispatched, so the failure is found when it is read (a
    dispatch that runs at once, and raises, is tried again)."""
    # on the CPU, also on an accelerator's host: the host path's array
    square = jax.device_put(np.eye(256, dtype=np.float32) * 0.5, jax.devices("cpu")[0])
    for _ in range(20):
        try:
            out = _fail(_slow(square))
        except Exception:  # XLA ran it at once: try again
            continue
        try:
            np.asarray(out)
        except Exception:
            break
    else:
        pytest.fail("no failed computation could be made")
    yield out
    # a good callback, so that JAX's exit does not raise the failed one's error: a new jit
    # each time (a cached one takes a fast path, which leaves the last callback's token)
    ok = jax.jit(lambda x: jax.pure_callback(np.asarray, jax.ShapeDtypeStruct((3,), x.dtype), x))
    np.asarray(ok(jax.device_put(np.ones(3, np.float32), jax.devices("cpu")[0])))


def _full(i: int) -> dict[str, jax.Array]:
    return {"x": jnp.full(3, i, jnp.float32)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_array_on_the_host_path_is_refused_by_its_append(tmp_path, backend, failed):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.zeros(3, np.float32)}, backend=backend)
    store.append(_full(0))
    store.append(_full(1))
    with pytest.raises(errors.DeviceFetchError) as info:
        store.append({"x": failed})
    assert re.search(
        r"record 2's jax.Array at \['x'\].*failed.*Nothing was appended", str(info.value)
    )
    assert len(store) == 2
    for i in range(2, 5):
        store.append(_full(i))
    store.close()
    np.testing.assert_array_equal(pytreestore.open(path).load(as_numpy=True)["x"][:, 0], range(5))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_array_in_the_chunk_being_filled_drops_it_and_what_follows(
    tmp_path, backend, failed, monkeypatch
):
    """Accelerator path: record 2 of 6 fails to fetch; ``flush`` commits records 0-1, says
    that 2-5 were dropped, and the store goes on from record 2 (7787639 committed
    uninitialised rows for 3-5)."""
    monkeypatch.setattr("pytreestore._tree.device._on_host", lambda leaf: False)
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.zeros(3, np.float32)}, backend=backend)
    for i in range(6):
        store.append({"x": failed} if i == 2 else _full(i))
    with pytest.raises(errors.DeviceFetchError) as info:
        store.flush()
    text = str(info.value)
    assert "record 2's jax.Array at ['x'] could not be fetched" in text
    assert "Records 2 to 5 (4 records) were dropped" in text
    assert len(store) == 2 and store.committed == 2
    store.flush()  # nothing left to fail
    assert pytreestore.open(path, backend=backend).committed == 2
    store.append(_full(20))
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)["x"][:, 0]
    np.testing.assert_array_equal(got, [0, 1, 20])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failed_array_in_a_chunk_handed_over_drops_it_and_what_follows(
    tmp_path, backend, failed, monkeypatch
):
    """Accelerator path, chunks of 4: record 2 fails in a chunk written in the background;
    the next call says 2-4 were dropped, keeps 0-1, and the store goes on (7787639 failed
    every call, and kept 0-3 at ``close``)."""
    monkeypatch.setattr("pytreestore._tree.device._on_host", lambda leaf: False)
    path = tmp_path / "s"
    store = pytreestore.create(
        path, {"x": np.zeros(3, np.float32)}, chunk_records=4, backend=backend
    )
    for i in range(5):  # the fifth hands the first chunk over
        store.append({"x": failed} if i == 2 else _full(i))
    with pytest.raises(errors.DeviceFetchError, match=r"Records 2 to 4 \(3 records\) were"):
        store.flush()
    assert len(store) == 2 and store.committed == 2
    for i in range(2, 9):
        store.append(_full(10 + i))
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)["x"][:, 0]
    np.testing.assert_array_equal(got, [0, 1, *range(12, 19)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_column_on_two_devices_is_stored_exactly(tmp_path, backend, path_kind, eight_devices):
    """One column's arrays alternate between two devices (7787639, accelerator path: an
    AssertionError, nothing committed, every later call failing)."""
    path = tmp_path / "s"
    like = {"x": np.zeros(2, np.float32), "n": np.int32(0)}
    store = pytreestore.create(path, like, chunk_records=300, backend=backend)
    for i in range(700):
        device = eight_devices[i % 2]
        x = jax.device_put(np.array([i, -i], np.float32), device)
        store.append({"x": x, "n": jax.device_put(np.int32(i), device)})
    store.close()
    got = pytreestore.open(path).load(as_numpy=True)
    np.testing.assert_array_equal(got["n"], np.arange(700))
    np.testing.assert_array_equal(got["x"][:, 1], -np.arange(700, dtype=np.float32))


# ---- the parts -------------------------------------------------------------------------------


def test_fetch_fills_rows_in_order_and_names_a_deleted_one():
    arrays = [jnp.full(2, i, jnp.int32) for i in range(4)]
    kept = [(row, 0, a) for row, a in enumerate(arrays)]
    arrays[2].delete()
    buf = np.zeros((4, 2), np.int32)
    with pytest.raises(LostLeaf) as info:
        fetch([buf], kept)
    assert (info.value.row, info.value.cause) == (2, None)
    np.testing.assert_array_equal(buf[:2, 0], [0, 1])


def test_own_copies_a_record_on_the_accelerator_path(monkeypatch):
    """The store's copies replace the caller's arrays: deleting those loses nothing."""
    monkeypatch.setattr("pytreestore._tree.device._on_host", lambda leaf: False)
    leaves, first, second = DeviceLeaves(), jnp.zeros(2), jnp.ones(2)
    leaves.keep(0, 0, first)
    leaves.keep(0, 1, second)
    leaves.own(0, [np.zeros((1, 2)), np.zeros((1, 2))])
    assert [k[2] is a for k, a in zip(leaves.kept, (first, second))] == [False, False]
    first.delete()
    second.delete()
    buffers = [np.full((1, 2), 9.0), np.full((1, 2), 9.0)]
    fetch(buffers, leaves.take())
    assert buffers[0].tolist() == [[0, 0]] and buffers[1].tolist() == [[1, 1]]


def test_stacked_fetch_fills_every_row_exactly(monkeypatch, eight_devices):
    """Columns stacked on their device (groups padded; one column on two devices, stacked
    per device), then the rest one by one; a deleted array is found in row order."""
    monkeypatch.setattr(RUNTIME.writes, "device_stack", 8)
    kept = [
        (r, 0, jax.device_put(jnp.full(3, r, jnp.float32), eight_devices[r % 2])) for r in range(21)
    ]
    kept += [(r, 1, jnp.int8(r)) for r in range(0, 14, 2)]  # 7: one by one
    buffers = [np.zeros((21, 3), np.float32), np.zeros(21, np.int8)]
    fetch(buffers, kept)
    np.testing.assert_array_equal(buffers[0][:, 2], np.arange(21))
    evens = (np.arange(21) % 2 == 0) & (np.arange(21) < 14)
    np.testing.assert_array_equal(buffers[1], np.where(evens, np.arange(21), 0))
    kept[13][2].delete()
    with pytest.raises(LostLeaf) as info:
        fetch([np.zeros((21, 3), np.float32), np.zeros(21, np.int8)], kept)
    assert (info.value.row, info.value.column) == (13, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fetch_interrupted_by_ctrl_c_is_done_again_by_the_next_call(
    tmp_path, backend, monkeypatch
):
    """Accelerator path: a KeyboardInterrupt while ``flush`` fetches the chunk being filled
    left its arrays taken and its rows unfilled, and ``close`` committed them uninitialised."""
    from pytreestore._write import background as handoff

    monkeypatch.setattr("pytreestore._tree.device._on_host", lambda leaf: False)
    calls = []

    def interrupted_once(buffers, kept):
        calls.append(len(kept))
        if len(calls) == 1:
            raise KeyboardInterrupt
        fetch(buffers, kept)

    monkeypatch.setattr(handoff, "fetch", interrupted_once)
    path = tmp_path / "s"
    store = pytreestore.create(
        path, {"x": np.zeros(3, np.float32)}, chunk_records=8, backend=backend
    )
    for i in range(5):
        store.append(_full(i))
    with pytest.raises(KeyboardInterrupt):
        store.flush()
    store.close()
    assert calls == [5, 5]
    np.testing.assert_array_equal(pytreestore.open(path).load(as_numpy=True)["x"][:, 0], range(5))
