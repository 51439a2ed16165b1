"""TreeStore end to end: the seed example, appends, indexing, loads, lifecycle."""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from tests import trees


def leaves_equal(a, b) -> None:
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture
def seed_store(tmp_path):
    with pytreestore.create(tmp_path / "seed", trees.seed_records()[0]) as store:
        for record in trees.seed_records():
            store.append(record)
    return pytreestore.open(tmp_path / "seed")


def test_seed_example_vmap(seed_store):
    out = jax.vmap(trees.some_func)(seed_store[:])
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(out, [4, 2, -3])


def test_seed_example_record(seed_store):
    record = seed_store[1]
    assert isinstance(record, trees.AllParams)
    assert isinstance(record.p[0], trees.Params)
    assert record.p[0].x.shape == ()
    leaves_equal(record, trees.AllParams([trees.Params(3, 5), trees.Params(2, 4)]))


def test_negative_index_and_iteration(seed_store):
    leaves_equal(seed_store[-1], trees.seed_records()[2])
    records = list(seed_store)
    assert len(records) == 3
    for got, want in zip(records, trees.seed_records(), strict=True):
        leaves_equal(got, want)


def test_index_forms(seed_store):
    x0 = np.array([4, 3, 3], np.int32)
    np.testing.assert_array_equal(seed_store[::2].p[0].x, x0[::2])
    np.testing.assert_array_equal(seed_store[::-1].p[0].x, x0[::-1])
    np.testing.assert_array_equal(seed_store[[2, 0, 2]].p[0].x, x0[[2, 0, 2]])
    np.testing.assert_array_equal(seed_store[np.array([-1])].p[0].x, x0[[-1]])
    mask = np.array([True, False, True])
    np.testing.assert_array_equal(seed_store[mask].p[0].x, x0[mask])
    assert seed_store[1:1].p[0].x.shape == (0,)
    assert isinstance(seed_store[:].p[0].x, jax.Array)


def test_columns_select_prefix(seed_store):
    part = seed_store.load(columns=".p[0]")
    np.testing.assert_array_equal(part.p[0].x, [4, 3, 3])
    np.testing.assert_array_equal(part.p[0].y, [2, 5, 2])
    assert part.p[1].x is None and part.p[1].y is None
    only = seed_store.load(slice(0, 2), columns=[".p[1].y"], as_numpy=True)
    assert isinstance(only.p[1].y, np.ndarray)
    np.testing.assert_array_equal(only.p[1].y, [3, 4])
    with pytest.raises(KeyError, match=re.escape("no column at or below '.q'")) as info:
        seed_store.load(columns=".q")
    assert isinstance(info.value, errors.UnknownColumnError)
    assert str(info.value).startswith("no column at or below '.q'")  # not in quotes, as KeyError


def test_load_to_device(seed_store):
    device = jax.devices()[0]
    out = seed_store.load(device=device)
    assert out.p[0].x.devices() == {device}


def test_extend_generator_and_batch(tmp_path):
    like = {"a": np.zeros(3, np.float32), "n": 0}
    with pytreestore.create(tmp_path / "s", like, chunk_records=4) as store:
        store.extend({"a": np.full(3, i, np.float32), "n": i} for i in range(10))
        store.extend_batch({"a": np.ones((9, 3), np.float32), "n": np.arange(10, 19)})
        store.append({"a": np.zeros(3, np.float32), "n": 19})
        assert len(store) == 20
    reader = pytreestore.open(tmp_path / "s")
    out = reader.load(as_numpy=True)
    np.testing.assert_array_equal(out["n"], np.arange(20))
    np.testing.assert_array_equal(out["a"][:10, 0], np.arange(10))
    np.testing.assert_array_equal(out["a"][10:19], np.ones((9, 3)))


def test_extend_batch_large_aligned_and_unaligned(tmp_path):
    with pytreestore.create(tmp_path / "s", {"v": np.float64(0)}, chunk_records=8) as store:
        store.append({"v": np.float64(-1)})
        store.extend_batch({"v": np.arange(100, dtype=np.float64)})
        store.flush()
        store.extend_batch({"v": np.arange(100, 131, dtype=np.float64)})
    values = pytreestore.open(tmp_path / "s").load(as_numpy=True)["v"]
    np.testing.assert_array_equal(values, np.r_[-1, np.arange(131)])


