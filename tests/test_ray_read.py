"""Reading a store with Ray Data (``pytreestore.ray.read_store``), on a local Ray instance on
127.0.0.1 with 2 workers (``local_ray`` in tests/conftest.py).

A store read into a dataset, mapped with ``map_batches`` and written with the datasink into
a new store must give the same records (classes, structure, dtypes, values) on every kind of
store and both file backends; the read tasks split on chunk boundaries and all read the
version resolved on the driver; ``columns=`` projects; bad arguments fail on the driver.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import (
    BadLocationError,
    StoreNotFoundError,
    UnknownColumnError,
    UnsupportedDtypeError,
    VersionNotFoundError,
)
from pytreestore.testing import assert_trees_equal
from tests import optional
from tests.conftest import diagonal, tiered
from tests.parity import kinds

NO_RAY = "the ray extra is not installed (pip install '.[ray]')"
ray = optional.importorskip("ray", reason=NO_RAY)
pts_ray = optional.importorskip("pytreestore.ray", reason=NO_RAY)  # each imports Ray at first use

N, CHUNK = 40, 8
pytest_plugins = ("tests.fixtures",)  # the moto S3 server of test_a_store_on_s3_round_trips
pytestmark = [
    # Ray Data's own DataContext warns of its deprecated options as it is made
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*"),
    # ray.init forks helper processes, which exec at once; JAX warns of any fork once it
    # has started (earlier tests in the same run start it)
    pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning"),
    pytest.mark.usefixtures("local_ray"),
]


def shifted(batch: Any) -> Any:
    """A map_batches function: every record's ``t`` plus 1000, the rest as read."""
    return {**batch, "t": batch["t"] + 1000}


def stored(path: Any, backend: str, kind: str, n: int = N) -> list[Any]:
    """A store of ``kind`` with ``n`` records, CHUNK records a chunk; its records."""
    return kinds.filled(path, kind, backend, n=n, chunk_records=CHUNK)


#: make test: each kind on one of the two backends, in turn; make test-long: on both
ROUND_TRIPS = tiered(
    [(k, b) for k in kinds.KINDS for b in ("tensorstore", "zarr")],
    diagonal(kinds.KINDS, ("tensorstore", "zarr")),
)


@pytest.mark.parametrize(("kind", "backend"), ROUND_TRIPS)
def test_a_store_round_trips_through_map_batches(tmp_path, backend, kind):
    src, out = tmp_path / "src", tmp_path / "out"
    records = stored(src, backend, kind)
    kinds.create(out, kind, backend, chunk_records=CHUNK).close()
    ds = pts_ray.read_store(src, backend=backend).map_batches(shifted)
    ds.write_datasink(pts_ray.TreeStoreDatasink(out, backend=backend))
    got = pytreestore.open(out, backend=backend)
    assert len(got) == N
    for i, (record, want) in enumerate(zip(got.records(as_numpy=True), records)):
        want = dataclasses.replace(want, t=np.int32(want.t + 1000))
        assert_trees_equal(record, want, err_msg=f"record {i}")
    assert got.verify().ok


def test_a_ragged_and_optional_store_round_trips_without_a_map(tmp_path):
    """The harness's store: a list of dataclasses holding a nested ragged list and a ragged
    leading axis, an optional subtree holding a ragged axis (Python-object columns)."""
    from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record

    src, out = tmp_path / "src", tmp_path / "out"
    with pytreestore.create(src, ragged_like(False), chunk_records=CHUNK, **RAGGED_DECL) as s:
        s.extend(ragged_record(i) for i in range(N))
    pytreestore.create(out, ragged_like(False), **RAGGED_DECL).close()
    ds = pts_ray.read_store(src)
    assert ds.columns() == ["elems.x", "elems.tags", "elems.trail", "i", "opt.cells", "opt.w"]
    ds.map_batches(lambda b: b).write_datasink(pts_ray.TreeStoreDatasink(out))
    ds.write_datasink(
        pts_ray.TreeStoreDatasink(out)
    )  # Arrow blocks as read, no numpy batches between
    got = pytreestore.open(out)
    assert len(got) == 2 * N
    for i, record in enumerate(got.records(as_numpy=True)):
        assert_trees_equal(record, ragged_record(i % N), err_msg=f"record {i}")


