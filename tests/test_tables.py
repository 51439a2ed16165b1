"""``schema.tables``: every store's axis tables and optional subtrees, none for a fixed store.

The record model's empty case: code walking axes, presence and index columns iterates
``schema.tables`` with no branch, and the on-disk format does not change (a fixed store's
schema has no ``ragged`` section, its commit records no ``tables``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import pytreestore
from pytreestore._format.keys import COMMIT_KEY
from pytreestore._format.ragged import NO_TABLES
from pytreestore._format.schema import TreeSchema
from pytreestore.errors import CorruptStoreError, SchemaMismatchError


def test_a_fixed_schema_has_no_tables_and_keeps_its_format():
    schema = TreeSchema.from_example({"x": np.float32(0), "y": np.zeros(3, np.int8)})
    assert schema.ragged is None
    assert schema.tables == NO_TABLES
    assert schema.tables.tables() == [None]
    assert schema.tables.first_tables() is None
    assert "ragged" not in schema.to_json()
    assert schema.storage_columns == schema.columns
    assert schema.table_columns == schema.columns
    assert schema.with_tables(schema.tables).ragged is None
    again = TreeSchema.from_json(json.loads(json.dumps(schema.to_json())))
    assert again.ragged is None and again.columns == schema.columns


def test_a_ragged_schema_s_tables_are_its_ragged_section(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"p": [np.int8(0)]}, ragged=["['p']"])
    schema = store.schema
    assert schema.tables is schema.ragged
    assert [a.path for a in schema.tables.axes] == ["['p']"]
    assert schema.tables.first_tables() == (("['p']", 0),)
    assert schema.with_tables(schema.tables) == schema
    assert "ragged" in schema.to_json()
    store.close()


def test_an_optional_only_store_records_empty_tables(tmp_path):
    """An optional subtree and no ragged axis: a ragged section, commit ``tables: {}``."""
    like = {"a": np.int32(0), "b": {"c": np.float32(0)}}
    store = pytreestore.create(tmp_path / "s", like, optional=["['b']"])
    assert store.schema.tables.first_tables() == ()
    store.extend([{"a": np.int32(1), "b": None}, {"a": np.int32(2), "b": {"c": 1.5}}])
    store.close()
    commit = json.loads((tmp_path / "s" / COMMIT_KEY).read_bytes())
    assert commit["tables"] == {}
    with pytreestore.open(tmp_path / "s", "a") as store:
        store.truncate(1)
    commit = json.loads((tmp_path / "s" / COMMIT_KEY).read_bytes())
    assert commit["tables"] == {} and commit["records"] == 1
    with pytreestore.open(tmp_path / "s") as reader:
        assert len(reader) == 1 and reader[0]["b"] is None


def test_a_column_in_a_table_the_schema_does_not_describe_is_refused():
    schema = TreeSchema.from_example({"x": np.float32(0)})
    info = schema.to_json()
    info["columns"][0]["table"] = "['nowhere']"
    with pytest.raises(CorruptStoreError, match=r"\['nowhere'\].*edited or damaged"):
        TreeSchema.from_json(info)


def test_a_ragged_section_without_the_column_s_axis_is_refused(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"p": [np.int8(0)]}, ragged=["['p']"])
    info = store.schema.to_json()
    store.close()
    info["ragged"]["axes"] = []
    with pytest.raises(CorruptStoreError, match=r"\['p'\].*describes no such axis"):
        TreeSchema.from_json(info)


def test_extend_batch_of_a_fixed_store_refuses_a_mask_naming_the_store(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"x": np.int32(0)})
    batch = {"x": np.arange(3, dtype=np.int32)}
    with pytest.raises(SchemaMismatchError, match=r"s holds records of one structure"):
        store.extend_batch(batch, mask={"x": np.ones(3, bool)})
    assert len(store) == 0
    store.extend_batch(batch)
    assert store.load(slice(None), as_numpy=True)["x"].tolist() == [0, 1, 2]
    store.close()


def test_a_copy_of_an_evolved_fixed_store_reads_the_same(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"x": np.int32(0)}, chunk_records=2)
    store.extend({"x": np.int32(i)} for i in range(3))
    store.evolve(add={"['y']": np.float32(7)})
    store.append({"x": np.int32(3), "y": np.float32(0.5)})
    store.close()
    pytreestore.copy(tmp_path / "s", tmp_path / "c")
    with pytreestore.open(tmp_path / "c") as copied:
        got = copied.load(slice(None), as_numpy=True)
    assert got["x"].tolist() == [0, 1, 2, 3]
    assert got["y"].tolist() == [7.0, 7.0, 7.0, 0.5]
