"""The Ray Data datasink (pytreestore.ray): a local Ray instance on 127.0.0.1 with 2 workers.

A dataset written with ``ds.write_datasink(TreeStoreDatasink(path))`` must equal the same rows
appended directly (values, order, classes) on both backends; a failing task, or a commit
that fails, must commit nothing and release the writer lock; a dataset whose columns are not
the store's leaves is refused before any task runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import BadLocationError, SchemaMismatchError, UnknownColumnError
from tests import optional
from tests.trees import Params

NO_RAY = "the ray extra is not installed (pip install '.[ray]')"
ray = optional.importorskip("ray", reason=NO_RAY)
pts_ray = optional.importorskip("pytreestore.ray", reason=NO_RAY)  # each imports Ray at first use

ROOT = Path(__file__).resolve().parent.parent
N = 40
pytestmark = [
    # Ray Data's own DataContext warns of its deprecated options as it is made
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*"),
    # ray.init forks helper processes, which exec at once; JAX warns of any fork once it
    # has started (earlier tests in the same run start it)
    pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning"),
    pytest.mark.usefixtures("local_ray"),  # tests/conftest.py: 2 workers on 127.0.0.1
]


LIKE = {
    "obs": np.zeros((2, 3), np.float32),
    "meta": {"step": np.int32(0)},
    "p": Params(x=np.float32(0), y=np.int64(0)),
}


def rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The Ray columns of records ``batch["id"]``."""
    i = batch["id"]
    return {
        "obs": (i[:, None, None] * 6 + np.arange(6).reshape(2, 3)).astype(np.float32) / 8,
        "meta.step": i * 3,
        "p.x": i.astype(np.float32) - 0.5,
        "p.y": i * 2**33,
    }


def direct(path: Path, backend: str, ids: np.ndarray) -> Any:
    """The same records, appended by one process: the reference."""
    cols = rows({"id": ids})
    batch = {
        "obs": cols["obs"],
        "meta": {"step": cols["meta.step"].astype(np.int32)},
        "p": Params(x=cols["p.x"], y=cols["p.y"]),
    }
    with pytreestore.create(path, LIKE, backend=backend, chunk_records=8) as store:
        store.extend_batch(batch)
    return pytreestore.open(path, backend=backend).load(as_numpy=True)


def dataset(count: int = N, blocks: int = 4, fn: Any = rows) -> Any:
    return ray.data.range(count, override_num_blocks=blocks).map_batches(fn)


def assert_same(got: Any, want: Any) -> None:
    assert type(got["p"]) is type(want["p"]) is Params
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_dataset_written_equals_a_direct_write(tmp_path, backend):
    path = tmp_path / "ray"
    pytreestore.create(path, LIKE, backend=backend, chunk_records=8).close()
    dataset().write_datasink(pts_ray.TreeStoreDatasink(path, backend=backend))
    store = pytreestore.open(path, backend=backend)
    assert len(store) == N
    assert_same(store.load(as_numpy=True), direct(tmp_path / "ref", backend, np.arange(N)))
    assert [v.operation for v in store.versions()][-1] == "append"
    assert len(store.versions()) == 2  # the create and one commit of every task's fragments
    assert not list((path / ".pytreestore" / "fragments").glob("*/fragment.json"))


def test_a_second_write_appends_after_the_first(tmp_path):
    path = tmp_path / "ray"
    pytreestore.create(path, LIKE, chunk_records=8).close()
    sink = pts_ray.TreeStoreDatasink(path)
    dataset(16, 2).write_datasink(sink)
    later = ray.data.from_items([{"id": i} for i in range(16, 30)], override_num_blocks=3)
    later.map_batches(rows).write_datasink(sink)
    got = pytreestore.open(path).load(as_numpy=True)
    want = direct(tmp_path / "ref", "tensorstore", np.arange(30))
    assert_same(got, want)