def test_rows_hold_the_leaves_with_their_dtypes(tmp_path):
    src = tmp_path / "src"
    records = stored(src, "tensorstore", "ragged_axis", n=12)
    rows = pts_ray.read_store(src).take_all()
    agents = ["agents.0.energy", "agents.0.pos", "agents.1.energy", "agents.1.pos"]
    assert sorted(rows[0]) == [*agents, "storm.cells", "storm.strength", "t", "trail", "x"]
    for row, record in zip(rows, records, strict=True):
        assert row["t"] == record.t  # a scalar: Ray's rows give it as a Python number
        for name, want in [
            ("trail", record.trail),
            ("x", record.x),
            ("storm.cells", record.storm.cells),
        ]:
            got = np.asarray(row[name])
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want)
    batch = pts_ray.read_store(src).take_batch(12)  # numpy: tensors of the leaves' dtypes
    assert batch["storm.cells"].dtype == np.int16 and batch["storm.cells"].shape == (12, 3)
    assert [t.shape for t in batch["trail"]] == [r.trail.shape for r in records]


def test_optional_rows_are_none_where_the_subtree_is_absent(tmp_path):
    src = tmp_path / "src"
    records = stored(src, "tensorstore", "optional", n=16)
    rows = pts_ray.read_store(src, columns=[".storm", ".t"]).take_all()
    assert [r["storm.strength"] is None for r in rows] == [r.storm is None for r in records]
    batch = pts_ray.read_store(src).take_batch(16)  # numpy: None, not NaN
    assert [v is None for v in batch["storm.cells"]] == [r.storm is None for r in records]
    present = [i for i, r in enumerate(records) if r.storm is not None]
    assert batch["storm.cells"][present[0]].dtype == np.int16


def test_columns_project(tmp_path):
    src = tmp_path / "src"
    records = stored(src, "tensorstore", "ragged_list", n=16)
    ds = pts_ray.read_store(src, columns=[".agents", ".t"])
    assert ds.columns() == ["t", "agents.pos", "agents.energy"]  # the store's column order
    rows = ds.take_all()
    assert [len(r["agents.energy"]) for r in rows] == [len(r.agents) for r in records]
    assert pts_ray.read_store(src, columns=".storm.cells").columns() == ["storm.cells"]


def test_columns_take_a_mask_pytree(tmp_path):
    src = tmp_path / "src"
    records = stored(src, "tensorstore", "ragged_list", n=16)
    longest = max(records, key=lambda r: len(r.agents))
    mask = jax.tree.map(lambda _: False, longest)
    mask = mask.replace(t=True, agents=[a.replace(energy=True) for a in mask.agents])
    ds = pts_ray.read_store(src, columns=mask)
    assert ds.columns() == ["t", "agents.energy"]
    rows = ds.take_all()
    assert [len(r["agents.energy"]) for r in rows] == [len(r.agents) for r in records]


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_every_task_reads_the_version_resolved_on_the_driver(tmp_path, backend):
    src = tmp_path / "src"
    records = stored(src, backend, "ragged_list", n=16)
    first = pytreestore.open(src, backend=backend).version
    ds = pts_ray.read_store(
        src, backend=backend
    )  # planned now; its tasks run after the writes below
    with pytreestore.open(src, "a", backend=backend) as writer:
        writer.extend(kinds.records("ragged_list", 16, start=16))
        writer.truncate(20)
        writer.extend(kinds.records("ragged_list", 8, start=100))
    assert pytreestore.open(src, backend=backend).version > first
    rows = ds.take_all()
    assert [r["t"] for r in rows] == [r.t for r in records]
    assert [len(r["agents.energy"]) for r in rows] == [len(r.agents) for r in records]
    assert pts_ray.read_store(src, backend=backend).count() == 28
    older = pts_ray.read_store(src, version=first, backend=backend).take_all()
    assert [r["t"] for r in older] == list(range(16))
    with pytreestore.open(src, "a", backend=backend) as writer:  # over records 12-15 of first
        writer.truncate(12)
        writer.extend(kinds.records("ragged_list", 8, start=200))
    with pytest.raises(VersionNotFoundError, match=f"version {first} of .* is gone"):
        ds.take_all()  # every task refuses the version it was given, none reads another


