"""Inner chunks (issue 31) on every kind of store and backend: a store whose chunks are
shards of inner chunks takes appends, fragments, a truncate and a rerun, a reopen and a
verify, and reads every record back exactly, one at a time, gathered and shuffled."""

from __future__ import annotations

import numpy as np
import pytest

import pytreestore
from pytreestore.testing import assert_trees_equal
from tests.parity import kinds

MATRIX = [(k, b) for k in kinds.KINDS for b in kinds.BACKENDS]


@pytest.mark.parametrize(("kind", "backend"), MATRIX, ids=[f"{k}-{b}" for k, b in MATRIX])
def test_a_store_of_inner_chunks_keeps_every_record(tmp_path, kind, backend):
    path = str(tmp_path / "s")
    expected = kinds.filled(path, kind, backend, n=9, chunk_records=4, inner_chunk_bytes=8)
    store = pytreestore.open(path, "a", backend=backend, like=kinds.like(kind))
    schema = store.schema
    assert schema.inner_chunk_bytes == 8
    assert any(schema.inner(c) for c in schema.storage_columns)  # chunks of 2 or 4 shards
    fragment = pytreestore.write_fragment(path, kinds.records(kind, 6, start=9), backend=backend)
    store.commit_fragments([fragment])
    store.truncate(11)
    store.extend(kinds.records(kind, 5, start=11))
    store.close()
    want = [*expected, *kinds.records(kind, 7, start=9)]
    store = pytreestore.open(path, backend=backend, like=kinds.like(kind), cache_bytes=0)
    assert len(store) == 16 and store.verify().ok
    for i in (0, 3, 8, 9, 15):
        assert_trees_equal(store[i], want[i], err_msg=f"record {i}")
    assert_trees_equal(list(store), want)
    seen = []
    for batch in store.batches(
        3,
        shuffle=True,
        seed=2,
        shuffle_window=4,
        pad_to=[2, 4] if not kinds.kind(kind).is_fixed else None,
    ):
        values = batch if kinds.kind(kind).is_fixed else batch[0]
        seen += np.asarray(values.t).tolist()
    assert sorted(seen) == list(range(16))
