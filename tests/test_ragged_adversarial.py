"""Ragged stores (issue #14) under attack: damaged files, threads, pickling, fork, changed
classes and malformed inputs. Each case passes; those that found a bug are its regression tests."""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
import threading
import types
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.validate import digest
from pytreestore.testing import assert_trees_equal
from tests.test_misuse import run_in_child


@dataclasses.dataclass
class Part:
    x: Any  # float32
    tags: list  # ragged list of int16
    trail: Any  # float32[n, 2]


jax.tree_util.register_dataclass(Part, data_fields=["x", "tags", "trail"], meta_fields=[])

DECL: dict[str, Any] = {
    "ragged": ["['parts']", "['parts'][*].tags", "['parts'][*].trail", "['opt']['cells']"],
    "optional": ["['opt']"],
}


def record(i: int) -> dict[str, Any]:
    rng = np.random.default_rng([i, 3])
    parts = [
        Part(
            np.float32(rng.standard_normal()),
            [np.int16(rng.integers(-99, 99)) for _ in range(rng.integers(0, 4))],
            rng.standard_normal((int(rng.integers(0, 4)), 2)).astype(np.float32),
        )
        for _ in range(1 + i % 5)
    ]
    present = i % 3 != 1
    cells = np.arange(i % 4, dtype=np.int16)
    return {
        "id": np.int32(i),
        "parts": parts,
        "opt": {"w": np.float32(i), "cells": cells} if present else None,
    }


LIKE = record(0)