def test_columns_rename_leaves(tmp_path):
    path = tmp_path / "ray"
    pytreestore.create(path, LIKE).close()

    def renamed(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = rows(batch)
        out["step"] = out.pop("meta.step")
        return out

    sink = pts_ray.TreeStoreDatasink(path, columns={"['meta']['step']": "step"})
    dataset(fn=renamed).write_datasink(sink)
    got = pytreestore.open(path).load(as_numpy=True)
    np.testing.assert_array_equal(got["meta"]["step"], np.arange(N, dtype=np.int32) * 3)


def test_a_failing_task_commits_nothing(tmp_path):
    path = tmp_path / "ray"
    pytreestore.create(path, LIKE, chunk_records=8).close()
    dataset(8, 1).write_datasink(pts_ray.TreeStoreDatasink(path))

    def late_rows_overflow(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = rows(batch)
        if batch["id"][0] >= 20:  # the last two tasks: values an int32 column cannot hold
            out["meta.step"] = out["meta.step"] + 2**40
        return out

    with pytest.raises(SchemaMismatchError, match=re.escape("['meta']['step']")):
        dataset(fn=late_rows_overflow).write_datasink(pts_ray.TreeStoreDatasink(path))
    store = pytreestore.open(path, "a")  # the driver gave the writer lock back
    assert len(store) == 8
    # the tasks that succeeded wrote fragments nobody committed: vacuum's to remove
    assert len(list((path / ".pytreestore" / "fragments").glob("*/fragment.json"))) <= 2
    store.vacuum(fragments_older_than=0)
    assert not list((path / ".pytreestore" / "fragments").glob("*/*.json"))
    store.close()
    assert_same(
        pytreestore.open(path).load(as_numpy=True),
        direct(tmp_path / "ref", "tensorstore", np.arange(8)),
    )


def test_a_failing_commit_commits_nothing(tmp_path, monkeypatch):
    path = tmp_path / "ray"
    pytreestore.create(path, LIKE).close()

    def refuse(self: Any, fragments: Any) -> None:
        raise pytreestore.errors.StorageError("injected: the disk is full")

    monkeypatch.setattr(pytreestore.TreeStore, "commit_fragments", refuse)
    with pytest.raises(pytreestore.errors.StorageError, match="injected"):
        dataset().write_datasink(pts_ray.TreeStoreDatasink(path))
    monkeypatch.undo()
    with pytreestore.open(path, "a") as store:  # the lock was given back
        assert len(store) == 0


def test_wrong_columns_are_refused_with_nothing_written(tmp_path):
    path = tmp_path / "ray"
    pytreestore.create(path, LIKE).close()
    extra = dataset().add_column("label", lambda b: b["p.y"])
    with pytest.raises(SchemaMismatchError, match=re.escape("columns no leaf reads: ['label']")):
        extra.write_datasink(pts_ray.TreeStoreDatasink(path))
    missing = dataset().drop_columns(["p.x"])
    with pytest.raises(SchemaMismatchError, match=re.escape("missing the columns ['p.x']")):
        missing.write_datasink(pts_ray.TreeStoreDatasink(path))
    assert not list((path / ".pytreestore").glob("fragments/*"))
    assert len(pytreestore.open(path)) == 0


def test_column_names_follow_the_simple_keypath(tmp_path):
    store = pytreestore.create(tmp_path / "s", LIKE)
    assert pts_ray.column_names(store.schema) == ["meta.step", "obs", "p.x", "p.y"]
    bare = pytreestore.create(tmp_path / "bare", np.zeros(3, np.float32))
    assert pts_ray.column_names(bare.schema) == ["item"]
    with pytest.raises(UnknownColumnError, match=re.escape("['nope']")):
        pts_ray.column_names(store.schema, {"['nope']": "x"})
    with pytest.raises(SchemaMismatchError, match="would both read the Ray column 'obs'"):
        pts_ray.column_names(store.schema, {"['meta']['step']": "obs"})
    store.close()
    bare.close()


def test_memory_stores_are_refused():
    with pytest.raises(BadLocationError, match="in-memory"):
        pts_ray.TreeStoreDatasink("memory://ray-sink")


def test_the_scaling_page_examples_run(tmp_path, monkeypatch):
    """docs/scaling.md's Ray blocks (not run by tests/test_docs.py, which starts no Ray):
    a fixed store's, then a ragged and optional store's."""
    from tests.test_docs import blocks

    page = ROOT / "docs" / "scaling.md"
    found = [
        b for b in blocks(page) if "TreeStoreDatasink(" in b.code and "read_store" not in b.code
    ]
    assert len(found) == 2
    monkeypatch.chdir(tmp_path)  # the blocks' relative paths: paths the workers never saw
    for block in found:
        exec(compile(block.code, block.where, "exec"), {"__name__": "docs_scaling_ray"})
    assert len(pytreestore.open(tmp_path / "ray.store")) == 100
    assert len(pytreestore.open(tmp_path / "hits.store")) == 100


def test_a_locked_store_is_refused_before_any_task(tmp_path):
    path = tmp_path / "ray"
    writer = pytreestore.create(path, LIKE)
    with pytest.raises(pytreestore.errors.StoreLockedError):
        dataset().write_datasink(pts_ray.TreeStoreDatasink(path))
    writer.close()
    assert len(pytreestore.open(path)) == 0


# ---- ragged and optional stores ------------------------------------------------------------


def ragged_rows(batch: dict[str, np.ndarray]) -> dict[str, Any]:
    """Columns of :func:`tests.trial_harness.ragged_record` ``batch["id"]``: one per leaf,
    a list per ragged list (a list of lists for the nested one), None where ``opt`` is."""
    from tests.trial_harness import ragged_record

    recs = [ragged_record(int(i)) for i in batch["id"]]
    return {
        "i": batch["id"],
        "elems.x": [[e.x for e in r["elems"]] for r in recs],
        "elems.tags": [[list(e.tags) for e in r["elems"]] for r in recs],
        "elems.trail": [[e.trail for e in r["elems"]] for r in recs],
        "opt.w": [None if r["opt"] is None else r["opt"]["w"] for r in recs],
        "opt.cells": [None if r["opt"] is None else r["opt"]["cells"] for r in recs],
    }


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_ragged_dataset_equals_appending_its_records(tmp_path, backend):
    from pytreestore.testing import assert_trees_equal
    from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record

    path = tmp_path / "ragged"
    like = ragged_like(True)  # every structure pending: learnt at the commit
    pytreestore.create(path, like, backend=backend, chunk_records=8, **RAGGED_DECL).close()
    with pytreestore.open(path, "a", backend=backend) as store:
        store.append(ragged_record(0))  # nothing learnt: the Ray columns of a pending
        store.append(ragged_record(8))  # structure do not exist, so learn them first
    assert pts_ray.column_names(pytreestore.open(path).schema) == [
        "elems.x",
        "elems.tags",
        "elems.trail",
        "i",
        "opt.cells",
        "opt.w",
    ]
    dataset(N, 4, ragged_rows).write_datasink(pts_ray.TreeStoreDatasink(path, backend=backend))
    store = pytreestore.open(path, backend=backend)
    assert len(store) == N + 2
    want = [ragged_record(0), ragged_record(8), *(ragged_record(i) for i in range(N))]
    for i, record in enumerate(want):
        assert_trees_equal(store.load(i, as_numpy=True), record, err_msg=f"record {i}")
    assert store.verify().ok


def test_ragged_rows_that_do_not_fit_commit_nothing(tmp_path):
    from tests.trial_harness import RAGGED_DECL, ragged_like

    path = tmp_path / "ragged"
    pytreestore.create(path, ragged_like(False), **RAGGED_DECL).close()

    def uneven(batch: dict[str, np.ndarray]) -> dict[str, Any]:
        out = ragged_rows(batch)
        if batch["id"][0] >= 20:  # a list of x values one longer than the record's list
            out["elems.x"] = [[*xs, np.float32(0)] for xs in out["elems.x"]]
        return out

    with pytest.raises(SchemaMismatchError, match="hold lists of different lengths"):
        dataset(N, 4, uneven).write_datasink(pts_ray.TreeStoreDatasink(path))

    def half_absent(batch: dict[str, np.ndarray]) -> dict[str, Any]:
        out = ragged_rows(batch)
        out["opt.w"] = [None] * len(out["opt.w"])  # None where opt.cells is not
        return out

    with pytest.raises(SchemaMismatchError, match=re.escape("optional subtree at ['opt']")):
        dataset(N, 4, half_absent).write_datasink(pts_ray.TreeStoreDatasink(path))
    assert len(pytreestore.open(path)) == 0


def test_a_pending_structure_has_no_column(tmp_path):
    path = tmp_path / "pending"
    pytreestore.create(path, {"p": [], "n": np.int32(0)}, ragged=["['p']"]).close()

    def listed(batch: dict[str, np.ndarray]) -> dict[str, Any]:
        return {"n": batch["id"].astype(np.int32), "p": [[1.5] * int(i % 3) for i in batch["id"]]}

    with pytest.raises(SchemaMismatchError, match=re.escape("has not learnt the structures at")):
        dataset(8, 2, listed).write_datasink(pts_ray.TreeStoreDatasink(path))
    empty = ray.data.range(4).map_batches(lambda b: {"n": b["id"].astype(np.int32)})
    empty.write_datasink(pts_ray.TreeStoreDatasink(path))  # no element anywhere: fine
    assert [r["p"] for r in pytreestore.open(path)] == [[], [], [], []]


# ---- a new store, and Ray's default blocks (issue 46) ---------------------------------------


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_an_absent_store_is_created_from_the_first_block(tmp_path, backend):
    """As ``map(out=path)`` does: the store made from the first row (nested dicts by the dots
    of the column names), with the sink's backend and create_options."""
    path = tmp_path / "new"
    sink = pts_ray.TreeStoreDatasink(path, backend=backend, create_options={"chunk_records": 8})
    dataset().write_datasink(sink)
    store = pytreestore.open(path, backend=backend)
    assert store.schema.chunk_records == 8 and len(store) == N
    want = direct(tmp_path / "ref", backend, np.arange(N))
    got = store.load(as_numpy=True)
    assert sorted(got) == ["meta", "obs", "p"] and sorted(got["p"]) == ["x", "y"]
    assert got["meta"]["step"].dtype == np.int64  # the row's dtype: no store said otherwise
    np.testing.assert_array_equal(got["meta"]["step"], want["meta"]["step"])
    for key in ("x", "y"):
        np.testing.assert_array_equal(got["p"][key], getattr(want["p"], key))
    np.testing.assert_array_equal(got["obs"], want["obs"])
    assert [v.operation for v in store.versions()] == ["create", "append"]


def test_an_absent_store_takes_like_and_its_classes(tmp_path):
    path = tmp_path / "new"
    dataset(blocks=6).write_datasink(pts_ray.TreeStoreDatasink(path, like=LIKE))
    assert_same(
        pytreestore.open(path).load(as_numpy=True),
        direct(tmp_path / "ref", "tensorstore", np.arange(N)),
    )


def test_an_absent_ragged_store_is_created_from_like_and_declarations(tmp_path):
    from pytreestore.testing import assert_trees_equal
    from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record

    path = tmp_path / "new"
    sink = pts_ray.TreeStoreDatasink(path, like=ragged_like(False), create_options=RAGGED_DECL)
    dataset(N, 4, ragged_rows).write_datasink(sink)
    store = pytreestore.open(path)
    assert len(store) == N
    for i in range(N):
        assert_trees_equal(store.load(i, as_numpy=True), ragged_record(i), err_msg=f"record {i}")


def test_a_ragged_dataset_cannot_make_a_store_alone(tmp_path):
    path = tmp_path / "new"
    with pytest.raises(SchemaMismatchError, match="cannot be made from the rows alone"):
        dataset(N, 4, ragged_rows).write_datasink(pts_ray.TreeStoreDatasink(path))
    with pytest.raises(pytreestore.errors.StoreNotFoundError):
        pytreestore.open(path)


def test_an_empty_dataset_makes_no_store(tmp_path):
    path = tmp_path / "new"
    empty = dataset(8, 2, lambda b: {k: v[:0] for k, v in rows(b).items()})
    with pytest.raises(pytreestore.errors.StoreNotFoundError, match="no row to create it from"):
        empty.write_datasink(pts_ray.TreeStoreDatasink(path))


def test_create_options_are_checked():
    with pytest.raises(pytreestore.errors.ArgumentTypeError, match=re.escape("['overwrite']")):
        pts_ray.TreeStoreDatasink("/tmp/x.store", create_options={"overwrite": True})
    with pytest.raises(pytreestore.errors.ArgumentTypeError, match="takes a dict"):
        pts_ray.TreeStoreDatasink("/tmp/x.store", create_options=[("codec", None)])


def test_default_blocks_write_a_fragment_per_task(tmp_path):
    """``from_items`` makes 200 blocks: Ray bundles them into tasks of at least
    BYTES_PER_WRITE, each a fragment, so the commit holds one fragment, not 200."""
    path = tmp_path / "ray"
    pytreestore.create(path, LIKE, chunk_records=8).close()
    items = ray.data.from_items([{"id": i} for i in range(N)])
    assert items.materialize().num_blocks() > 2
    written = []
    original = pytreestore.TreeStore.commit_fragments

    def counted(self: Any, fragments: Any) -> Any:
        written.append(len(fragments))
        return original(self, fragments)

    pytreestore.TreeStore.commit_fragments = counted  # type: ignore[method-assign]
    try:
        items.map_batches(rows).write_datasink(pts_ray.TreeStoreDatasink(path))
    finally:
        pytreestore.TreeStore.commit_fragments = original  # type: ignore[method-assign]
    assert written == [1]
    assert_same(
        pytreestore.open(path).load(as_numpy=True),
        direct(tmp_path / "ref", "tensorstore", np.arange(N)),
    )