def test_extend_is_all_or_nothing(tmp_path):
    with pytreestore.create(tmp_path / "s", {"n": 0}, chunk_records=4) as store:
        store.extend({"n": i} for i in range(6))
        store.flush()
        store.append({"n": 6})
        bad = [{"n": i} for i in range(7, 20)] + [{"n": 1.5}]
        with pytest.raises(errors.SchemaMismatchError, match=re.escape("refused record 13")):
            store.extend(bad)
        assert len(store) == 7
        store.append({"n": 7})
    values = pytreestore.open(tmp_path / "s").load(as_numpy=True)["n"]
    np.testing.assert_array_equal(values, np.arange(8))


def test_flush_commits_and_reader_refresh(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"n": 0}, chunk_records=4)
    reader = pytreestore.open(tmp_path / "s")
    store.extend({"n": i} for i in range(3))
    assert store.committed == 0 and len(store) == 3
    assert reader.refresh() == 0
    store.flush()
    assert store.committed == 3
    assert reader.refresh() == 3
    store.extend({"n": i} for i in range(3, 11))
    store.flush()
    assert reader.refresh() == 11
    np.testing.assert_array_equal(reader.load(as_numpy=True)["n"], np.arange(11))
    store.close()


def test_full_chunks_commit_without_flush(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"n": 0}, chunk_records=4)
    for i in range(9):
        store.append({"n": i})
    # full chunks are written and committed by the background writer: soon, not at once
    deadline = time.monotonic() + 60
    while store.committed < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.committed == 8
    assert len(pytreestore.open(tmp_path / "s")) == 8
    store.close()
    assert len(pytreestore.open(tmp_path / "s")) == 9


def test_reads_while_appending_see_appended(tmp_path):
    with pytreestore.create(tmp_path / "s", {"n": 0}) as store:
        store.append({"n": 5})
        assert int(store[0]["n"]) == 5
        assert store.committed == 0  # the read committed nothing (issue 46)


def test_reopen_append_continues_tail(tmp_path):
    for start in range(0, 15, 5):
        mode = "a"
        if start == 0:
            store = pytreestore.create(tmp_path / "s", {"n": 0}, chunk_records=4)
        else:
            store = pytreestore.open(tmp_path / "s", mode=mode)
        with store:
            store.extend({"n": i} for i in range(start, start + 5))
    values = pytreestore.open(tmp_path / "s").load(as_numpy=True)["n"]
    np.testing.assert_array_equal(values, np.arange(15))


def test_memory_store_round_trip():
    with pytreestore.create("memory://test-mem", {"x": 0.0}, overwrite=True) as store:
        store.extend({"x": float(i)} for i in range(5))
    reader = pytreestore.open("memory://test-mem")
    np.testing.assert_array_equal(reader[:]["x"], np.arange(5, dtype=np.float32))


def test_uncompressed_and_other_codecs(tmp_path):
    for codec in (None, "zstd", "blosc", "gzip"):
        path = tmp_path / str(codec)
        with pytreestore.create(path, {"x": np.zeros(4, np.int16)}, codec=codec) as store:
            store.extend_batch({"x": np.arange(40, dtype=np.int16).reshape(10, 4)})
        got = pytreestore.open(path).load(as_numpy=True)["x"]
        np.testing.assert_array_equal(got, np.arange(40).reshape(10, 4))


def test_overwrite(tmp_path):
    pytreestore.create(tmp_path / "s", {"x": 0}).close()
    with pytest.raises(errors.StoreExistsError, match="overwrite=True"):
        pytreestore.create(tmp_path / "s", {"x": 0})
    with pytreestore.create(tmp_path / "s", {"y": 0.0}, overwrite=True) as store:
        store.append({"y": 1.0})
    assert pytreestore.open(tmp_path / "s").schema.paths == ("['y']",)


