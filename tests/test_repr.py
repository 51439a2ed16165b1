"""What people see of a store: repr, the notebook table, the column tree and records."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore._format.schema import TreeSchema
from pytreestore._inspect import repr as _repr
from pytreestore._inspect.printed import format_record
from tests import trees


@pytest.fixture
def seed(tmp_path: Path) -> pytreestore.TreeStore:
    with pytreestore.create(tmp_path / "seed", trees.seed_records()[0]) as store:
        store.extend(trees.seed_records())
    return pytreestore.open(tmp_path / "seed")


def test_repr_is_one_informative_line(seed: pytreestore.TreeStore, tmp_path: Path) -> None:
    assert repr(seed) == (
        f"TreeStore({str(tmp_path / 'seed')!r}, mode='r', records=3, columns=4, nbytes=48 B)"
    )
    seed.close()
    assert repr(seed) == f"TreeStore({str(tmp_path / 'seed')!r}, mode='r', closed)"


def test_repr_of_a_writer_counts_buffered_records() -> None:
    store = pytreestore.create("memory://repr-writer", {"v": np.zeros(256, np.float32)})
    store.extend({"v": np.zeros(256, np.float32)} for _ in range(1024))
    assert repr(store).endswith("mode='a', records=1024, columns=1, nbytes=1.0 MiB)")
    store.close()


def test_describe_measures_local_and_memory_stores(seed: pytreestore.TreeStore) -> None:
    local = _repr.describe(seed)
    assert (local.records, local.format_version, local.codec) == (3, 3, "zstd")
    assert local.nbytes == 48 and [c.nbytes for c in local.columns] == [12] * 4
    assert all(c.stored and c.stored > 0 for c in local.columns)
    assert local.stored == sum(c.stored or 0 for c in local.columns)
    assert local.disk_bytes is not None and local.disk_bytes > local.stored
    assert local.ratio == pytest.approx(48 / local.stored)

    with pytreestore.create("memory://repr-mem", {"x": np.float32(0)}, codec=None) as mem:
        mem.extend({"x": np.float32(i)} for i in range(8))
        mem.flush()
        info = _repr.describe(mem)
    chunk = mem.schema.chunk_records
    stored = info.columns[0].stored
    assert stored is not None and 4 * chunk <= stored < 4 * chunk + 64  # one raw chunk, padded
    assert info.to_json()["columns"][0]["stored_bytes"] == stored


def test_sizes_and_ratios_format_for_people() -> None:
    assert [_repr.format_bytes(n) for n in (0, 1023, 1024, 1536, 5 << 20, None)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 KiB",
        "5.0 MiB",
        "?",
    ]
    assert (_repr.format_ratio(2.345), _repr.format_ratio(None)) == ("2.35x", "-")


def test_tree_rows_of_every_node_kind() -> None:
    like = {
        "nt": trees.Pair(0, None),
        "od": collections.OrderedDict(b=0, a=0),
        "t": (0,),
        "c": trees.Plain(0, [0.0]),
    }
    rows = _repr.tree_rows(TreeSchema.from_example(like).tree)
    assert [r.prefix + r.label for r in rows] == [
        "dict",
        "├── ['c']  Plain",
        "│   ├── .a",
        "│   └── .b  list[1]",
        "│       └── [0]",
        "├── ['nt']  Pair",
        "│   ├── .left",
        "│   └── .right  None",
        "├── ['od']  OrderedDict",
        "│   ├── ['b']",
        "│   └── ['a']",
        "└── ['t']  tuple[1]",
        "    └── [0]",
    ]
    assert [r.column for r in rows if r.column is not None] == list(range(6))
    root_leaf = _repr.tree_rows(TreeSchema.from_example(np.zeros(3)).tree)
    assert [(r.label, r.column) for r in root_leaf] == [("(the root leaf)", 0)]


def test_render_text_aligns_the_table(seed: pytreestore.TreeStore) -> None:
    text = _repr.render_text(_repr.describe(seed), seed.schema.tree)
    table = text.splitlines()[4:]
    leaves = [line for line in table if "int32" in line]
    assert len(leaves) == 4
    assert len({line.index("int32") for line in leaves}) == 1
    assert len({len(line) for line in leaves}) == 1


def test_format_record_of_every_node_kind() -> None:
    like = {
        "nt": trees.Pair(np.float32(0), None),
        "od": collections.OrderedDict(b=0, a=0),
        "t": (np.zeros(2, np.int8),),
        "c": trees.Plain(np.bool_(True), [0.5]),
    }
    tree = TreeSchema.from_example(like).tree
    leaves = [np.bool_(True), np.float32(0.5), np.float32(1), 2, 3, np.arange(2, dtype=np.int8)]
    assert format_record(tree, leaves, width=200) == (
        "{'c': Plain(a=True, b=[0.5]), 'nt': Pair(left=1., right=None), "
        "'od': OrderedDict({'b': 2, 'a': 3}), 't': ([0, 1],)}"
    )
    narrow = format_record(tree, leaves, width=40)
    assert narrow.splitlines()[:3] == [
        "{",
        "  'c': Plain(a=True, b=[0.5]),",
        "  'nt': Pair(left=1., right=None),",
    ]
    assert narrow.splitlines()[-2:] == ["  't': ([0, 1],),", "}"]


def test_format_record_prints_every_value_exactly() -> None:
    tree = TreeSchema.from_example(np.zeros(1000, np.float32)).tree
    values = np.linspace(0, 1, 1000, dtype=np.float32) / 3
    text = format_record(tree, [values])
    assert "..." not in text
    assert np.array_equal(np.array(ast.literal_eval(text), np.float32), values)


def test_info_of_a_packed_store_names_each_leaf_and_its_pack(tmp_path: Path) -> None:
    """Each leaf row shows its own dtype and shape, and the pack holding it (the rows were
    taken from the store's arrays by position: a packed store's leaves got the wrong ones)."""
    like = {"a": np.zeros(3, np.float32), "b": np.int8(0), "c": np.float32(0)}
    with pytreestore.create(tmp_path / "p", like, pack=True) as store:
        store.extend([like] * 4)
    info = _repr.describe(pytreestore.open(tmp_path / "p"))
    leaves = [(c.path, c.dtype, c.shape, c.pack) for c in info.leaves]
    assert leaves == [
        ("['a']", "float32", (3,), "_pack_float32_0"),
        ("['b']", "int8", (), None),
        ("['c']", "float32", (), "_pack_float32_0"),
    ]
    text = _repr.render_text(info, pytreestore.open(tmp_path / "p").schema.tree)
    assert "4 records · 3 columns" in text
    assert "_pack_float32_0  (pack, in the record table)  float32  (4,)" in text
    assert info.nbytes == 4 * (4 * 4 + 1)  # the pack's bytes and b's, each once
