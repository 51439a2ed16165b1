"""Multi-host writes: two processes under ``jax.distributed`` on 127.0.0.1, 4 CPU devices each.

Both processes create a store with ``multihost=True`` and call ``extend_batch`` with the same
global batches (tests/multihost_child.py), sharded over a mesh spanning both processes: split,
partially replicated, replicated, split on a leaf axis too, and each leaf its own way. The
stores must equal a single-process write of the same batches (values, order, classes) on both
backends, and both processes must see the same length after every batch. Failures on one
process (a batch of the wrong structure, a storage error, batches that differ) and a batch no
process holds whole must raise on both processes, commit nothing, and leave the store usable.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from tests import launch
from tests import multihost_child as child
from tests.trees import Params


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Runs the two processes once for the module; their reports, by process."""
    root = tmp_path_factory.mktemp("multihost")
    return root, launch.run_two("tests.multihost_child", root)


def reference(tmp_path: Path, backend: str, batches: list[tuple[int, int]]) -> Any:
    """The same records written by one process, as numpy."""
    with pytreestore.create(tmp_path / f"ref-{backend}", child.LIKE, backend=backend) as store:
        for first, count in batches:
            store.extend_batch(child.batch_values(first, count))
    return pytreestore.open(tmp_path / f"ref-{backend}", backend=backend).load(as_numpy=True)


def assert_same(got: Any, want: Any) -> None:
    assert type(got) is type(want) is Params
    for name in ("x", "y"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_global_batches_equal_a_single_process_write(runs, tmp_path, backend):
    root, reports = runs
    counts = [count for count, _, _ in child.BATCHES]
    firsts = np.cumsum([0, *counts[:-1]]).tolist()
    want = reference(tmp_path, backend, list(zip(firsts, counts)))
    got = pytreestore.open(root / backend, backend=backend).load(as_numpy=True)
    assert_same(got, want)
    lengths = np.cumsum(counts).tolist()
    assert [r["lengths"][backend] for r in reports] == [lengths, lengths]
    assert [r["modes"][backend] for r in reports] == ["a", "a"]


def test_each_failure_raises_on_both_processes_and_commits_nothing(runs):
    _, reports = runs
    expected = {
        "structure": "SchemaMismatchError",  # process 1's batch is a dict
        "split": "ShardingError",  # rows split across the processes on a leaf axis
        "different": "MultiHostError",  # the processes passed batches of 8 and 6 records
        "append": "MultiHostError",  # one process's append on a multi-host store
        "storage": "StorageError",  # process 1's fragment write failed
    }
    for report in reports:
        failures = report["failures"]
        for name, kind in expected.items():
            assert failures[name]["type"] == kind, (report["process"], name, failures[name])
            assert failures[name]["length"] == 0, (report["process"], name)
        assert failures["after"] == {"type": None, "length": 8}
    zero, one = (r["failures"] for r in reports)
    assert "process 1 of 2" in zero["structure"]["message"]
    assert "nothing was committed" in zero["storage"]["message"]
    assert "injected: the disk of process 1 is full" in zero["storage"]["message"]
    assert any("every process" in note for note in one["storage"]["notes"])
    assert "8 records" in zero["different"]["message"]
    assert "6 records" in zero["different"]["message"]
    assert "extend_batch" in zero["append"]["message"]


def test_the_store_after_failures_holds_only_the_good_batch(runs, tmp_path):
    root, _ = runs
    got = pytreestore.open(root / "failures").load(as_numpy=True)
    assert_same(got, reference(tmp_path, "tensorstore", [(0, 8)]))


def test_prng_key_leaves_split_over_processes(runs):
    root, reports = runs
    assert [r["keys"] for r in reports] == [8, 8]
    got = pytreestore.open(root / "keys").load()["k"]
    want = jax.random.split(jax.random.key(7), 8)
    np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))


def test_a_failed_create_or_open_raises_on_both_processes(runs):
    _, reports = runs
    for report in reports:
        opening = report["opening"]
        assert opening["exists"]["type"] == "StoreExistsError"
        assert opening["missing"]["type"] == "StoreNotFoundError"
        assert report["reopened"] == sum(count for count, _, _ in child.BATCHES)
    assert "process 0 of 2 could not create or open" in reports[1]["opening"]["exists"]["message"]


# ---- one process: multihost=True where process 0 is all there is -------------------------


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_one_process_writes_global_batches_like_extend_batch(tmp_path, backend):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    path = tmp_path / "one"
    with pytreestore.create(path, child.LIKE, backend=backend, multihost=True) as store:
        assert store.mode == "a"
        for first in (0, 8):
            batch = jax.device_put(child.batch_values(first, 8), NamedSharding(mesh, P("data")))
            store.extend_batch(batch)
        assert len(store) == 16
        store.flush()  # nothing is ever buffered
    assert_same(
        pytreestore.open(path, backend=backend).load(as_numpy=True),
        reference(tmp_path, backend, [(0, 8), (8, 8)]),
    )
    with pytreestore.open(path, "a", backend=backend, multihost=True) as store:
        store.extend_batch(child.batch_values(16, 3))
        assert len(store) == 19


def test_one_process_refusals(tmp_path):
    path = tmp_path / "one"
    store = pytreestore.create(path, child.LIKE, multihost=True)
    message = "open with multihost=True and this is process 0 of 1"
    with pytest.raises(errors.MultiHostError, match=re.escape(message)):
        store.append(child.batch_values(0, 1))
    with pytest.raises(errors.MultiHostError, match=re.escape("extend_batch(batch)")):
        store.extend([child.batch_values(0, 1)])
    with pytest.raises(errors.SchemaMismatchError, match="extend_batch takes no mask="):
        store.extend_batch(child.batch_values(0, 2), mask=child.batch_values(0, 2))
    with pytest.raises(errors.SchemaMismatchError, match="does not match the store schema"):
        store.extend_batch({"x": np.zeros((2, 4), np.float32), "y": np.zeros(2, np.int32)})
    assert len(store) == 0
    store.close()
    with pytest.raises(errors.ClosedStoreError):
        store.extend_batch(child.batch_values(0, 2))
    with pytest.raises(ValueError, match=re.escape("mode='a'")):
        pytreestore.open(path, multihost=True)
