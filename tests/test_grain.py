"""A store as a Grain random-access data source."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import pytreestore

grain = pytest.importorskip("grain")


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
