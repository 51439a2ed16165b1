"""Multi-host writes of ragged and optional stores: two processes under ``jax.distributed`` on
127.0.0.1, 4 CPU devices each (tests/multihost_ragged_child.py).

Both processes create a ragged store with ``multihost=True`` and call
``extend_batch(batch, mask=mask)`` with the same padded global batches, values and mask
sharded over a mesh spanning both processes (split, partially replicated, replicated, the
mask sharded otherwise than the values). Each process writes its rows as ragged fragments,
process 0 commits them: the stores must equal one process's ``extend_batch`` of the same
batches, on both backends, and both processes must see the same length after every batch.
A batch without a mask, a mask that gives no length on one process's rows, and real values
at a structure the store has not learnt must raise on both processes and commit nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore.testing import assert_trees_equal
from tests import launch
from tests import multihost_ragged_child as child
from tests.parity import kinds
from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """Runs the two processes once for the module; their reports, by process."""
    root = tmp_path_factory.mktemp("multihost-ragged")
    return root, launch.run_two("tests.multihost_ragged_child", root, timeout=300)


def reference(tmp_path: Path, backend: str) -> pytreestore.TreeStore:
    """The same padded batches appended by one process."""
    path = tmp_path / f"ref-{backend}"
    with pytreestore.create(
        path, ragged_like(False), backend=backend, chunk_records=4, **RAGGED_DECL
    ) as store:
        for first, count, _, _ in child.BATCHES:
            batch, mask = child.padded(first, count)
            store.extend_batch(batch, mask=mask)
    return pytreestore.open(path, backend=backend)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_global_padded_batches_equal_a_single_process_write(runs, tmp_path, backend):
    root, reports = runs
    want = reference(tmp_path, backend)
    got = pytreestore.open(root / backend, backend=backend)
    total = sum(count for _, count, _, _ in child.BATCHES)
    assert len(got) == len(want) == total
    for i in range(total):
        assert_trees_equal(got.load(i, as_numpy=True), ragged_record(i), err_msg=f"record {i}")
    assert_trees_equal(got.load(as_numpy=True), want.load(as_numpy=True))
    segments = {"ragged": "segments", "as_numpy": True}
    assert_trees_equal(got.load(**segments), want.load(**segments))
    assert got.verify().ok
    lengths = np.cumsum([count for _, count, _, _ in child.BATCHES]).tolist()
    assert [r["lengths"][backend] for r in reports] == [lengths, lengths]


def test_each_failure_raises_on_both_processes_and_commits_nothing(runs):
    root, reports = runs
    expected = {"nomask": "SchemaMismatchError", "run": "SchemaMismatchError"}
    for report in reports:
        failures = report["failures"]
        for name, kind in expected.items():
            assert failures[name]["type"] == kind, (report["process"], name, failures[name])
            assert failures[name]["length"] == 0, (report["process"], name)
        assert failures["after"] == {"type": None, "length": 8}
        assert failures["pending"]["type"] == "SchemaMismatchError"
        assert failures["pending"]["length"] == 0
        assert "has not learnt yet" in failures["pending"]["message"]
    zero, one = (r["failures"] for r in reports)
    assert "mask=mask" in zero["nomask"]["message"]
    assert "not a run of True then False" in one["run"]["message"]
    assert "process 1 of 2" in zero["run"]["message"]
    store = pytreestore.open(root / "failures")
    for i in range(8):
        assert_trees_equal(store.load(i, as_numpy=True), ragged_record(i))


@pytest.mark.parametrize("cell", [f"{k}-{b}" for k in kinds.KINDS for b in kinds.BACKENDS])
def test_every_kind_and_backend(runs, cell):
    """Each kind of store of the parity matrix on each backend: global padded batches (a
    fixed store's batch alone) split over both processes, then replicated, append exactly
    the records a loop of appends would."""
    root, reports = runs
    total = sum(count for _, count, _ in child.KIND_BATCHES)
    lengths = np.cumsum([count for _, count, _ in child.KIND_BATCHES]).tolist()
    for report in reports:
        assert report["kinds"][cell] == {"type": None, "lengths": lengths}, report["process"]
    name, backend = cell.split("-")
    store = pytreestore.open(root / "kinds" / cell, backend=backend)
    kinds.assert_same(list(store), kinds.records(name, total))
    assert store.verify().ok


def test_one_process_ragged_multihost_store(tmp_path):
    """multihost=True where process 0 is all there is: a ragged store takes global padded
    batches, and refuses a batch without its mask."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    like = {"p": [np.float32(0)], "n": np.int32(0)}
    recs = [{"p": [np.float32(j) for j in range(i % 3)], "n": np.int32(i)} for i in range(8)]
    batch, mask = pytreestore.stack(recs, ragged=["['p']"])
    place = NamedSharding(mesh, P("data"))
    path = tmp_path / "one"
    with pytreestore.create(path, like, ragged=["['p']"], multihost=True) as store:
        store.extend_batch(jax.device_put(batch, place), mask=jax.device_put(mask, place))
        with pytest.raises(pytreestore.errors.SchemaMismatchError, match="mask=mask"):
            store.extend_batch(batch)
        assert len(store) == 8
    got = pytreestore.open(path)
    assert [len(r["p"]) for r in got] == [i % 3 for i in range(8)]


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_every_store_checks_a_batch_as_its_extend_batch_before_reading_a_row(tmp_path, kind):
    """One local step for every kind: the store's own ``extend_batch`` refuses the batch on
    none of its records (a mask where it needs none, none where it needs one, a column's
    dtype)."""
    from pytreestore._fragments.multihost import check_batch

    ragged = {"ragged": ["['p']"]} if kind == "ragged" else {}
    like = {"p": [np.float32(0)], "n": np.int32(0)} if ragged else {"n": np.int32(0)}
    store = pytreestore.create(tmp_path / kind, like, **ragged)
    if ragged:
        batch, mask = pytreestore.stack([{"p": [np.float32(1)], "n": np.int32(1)}], **ragged)
    else:
        batch, mask = {"n": np.arange(3, dtype=np.int32)}, None
    head, where = store.commit_now(), store.path
    check_batch(store._backend, store.schema, head, batch, mask, where)  # accepted
    refusal, other = ("mask=mask", None) if ragged else ("extend_batch takes no mask=", batch)
    with pytest.raises(pytreestore.errors.SchemaMismatchError, match=refusal):
        check_batch(store._backend, store.schema, head, batch, other, where)
    if not ragged:  # a column's dtype (a ragged store's values: as its records are walked)
        text = {**batch, "n": np.array(["a"])}
        with pytest.raises(pytreestore.errors.SchemaMismatchError, match=r"\['n'\]"):
            check_batch(store._backend, store.schema, head, text, mask, where)
    assert len(store) == 0