def same(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert_trees_equal(got, want)


def filled(path: Path, backend: str = "tensorstore", n: int = 12, **kw: Any) -> list:
    records = [record(i) for i in range(n)]
    with pytreestore.create(path, LIKE, backend=backend, chunk_records=4, **DECL, **kw) as s:
        s.extend(records)
    return records


def read_everything(path: Path, backend: str, records: list) -> None:
    """Every read a ragged store offers; each must equal ``records``."""
    store = pytreestore.open(path, backend=backend)
    for i, want in enumerate(records):
        same(store.load(i, as_numpy=True), want)
    same(store.load(as_numpy=True), pytreestore.stack(records, like=LIKE, as_numpy=True, **DECL))
    store.load(ragged="segments", as_numpy=True)
    store.lengths()


# ---- damaged files -------------------------------------------------------------------------------


def _chunk(path: Path, key: str) -> Path:
    files = sorted((path / key / "c").rglob("*"))
    files = [f for f in files if f.is_file()]
    assert files, f"no chunk of {key}"
    return files[0]


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: max(1, f.stat().st_size // 2)])


def _garble(f: Path) -> None:
    data = bytearray(f.read_bytes())
    for k in range(0, len(data), 3):
        data[k] ^= 0x5A
    f.write_bytes(bytes(data))


DAMAGED_CHUNKS = [
    ("parts/-2A/x", _truncate),
    ("parts/-2A/x", _garble),
    ("parts/-2A/tags/-2A", _truncate),
    ("parts-offsets", _truncate),
    ("parts-offsets", _garble),
    ("parts/-2A/trail-offsets", _garble),
    ("opt-present", _truncate),
]


@pytest.mark.plain_files
@pytest.mark.parametrize(("key", "damage"), DAMAGED_CHUNKS, ids=lambda x: getattr(x, "__name__", x))
def test_a_damaged_chunk_is_a_corrupt_chunk_error_naming_its_array(tmp_path, backend, key, damage):
    records = filled(tmp_path / "s", backend)  # zstd with crc32c: damage is detectable
    damage(_chunk(tmp_path / "s", key))
    with pytest.raises(errors.CorruptStoreError, match=key.replace("*", r"\*")):
        read_everything(tmp_path / "s", backend, records)


@pytest.mark.plain_files
@pytest.mark.parametrize("key", ["parts/-2A/x", "parts-offsets", "parts/-2A/tags-offsets"])
def test_a_missing_chunk_is_a_corrupt_chunk_error(tmp_path, backend, key):
    records = filled(tmp_path / "s", backend)
    _chunk(tmp_path / "s", key).unlink()
    with pytest.raises(errors.CorruptChunkError, match=key.replace("*", r"\*")):
        read_everything(tmp_path / "s", backend, records)


@pytest.mark.plain_files
def test_an_uncompressed_truncated_element_chunk_is_refused(tmp_path, backend):
    records = filled(tmp_path / "s", backend, codec=None)
    _truncate(_chunk(tmp_path / "s", "parts/-2A/x"))
    with pytest.raises(errors.CorruptStoreError, match=r"parts/-2A/x"):
        read_everything(tmp_path / "s", backend, records)


def _edit_commit(path: Path, edit) -> None:
    f = path / ".pytreestore" / "commit.json"
    doc = json.loads(f.read_text())
    edit(doc)
    f.write_text(json.dumps(doc))


COMMIT_EDITS = {
    "table missing": lambda d: d["tables"].pop("['parts']"),
    "tables missing": lambda d: d.pop("tables"),
    "tables a list": lambda d: d.__setitem__("tables", [1, 2]),
    "rows a string": lambda d: d["tables"].__setitem__("['parts']", "12"),
    "rows negative": lambda d: d["tables"].__setitem__("['parts']", -1),
    "rows below the offsets": lambda d: d["tables"].__setitem__("['parts']", 3),
    "rows past the arrays": lambda d: d["tables"].__setitem__("['parts']", 10**6),
}


@pytest.mark.plain_files
@pytest.mark.parametrize("edit", list(COMMIT_EDITS))
def test_a_damaged_commit_tables_entry_is_a_corrupt_store_error(tmp_path, backend, edit):
    records = filled(tmp_path / "s", backend)
    _edit_commit(tmp_path / "s", COMMIT_EDITS[edit])
    with pytest.raises(errors.CorruptStoreError, match=r"tables|\['parts'\]|parts-offsets|nope"):
        read_everything(tmp_path / "s", backend, records)


def _edit_schema(path: Path, edit, restamp: bool = True) -> None:
    f = path / "zarr.json"
    doc = json.loads(f.read_text())
    info = doc["attributes"]["pytreestore"]
    edit(info)
    if restamp:
        info["digest"] = digest(info)
    f.write_text(json.dumps(doc))


def _axis(info: dict, path: str) -> dict:
    return next(a for a in info["ragged"]["axes"] if a["path"] == path)


SCHEMA_EDITS = {
    "ragged a list": lambda i: i.__setitem__("ragged", []),
    "axes missing": lambda i: i["ragged"].pop("axes"),
    "an axis dropped": lambda i: i["ragged"]["axes"].pop(1),
    "offsets key unknown": lambda i: _axis(i, "['parts']").__setitem__("offsets", "nope-offsets"),
    "offsets key of a leaf": lambda i: _axis(i, "['parts']").__setitem__("offsets", "id"),
    "table unknown": lambda i: _axis(i, "['parts'][*].tags").__setitem__("table", "['nope']"),
    "table of itself": lambda i: _axis(i, "['parts']").__setitem__("table", "['parts']"),
    "chunk_rows zero": lambda i: _axis(i, "['parts']").__setitem__("chunk_rows", 0),
    "chunk_rows a string": lambda i: _axis(i, "['parts']").__setitem__("chunk_rows", "8"),
    "optional presence unknown": lambda i: i["ragged"]["optional"][0].__setitem__(
        "presence", "nope-present"
    ),
    "declared garbled": lambda i: i["ragged"].__setitem__("declared", {"ragged": 3}),
}


@pytest.mark.parametrize("restamp", [True, False], ids=["digest-restamped", "digest-stale"])
@pytest.mark.parametrize("edit", list(SCHEMA_EDITS))
def test_a_damaged_ragged_schema_section_is_refused_clearly(tmp_path, edit, restamp):
    """A stale digest makes the reader validate the schema against the format's JSON Schema;
    a re-stamped one (a deliberate edit) leaves it to the reader's own checks."""
    records = filled(tmp_path / "s")
    _edit_schema(tmp_path / "s", SCHEMA_EDITS[edit], restamp)
    with pytest.raises(errors.PyTreeStoreError):
        read_everything(tmp_path / "s", "tensorstore", records)


@pytest.mark.parametrize("restamp", [True, False], ids=["digest-restamped", "digest-stale"])
def test_a_schema_without_its_ragged_section_is_refused(tmp_path, restamp):
    records = filled(tmp_path / "s")
    _edit_schema(tmp_path / "s", lambda i: i.pop("ragged"), restamp)
    with pytest.raises(errors.CorruptStoreError):
        read_everything(tmp_path / "s", "tensorstore", records)


def test_records_with_only_empty_outer_lists_read_back(tmp_path):
    like = {"p": [{"x": np.float32(0), "q": [np.float32(0)]}]}
    store = pytreestore.create(tmp_path / "s", like, ragged=["['p']", "['p'][*]['q']"])
    store.append({"p": []})
    store.close()
    same(pytreestore.open(tmp_path / "s").load(0, as_numpy=True), {"p": []})


def test_records_with_only_empty_outer_lists_read_back_with_zarr(tmp_path):
    like = {"p": [{"x": np.float32(0), "q": [np.float32(0)]}]}
    path = tmp_path / "s"
    with pytreestore.create(path, like, ragged=["['p']", "['p'][*]['q']"], backend="zarr") as s:
        s.append({"p": []})
    got = pytreestore.open(path, backend="zarr").load(0, as_numpy=True)
    same(got, {"p": []})


# ---- threads, pickle, fork ----------------------------------------------------------------------


@pytest.mark.parametrize("count", [24, pytest.param(96, marks=pytest.mark.slow)])
def test_threads_read_only_exact_committed_records_while_one_appends(tmp_path, backend, count):
    """Five threads read one shared reader for as long as the writer appends ``count`` records
    (the readers spin, so they cost about five times the writer's time: the default run writes
    six chunks, flushing mid-chunk four times; ``make test-long`` four times as many)."""
    path = tmp_path / "s"
    want = [record(i) for i in range(count)]
    writer = pytreestore.create(path, LIKE, backend=backend, chunk_records=4, **DECL)
    writer.extend(want[:4])
    writer.flush()
    reader = pytreestore.open(path, backend=backend)  # one object shared by every reader
    failures: list[str] = []
    done = threading.Event()

    def read(kind: int) -> None:
        rng = np.random.default_rng(kind)
        try:
            while not done.is_set():
                n = reader.refresh()
                i = int(rng.integers(0, n))
                if kind == 0:
                    same(reader.load(i, as_numpy=True), want[i])
                elif kind == 1:
                    got = reader.load(slice(0, n), as_numpy=True)
                    same(got, pytreestore.stack(want[:n], like=LIKE, as_numpy=True, **DECL))
                else:
                    lengths = reader.lengths(slice(0, n))
                    assert lengths["['parts']"].tolist() == [len(w["parts"]) for w in want[:n]]
        except Exception as err:  # reported below with the thread's kind
            failures.append(f"reader {kind}: {type(err).__name__}: {err}")

    threads = [threading.Thread(target=read, args=(k,)) for k in (0, 1, 2, 0, 1)]
    for t in threads:
        t.start()
    try:
        for i in range(4, count):
            writer.append(want[i])
            if i % 5 == 0:
                writer.flush()
        writer.close()
    finally:
        done.set()
        for t in threads:
            t.join(60)
    assert not failures, failures[:3]
    assert reader.refresh() == count


def test_an_unpickled_reader_reads_the_same_records(tmp_path, backend):
    records = filled(tmp_path / "s", backend)
    reader = pytreestore.open(tmp_path / "s", backend=backend)
    copy = pickle.loads(pickle.dumps(reader))
    for i in (0, 5, 11):
        same(copy.load(i, as_numpy=True), records[i])
    same(copy.load(as_numpy=True), reader.load(as_numpy=True))
    assert copy.lengths()["['parts']"].tolist() == [len(r["parts"]) for r in records]


@pytest.mark.forked_reads
def test_a_forked_child_reads_the_same_records(tmp_path, backend):
    # uncompressed: TensorStore's own reads abort in a forked child (see test_misuse)
    records = filled(tmp_path / "s", backend, codec=None)
    reader = pytreestore.open(tmp_path / "s", backend=backend)
    same(reader.load(3, as_numpy=True), records[3])  # used before the fork

    def child() -> int:
        for i in range(len(records)):
            same(reader.load(i, as_numpy=True), records[i])
        want = pytreestore.stack(records, like=LIKE, as_numpy=True, **DECL)
        same(reader.load(as_numpy=True), want)
        return 7

    assert run_in_child(child) == 7


# ---- classes changed between write and open ------------------------------------------------------

V1 = """
import dataclasses, jax
@dataclasses.dataclass
class Part:
    x: object
    y: object
jax.tree_util.register_dataclass(Part, data_fields=["x", "y"], meta_fields=[])
"""
V2 = {
    "reordered": V1.replace("x: object\n    y: object", "y: object\n    x: object").replace(
        '["x", "y"]', '["y", "x"]'
    ),
    "added": V1.replace("y: object", "y: object\n    z: object = 0").replace(
        '["x", "y"]', '["x", "y", "z"]'
    ),
    "removed": V1.replace("    y: object\n", "").replace('["x", "y"]', '["x"]'),
}


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("radv_classes")
    sys.modules["radv_classes"] = module  # dataclasses looks its module up
    exec(source, module.__dict__)
    return module


@pytest.mark.parametrize("change", list(V2))
def test_a_changed_element_class(tmp_path, change):
    m = _module(V1)
    try:
        records = [
            {"p": [m.Part(np.float32(i + k), np.int32(-i - k)) for k in range(i)]} for i in range(4)
        ]
        like = {"p": [m.Part(np.float32(0), np.int32(0))]}
        with pytreestore.create(tmp_path / "s", like, ragged=["['p']"]) as store:
            store.extend(records)
        m2 = _module(V2[change])
        if change == "reordered":
            store = pytreestore.open(tmp_path / "s")
            for i, r in enumerate(records):
                got = store.load(i, as_numpy=True)
                assert all(type(p) is m2.Part for p in got["p"])
                assert [(p.x, p.y) for p in got["p"]] == [(p.x, p.y) for p in r["p"]]
        else:
            with pytest.raises(errors.SchemaMismatchError, match=r"\['p'\]\[\*\]\.[yz]"):
                pytreestore.open(tmp_path / "s").load(0, as_numpy=True)
    finally:
        sys.modules.pop("radv_classes", None)


# ---- malformed declarations ----------------------------------------------------------------------

SMALL = {"p": [{"x": np.float32(0), "v": np.zeros(3, np.float32)}], "s": np.float32(0)}
BAD_RAGGED = [1.5, b"['p']", [1], [None], [["['p']"]], "['p']", object()]


@pytest.mark.parametrize(
    "value",
    [
        *BAD_RAGGED,
        1,
        {"['p']": True},
    ],
    ids=lambda v: "object()" if type(v) is object else repr(v),  # one id in every process (xdist)
)
def test_ragged_of_a_wrong_type_is_a_declaration_error(tmp_path, value):
    with pytest.raises(errors.RaggedDeclarationError, match="ragged="):
        pytreestore.create(tmp_path / "s", SMALL, ragged=value)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value", [1, True, "['p']", b"x", [1], [None], {"a": 1}], ids=repr)
def test_optional_of_a_wrong_type_is_a_declaration_error(tmp_path, value):
    with pytest.raises(errors.RaggedDeclarationError, match="optional="):
        pytreestore.create(tmp_path / "s", SMALL, ragged=["['p']"], optional=value)


@pytest.mark.parametrize(
    ("ragged", "optional", "match"),
    [
        (["['p']", "['nope']"], None, "names nothing"),
        (["['p']", "['p'][0]['v']"], None, r"\[\*\]"),  # [0] instead of [*]
        (["['s']"], None, r"\['s'\]"),  # a scalar leaf has no leading axis
        (["['p']", "['p'][*]['x']"], None, "scalar"),  # a scalar element leaf
        (["['p']"], [""], "record itself"),  # the whole record optional
        (["['p']"], ["['nope']"], "names nothing"),
        (["['p'"], None, r"\['p'"),  # not a keypath
    ],
)
def test_a_bad_keypath_is_a_declaration_error(tmp_path, ragged, optional, match):
    with pytest.raises(errors.RaggedDeclarationError, match=match):
        pytreestore.create(tmp_path / "s", SMALL, ragged=ragged, optional=optional)
    assert not (tmp_path / "s").exists()


def test_elements_of_different_structures_in_one_list_are_refused():
    store = pytreestore.create("memory://radv-mixed", SMALL, ragged=["['p']"], overwrite=True)
    good = {"x": np.float32(1), "v": np.ones(3, np.float32)}
    with pytest.raises(errors.SchemaMismatchError, match=r"\['p'\]"):
        store.append({"p": [good, {"x": np.float32(1)}], "s": np.float32(0)})
    with pytest.raises(errors.SchemaMismatchError, match=r"\['p'\]"):
        store.append({"p": [good, np.float32(1)], "s": np.float32(0)})
    with pytest.raises(errors.SchemaMismatchError, match=r"\['p'\]"):
        store.append({"p": [good, {**good, "v": np.ones(4, np.float32)}], "s": np.float32(0)})
    assert len(store) == 0


def test_zero_d_and_one_d_leaves_are_not_confused():
    like = {"p": [np.float32(0)], "t": np.zeros((1, 2), np.float32)}
    store = pytreestore.create("memory://radv-0d", like, ragged=["['p']", "['t']"], overwrite=True)
    for bad in (
        {"p": [np.zeros(1, np.float32)], "t": np.zeros((1, 2), np.float32)},  # 1-d element
        {"p": [np.float32(0)], "t": np.float32(0)},  # 0-d where a ragged leading axis is
        {"p": [np.float32(0)], "t": np.zeros(2, np.float32)},  # 1-d: [n] without its [2]
    ):
        with pytest.raises(errors.SchemaMismatchError):
            store.append(bad)
    ok = {"p": [np.float32(1)], "t": np.zeros((0, 2), np.float32)}
    store.append(ok)
    store.flush()
    same(store.load(0, as_numpy=True), ok)


def test_an_object_array_leaf_is_refused():
    store = pytreestore.create("memory://radv-obj", SMALL, ragged=["['p']"], overwrite=True)
    bad = {
        "p": [{"x": np.array(1.0, dtype=object), "v": np.zeros(3, np.float32)}],
        "s": np.float32(0),
    }
    with pytest.raises(errors.PyTreeStoreError):
        store.append(bad)
    with pytest.raises(errors.PyTreeStoreError):
        pytreestore.create(
            "memory://radv-obj2",
            {"p": [np.array([1, "a"], dtype=object)]},
            ragged=["['p']"],
            overwrite=True,
        )


def test_a_prng_key_inside_a_ragged_list_is_refused_or_round_trips():
    keys = [jax.random.key(i) for i in range(3)]
    try:
        store = pytreestore.create(
            "memory://radv-prng", {"k": [keys[0]]}, ragged=["['k']"], overwrite=True
        )
    except errors.PyTreeStoreError as err:
        assert "['k']" in str(err) or "key" in str(err).lower()
        return
    store.append({"k": keys})
    store.flush()
    got = store[0]["k"]
    assert [jax.random.key_data(a).tolist() for a in got] == [
        jax.random.key_data(k).tolist() for k in keys
    ]


# ---- malformed read options ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    path = tmp_path_factory.mktemp("radv") / "s"
    records = filled(path, "tensorstore")
    return pytreestore.open(path), records


@pytest.mark.parametrize(
    "pad_to", [-1, 0, [16, 4], [4, 4], [], [0], True, 2.5, "pow3", [4, "8"]], ids=repr
)
def test_a_bad_pad_to_is_refused(reader, pad_to):
    store, _ = reader
    with pytest.raises((errors.RaggedDeclarationError, errors.RaggedLengthError)):
        store.load(pad_to=pad_to)


def test_a_huge_pad_to_is_refused_clearly(reader):
    store, _ = reader
    with pytest.raises(errors.PyTreeStoreError):
        store.load(pad_to=10**15)


@pytest.mark.parametrize("size", [-1, True, 2.5, "10"], ids=repr)
def test_a_bad_segments_size_is_refused(reader, size):
    store, _ = reader
    with pytest.raises((errors.RaggedDeclarationError, errors.RaggedLengthError)):
        store.load(ragged="segments", size=size)


@pytest.mark.parametrize("index", [12, -13, [0, 12], slice(None), np.int64(12)], ids=repr)
def test_an_index_out_of_range_is_a_store_index_error(reader, index):
    store, _ = reader
    if isinstance(index, slice):
        assert len(store.load(index, as_numpy=True)[0]["id"]) == 12
        return
    with pytest.raises(errors.StoreIndexError):
        store.load(index, as_numpy=True)
    with pytest.raises(errors.StoreIndexError):
        store.lengths(index)


def test_a_bool_mask_index_selects_like_a_fixed_store(reader):
    store, records = reader
    mask = np.arange(12) % 3 == 0
    fixed = pytreestore.create("memory://radv-mask", {"id": np.int32(0)}, overwrite=True)
    fixed.extend({"id": np.int32(i)} for i in range(12))
    fixed.flush()
    try:
        want_ids = fixed.load(mask, as_numpy=True)["id"]
    except errors.PyTreeStoreError as err:
        with pytest.raises(type(err)):
            store.load(mask, as_numpy=True)
        return
    got, _ = store.load(mask, as_numpy=True)
    chosen = [records[i] for i in np.flatnonzero(mask)]
    assert got["id"].tolist() == want_ids.tolist()
    same(got, pytreestore.stack(chosen, like=LIKE, as_numpy=True, **DECL)[0])


def test_an_empty_selection_gives_zero_records(reader):
    store, _ = reader
    got, mask = store.load([], as_numpy=True)
    want, want_mask = pytreestore.stack([], like=LIKE, as_numpy=True, **DECL)
    shapes = lambda t: jax.tree.map(lambda a: (a.shape, a.dtype), t)  # noqa: E731
    assert shapes(got) == shapes(want) and shapes(mask) == shapes(want_mask)
    assert all(a.shape[0] == 0 for a in jax.tree.leaves(got))
    values, segments = store.load([], ragged="segments", as_numpy=True)
    assert segments["['parts']"].record.shape == (0,)
    assert all(a.shape[0] == 0 for a in jax.tree.leaves(values))
    assert {k: v.tolist() for k, v in store.lengths([]).items()} == {
        k: [] for k in store.lengths([0])
    }


# ---- values ------------------------------------------------------------------------------------


def test_nan_inf_and_signed_zeros_round_trip_bit_for_bit(tmp_path):
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, np.float32(1e-45)], np.float32)
    odd_nan = np.array([0x7FC00001, 0xFFC12345], np.uint32).view(np.float32)
    like = {"p": [np.float32(0)], "t": np.zeros((1, 2), np.float32)}
    rec = {
        "p": [np.float32(v) for v in np.concatenate([special, odd_nan])],
        "t": np.stack([special, special[::-1]], 1),
    }
    with pytreestore.create(tmp_path / "s", like, ragged=["['p']", "['t']"]) as store:
        store.append(rec)
    got = pytreestore.open(tmp_path / "s").load(0, as_numpy=True)
    bits = lambda a: np.asarray(a).view(np.uint32).tolist()  # noqa: E731
    assert [bits(v) for v in got["p"]] == [bits(v) for v in rec["p"]]
    assert bits(got["t"]) == bits(rec["t"])