def test_read_tasks_split_on_chunk_boundaries(tmp_path):
    src = tmp_path / "src"
    stored(src, "tensorstore", "nested", n=N + 3)  # 6 chunks, the last of 3 records
    source = pts_ray.TreeStoreDatasource(src)
    for parallelism, ranges in [
        (1, [(0, 43)]),
        (2, [(0, 24), (24, 43)]),
        (4, [(0, 8), (8, 24), (24, 32), (32, 43)]),
        (100, [(i, min(i + CHUNK, 43)) for i in range(0, 43, CHUNK)]),
    ]:
        tasks = source.get_read_tasks(parallelism)
        assert [t.metadata.num_rows for t in tasks] == [b - a for a, b in ranges]
    ds = pts_ray.read_store(src, override_num_blocks=4).materialize()
    assert ds.num_blocks() == 4
    assert [r["t"] for r in ds.take_all()] == list(range(N + 3))
    assert source.estimate_inmemory_data_size() == (N + 3) * (4 + 16 + 8 + 4 + 4 + 24 + 4 + 6)


def test_an_empty_store_reads_no_rows(tmp_path):
    kinds.create(tmp_path / "src", "fixed", "tensorstore").close()
    assert pts_ray.TreeStoreDatasource(tmp_path / "src").get_read_tasks(4) == []
    assert pts_ray.read_store(tmp_path / "src").count() == 0


def test_bad_arguments_fail_on_the_driver(tmp_path):
    src = tmp_path / "src"
    stored(src, "tensorstore", "fixed", n=8)
    with pytest.raises(StoreNotFoundError):
        pts_ray.read_store(tmp_path / "nowhere")
    with pytest.raises(UnknownColumnError, match=re.escape("no column at or below '.nope'")):
        pts_ray.read_store(src, columns=[".t", ".nope"])
    with pytest.raises(VersionNotFoundError):
        pts_ray.read_store(src, version=99)
    with pytest.raises(BadLocationError, match="in-memory"):
        pts_ray.read_store("memory://ray-read")
    odd = tmp_path / "odd"
    like = {"w": np.zeros(2, ml_dtypes.bfloat16), "c": np.complex64(0), "n": np.int8(0)}
    with pytreestore.create(odd, like) as store:
        store.append(like)
    with pytest.raises(
        UnsupportedDtypeError, match=re.escape("['c'] (complex64), ['w'] (bfloat16)")
    ):
        pts_ray.read_store(odd)
    assert pts_ray.read_store(odd, columns="['n']").columns() == ["n"]


def test_the_scaling_page_read_example_runs(tmp_path, monkeypatch):
    """docs/scaling.md's read_store block (tests/test_docs.py starts no Ray)."""
    from tests.test_docs import blocks
    from tests.test_ray import ROOT

    found = [b for b in blocks(ROOT / "docs" / "scaling.md") if "read_store(" in b.code]
    assert len(found) == 1
    monkeypatch.chdir(tmp_path)
    exec(compile(found[0].code, found[0].where, "exec"), {"__name__": "docs_scaling_read"})
    assert len(pytreestore.open(tmp_path / "scaled.store")) == 100


@pytest.mark.s3
def test_a_store_on_s3_round_trips(s3_server, bucket):
    """Every worker reaches the store through the options alone (its own environment has
    no AWS variables): the credentials travel in ``storage_options``."""
    from pytreestore.testing.s3 import CLIENT_ENV

    opts = {
        **s3_server.options,
        "access_key_id": CLIENT_ENV["AWS_ACCESS_KEY_ID"],
        "secret_access_key": CLIENT_ENV["AWS_SECRET_ACCESS_KEY"],
    }
    src, out = f"s3://{bucket}/src", f"s3://{bucket}/out"
    records = kinds.records("ragged_list", 20)
    with kinds.create(
        src, "ragged_list", "tensorstore", chunk_records=CHUNK, storage_options=opts
    ) as s:
        s.extend(records)
    kinds.create(out, "ragged_list", "tensorstore", storage_options=opts).close()
    ds = pts_ray.read_store(src, storage_options=opts).map_batches(shifted)
    ds.write_datasink(pts_ray.TreeStoreDatasink(out, storage_options=opts))
    got = pytreestore.open(out, storage_options=opts)
    for i, (record, want) in enumerate(zip(got.records(as_numpy=True), records, strict=True)):
        assert_trees_equal(
            record, dataclasses.replace(want, t=np.int32(want.t + 1000)), err_msg=f"record {i}"
        )


