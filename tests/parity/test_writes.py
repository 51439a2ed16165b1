"""Background chunk writes and the stacked ``extend`` on every kind of store and backend
(issue 45's parity rows for the writer).

* **Background writes**: appends that fill chunks hand them to the writer's background queue
  (:class:`~pytreestore._write.background.ChunkWrites`): the chunks' writes and their
  commits run off the caller's thread, for every table of a ragged store too; ``committed``
  counts what landed; a write that fails is reported by the next append (whose record is not
  appended) and retried; the values read back are exact.
* **Stacked extend**: an ``extend`` of a list is checked whole, then each table's rows are
  taken as one batch (not record by record); all or none; exact values, offsets past the rows
  already there.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY
from pytreestore._write.writer import Writer
from tests.parity import kinds

MATRIX = [(k, b) for k in kinds.KINDS for b in kinds.BACKENDS]
IDS = [f"{k}-{b}" for k, b in MATRIX]


def _drain(store: Any) -> None:
    """Waits for the chunks handed over (the record table's queue: every table's, in a
    ragged store)."""
    store._core.writer.tables[None].writes.drain()


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=IDS)
def test_full_chunks_are_written_and_committed_off_the_callers_thread(
    name, backend, tmp_path, monkeypatch
):
    store = kinds.create(tmp_path / "s", name, backend, chunk_records=4)
    engine = store._backend
    threads: dict[str, set[bool]] = {"write": set(), "commit": set()}

    def spy(method: str, role: str) -> None:
        real = getattr(engine, method)

        def call(*args: Any, **kwargs: Any) -> Any:
            if role == "write" or args[0] == COMMIT_KEY:
                threads[role].add(threading.current_thread() is threading.main_thread())
            return real(*args, **kwargs)

        monkeypatch.setattr(engine, method, call)

    spy("write", "write")
    for method in ("write_bytes", "write_bytes_if"):
        if hasattr(engine, method):
            spy(method, "commit")
    recs = kinds.records(name, 23)
    for r in recs:
        store.append(r)
    assert threads == {"write": {False}, "commit": {False}}  # nothing on the caller's thread
    _drain(store)
    assert (store.committed, len(store)) == (20, 23)  # five chunks handed over, committed
    store.close()
    got = pytreestore.open(tmp_path / "s", backend=backend)
    kinds.assert_same(list(got), recs)
    assert got.verify().ok


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=IDS)
def test_a_background_write_that_fails_refuses_the_next_record_and_is_retried(
    name, backend, tmp_path, monkeypatch
):
    store = kinds.create(tmp_path / "s", name, backend, chunk_records=4)
    engine = store._backend
    real, failures = engine.write, iter([True])

    def fails_once_off_thread(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread() and next(failures, False):
            raise errors.StorageError("disk full (injected)")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "write", fails_once_off_thread)
    recs = kinds.records(name, 23)
    for r in recs[:5]:  # the fifth hands the first chunk over; its write fails
        store.append(r)
    with pytest.raises(errors.StorageError, match="injected"):
        store._core.writer.tables[None].writes.wait_idle()
        store.append(recs[5])  # refused: the failure is reported, the record not appended
    assert (len(store), store.committed) == (5, 0)
    for r in recs[5:]:
        store.append(r)
    store.flush()  # the failed chunk was retried, in order
    assert store.committed == 23
    store.close()
    kinds.assert_same(list(pytreestore.open(tmp_path / "s", backend=backend)), recs)


def _count_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = Writer.write_batch

    def counted(self: Writer, blocks: Any) -> None:
        calls.append(len(blocks[0]) if blocks else 0)
        real(self, blocks)

    monkeypatch.setattr(Writer, "write_batch", counted)
    return calls


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=IDS)
def test_an_extend_of_a_list_is_stacked_and_taken_as_one_batch_per_table(
    name, backend, tmp_path, monkeypatch
):
    store = kinds.create(tmp_path / "s", name, backend, chunk_records=4)
    recs = kinds.records(name, 40)
    for r in recs[:3]:  # rows already buffered: the batch's offsets go past them
        store.append(r)
    tables = len(store._core.writer.tables)
    calls = _count_batches(monkeypatch)
    store.extend(recs[3:40])
    assert len(calls) <= 2 * tables  # per table, not per record (37 records)
    assert sum(calls) >= 37  # the record table's rows at least, in those batches
    assert store.committed >= 36  # the whole chunks at least, committed by the extend
    store.close()
    got = pytreestore.open(tmp_path / "s", backend=backend)
    kinds.assert_same(list(got), recs)
    assert got.verify().ok


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=IDS)
def test_a_stacked_extend_with_a_refused_record_appends_nothing(name, backend, tmp_path):
    store = kinds.create(tmp_path / "s", name, backend, chunk_records=4)
    recs = kinds.records(name, 30)
    store.extend(recs[:5])
    bad = dataclasses.replace(recs[20], x=np.zeros(5, np.float32))  # float32[4] in the store
    with pytest.raises(errors.SchemaMismatchError, match=r"extend\(\) refused record 15"):
        store.extend([*recs[5:20], bad, *recs[21:]])
    assert len(store) == 5
    store.extend(recs[5:])
    store.close()
    kinds.assert_same(list(pytreestore.open(tmp_path / "s", backend=backend)), recs)


@pytest.mark.parametrize(("name", "backend"), MATRIX, ids=IDS)
def test_an_extend_whose_commit_fails_appends_nothing(name, backend, tmp_path, monkeypatch):
    """All or none: an extend that raises keeps none of its records, so that a caller who
    appends them again has each once (a ragged store's extend commits every table after its
    walk; a failure there used to leave the records buffered)."""
    store = kinds.create(tmp_path / "s", name, backend, chunk_records=4)
    engine = store._backend
    failures = iter([True])

    def fail_commit_once(method: str) -> None:
        real = getattr(engine, method)

        def call(key: str, *args: Any, **kwargs: Any) -> Any:
            if key == COMMIT_KEY and next(failures, False):
                raise errors.StorageError("disk full (injected)")
            return real(key, *args, **kwargs)

        monkeypatch.setattr(engine, method, call)

    for method in ("write_bytes", "write_bytes_if"):
        if hasattr(engine, method):
            fail_commit_once(method)
    recs = kinds.records(name, 16)
    with pytest.raises(errors.StorageError, match="injected"):
        store.extend(recs[:7])
    assert (len(store), store.committed) == (0, 0)
    store.extend(recs[:7])  # again, as a caller told of the failure does
    store.extend(iter(recs[7:]))
    store.close()
    kinds.assert_same(list(pytreestore.open(tmp_path / "s", backend=backend)), recs)