def test_bfloat16_leaves_in_ragged_lists_round_trip(tmp_path, backend):
    bf = ml_dtypes.bfloat16
    like = {"p": [{"a": bf(0), "b": np.zeros((1, 2), bf)}]}
    records = [
        {"p": [{"a": bf(i * 0.5 + k), "b": np.full((k, 2), i - k, bf)} for k in range(i)]}
        for i in range(5)
    ]
    decl = {"ragged": ["['p']", "['p'][*]['b']"]}
    with pytreestore.create(tmp_path / "s", like, backend=backend, **decl) as store:
        store.extend(records)
    reader = pytreestore.open(tmp_path / "s", backend=backend)
    for i, r in enumerate(records):
        same(reader.load(i, as_numpy=True), r)
    same(reader.load(as_numpy=True), pytreestore.stack(records, like=like, as_numpy=True, **decl))


def test_a_record_of_100k_elements(tmp_path):
    n = 100_000
    x = np.arange(n, dtype=np.float32)
    rec = {
        "p": [{"x": x[k], "v": np.full(3, k % 7, np.float32)} for k in range(n)],
        "s": np.float32(1),
    }
    with pytreestore.create(tmp_path / "s", SMALL, ragged=["['p']"]) as store:
        store.append({"p": [], "s": np.float32(0)})
        store.append(rec)
    reader = pytreestore.open(tmp_path / "s")
    got = reader.load(1, as_numpy=True)
    assert len(got["p"]) == n and got["p"][-1]["x"] == n - 1
    assert reader.lengths()["['p']"].tolist() == [0, n]
    values, segments = reader.load(ragged="segments", as_numpy=True)
    assert values["p"]["x"].tolist() == x.tolist() and segments["['p']"].record.shape == (n,)
    batch, mask = reader.load(as_numpy=True)
    assert batch["p"]["x"].shape == (2, n) and int(mask["p"]["x"].sum()) == n


def test_many_tiny_records(tmp_path):
    like = {"p": [np.int16(0)], "i": np.int32(0)}
    records = [{"p": [np.int16(k) for k in range(i % 3)], "i": np.int32(i)} for i in range(5000)]
    with pytreestore.create(tmp_path / "s", like, ragged=["['p']"]) as store:
        store.extend(records)
    reader = pytreestore.open(tmp_path / "s")
    same(
        reader.load(as_numpy=True),
        pytreestore.stack(records, like=like, as_numpy=True, ragged=["['p']"]),
    )
    for i in (0, 1, 2, 4999):
        same(reader.load(i, as_numpy=True), records[i])
