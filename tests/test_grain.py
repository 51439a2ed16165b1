"""A store as a Grain random-access data source."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import pytreestore
from tests import optional

grain = optional.importorskip("grain")


@pytest.fixture
def store(tmp_path):
    s = pytreestore.create(tmp_path / "s", {"i": np.int32(0), "v": np.zeros(2, np.float32)})
    s.extend_batch(
        {"i": np.arange(20, dtype=np.int32), "v": np.arange(40, dtype=np.float32).reshape(20, 2)}
    )
    s.close()
    return pytreestore.open(tmp_path / "s")


def test_source_follows_the_protocol(store):
    source = store.grain_source()
    assert isinstance(source, grain.sources.RandomAccessDataSource)
    assert len(source) == 20
    record = source[3]
    assert isinstance(record["v"], np.ndarray) and record["v"].tolist() == [6.0, 7.0]
    rows = source._getitems([5, 1])
    assert [int(r["i"]) for r in rows] == [5, 1]
    assert repr(source) == f"GrainSource({store.path!r}, columns=None)"


def test_map_dataset_shuffle_and_batch(store):
    source = store.grain_source(columns="['i']")
    dataset = grain.MapDataset.source(source).shuffle(seed=7).batch(5)
    batches = [b["i"].tolist() for b in dataset]
    assert sorted(np.concatenate(batches).tolist()) == list(range(20)) and len(batches) == 4
    assert batches == [b["i"].tolist() for b in dataset]
    assert dataset[0]["v"] is None


def test_data_loader(store):
    source = store.grain_source()
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=1,
        num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[grain.transforms.Batch(batch_size=4)],
        worker_count=0,
    )
    got = [b["i"].tolist() for b in loader]
    assert sorted(np.concatenate(got).tolist()) == list(range(20))


def test_pickled_source_reopens_the_store(store):
    source = pickle.loads(pickle.dumps(store.grain_source()))
    assert len(source) == 20 and int(source[19]["i"]) == 19


@pytest.fixture
def ragged(tmp_path):
    """A closed ragged store of three records, lists of 2, 0 and 3 elements, one `w` None."""
    records = [
        {"p": [np.float32(1), np.float32(2)], "w": np.int8(5)},
        {"p": [], "w": None},
        {"p": [np.float32(3), np.float32(4), np.float32(5)], "w": np.int8(6)},
    ]
    like = {"p": [np.float32(0)], "w": np.int8(0)}
    with pytreestore.create(tmp_path / "r", like, ragged=["['p']"], optional=["['w']"]) as s:
        s.extend(records)
    return tmp_path / "r", records


def test_ragged_records_come_padded_with_a_mask_and_grain_batches_them(ragged):
    path, records = ragged
    source = pytreestore.open(path).grain_source()
    record, mask = source[0]
    assert record["p"].tolist() == [1, 2, 0] and mask["p"].tolist() == [True, True, False]
    batch, mask = grain.MapDataset.source(source).batch(3)[0]
    want, want_mask = pytreestore.stack(records, ragged=["['p']"], optional=["['w']"])
    for got, expected in zip(jax_leaves((batch, mask)), jax_leaves((want, want_mask))):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
    assert batch["p"].tolist() == [[1, 2, 0], [0, 0, 0], [3, 4, 5]]
    assert mask["w"].tolist() == [True, False, True] and batch["w"].tolist() == [5, 0, 6]
    assert repr(source) == f"GrainSource({str(path)!r}, columns=None)"


def test_ragged_source_pads_to_pad_to_and_pickles_it(ragged):
    path, _ = ragged
    source = pickle.loads(pickle.dumps(pytreestore.open(path).grain_source(pad_to=4)))
    batch, mask = grain.MapDataset.source(source).batch(2)[1]
    assert batch["p"].tolist() == [[3, 4, 5, 0]] and mask["p"].tolist() == [[1, 1, 1, 0]]


def test_ragged_source_refuses_longer_lists_or_cuts_them(ragged):
    path, _ = ragged
    store = pytreestore.open(path)
    with pytest.raises(pytreestore.errors.RaggedLengthError, match="3"):
        store.grain_source(pad_to=2)[2]
    record, mask = store.grain_source(pad_to=2, truncate=True)[2]
    assert record["p"].tolist() == [3, 4] and mask["p"].tolist() == [True, True]


def test_ragged_source_unpadded_gives_exact_records(ragged):
    path, _ = ragged
    source = pytreestore.open(path).grain_source(padded=False)
    assert source[1] == {"p": [], "w": None}
    assert [float(v) for v in source._getitems([2])[0]["p"]] == [3, 4, 5]


def test_fixed_source_padded_gives_all_true_masks(store):
    source = store.grain_source(padded=True)
    batch, mask = grain.MapDataset.source(source).batch(4)[1]
    assert batch["i"].tolist() == [4, 5, 6, 7] and mask["i"].tolist() == [True] * 4
    assert mask["v"].shape == (4,) and mask["v"].dtype == np.bool_


def test_padding_options_are_checked(store, ragged):
    with pytest.raises(pytreestore.errors.ArgumentError, match="padded=True"):
        store.grain_source(pad_to=3)
    with pytest.raises(pytreestore.errors.ArgumentError, match="padded=True"):
        pytreestore.open(ragged[0]).grain_source(padded=False, truncate=True)
    with pytest.raises(pytreestore.errors.ArgumentTypeError, match="an int >= 1"):
        pytreestore.open(ragged[0]).grain_source(pad_to=[2, 4])
    with pytest.raises(pytreestore.errors.ArgumentError, match="an int >= 1"):
        pytreestore.open(ragged[0]).grain_source(pad_to=0)
    with pytest.raises(pytreestore.errors.ArgumentError, match="do not apply"):
        store.grain_source(padded=True, pad_to=3)
    with pytest.raises(pytreestore.errors.ArgumentTypeError, match="padded must be"):
        store.grain_source(padded="yes")


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def test_data_loader_batches_a_ragged_store(ragged):
    path, _ = ragged
    source = pytreestore.open(path).grain_source(pad_to=4)
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shuffle=False,
        seed=0,
        num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[grain.transforms.Batch(batch_size=2)],
        worker_count=0,
    )
    got = [(b["p"].tolist(), m["p"].tolist(), m["w"].tolist()) for b, m in loader]
    assert got == [
        ([[1, 2, 0, 0], [0, 0, 0, 0]], [[1, 1, 0, 0], [0, 0, 0, 0]], [True, False]),
        ([[3, 4, 5, 0]], [[1, 1, 1, 0]], [True]),
    ]


def test_columns_of_a_padded_ragged_source(ragged):
    path, _ = ragged
    source = pytreestore.open(path).grain_source(columns="['w']")
    batch, mask = grain.MapDataset.source(source).batch(3)[0]
    assert batch == {"p": None, "w": batch["w"]} and batch["w"].tolist() == [5, 0, 6]
    assert mask["w"].tolist() == [True, False, True] and mask["p"] is None


# ---- Grain's worker processes (issue 46) ---------------------------------------------------

#: a user's program: JAX first, then a DataLoader with 2 worker processes over each store
#: given, every batch checked against the same records read in this process
WORKERS_PROGRAM = """
import sys
import jax, numpy as np
import grain, pytreestore