def test_create_refuses_foreign_directory(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "thesis.tex").write_text("precious")
    with pytest.raises(errors.StoreExistsError, match="refusing to delete"):
        pytreestore.create(tmp_path / "other", {"x": 0}, overwrite=True)
    assert (tmp_path / "other" / "thesis.tex").read_text() == "precious"


def test_single_writer_lock(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"x": 0})
    with pytest.raises(errors.StoreLockedError, match="open for writing elsewhere"):
        pytreestore.open(tmp_path / "s", mode="a")
    reader = pytreestore.open(tmp_path / "s")
    assert len(reader) == 0
    store.close()
    pytreestore.open(tmp_path / "s", mode="a").close()


def test_read_only_and_closed(seed_store):
    with pytest.raises(errors.ReadOnlyError, match=re.escape("mode='a'")):
        seed_store.append(trees.seed_records()[0])
    with pytest.raises(errors.ReadOnlyError):
        seed_store.flush()
    seed_store.close()
    seed_store.close()
    with pytest.raises(errors.ClosedStoreError, match="is closed"):
        seed_store[0]
    with pytest.raises(errors.ClosedStoreError):
        len(seed_store)


def test_repr(seed_store):
    assert repr(seed_store).endswith("mode='r', records=3, columns=4, nbytes=48 B)")


def test_x64_columns_exact_and_policy(tmp_path):
    like = {"big": np.int64(0), "f": np.float64(0)}
    with pytreestore.create(tmp_path / "s", like) as store:
        store.append({"big": np.int64(2**40), "f": np.float64(1 / 3)})
    reader = pytreestore.open(tmp_path / "s")
    exact = reader.load(as_numpy=True)
    assert exact["big"].dtype == np.int64 and exact["big"][0] == 2**40
    assert exact["f"][0] == 1 / 3
    with pytest.raises(TypeError, match=re.escape("column ['big'] is int64")):
        reader[:]
    with pytest.raises(TypeError, match="outside int32"):
        reader.load(cast=True)
    small = reader.load(columns="['f']", cast=True)
    assert small["f"].dtype == jnp.float32


def test_deep_tree_seven_levels(tmp_path):
    records = [trees.deep_record(i) for i in range(25)]
    with pytreestore.create(tmp_path / "deep", records[0], chunk_records=8) as store:
        for r in records:
            store.append(r)
    reader = pytreestore.open(tmp_path / "deep")
    leaves_equal(reader[7], records[7])
    batch = reader[3:9]
    assert jax.tree_util.tree_structure(batch) == jax.tree_util.tree_structure(records[0])
    leaves_equal(batch, pytreestore.stack(records[3:9]))


def test_wide_tree_hundreds_of_leaves(tmp_path):
    records = [trees.wide_record(i) for i in range(6)]
    assert len(jax.tree_util.tree_leaves(records[0])) == 300
    with pytreestore.create(tmp_path / "wide", records[0]) as store:
        store.extend(records)
    reader = pytreestore.open(tmp_path / "wide")
    leaves_equal(reader[:], pytreestore.stack(records))
    leaves_equal(reader[5], records[5])


def test_jax_and_big_endian_leaves(tmp_path):
    like = {"a": jnp.zeros(3), "b": None, "c": [], "d": jnp.int32(0), "e": np.zeros(2, ">f8")}
    with pytreestore.create(tmp_path / "s", like) as store:
        store.append(
            {"a": jnp.ones(3), "b": None, "c": [], "d": jnp.int32(5), "e": np.ones(2, ">f8")}
        )
        store.append(
            {"a": np.full(3, 2, np.float32), "b": None, "c": [], "d": 7, "e": np.ones(2, "<f4")}
        )
    out = pytreestore.open(tmp_path / "s").load(as_numpy=True)
    assert out["b"] is None and out["c"] == []
    np.testing.assert_array_equal(out["a"], [[1, 1, 1], [2, 2, 2]])
    np.testing.assert_array_equal(out["d"], [5, 7])
    assert out["e"].dtype == np.float64
