"""A fixed store's extend() (pytreestore/_write/rows.py): records flattened a block at a time
read back exactly, and a refused record is named as append() names it, wherever it sits."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import pytreestore
from pytreestore import errors
from pytreestore._runtime import RUNTIME
from pytreestore.testing import assert_trees_equal
from tests.peer_trees import scale_by_two
from tests.trees import Pair, WithStatic, deep_record

#: records taken at once by a fixed store's extend
BLOCK = RUNTIME.writes.extend_block
#: records past the second block, so a chunk and a block end at different records
COUNT = 2 * BLOCK + 37


@struct.dataclass
class WithFunction:
    """A dataclass holding a function as a leaf: a constant of the schema, not a column."""

    w: Any
    fn: Any


def _records(count: int) -> list[Any]:
    return list(_made(count))


@functools.cache
def _made(count: int) -> tuple[Any, ...]:
    return tuple(deep_record(i, 7) for i in range(count))


def _extend_error(store: pytreestore.TreeStore, records: Any) -> str:
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.extend(records)
    return str(info.value)


def _append_error(store: pytreestore.TreeStore, record: Any) -> str:
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.append(record)
    return str(info.value)


def test_many_blocks_of_records_read_back_exactly(tmp_path, backend):
    records = _records(COUNT)
    with pytreestore.create(tmp_path / "s", records[0], chunk_records=300, backend=backend) as s:
        s.extend(records[:5])
        s.extend(records[5 : BLOCK + 9])
        s.extend(r for r in records[BLOCK + 9 :])  # a generator
    with pytreestore.open(tmp_path / "s", backend=backend) as store:
        assert len(store) == COUNT
        assert_trees_equal(store.load(as_numpy=True), pytreestore.stack(records, as_numpy=True))
        for i in (0, BLOCK - 1, BLOCK, COUNT - 1):
            assert_trees_equal(store.load(i, as_numpy=True), records[i], err_msg=f"record {i}")


def test_jax_arrays_and_mixed_leaf_classes_read_back(tmp_path, backend):
    def record(i: int) -> Any:
        small = i % 100
        scalar = [small, np.int8(small), np.zeros((), np.int32) + small, np.int32(small)][i % 4]
        return {"x": scalar, "v": jnp.full(2, i, jnp.float32), "p": Pair(np.float32(i), None)}

    records = [record(i) for i in range(BLOCK + 3)]
    like = {"x": np.int32(0), "v": np.zeros(2, np.float32), "p": Pair(np.float32(0), None)}
    with pytreestore.create(tmp_path / "s", like, chunk_records=100, backend=backend) as s:
        s.extend(records)
    with pytreestore.open(tmp_path / "s", backend=backend) as store:
        got = store.load(as_numpy=True)
    np.testing.assert_array_equal(got["x"], np.arange(BLOCK + 3) % 100)
    assert got["x"].dtype == np.int32
    np.testing.assert_array_equal(got["v"], np.repeat(np.arange(BLOCK + 3.0), 2).reshape(-1, 2))
    assert got["p"].right is None


def test_constant_leaves_are_checked_in_every_block(tmp_path, backend):
    records = [WithFunction(np.full(3, i, np.float32), scale_by_two) for i in range(BLOCK + 5)]
    with pytreestore.create(tmp_path / "s", records[0], chunk_records=64, backend=backend) as s:
        s.extend(records)
        other = WithFunction(np.zeros(3, np.float32), np.negative)
        want = _append_error(s, other)
        got = _extend_error(s, [*records[: BLOCK + 2], other])
        assert got == (
            f"extend() refused record {BLOCK + 2} (none of this call's records were "
            f"appended): {want}"
        )
    with pytreestore.open(tmp_path / "s", backend=backend) as store:
        assert len(store) == BLOCK + 5
        assert store[BLOCK + 4].fn is scale_by_two
        np.testing.assert_array_equal(store.load(as_numpy=True).w[:, 0], np.arange(BLOCK + 5))


def _missing_key(i: int) -> Any:
    record = deep_record(i, 7)
    del record["step"]
    return record


def _static_differs(i: int) -> Any:
    record = deep_record(i, 7)
    first = record["inner"][0]
    assert isinstance(first, WithStatic)
    return {**record, "inner": [dataclasses.replace(first, name="other"), *record["inner"][1:]]}


def _none_for_subtree(i: int) -> Any:
    return {**deep_record(i, 7), "inner": None}


def _longer_list(i: int) -> Any:
    record = deep_record(i, 7)
    return {**record, "inner": [*record["inner"], 1]}


def _wrong_dtype(i: int) -> Any:
    return {**deep_record(i, 7), "step": np.float64(0.5)}  # an int16 column


#: records a store of deep_record refuses: structure (caught as the block is flattened) and
#: value (caught as it is cast into its column)
REFUSED: dict[str, Callable[[int], Any]] = {
    "a key missing": _missing_key,
    "a static field differs": _static_differs,
    "None for a subtree": _none_for_subtree,
    "a longer list": _longer_list,
    "a leaf of the wrong dtype": _wrong_dtype,
}


#: how extend() takes its records: a list is stacked whole and written as one batch, any
#: other iterable (or a list past STACKED_BYTES) goes to the row buffer a block at a time
HOW: dict[str, Callable[[list[Any]], Any]] = {"list": list, "generator": lambda xs: iter(xs)}


@pytest.mark.parametrize("how", HOW.values(), ids=HOW.keys())
@pytest.mark.parametrize("at", [0, BLOCK, COUNT - 1])
@pytest.mark.parametrize("bad", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_record_is_named_as_append_names_it(tmp_path, bad, at, how):
    records = _records(COUNT)
    with pytreestore.create(tmp_path / "s", records[0], chunk_records=300) as store:
        kept = records[:7]
        store.extend(kept)
        refused = bad(at)
        want = _append_error(store, refused)
        records[at] = refused
        got = _extend_error(store, how(records))
        assert got == (
            f"extend() refused record {at} (none of this call's records were appended): {want}"
        )
        assert (len(store), store.committed) == (7, 0)
    with pytreestore.open(tmp_path / "s") as store:
        assert_trees_equal(store.load(as_numpy=True), pytreestore.stack(kept, as_numpy=True))


@pytest.mark.parametrize("how", HOW.values(), ids=HOW.keys())
@pytest.mark.parametrize("bad", [_static_differs, _wrong_dtype], ids=["structure", "value"])
def test_refusals_keep_nothing_on_every_backend(tmp_path, backend, bad, how):
    records = _records(BLOCK + 40)  # a generator's chunks are written, then rolled back
    with pytreestore.create(tmp_path / "s", records[0], chunk_records=256, backend=backend) as s:
        records[BLOCK + 20] = bad(BLOCK + 20)
        message = _extend_error(s, how(records))
        assert message.startswith(f"extend() refused record {BLOCK + 20} (none of this call")
        assert len(s) == 0
        s.extend(records[:3])
    with pytreestore.open(tmp_path / "s", backend=backend) as store:
        assert_trees_equal(store.load(as_numpy=True), pytreestore.stack(records[:3], as_numpy=True))


def test_a_refused_record_names_its_fix(tmp_path):
    like = {"x": [np.int32(0), np.int32(0)]}
    records = [{"x": [np.int32(i), np.int32(i)]} for i in range(BLOCK + 3)]
    records[BLOCK + 1] = {"x": [np.int32(1)] * 3}
    with pytreestore.create(tmp_path / "s", like) as store:
        message = _extend_error(store, records)
    assert f"extend() refused record {BLOCK + 1} " in message
    assert "expected a list of 2, got a list of 3 (declare ragged=[\"['x']\"]" in message


def test_a_list_past_the_stacked_size_streams_and_reads_back(tmp_path, backend, monkeypatch):
    monkeypatch.setattr(RUNTIME.writes, "stacked_bytes", 1000)  # a few records' worth
    records = _records(BLOCK + 40)
    with pytreestore.create(tmp_path / "s", records[0], chunk_records=256, backend=backend) as s:
        s.extend(records[:2])  # stacked: 2 records fit
        s.extend(records[2:])  # streamed
        bad = [*records[:BLOCK], _wrong_dtype(0)]
        message = _extend_error(s, bad)
        assert message.startswith(f"extend() refused record {BLOCK} (none of this call")
    with pytreestore.open(tmp_path / "s", backend=backend) as store:
        assert_trees_equal(store.load(as_numpy=True), pytreestore.stack(records, as_numpy=True))
