"""The table of a list of numpy-scalar elements (``pytreestore._write.lists``): values
wait as they are and are converted per block, in order with blocks queued between them;
forgetting and rolling back drop exactly what they should, and a failed chunk write keeps
the rows it did not write. Real table writers on both backends."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log.commit_record import Commit
from pytreestore._log.protocol import layouts
from pytreestore._runtime import RUNTIME
from pytreestore._write.lists import ElementRows
from pytreestore._write.writer import Writer
from pytreestore.backends import get_backend
from pytreestore.errors import StorageError

F32, I32 = np.float32, np.int32


def _table(path: str, backend: str, chunk: int) -> tuple[Any, ElementRows]:
    """The backend of a new store at ``path`` and an :class:`ElementRows` over a table
    writer of two columns (a: float32, b: int32) of ``chunk`` rows per chunk."""
    schema = TreeSchema.from_example({"a": F32(0), "b": I32(0)}, chunk_records=chunk)
    engine = get_backend(backend)(Location.parse(path))
    engine.create_columns(layouts(schema))
    return engine, ElementRows(Writer(engine, schema, Commit(0, 0)), (F32, I32))


def _columns(start: int, n: int) -> list[Any]:
    """The values of rows ``start`` to ``start + n`` (a: i + 0.5, b: -i), row after row."""
    return [v for i in range(start, start + n) for v in (F32(i + 0.5), I32(-i))]


def _written(engine: Any, table: ElementRows) -> list[np.ndarray]:
    """The rows of ``table``'s whole chunks, read back from storage."""
    writer = table.writer
    keys = [c.key for c in writer.schema.columns]
    return engine.read(keys, slice(0, writer.start), writer.start)


def test_values_wait_until_pushed_then_fill_chunks_in_order(backend, path):
    engine, table = _table(path, backend, chunk=4)
    table.defer(_columns(0, 3))
    table.defer_blocks([np.array([10.5, 11.5], F32), np.array([-10, -11], I32)])
    table.defer(_columns(20, 2))
    assert (len(table), table.waiting, len(table.writer)) == (7, 7, 0)
    table.push()
    assert (table.waiting, len(table), table.writer.start, table.writer.fill) == (0, 7, 4, 3)
    a, b = _written(engine, table)
    assert a.tolist() == [0.5, 1.5, 2.5, 10.5] and b.tolist() == [0, -1, -2, -10]
    assert table.writer.buffers[0][:3].tolist() == [11.5, 20.5, 21.5]
    assert table.writer.buffers[1][:3].tolist() == [-11, -20, -21]
    assert a.dtype == F32 and b.dtype == I32
    engine.close()


def test_forget_drops_the_last_deferrals_only(backend, path):
    engine, table = _table(path, backend, chunk=64)
    table.defer(_columns(0, 2))
    mark = table.waiting
    table.defer(_columns(2, 3))
    table.defer_blocks([np.array([7.5], F32), np.array([7], I32)])
    table.forget(mark)
    assert (table.waiting, len(table)) == (2, 2)
    table.push()
    assert table.writer.buffers[0][:2].tolist() == [0.5, 1.5]
    engine.close()


def test_due_at_a_block_or_the_chunks_end(backend, path, monkeypatch):
    engine, table = _table(path, backend, chunk=5)
    assert table.due_at == 5  # at the chunk's end, before a block
    table.defer(_columns(0, 4))
    assert not table.due
    table.defer(_columns(4, 1))
    assert table.due
    table.push()
    assert (table.writer.start, table.writer.fill, table.due_at) == (5, 0, 5)
    monkeypatch.setattr(RUNTIME.writes, "table_block_rows", 2)
    table.flush()
    assert table.due_at == 2
    engine.close()


def test_snapshot_pushes_and_rollback_forgets_everything(backend, path):
    engine, table = _table(path, backend, chunk=64)
    table.defer(_columns(0, 2))
    position = table.snapshot()
    assert (table.waiting, len(table.writer)) == (0, 2)
    table.defer(_columns(2, 3))
    table.rollback(position)
    assert (table.waiting, len(table)) == (0, 2)
    engine.close()


def test_a_failed_chunk_write_keeps_the_rows_it_did_not_write(backend, path, monkeypatch):
    engine, table = _table(path, backend, chunk=4)
    table.defer(_columns(0, 6))

    def failing(*args: Any, **kwargs: Any) -> None:
        raise StorageError("disk full (injected)")

    monkeypatch.setattr(engine, "write", failing)
    with pytest.raises(StorageError, match="injected"):
        table.push()
    assert (table.writer.start, table.writer.fill, table.waiting) == (0, 0, 6)
    monkeypatch.undo()
    table.push()
    assert (table.writer.start, table.writer.fill, table.waiting) == (4, 2, 0)
    a, _ = _written(engine, table)
    assert a.tolist() == [0.5, 1.5, 2.5, 3.5]
    assert table.writer.buffers[0][:2].tolist() == [4.5, 5.5]
    engine.close()


def test_a_store_reads_back_what_waited_at_close(backend, path):
    like = {"p": [{"a": F32(0), "b": I32(0)}]}
    with pytreestore.create(path, like, backend=backend, ragged=["['p']"]) as store:
        for n in (3, 0, 2):
            store.append({"p": [{"a": F32(k), "b": I32(n)} for k in range(n)]})
        assert store._core.writer.tables["['p']"].waiting == 5  # type: ignore[union-attr]
    with pytreestore.open(path, backend=backend) as store:
        got = [[(float(e["a"]), int(e["b"])) for e in store[i]["p"]] for i in range(3)]
    assert got == [[(0.0, 3), (1.0, 3), (2.0, 3)], [], [(0.0, 2), (1.0, 2)]]