for path in sys.argv[1:]:
    source = pytreestore.open(path).grain_source()
    sampler = grain.samplers.IndexSampler(
        num_records=len(source), shuffle=True, seed=3, num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    loader = grain.DataLoader(
        data_source=source, sampler=sampler, worker_count=2,
        operations=[grain.transforms.Batch(batch_size=3)],
    )
    seen = []
    for batch in loader:
        records = batch[0] if isinstance(batch, tuple) else batch
        ids = [int(t) for t in records.t]
        want = jax.tree.map(lambda *x: np.stack(x), *[source[i] for i in ids])
        assert jax.tree.structure(batch) == jax.tree.structure(want), path
        for got, expected in zip(jax.tree.leaves(batch), jax.tree.leaves(want)):
            assert got.dtype == expected.dtype and np.array_equal(got, expected), path
        seen += ids
    assert sorted(seen) == list(range(len(source))), (path, seen)
    print(path, "records", len(seen))
"""

WORKER_CELLS = [("fixed", "tensorstore"), ("ragged_list", "zarr")]


def run_workers(paths: list[Any]) -> Any:
    """Runs :data:`WORKERS_PROGRAM` in a fresh interpreter, as a user's script runs."""
    import subprocess
    import sys

    from tests.conftest import child_env

    args = [sys.executable, "-c", WORKERS_PROGRAM, *map(str, paths)]
    return subprocess.run(args, capture_output=True, text=True, env=child_env(), timeout=300)


def assert_workers_yield_the_store(tmp_path: Any, cells: list[tuple[str, str]]) -> None:
    from tests.parity import kinds

    paths = [tmp_path / f"{k}-{b}" for k, b in cells]
    for path, (kind, backend) in zip(paths, cells):
        kinds.filled(path, kind, backend, n=13, chunk_records=4)
    done = run_workers(paths)
    report = f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.returncode == 0, report
    for path in paths:
        assert f"{path} records 13" in done.stdout, report
    assert "leaked" not in done.stderr and "Traceback" not in done.stderr, report


def test_a_data_loader_with_workers_yields_the_store(tmp_path):
    """``DataLoader(worker_count=2)`` in a program that never parsed absl flags: no
    ``UnparsedFlagAccessError``, every record once and equal to the store's, and no leaked
    shared memory at the exit (a fixed and a ragged store in one program)."""
    assert_workers_yield_the_store(tmp_path, WORKER_CELLS)


@pytest.mark.slow
def test_a_data_loader_with_workers_yields_every_kind(tmp_path):
    from tests.parity import kinds

    cells = [c for c in kinds_by_backend(kinds) if c not in WORKER_CELLS]
    assert_workers_yield_the_store(tmp_path, cells)


def kinds_by_backend(kinds: Any) -> list[tuple[str, str]]:
    """Every kind, each on the backends in turn, twice round (every backend and kind)."""
    from tests.conftest import diagonal

    return diagonal(kinds.KINDS, kinds.BACKENDS) + diagonal(kinds.KINDS, kinds.BACKENDS, 1)


def test_a_source_marks_only_grains_profiling_flag_and_argv_still_parses(store):
    """What lets Grain start its workers unparsed: its one flag marked given, at its default;
    absl stays unparsed, and a later ``FLAGS(argv)`` parses that flag as any other."""
    from absl import flags

    from pytreestore._pipelines.batches import _GRAIN_PROFILING_FLAG as NAME

    FLAGS = flags.FLAGS
    was_parsed, was_present = FLAGS.is_parsed(), FLAGS[NAME].present
    try:
        FLAGS.unparse_flags()
        FLAGS[NAME].present = 0
        store.grain_source()
        assert FLAGS[NAME].present and not FLAGS.is_parsed()
        assert FLAGS.grain_enable_multiprocess_worker_profiling is False  # readable now
        FLAGS(["program", f"--{NAME}"])
        assert FLAGS.grain_enable_multiprocess_worker_profiling is True
    finally:
        FLAGS.unparse_flags()
        FLAGS[NAME].present = was_present
        if was_parsed:
            FLAGS.mark_as_parsed()
