"""create(pack=...): small fixed-shape leaves of one dtype in shared pack arrays.

The schema keeps one column per leaf; the packs are the arrays on disk. Every read and write
of a packed column goes through the pack (pytreestore/backends/_packed.py), on both backends.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import zarr

import pytreestore
from pytreestore import errors
from pytreestore._format import validate as _validate
from pytreestore.backends import TensorStoreBackend, register_backend
from pytreestore.testing import assert_trees_equal
from tests.conftest import BACKENDS

N = 11


def like() -> dict:
    return {
        "a": np.zeros((2, 3), np.float32),
        "b": np.float32(0),
        "c": np.int32(0),
        "d": np.zeros(2000, np.float32),  # 8 KB per record: above pack=True's 4 KiB
        "e": {"f": np.int32(0), "g": np.zeros(2, np.float16)},
    }


def record(i: int) -> dict:
    return {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
        "b": np.float32(-i),
        "c": np.int32(3 * i),
        "d": np.full(2000, i / 2, np.float32),
        "e": {"f": np.int32(-7 * i), "g": np.array([i, i + 0.5], np.float16)},
    }


def make(path: Path, backend: str = "tensorstore", n: int = N, **options) -> Path:
    with pytreestore.create(
        path, like(), chunk_records=4, backend=backend, pack=True, **options
    ) as s:
        s.extend(record(i) for i in range(n))
    return path


def arrays_on_disk(path: Path) -> list[str]:
    return sorted(
        str(p.parent.relative_to(path))
        for p in path.rglob("zarr.json")
        if json.loads(p.read_text())["node_type"] == "array"
    )


@pytest.mark.plain_files
def test_round_trip(tmp_path, backend):
    path = make(tmp_path / "s", backend)
    store = pytreestore.open(path, backend=backend)
    assert store.schema.paths == ("['a']", "['b']", "['c']", "['d']", "['e']['f']", "['e']['g']")
    assert [p.key for p in store.schema.packs] == ["_pack_float32_0", "_pack_int32_0"]
    assert [m[0] for m in store.schema.packs[0].members] == ["a", "b"]
    assert [c.key for c in store.schema.storage_columns] == [
        "d",
        "e/g",  # alone of its dtype: no pack
        "_pack_float32_0",
        "_pack_int32_0",
    ]
    assert arrays_on_disk(path) == ["_pack_float32_0", "_pack_int32_0", "d", "e/g"]
    assert_trees_equal(
        store.load(as_numpy=True), pytreestore.stack([record(i) for i in range(N)], as_numpy=True)
    )
    assert store.verify().ok


def test_column_subsets_records_and_iteration(tmp_path, backend):
    store = pytreestore.open(make(tmp_path / "s", backend), backend=backend)
    got = store.load(columns=["['b']", "['e']['f']"], as_numpy=True)
    np.testing.assert_array_equal(got["b"], -np.arange(N, dtype=np.float32))
    np.testing.assert_array_equal(got["e"]["f"], -7 * np.arange(N))
    assert got["a"] is None and got["c"] is None
    assert_trees_equal(store.load(5, as_numpy=True), record(5))
    assert_trees_equal(jax_to_numpy(store[7]), record(7))
    for i in (0, 1, 2, 9):  # store[i] in a loop reads ahead
        assert_trees_equal(jax_to_numpy(store[i]), record(i))
    assert_trees_equal(
        store.load([9, 2, 2], as_numpy=True),
        pytreestore.stack([record(9), record(2), record(2)], as_numpy=True),
    )
    for i, r in enumerate(store.records(as_numpy=True)):
        assert_trees_equal(r, record(i))
    assert i == N - 1


def jax_to_numpy(tree):
    import jax

    return jax.tree.map(np.asarray, tree)


def test_appending_again_after_reopen(tmp_path, backend):
    path = make(tmp_path / "s", backend, n=5)
    with pytreestore.open(path, "a", backend=backend) as s:
        s.extend(record(i) for i in range(5, N))
    store = pytreestore.open(path, backend=backend)
    assert_trees_equal(
        store.load(as_numpy=True), pytreestore.stack([record(i) for i in range(N)], as_numpy=True)
    )


def test_an_older_version_reads_its_packed_leaves(tmp_path, backend):
    """``version=`` pins the store (on OCDBT, a backend at that generation): the pinned
    backend must still read packed leaves out of their packs."""
    path = make(tmp_path / "s", backend, n=5)
    with pytreestore.open(path, "a", backend=backend) as s:
        s.extend(record(i) for i in range(5, N))
    version = max(v.version for v in pytreestore.open(path).versions() if v.records == 5)
    old = pytreestore.open(path, backend=backend, version=version)
    assert len(old) == 5
    assert_trees_equal(
        old.load(as_numpy=True), pytreestore.stack([record(i) for i in range(5)], as_numpy=True)
    )
    assert_trees_equal(jax_to_numpy(old[3]), record(3))


@pytest.mark.plain_files
def test_plain_zarr_python_sees_the_pack_arrays(tmp_path, backend):
    path = make(tmp_path / "s", backend)
    group = zarr.open_group(path, mode="r")
    assert sorted(group.array_keys()) == ["_pack_float32_0", "_pack_int32_0", "d"]
    pack = group["_pack_float32_0"]
    assert pack.shape == (N, 7)  # a: 6 elements, b: 1
    values = pack[:]
    np.testing.assert_array_equal(
        values[:, :6].reshape(N, 2, 3), np.stack([record(i)["a"] for i in range(N)])
    )
    np.testing.assert_array_equal(values[:, 6], -np.arange(N, dtype=np.float32))
    ints = group["_pack_int32_0"][:]
    np.testing.assert_array_equal(ints, np.stack([3 * np.arange(N), -7 * np.arange(N)], axis=1))
    np.testing.assert_array_equal(group["e/g"][:][:, 1], np.arange(N) + 0.5)


@pytest.mark.plain_files
def test_copy_unpacks_packs_or_keeps(tmp_path, backend):
    path = make(tmp_path / "s", backend)
    want = pytreestore.stack([record(i) for i in range(N)], as_numpy=True)
    assert pytreestore.copy(path, tmp_path / "plain", pack=False, backend=backend) == N
    assert arrays_on_disk(tmp_path / "plain") == ["a", "b", "c", "d", "e/f", "e/g"]
    plain = pytreestore.open(tmp_path / "plain", backend=backend)
    assert plain.schema.packs == ()
    assert_trees_equal(plain.load(as_numpy=True), want)
    np.testing.assert_array_equal(
        zarr.open_group(tmp_path / "plain", mode="r")["e/f"][:], -7 * np.arange(N)
    )

    pytreestore.copy(path, tmp_path / "kept", chunk_records=3, backend=backend)
    kept = pytreestore.open(tmp_path / "kept", backend=backend)
    assert [(p.key, p.chunks) for p in kept.schema.packs] == [
        ("_pack_float32_0", (3, 7)),
        ("_pack_int32_0", (3, 2)),
    ]
    assert_trees_equal(kept.load(as_numpy=True), want)

    pytreestore.copy(tmp_path / "plain", tmp_path / "repacked", pack=True, backend=backend)
    assert arrays_on_disk(tmp_path / "repacked") == arrays_on_disk(path)
    assert_trees_equal(pytreestore.open(tmp_path / "repacked").load(as_numpy=True), want)


@pytest.mark.plain_files
def test_evolve_adds_drops_and_renames_packed_columns(tmp_path, backend):
    path = make(tmp_path / "s", backend, n=6)
    with pytreestore.open(path, "a", generic=True, backend=backend) as s:
        s.evolve(drop=["['b']"], rename={"['c']": "['cc']"}, add={"['h']": np.float32(1.5)})
    assert arrays_on_disk(path) == ["_pack_float32_0", "_pack_int32_0", "d", "e/g", "h"]
    with pytreestore.open(path, "a", backend=backend) as s:
        s.extend(
            {
                **{k: v for k, v in record(i).items() if k not in "bc"},
                "cc": np.int32(3 * i),
                "h": np.float32(i),
            }
            for i in range(6, 9)
        )
    store = pytreestore.open(path, generic=True, backend=backend)
    got = store.load(as_numpy=True)
    assert "b" not in got
    np.testing.assert_array_equal(got["cc"], 3 * np.arange(9))
    np.testing.assert_array_equal(got["h"], [1.5] * 6 + [6, 7, 8])
    np.testing.assert_array_equal(got["a"], np.stack([record(i)["a"] for i in range(9)]))
    raw = zarr.open_group(path, mode="r")["_pack_float32_0"][:]
    np.testing.assert_array_equal(
        raw[:, 6], [0, -1, -2, -3, -4, -5, 0, 0, 0]
    )  # b: kept, then zeros
    assert store.verify().ok


def test_dropping_every_column_of_a_pack_hides_it(tmp_path, backend):
    path = make(tmp_path / "s", backend, n=4)
    pytreestore.evolve(path, drop=["['c']", "['e']['f']"], backend=backend)
    with pytreestore.open(path, "a", backend=backend) as s:
        assert [c.key for c in s.schema.storage_columns] == ["d", "e/g", "_pack_float32_0"]
        s.extend(
            {
                "a": record(i)["a"],
                "b": record(i)["b"],
                "d": record(i)["d"],
                "e": {"g": record(i)["e"]["g"]},
            }
            for i in range(4, 6)
        )
    store = pytreestore.open(path, generic=True, backend=backend)
    np.testing.assert_array_equal(store.load(as_numpy=True)["b"], -np.arange(6, dtype=np.float32))
    assert store.verify().ok


def test_truncate_then_append(tmp_path, backend):
    path = make(tmp_path / "s", backend)
    with pytreestore.open(path, "a", backend=backend) as s:
        s.truncate(5)
        s.extend(record(100 + i) for i in range(3))
    store = pytreestore.open(path, backend=backend)
    want = [record(i) for i in range(5)] + [record(100 + i) for i in range(3)]
    assert_trees_equal(store.load(as_numpy=True), pytreestore.stack(want, as_numpy=True))
    assert store.verify().ok


def test_a_damaged_pack_chunk_names_the_pack(tmp_path):
    path = make(tmp_path / "s")
    (path / "_pack_float32_0" / "c" / "0" / "0").write_bytes(b"garbage")
    store = pytreestore.open(path)
    with pytest.raises(errors.CorruptChunkError, match="_pack_float32_0"):
        store.load(columns="['a']", as_numpy=True)
    np.testing.assert_array_equal(store.load(columns="['c']", as_numpy=True)["c"], 3 * np.arange(N))
    report = store.verify()
    assert [(p.path, p.chunk) for p in report.problems] == [("<pack _pack_float32_0>", (0, 0))]


def edit_packs(path: Path, change) -> None:
    root = path / "zarr.json"
    meta = json.loads(root.read_text())
    change(meta["attributes"]["pytreestore"]["packs"])
    root.write_text(json.dumps(meta))
    _validate.forget_validated()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda packs: packs[0]["columns"][1].__setitem__(2, 2),
            "packs column ['b'] (float32[]) as 2 float32 elements",
        ),
        (
            lambda packs: packs[0]["columns"][1].__setitem__(0, "zz"),
            "it packs 'zz', which is no column",
        ),
        (
            lambda packs: packs[0]["columns"][1].__setitem__(1, 7),
            "column ['b'] sits at element 7, not 6",
        ),
        (
            lambda packs: packs[1]["columns"].append(["a", 2, 6]),
            "it packs column ['a'] a second time",
        ),
    ],
    ids=["count", "unknown", "gap", "twice"],
)
def test_a_damaged_packs_section_is_refused_on_first_use(tmp_path, change, message):
    path = make(tmp_path / "s")
    edit_packs(path, change)
    with pytest.raises(errors.CorruptStoreError, match=re.escape(message)):
        pytreestore.open(path).schema


def test_the_packs_section_follows_the_json_schema(tmp_path):
    path = make(tmp_path / "s")
    assert _validate.schema_errors(json.loads((path / "zarr.json").read_text())) == []
    edit_packs(path, lambda packs: packs[0].__setitem__("chunks", [4]))
    with pytest.raises(errors.CorruptStoreError, match="packs/0/chunks"):
        pytreestore.open(path).schema


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match=re.escape("pack must be False, True")):
        pytreestore.create(tmp_path / "v", like(), pack=-1)
    clash = {"_pack_float32_0": np.float32(0), "a": np.float32(0), "b": np.float32(0)}
    with pytest.raises(
        errors.SchemaMismatchError, match=re.escape("the leaf at ['_pack_float32_0']")
    ):
        pytreestore.create(tmp_path / "k", clash, pack=True)
    assert not (tmp_path / "k").exists()


def test_default_stores_are_not_packed_and_pack_limits(tmp_path):
    store = pytreestore.create(tmp_path / "p", like())
    assert store.schema.packs == () and "packs" not in store.schema.to_json()
    small = pytreestore.create(tmp_path / "q", like(), pack=8)  # leaves of at most 8 bytes
    assert [[m[0] for m in p.members] for p in small.schema.packs] == [["c", "e/f"]]
    none = pytreestore.create(tmp_path / "n", {"x": np.float32(0), "y": np.int8(0)}, pack=True)
    assert none.schema.packs == ()  # one leaf per dtype: nothing to share


def test_default_chunks_follow_the_pack_width(tmp_path):
    wide = {f"k{i:04d}": np.zeros(8, np.float32) for i in range(4000)}
    store = pytreestore.create(tmp_path / "w", wide, pack=True)
    (pack,) = store.schema.packs
    assert pack.elements == 32000
    assert store.schema.chunk_records * 32000 * 4 <= 4 << 20  # about 4 MiB chunks of the pack


class PartCounting(TensorStoreBackend):
    """TensorStore, keeping the parts of the arrays its reads are asked for."""

    parts: ClassVar[list[tuple[str, slice | None]]] = []

    def read_parts(self, requests, records):
        PartCounting.parts.extend((key, part) for key, _, part in requests)
        return super().read_parts(requests, records)


register_backend("test-part-counting", PartCounting, replace=True)

#: columns selected -> the parts of the packs read (float32: a 0-6, b 6-7; int32: c 0-1,
#: e/f 1-2; d and e/g have arrays of their own)
SPANS = [
    ("['b']", {("_pack_float32_0", (6, 7))}),
    (["['a']", "['e']['f']"], {("_pack_float32_0", (0, 6)), ("_pack_int32_0", (1, 2))}),
    (["['c']", "['d']"], {("_pack_int32_0", (0, 1))}),
    ("['e']", {("_pack_int32_0", (1, 2))}),
    (None, {("_pack_float32_0", None), ("_pack_int32_0", None)}),  # every leaf: whole rows
]


@pytest.mark.parametrize("codec", ["zstd", None])  # None: TensorStore's direct reads locally
@pytest.mark.parametrize("backend", [*BACKENDS, "test-part-counting"])
@pytest.mark.parametrize(("columns", "spans"), SPANS, ids=[str(c) for c, _ in SPANS])
def test_a_read_of_some_packed_leaves_reads_only_their_span(
    tmp_path, backend, columns, spans, codec
):
    """A packed leaf is read as its own elements of the pack (PartialReads): one leaf of a
    wide pack costs memory for its rows, not for the pack's whole rows. Every selection and
    index form reads what the unpacked store reads, on every backend."""
    path = make(tmp_path / "s", backend=backend, codec=codec)
    pytreestore.copy(path, tmp_path / "plain", pack=False)
    store = pytreestore.open(path, backend=backend, cache_bytes=0)
    plain = pytreestore.open(tmp_path / "plain", cache_bytes=0)
    PartCounting.parts.clear()
    for index in (slice(None), slice(2, 9, 3), [10, 0, 4, 4], 5, -1):
        got = store.load(index, columns=columns, as_numpy=True)
        assert_trees_equal(got, plain.load(index, columns=columns, as_numpy=True))
    if backend == "test-part-counting":
        read = {(k, p and (p.start, p.stop)) for k, p in PartCounting.parts}
        assert {(k, p) for k, p in read if k.startswith("_pack_")} == spans


def test_ragged_store_packs_each_table_and_keeps_packs_when_it_learns(tmp_path):
    """create(ragged=, optional=, pack=True) packs the record table and the list's table
    within themselves; a structure learnt later (a list empty in like, an optional None)
    gets arrays of its own and the packs stay (create refused pack= with ragged=)."""
    like = {"a": np.float32(0), "b": np.zeros(2, np.float32), "p": [], "o": None}
    path = tmp_path / "r"
    store = pytreestore.create(path, like, ragged=["['p']"], optional=["['o']"], pack=True)
    assert [[k for k, _, _ in p.members] for p in store.schema.packs] == [["a", "b"]]
    records = [
        {
            "a": np.float32(i),
            "b": np.full(2, -i, np.float32),
            "p": [{"x": np.float32(i + k), "y": np.full(2, k, np.float32)} for k in range(i % 3)],
            "o": None if i % 2 else {"u": np.float32(-i), "v": np.int8(i)},
        }
        for i in range(12)
    ]
    with store:
        store.extend(records)
    again = pytreestore.open(path)
    assert again.schema.packs == store.schema.packs
    assert {"p/-2A/x", "p/-2A/y", "o/u", "o/v"} <= set(arrays_on_disk(path))
    assert_trees_equal(list(again.records(as_numpy=True)), records)
    assert again.verify().problems == ()
    copy = tmp_path / "c"
    pytreestore.copy(path, copy, pack=True, backend="zarr")  # learnt leaves packed too
    members = [[k for k, _, _ in p.members] for p in pytreestore.open(copy).schema.packs]
    assert members == [["a", "b", "o/u"], ["p/-2A/x", "p/-2A/y"]]
    elements = sum(len(r["p"]) for r in records)  # the list's table: one row per element
    meta = json.loads((copy / "_pack_float32_1" / "zarr.json").read_text())
    assert (meta["dimension_names"][0], meta["shape"]) == ("element", [elements, 3])
    root = json.loads((copy / "zarr.json").read_text())["consolidated_metadata"]["metadata"]
    assert root["_pack_float32_1"]["shape"] == [elements, 3]
    assert root["_pack_float32_0"]["shape"] == [len(records), 4]
    assert_trees_equal(list(pytreestore.open(copy).records(as_numpy=True)), records)


def test_a_pack_across_two_tables_is_damage(tmp_path):
    path = tmp_path / "r"
    like = {"a": np.float32(0), "b": np.float32(0), "p": [{"x": np.float32(0)}]}
    with pytreestore.create(path, like, ragged=["['p']"], pack=True) as store:
        store.append(like)
    edit_packs(path, lambda packs: packs[0]["columns"].append(["p/-2A/x", 2, 1]))
    with pytest.raises(errors.CorruptStoreError, match="a pack holds the columns of one table"):
        pytreestore.open(path).schema


def test_packed_stores_on_backends_with_and_without_transactions_in_one_process(tmp_path):
    """Regression: whether a backend has transactions was remembered by its class, and a
    packed store's backend is one class (``PackedColumns``) whatever it wraps: after a packed
    OCDBT store (transactions), a packed file store's append asked its TensorStore backend
    for a transaction it lacks (AttributeError)."""
    like = {"a": np.zeros(2, np.float32), "b": np.float32(0)}
    for backend in ("ocdbt", "tensorstore", "ocdbt", "zarr"):
        path = tmp_path / backend
        with pytreestore.create(path, like, pack=True, backend=backend, overwrite=True) as s:
            s.extend([{"a": np.full(2, i, np.float32), "b": np.float32(i)} for i in range(3)])
        got = pytreestore.open(path, backend=backend).load(as_numpy=True)
        assert got["b"].tolist() == [0.0, 1.0, 2.0]