def test_dtypes_and_values_survive_exactly(tmp_path):
    """Every dtype Arrow holds, extreme values, in fixed leaves and in a ragged list."""
    like = {
        "b": np.bool_(False),
        "i8": np.int8(0),
        "u16": np.zeros(2, np.uint16),
        "u64": np.uint64(0),
        "i64": np.int64(0),
        "h": np.zeros((2, 2), np.float16),
        "d": np.float64(0),
        "l": [{"flag": np.bool_(False), "h": np.float16(0), "big": np.int64(0)}],
    }

    def record(i: int) -> dict[str, Any]:
        return {
            "b": np.bool_(i % 2),
            "i8": np.int8(-128 + i),
            "u16": np.array([65535, i], np.uint16),
            "u64": np.uint64(2**64 - 1 - i),
            "i64": np.int64(-(2**62) + i),
            "h": np.full((2, 2), 1 / (i + 3), np.float16),
            "d": np.float64(np.pi * i),
            "l": [
                {"flag": np.bool_(j % 2), "h": np.float16(j / 7), "big": np.int64(2**40 + j)}
                for j in range(i % 4)
            ],
        }

    src, out = tmp_path / "src", tmp_path / "out"
    with pytreestore.create(src, like, ragged=["['l']"], chunk_records=4) as s:
        s.extend(record(i) for i in range(10))
    pytreestore.create(out, like, ragged=["['l']"]).close()
    pts_ray.read_store(src).map_batches(lambda b: b).write_datasink(pts_ray.TreeStoreDatasink(out))
    got = pytreestore.open(out)
    for i, r in enumerate(got.records(as_numpy=True)):
        assert_trees_equal(r, record(i), err_msg=f"record {i}")


@pytest.mark.parametrize(
    ("dtype", "inner"), [(np.float32, ()), (np.bool_, ()), (np.int16, (2, 3)), (np.uint64, (1,))]
)
def test_variable_shaped_columns_are_rays_own(dtype, inner):
    """Built from the flat rows at once, a ragged column is what Ray builds row by row."""
    from ray.data.extensions import ArrowVariableShapedTensorArray

    from pytreestore._ray.arrow import variable_shaped

    counts = np.array([2, 0, 3, 1], np.int64)
    rows = (np.arange(6 * int(np.prod(inner))) % 3).astype(dtype).reshape(6, *inner)
    ends = np.cumsum(counts)
    pieces = np.empty(len(counts), object)
    for i, (n, e) in enumerate(zip(counts, ends)):
        pieces[i] = rows[e - n : e]
    ours, rays = variable_shaped(rows, counts), ArrowVariableShapedTensorArray.from_numpy(pieces)
    assert ours.type == rays.type
    assert ours.storage.equals(rays.storage)
    for got, want in zip(ours.to_pylist(), pieces, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_read_stores_docstring_row(tmp_path):
    """The row ``read_store``'s docstring shows: a ragged leaf's array, a scalar's number."""
    path = tmp_path / "doc"
    with pytreestore.create(path, {"x": np.int32(0), "p": [np.int8(0)]}, ragged=["['p']"]) as s:
        s.extend({"x": np.int32(i), "p": [np.int8(i)] * i} for i in range(3))
    row = pts_ray.read_store(path).take(3)[2]
    assert sorted(row) == ["p", "x"] and row["x"] == 2 and type(row["x"]) is int
    assert row["p"].dtype == np.int8 and row["p"].tolist() == [2, 2]
