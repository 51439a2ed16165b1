"""Read-ahead blocks (``pytreestore/_read/ahead.py``): ``store[i]`` in a loop and record
iteration serve records from a block read once, exactly as reading each record alone would,
on both backends."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore._read import ahead as _ahead
from pytreestore._runtime import RUNTIME
from pytreestore.errors import StoreReplacedError, X64DisabledError
from tests.reads import count_reads

N = 300


class Pose(NamedTuple):
    x: Any
    n: Any


def _record(i: int) -> dict[str, Any]:
    return {
        "pose": Pose(np.arange(3, dtype=np.float32) + i, np.int32(i)),
        "grid": np.full((2, 2), i % 7, np.uint8),
        "flag": np.bool_(i % 2),
    }


def _check(record: Any, i: int) -> None:
    assert isinstance(record["pose"], Pose)
    np.testing.assert_array_equal(np.asarray(record["pose"].x), np.arange(3) + i)
    assert int(record["pose"].n) == i
    np.testing.assert_array_equal(np.asarray(record["grid"]), np.full((2, 2), i % 7))
    assert bool(record["flag"]) == bool(i % 2)


@pytest.fixture
def store(backend: str, tmp_path: Path) -> Any:
    path = tmp_path / "s"
    with pytreestore.create(path, _record(0), backend=backend, chunk_records=64) as s:
        s.extend(_record(i) for i in range(N))
    reader = pytreestore.open(path, backend=backend, cache_bytes=0)  # reads counted
    yield reader
    reader.close()


def test_block_size_is_a_power_of_two_within_bounds() -> None:
    assert _ahead.block_size(1) == RUNTIME.reads.ahead_max_records
    assert _ahead.block_size(14_500) == 1024
    assert _ahead.block_size(RUNTIME.caches.ahead_block_bytes + 1) == 1
    assert _ahead.block_size(0) == RUNTIME.reads.ahead_max_records


@pytest.mark.parametrize("as_numpy", [True, False])
def test_a_loop_of_store_i_reads_blocks_and_returns_every_record(
    store: Any, as_numpy: bool
) -> None:
    calls = count_reads(store)
    for i in range(N):
        _check(store.load(i, as_numpy=as_numpy), i)
    # record 0 alone, then one block from record 1 (the block holds the rest)
    assert len(calls) == 2


def test_random_reads_read_each_record_alone(store: Any) -> None:
    calls = count_reads(store)
    order = [5, 200, 17, 260, 3, 99]
    for i in order:
        _check(store.load(i, as_numpy=True), i)
    assert len(calls) == len(order)


def test_negative_indices_and_a_block_cut_at_the_end(store: Any) -> None:
    for i in range(-3, 0):
        _check(store.load(i, as_numpy=True), N + i)
    with pytest.raises(IndexError):
        store.load(N, as_numpy=True)


def test_a_record_from_a_block_is_a_copy(store: Any) -> None:
    first = store.load(10, as_numpy=True)
    second = store.load(11, as_numpy=True)  # from the block read at 11
    second["pose"].x[:] = -1
    second["grid"][:] = 99
    _check(store.load(12, as_numpy=True), 12)
    _check(store.load(11, as_numpy=True), 11)  # re-read alone: not sequential
    _check(first, 10)


def test_columns_and_placements_do_not_share_a_block(store: Any) -> None:
    store.load(0, as_numpy=True)
    store.load(1, as_numpy=True)  # a block of every column, as numpy
    only = store.load(2, columns="['grid']", as_numpy=True)
    assert only["pose"] == Pose(None, None) and only["flag"] is None
    np.testing.assert_array_equal(only["grid"], np.full((2, 2), 2))
    placed = store.load(3)
    assert isinstance(placed["grid"], jax.Array)
    _check(placed, 3)


def test_iteration_places_blocks_and_takes_each_record_in_one_call(store: Any) -> None:
    records = list(store)
    assert len(records) == N
    for i, record in enumerate(records):
        _check(record, i)
        assert isinstance(record["pose"].x, jax.Array)
    assert [r["pose"].n.item() for r in store.records(as_numpy=True)] == list(range(N))


def test_iteration_of_fewer_records_than_a_compiled_block(tmp_path: Path) -> None:
    with pytreestore.create(tmp_path / "s", _record(0)) as s:
        s.extend(_record(i) for i in range(RUNTIME.reads.ahead_jit_min - 1))
        got = list(s)
    assert len(got) == RUNTIME.reads.ahead_jit_min - 1
    for i, record in enumerate(got):
        _check(record, i)


def test_an_evolved_schema_misses_the_block(tmp_path: Path) -> None:
    with pytreestore.create(tmp_path / "s", {"a": np.int32(0)}) as s:
        s.extend({"a": np.int32(i)} for i in range(100))
        assert [s.load(i, as_numpy=True)["a"].item() for i in range(3)] == [0, 1, 2]
        s.evolve(add={"['b']": np.float32(0.5)})
        got = s.load(3, as_numpy=True)  # follows 2, but the schema is new
        assert got["a"].item() == 3 and got["b"].item() == 0.5


def test_a_replaced_store_is_refused_on_a_block_hit(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with pytreestore.create(path, {"a": np.int32(0)}) as s:
        s.extend({"a": np.int32(i)} for i in range(100))
    reader = pytreestore.open(path)
    reader.load(0, as_numpy=True)
    reader.load(1, as_numpy=True)  # the block [1, 100) is in memory now
    with pytreestore.create(path, {"a": np.int32(0)}, overwrite=True) as s:
        s.extend({"a": np.int32(-i)} for i in range(100))
    with pytest.raises(StoreReplacedError):
        reader.load(2, as_numpy=True)


def test_a_value_the_dtype_policy_refuses_raises_only_for_its_record(tmp_path: Path) -> None:
    with pytreestore.create(tmp_path / "s", {"a": np.int64(0)}, chunk_records=128) as s:
        values = [np.int64(i) for i in range(100)]
        values[80] = np.int64(2**40)  # outside int32: cast=True cannot load record 80
        s.extend({"a": v} for v in values)
    reader = pytreestore.open(tmp_path / "s", cast=True)
    assert not jax.config.read("jax_enable_x64")
    for i in range(80):
        assert int(reader[i]["a"]) == i
        assert reader[i]["a"].dtype == np.int32
    with pytest.raises(X64DisabledError):
        reader[80]
    got = []
    with pytest.raises(X64DisabledError):
        for record in reader:
            got.append(int(record["a"]))
    assert got == list(range(80))


def test_prng_key_columns_come_back_typed_from_a_block(tmp_path: Path) -> None:
    keys = jax.random.split(jax.random.key(0), 100)
    with pytreestore.create(tmp_path / "s", {"k": keys[0]}) as s:
        s.extend({"k": k} for k in keys)
        for i in range(100):
            got = s[i]["k"]
            assert jax.numpy.issubdtype(got.dtype, jax.dtypes.prng_key)
            np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(keys[i]))
        iterated = [r["k"] for r in s]
    np.testing.assert_array_equal(
        jax.random.key_data(jax.numpy.stack(iterated)), jax.random.key_data(keys)
    )


def test_threads_looping_over_one_store(store: Any) -> None:
    errors: list[BaseException] = []

    def loop(offset: int) -> None:
        try:
            for i in range(offset, N, 3):
                _check(store.load(i, as_numpy=True), i)
            for i in range(N):
                _check(store.load(i, as_numpy=True), i)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=loop, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_writer_reads_its_own_records_in_a_loop(tmp_path: Path) -> None:
    with pytreestore.create(tmp_path / "s", _record(0), chunk_records=16) as s:
        for i in range(50):
            s.append(_record(i))
            _check(s.load(i, as_numpy=True), i)  # each read follows the last
        for i in range(50):
            _check(s.load(i, as_numpy=True), i)


def test_a_ragged_store_in_a_loop(tmp_path: Path, backend: str) -> None:
    like = {"p": [np.float32(0)], "t": np.int32(0)}
    records = [
        {"p": [np.float32(i + k) for k in range(i % 4)], "t": np.int32(i)} for i in range(90)
    ]
    with pytreestore.create(tmp_path / "s", like, ragged=["['p']"], backend=backend) as s:
        s.extend(records)
    reader = pytreestore.open(tmp_path / "s", backend=backend, cache_bytes=0)
    calls = count_reads(reader)
    for i, want in enumerate(records):
        got = reader.load(i, as_numpy=True)
        assert got["t"].item() == i
        assert [x.item() for x in got["p"]] == [x.item() for x in want["p"]]
    served = len(calls)
    got = reader[40]
    assert isinstance(got["t"], jax.Array) and int(got["t"]) == 40
    got = reader.load(41, as_numpy=True)
    got["t"][...] = -1
    assert reader.load(42, as_numpy=True)["t"].item() == 42
    assert served < len(records)  # blocks, not one read per record
