"""The buffering Writer (``pytreestore._write.writer``): chunk-sized buffers, when it commits,
all-or-none extends, a flush that fails and is retried, and the columns' on-disk layouts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log.protocol import layouts, start_store
from pytreestore._write.rows import FixedRecords
from pytreestore._write.writer import Writer, buffer_nbytes, check_buffer
from pytreestore.backends import TensorStoreBackend, get_backend
from pytreestore.errors import StorageError

LIKE = {"x": np.int32(0), "v": np.zeros(2, np.float32)}


def rec(i: int) -> dict[str, np.ndarray]:
    return {"x": np.int32(i), "v": np.full(2, i, np.float32)}


class Fixed:
    """A fixed store's one table writer, with the record calls its record writer makes of it
    (:class:`~pytreestore._write.rows.FixedRecords`); every other name is the writer's."""

    def __init__(self, table: Writer) -> None:
        self.table = table
        self.records = FixedRecords(table)

    def __len__(self) -> int:
        return len(self.table)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.records if hasattr(FixedRecords, name) else self.table, name)


def writer_at(path: Path, chunk: int = 4, backend: str = "tensorstore") -> Any:
    location = Location.parse(str(path))
    schema = TreeSchema.from_example(LIKE, chunk_records=chunk)
    engine = get_backend(backend)(location)
    commit, lock = start_store(engine, location, schema, overwrite=False)
    lock.release()
    return Fixed(Writer(engine, schema, commit))


def stored(path: Path, backend: str = "tensorstore") -> np.ndarray:
    return pytreestore.open(str(path), backend=backend).load(as_numpy=True)["x"]


def test_appends_are_buffered_and_a_full_chunk_commits_at_the_next_append(tmp_path):
    w = writer_at(tmp_path / "s")
    for i in range(4):
        w.append_record(rec(i))
    assert (w.commit.records, w.pending, len(w)) == (0, 4, 4)  # the chunk is full, not written
    w.append_record(rec(4))
    assert (w.commit.records, w.pending, w.start, w.fill) == (4, 1, 4, 1)
    w.flush()
    assert (w.commit.records, w.pending) == (5, 0)
    np.testing.assert_array_equal(stored(tmp_path / "s"), np.arange(5))


def test_extend_commits_once_at_its_last_whole_chunk(tmp_path):
    w = writer_at(tmp_path / "s")
    w.extend(rec(i) for i in range(10))
    assert (w.commit.records, w.commit.generation, w.pending) == (8, 1, 2)
    w.flush()
    assert (w.commit.records, w.commit.generation) == (10, 2)


def batch_of(start: int, stop: int) -> dict[str, np.ndarray]:
    i = np.arange(start, stop)
    return {"x": i.astype(np.int32), "v": np.repeat(i[:, None], 2, axis=1).astype(np.float32)}


def test_an_extend_batch_reaching_a_chunk_boundary_commits_all_its_records(tmp_path, backend):
    """One resize, one round of chunk writes (the tail chunk's with the whole ones), one
    commit: nothing is left for flush (or close) to write."""
    w = writer_at(tmp_path / "s", backend=backend)
    w.append_record(rec(0))
    w.extend_batch(batch_of(1, 11))
    assert (w.commit.records, w.commit.generation, w.pending) == (11, 1, 0)
    assert (w.start, w.fill) == (8, 3)  # the tail rows stay buffered, committed
    w.flush()
    assert w.commit.generation == 1  # nothing pending: no second commit
    np.testing.assert_array_equal(stored(tmp_path / "s", backend), np.arange(11))
    for i in range(11, 14):  # the tail chunk is written whole again, with its old rows
        w.append_record(rec(i))
    w.flush()
    got = pytreestore.open(str(tmp_path / "s"), backend=backend).load(as_numpy=True)
    np.testing.assert_array_equal(got["x"], np.arange(14))
    np.testing.assert_array_equal(got["v"], batch_of(0, 14)["v"])


@pytest.mark.parametrize(("count", "start", "fill"), [(8, 8, 0), (9, 8, 1), (3, 0, 3)])
def test_an_extend_batch_into_an_empty_buffer(tmp_path, backend, count, start, fill):
    w = writer_at(tmp_path / "s", backend=backend)
    w.extend_batch(batch_of(0, count))
    assert (w.start, w.fill) == (start, fill)
    expect = count if count >= 4 else 0  # within one chunk it stays buffered
    assert (w.commit.records, w.pending) == (expect, count - expect)
    w.flush()
    w.extend_batch(batch_of(count, count + 6))
    w.flush()
    assert w.commit.records == count + 6
    np.testing.assert_array_equal(stored(tmp_path / "s", backend), np.arange(count + 6))


