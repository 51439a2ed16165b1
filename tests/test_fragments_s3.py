"""Fragments on S3 (a real ``moto_server`` on 127.0.0.1): chunks placed as raw bytes, and two
writers racing to commit fragments, one of which took the lock over with ``break_lock``."""

from __future__ import annotations

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from tests.test_fragments import CHUNK, batch, rec

pytestmark = pytest.mark.s3
pytest_plugins = ("tests.fixtures",)


def test_fragments_round_trip_on_s3(s3_server, bucket, backend):
    url, opts = f"s3://{bucket}/frag", s3_server.options
    store = pytreestore.create(
        url, rec(0), chunk_records=CHUNK, backend=backend, storage_options=opts
    )
    store.extend(rec(i) for i in range(4))
    frags = [
        pytreestore.write_fragment(url, batch(s, n), backend=backend, storage_options=opts)
        for s, n in ((4, 4), (8, 3), (11, 5))
    ]
    assert len(pytreestore.open(url, backend=backend, storage_options=opts)) == 4
    store.commit_fragments(frags)
    store.close()
    reader = pytreestore.open(url, backend=backend, storage_options=opts)
    loaded = reader.load(as_numpy=True)
    assert loaded["x"].tolist() == list(range(16))
    np.testing.assert_array_equal(loaded["p"].v, batch(0, 16)["p"].v)
    assert reader.verify().ok
    assert reader._backend.list_keys(".pytreestore/fragments/") == []


def test_racing_commits_of_fragments_one_wins(s3_server, bucket, backend):
    url, opts = f"s3://{bucket}/race", s3_server.options
    first = pytreestore.create(
        url, rec(0), chunk_records=CHUNK, backend=backend, storage_options=opts
    )
    mine = pytreestore.write_fragment(url, batch(0, 4), backend=backend, storage_options=opts)
    theirs = pytreestore.write_fragment(url, batch(4, 4), backend=backend, storage_options=opts)
    second = pytreestore.open(url, "a", backend=backend, storage_options=opts, break_lock=True)
    second.commit_fragments([theirs])
    with pytest.raises(errors.CommitConflictError, match="another writer committed"):
        first.commit_fragments([mine])
    reader = pytreestore.open(url, backend=backend, storage_options=opts)
    assert reader.load(as_numpy=True)["x"].tolist() == [4, 5, 6, 7]
    second.close()
    # the documented retry: open the store again and commit the same fragment
    again = pytreestore.open(url, "a", backend=backend, storage_options=opts)
    again.commit_fragments([mine])
    assert again.load(as_numpy=True)["x"].tolist() == [4, 5, 6, 7, 0, 1, 2, 3]
    again.close()


def test_ragged_fragments_on_s3_learn_and_race(s3_server, bucket, backend):
    """A ragged store's fragments as raw bytes on S3; a writer whose lock was taken over
    loses its commit (CommitConflictError) before it learns anything, and its fragments
    commit after a reopen."""
    from pytreestore.testing import assert_trees_equal
    from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record

    url, opts = f"s3://{bucket}/ragged", s3_server.options
    where = {"backend": backend, "storage_options": opts}
    first = pytreestore.create(url, ragged_like(True), chunk_records=CHUNK, **where, **RAGGED_DECL)
    mine = pytreestore.write_fragment(url, [ragged_record(i) for i in range(4)], **where)
    theirs = pytreestore.write_fragment(url, [ragged_record(i) for i in range(4, 10)], **where)
    second = pytreestore.open(url, "a", break_lock=True, **where)
    second.commit_fragments([theirs])  # learns every structure
    second.close()
    with pytest.raises(errors.CommitConflictError, match="another writer committed"):
        first.commit_fragments([mine])
    again = pytreestore.open(url, "a", **where)
    again.commit_fragments([mine])
    want = [*range(4, 10), *range(4)]
    for i, k in enumerate(want):
        assert_trees_equal(again.load(i, as_numpy=True), ragged_record(k))
    assert again.verify().ok and again.schema.pending == ()
    again.close()
