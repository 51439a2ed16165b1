"""Many writers on every kind of store and backend (issue 29's parity matrix): writers
sharing an OCDBT store through a coordinator.

Writers sharing a store through a coordinator need the OCDBT backend's conditional writes;
on the other backends the test is skipped with that reason (their refusal of
``coordinator=`` is tested in tests/test_ocdbt_coordinator.py). Values are compared exactly.
Multi-host ``extend_batch`` on every kind is in tests/test_multihost_ragged.py.
"""

from __future__ import annotations

import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY
from pytreestore.backends import ocdbt_coordinator
from tests.parity import kinds

MATRIX = [(k, b) for k in kinds.KINDS for b in kinds.BACKENDS]
IDS = [f"{k}-{b}" for k, b in MATRIX]


def _shared_backend(backend: str) -> None:
    if backend != "ocdbt":
        pytest.skip(f"coordinator-shared writers need the OCDBT backend, not {backend}")


@pytest.fixture(scope="module")
def coordinator():
    with ocdbt_coordinator() as address:
        yield address


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=IDS)
def test_two_shared_writers_interleave_whole_commits(name, backend, tmp_path, coordinator):
    _shared_backend(backend)
    path = tmp_path / "s"
    kinds.create(path, name, backend, chunk_records=4).close()
    recs = kinds.records(name, 23)
    a = pytreestore.open(path, "a", backend=backend, coordinator=coordinator)
    b = pytreestore.open(path, "a", backend=backend, coordinator=coordinator)
    a.append(recs[0])  # buffered
    b.extend(recs[1:6])  # a chunk's worth or more: committed at once
    a.append(recs[6])
    a.flush()  # 0 and 6, after b's
    b.append(recs[7])
    b.flush()
    a.extend(recs[8:15])
    if kinds.kind(name).is_fixed:
        b.extend_batch(pytreestore.stack(recs[15:23]))
    else:  # the padded form with its mask, as load() gives it
        kind = kinds.kind(name)
        b.extend_batch(*pytreestore.stack(recs[15:23], **kind.declarations, like=kinds.like(name)))
    with pytest.raises(errors.ReadOnlyError, match="need its only writer"):
        a.truncate(3)  # refused before anything is written
    a.close()
    b.close()
    order = [1, 2, 3, 4, 5, 0, 6, *range(7, 23)]
    store = pytreestore.open(path, backend=backend)
    kinds.assert_same(list(store), [recs[i] for i in order])
    assert [v.records for v in store.versions()] == [0, 5, 7, 8, 15, 23]
    assert store.verify().ok


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=IDS)
def test_a_shared_commit_that_landed_then_failed_is_not_written_twice(
    name, backend, tmp_path, coordinator, monkeypatch
):
    _shared_backend(backend)
    path = tmp_path / "s"
    kinds.create(path, name, backend, chunk_records=4).close()
    recs = kinds.records(name, 6)
    store = pytreestore.open(path, "a", backend=backend, coordinator=coordinator)
    engine = store._backend
    real = engine.write_bytes_if
    failures = iter([True])

    def lands_then_fails(key, data, token):
        got = real(key, data, token)
        if key == COMMIT_KEY and next(failures, False):
            raise errors.StorageError("the coordinator went away after the write")
        return got

    monkeypatch.setattr(engine, "write_bytes_if", lands_then_fails)
    store.extend(recs[:3])
    store.flush()  # read back under the claim: it landed, so the flush stands (no retry)
    assert not next(failures, False)  # the failure was injected
    store.extend(recs[3:])
    store.close()
    again = pytreestore.open(path, backend=backend)
    kinds.assert_same(list(again), recs)
    assert again.verify().ok


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=IDS)
def test_shared_and_exclusive_writers_take_turns(name, backend, tmp_path, coordinator):
    _shared_backend(backend)
    path = tmp_path / "s"
    recs = kinds.records(name, 12)
    with kinds.create(path, name, backend, chunk_records=4) as first:
        first.extend(recs[:5])  # the tail chunk is shared with the shared writer's rows
    with pytreestore.open(path, "a", backend=backend, coordinator=coordinator) as shared:
        shared.extend(recs[5:7])
        kinds.assert_same([shared[i] for i in range(7)], recs[:7])
    with pytreestore.open(path, "a", backend=backend) as exclusive:
        exclusive.extend(recs[7:10])
    with pytreestore.open(path, "a", backend=backend, coordinator=coordinator) as shared:
        shared.extend(recs[10:])
    kinds.assert_same(list(pytreestore.open(path, backend=backend)), recs)