def test_a_batch_whose_commit_fails_rolls_back_to_the_rows_buffered_before(
    tmp_path, backend, monkeypatch
):
    w = writer_at(tmp_path / "s", backend=backend)
    w.extend(rec(i) for i in range(2))
    failing = StorageError("the commit record could not be written (test)")

    def advance(*args, **kwargs):
        raise failing

    with monkeypatch.context() as m:
        m.setattr(w.committer, "advance", advance)
        with pytest.raises(StorageError, match="could not be written"):
            w.extend_batch(batch_of(2, 13))
    assert (len(w), w.start, w.fill, w.commit.records) == (2, 0, 2, 0)
    w.extend_batch(batch_of(2, 13))  # the retry
    assert (w.commit.records, w.commit.generation) == (13, 1)
    np.testing.assert_array_equal(stored(tmp_path / "s", backend), np.arange(13))


def test_a_flush_after_a_whole_chunk_starts_the_next_one(tmp_path):
    w = writer_at(tmp_path / "s")
    w.extend(rec(i) for i in range(4))
    w.flush()
    assert (w.start, w.fill, w.commit.records) == (4, 0, 4)


def test_a_reopened_writer_reads_its_tail_chunk_back(tmp_path):
    w = writer_at(tmp_path / "s")
    w.extend(rec(i) for i in range(6))
    w.flush()
    location = Location.parse(str(tmp_path / "s"))
    schema = TreeSchema.from_example(LIKE, chunk_records=4)
    again = Fixed(Writer(TensorStoreBackend(location), schema, w.commit))
    assert (again.start, again.fill) == (4, 2)
    again.append_record(rec(6))
    again.flush()
    np.testing.assert_array_equal(stored(tmp_path / "s"), np.arange(7))


def test_an_extend_with_a_bad_record_keeps_none_of_its_records(tmp_path):
    w = writer_at(tmp_path / "s")
    w.extend(rec(i) for i in range(3))
    bad = [rec(3), rec(4), {"x": np.int32(5)}]  # the third misses a leaf
    with pytest.raises(errors.SchemaMismatchError, match=r"extend\(\) refused record 2"):
        w.extend(bad)
    assert len(w) == 3
    with pytest.raises(errors.SchemaMismatchError, match="disagree on the number of records"):
        w.extend_batch({"x": np.zeros(2, np.int32), "v": np.zeros((3, 2), np.float32)})
    w.flush()
    np.testing.assert_array_equal(stored(tmp_path / "s"), np.arange(3))


def test_an_extend_that_crosses_chunks_and_fails_rolls_back(tmp_path):
    w = writer_at(tmp_path / "s")
    w.extend(rec(i) for i in range(2))
    records = [rec(i) for i in range(2, 9)] + [{"x": np.float64(0.5), "v": np.zeros(2)}]
    with pytest.raises(errors.SchemaMismatchError):
        w.extend(records)
    assert (len(w), w.commit.records) == (2, 0)
    w.flush()
    np.testing.assert_array_equal(stored(tmp_path / "s"), [0, 1])


def test_a_failed_flush_keeps_the_buffer_and_can_be_retried(tmp_path):
    root = tmp_path / "s"
    w = writer_at(root)
    w.extend(rec(i) for i in range(3))
    blocker = root / "x" / "c"
    blocker.write_text("not a directory")  # the column's chunks cannot be written
    with pytest.raises(errors.StorageError, match="retry the call"):
        w.flush()
    assert (w.commit.records, w.pending) == (0, 3)
    blocker.unlink()
    w.flush()
    assert w.commit.records == 3
    np.testing.assert_array_equal(stored(root), np.arange(3))


def test_layouts_describe_every_column_on_disk():
    schema = TreeSchema.from_example(LIKE, chunk_records=8, codec="gzip")
    got = {lay.key: lay for lay in layouts(schema)}
    assert set(got) == {"x", "v"}
    assert got["v"].shape == (2,) and got["v"].chunks[0] == 8 and got["v"].codec == "gzip"
    assert got["x"].dtype == np.int32 and got["x"].fill_value == 0


def test_the_buffer_is_one_chunk_of_every_column(tmp_path):
    schema = TreeSchema.from_example(LIKE, chunk_records=8)
    assert buffer_nbytes(schema) == 8 * (4 + 8)
    check_buffer(schema, str(tmp_path))
    huge = TreeSchema.from_example({"x": np.zeros(1 << 20, np.float64)}, chunk_records=1 << 20)
    with pytest.raises(errors.ChunkSizeError, match="Nothing was written"):
        check_buffer(huge, str(tmp_path))
