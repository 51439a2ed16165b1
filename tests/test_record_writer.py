"""The one record writer of every store (``pytreestore._write.records``): a fixed store is
its case of one table, whose calls go straight to that table's writer; every kind commits one
commit record (``tables``, each axis table's rows, absent for a fixed store)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import pytreestore
import pytreestore.testing
from pytreestore._format.keys import COMMIT_KEY
from pytreestore._write.records import RecordWriter

#: (like, create options, two records) of each kind of store
KINDS: dict[str, tuple[Any, dict[str, Any], list[Any]]] = {
    "fixed": (
        {"x": np.int32(0), "v": np.zeros(2, np.float32)},
        {},
        [{"x": np.int32(i), "v": np.full(2, i, np.float32)} for i in (1, 2)],
    ),
    "ragged list": (
        {"x": np.int32(0), "p": [np.float32(0)]},
        {"ragged": ["['p']"]},
        [{"x": np.int32(1), "p": [np.float32(1), np.float32(2)]}, {"x": np.int32(2), "p": []}],
    ),
    "optional": (
        {"x": np.int32(0), "o": {"y": np.float32(0)}},
        {"optional": ["['o']"]},
        [{"x": np.int32(1), "o": None}, {"x": np.int32(2), "o": {"y": np.float32(3)}}],
    ),
}


def _commit_record(store: pytreestore.TreeStore) -> dict[str, Any]:
    raw = store._core.backend.read_bytes(COMMIT_KEY)  # the record readers trust, as stored
    assert raw is not None
    return json.loads(raw)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_store_has_the_one_record_writer(kind, backend, path):
    like, options, records = KINDS[kind]
    store = pytreestore.create(path, like, backend=backend, **options)
    writer = store._core.writer
    assert type(writer) is RecordWriter
    store.append(records[0])
    store.extend(records[1:])
    store.flush()
    assert writer.commit.records == len(store) == 2
    stored = _commit_record(store)
    assert stored["records"] == 2
    tables = {"fixed": None, "ragged list": {"['p']": 2}, "optional": {}}[kind]
    assert stored.get("tables") == tables  # each axis table's rows; a fixed store: absent
    pytreestore.testing.assert_trees_equal(pytreestore.open(path, backend=backend)[1], records[1])


def test_a_fixed_stores_calls_go_straight_to_its_one_table(backend, path):
    like, _, records = KINDS["fixed"]
    store = pytreestore.create(path, like, backend=backend)
    writer = store._core.writer
    assert writer is not None and list(writer.tables) == [None]
    table = writer.tables[None]
    assert not [k for k, v in vars(writer).items() if callable(v)]  # no method rebound
    assert writer._fixed is not None and writer._fixed.table is table  # no walk
    store.extend_batch(pytreestore.stack(records))
    store.flush()
    assert len(table) == writer.commit.records == 2
    np.testing.assert_array_equal(pytreestore.open(path, backend=backend).load()["x"], [1, 2])


def test_a_ragged_stores_records_are_walked_into_its_tables(backend, path):
    like, options, records = KINDS["ragged list"]
    store = pytreestore.create(path, like, backend=backend, **options)
    writer = store._core.writer
    assert writer is not None and list(writer.tables) == [None, "['p']"]
    assert "append_record" not in vars(writer)  # the walk: the class's own method
    store.extend(records)
    store.flush()
    assert [len(t) for t in writer.tables.values()] == [2, 2]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_list_past_a_chunk_fills_every_table_in_one_round(kind, backend, path):
    """``extend`` of a list writes each table's rows as one batch (``Writer.write_batch``,
    one path for every table): whole chunks and the tail, committed together."""
    like, options, records = KINDS[kind]
    store = pytreestore.create(path, like, backend=backend, chunk_records=2, **options)
    store.append(records[0])
    store.extend(records * 3)
    assert store.committed == len(store) == 7  # nothing left buffered uncommitted
    store.extend(records)
    store.flush()
    got = list(pytreestore.open(path, backend=backend).records(as_numpy=True))
    for have, want in zip(got, [records[0], *records * 4], strict=True):
        pytreestore.testing.assert_trees_equal(have, want)


def test_a_table_in_memory_keeps_a_first_batch_and_copies_it_before_a_row():
    from pytreestore._format.schema import TreeSchema
    from pytreestore._write.commits import TableRows

    rows = TableRows(TreeSchema.from_example({"x": np.int16(0)}))
    block = np.array([1, 2, 3], np.int16)
    rows.write_batch([block])
    assert rows.blocks()[0] is not None and np.shares_memory(rows.blocks()[0], block)
    rows.rollback((0, 1))
    rows.append([9])
    rows.write_batch([np.array([7], np.int16)])
    assert block.tolist() == [1, 2, 3] and rows.blocks()[0].tolist() == [1, 9, 7]
