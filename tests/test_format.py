"""The on-disk format, read straight from the files, as docs/format.md specifies it.

Stores are written with pytreestore and then read with ``json``, raw TensorStore and
zarr-python, never through pytreestore's own readers, except to compare with ``load``.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
import zarr
from flax import struct
from zarr.errors import ZarrUserWarning

import pytreestore
from pytreestore import errors
from pytreestore._format import dtypes as _dtypes
from pytreestore._format import validate as _validate

CHUNK = 4
ML_DTYPES = frozenset(np.dtype(getattr(ml_dtypes, n)) for n in ("bfloat16", "float8_e4m3fn"))


@struct.dataclass
class Layer:
    w: Any
    b: Any
    act: str = struct.field(pytree_node=False, default="relu")
    dims: tuple = struct.field(pytree_node=False, default=(2, 3))


class Stats(NamedTuple):
    loss: Any
    flag: Any


def make_record(i: int, *, ml: bool = True) -> dict[str, Any]:
    rec = {
        "layers": [
            Layer(w=np.full((2, 3), i + 0.5, np.float32), b=np.arange(3, dtype=np.int16) * i)
        ],
        "stats": Stats(loss=np.float64(1 / (i + 1)), flag=np.bool_(i % 2)),
        "meta": {
            "lr/base": np.float32(1e-3 * (i + 1)),
            "note": None,
            "ids": (np.int64(2**40 + i),),
        },
        "step": i + 1,
        "z": np.complex64(i - 1j),
    }
    if ml:
        rec["ml"] = {
            "bf16": np.full(3, i + 1, ml_dtypes.bfloat16),
            "f8": ml_dtypes.float8_e4m3fn(i % 7 + 1),
        }
    return rec


def walk_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


#: a commit record's time: ISO 8601 in UTC to the microsecond
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def commit_core(record: dict[str, Any], schema: str | None = None) -> dict[str, Any]:
    """A commit record less its time (checked to be one) and, when given, its schema digest."""
    record = dict(record)
    assert _TIME.fullmatch(record.pop("time")), record
    if schema is not None:
        assert record.pop("schema") == schema
    return record


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def flat_columns(store: pytreestore.TreeStore) -> dict[str, np.ndarray]:
    """``store.load(as_numpy=True)`` keyed by each column's storage key."""
    import jax

    leaves = jax.tree_util.tree_leaves(store.load(as_numpy=True))
    return {c.key: leaf for c, leaf in zip(store.schema.columns, leaves)}


@pytest.fixture(params=["zstd", "blosc", "gzip", None], ids=str)
def codec(request):
    return request.param


def written(root: Path, count: int, *, codec: str | None = "zstd", ml: bool = True) -> Path:
    with pytreestore.create(root, make_record(0, ml=ml), chunk_records=CHUNK, codec=codec) as s:
        for i in range(count):
            s.append(make_record(i, ml=ml))
            if i == 5:
                s.flush()
    return root


# ---- the root group ------------------------------------------------------------------------------


def test_root_zarr_json(tmp_path):
    root = written(tmp_path / "s", 10)
    meta = read_json(root / "zarr.json")
    assert set(meta) == {"zarr_format", "node_type", "attributes", "consolidated_metadata"}
    assert meta["zarr_format"] == 3 and meta["node_type"] == "group"
    assert set(meta["attributes"]) == {"pytreestore"}
    info = meta["attributes"]["pytreestore"]
    assert set(info) == {
        "format_version", "chunk_records", "codec", "inner_chunk_bytes", "tree", "columns", "digest"
    }  # fmt: skip
    assert info["inner_chunk_bytes"] == 8 << 10  # a compressed store's default (issue 47)
    assert info["format_version"] == pytreestore.FORMAT_VERSION == 3
    assert info["chunk_records"] == CHUNK
    assert info["codec"] == "zstd"
    store = pytreestore.open(root)
    assert info == {**store.schema.to_json(), "digest": _validate.digest(info)}
    for col, spec in zip(info["columns"], store.schema.columns):
        assert set(col) - {"weak_type"} == {"path", "key", "dtype", "shape", "chunks"}
        assert col.get("weak_type", False) is spec.weak_type
        assert col["dtype"] == spec.dtype.name and col["dtype"] in _dtypes.SUPPORTED
        assert col["chunks"] == [CHUNK, *col["shape"]]


def test_tree_json_node_kinds(tmp_path):
    tree = read_json(written(tmp_path / "s", 1) / "zarr.json")["attributes"]["pytreestore"]["tree"]
    assert tree["node"] == "dict" and tree["keys"] == ["layers", "meta", "ml", "stats", "step", "z"]
    layers, meta, ml, stats, step, z = tree["children"]
    assert layers == {
        "node": "list",
        "children": [
            {
                "node": "custom",
                "type": f"{Layer.__module__}:Layer",
                "aux": {"tuple": ["relu", {"tuple": [2, 3]}]},
                "keys": [{"attr": "w"}, {"attr": "b"}],
                "children": [{"node": "leaf"}, {"node": "leaf"}],
                "aux_fields": ["act", "dims"],  # format 2: static fields by name
            }
        ],
    }
    assert meta == {
        "node": "dict",
        "keys": ["ids", "lr/base", "note"],
        "children": [
            {"node": "tuple", "children": [{"node": "leaf"}]},
            {"node": "leaf"},
            {"node": "none"},
        ],
    }
    assert stats == {
        "node": "namedtuple",
        "type": f"{Stats.__module__}:Stats",
        "fields": ["loss", "flag"],
        "children": [{"node": "leaf"}, {"node": "leaf"}],
    }
    assert ml["node"] == "dict" and step == z == {"node": "leaf"}


GOLDEN_ROOT = {
    "zarr_format": 3,
    "node_type": "group",
    "attributes": {
        "pytreestore": {
            "format_version": 3,
            "chunk_records": 8,
            "codec": "zstd",
            "tree": {
                "node": "dict",
                "keys": ["a", "b", "c"],
                "children": [
                    {"node": "list", "children": [{"node": "leaf"}]},
                    {"node": "tuple", "children": [{"node": "leaf"}, {"node": "none"}]},
                    {"node": "ordered_dict", "keys": ["x/y"], "children": [{"node": "leaf"}]},
                ],
            },
            "columns": [
                {
                    "path": "['a'][0]",
                    "key": "a/0",
                    "dtype": "float32",
                    "shape": [2],
                    "chunks": [8, 2],
                },
                {"path": "['b'][0]", "key": "b/0", "dtype": "int8", "shape": [], "chunks": [8]},
                {
                    "path": "['c']['x/y']",
                    "key": "c/x-2Fy",
                    "dtype": "bool",
                    "shape": [],
                    "chunks": [8],
                },
            ],
            "digest": "blake2b-160:979f370866bc96c6c641ab7a8f517f6a49d3802e",
        }
    },
}
GOLDEN_GROUP = {
    "zarr_format": 3,
    "node_type": "group",
    "attributes": {},
    "consolidated_metadata": {"kind": "inline", "must_understand": False, "metadata": {}},
}
GOLDEN_ARRAY = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [3, 2],
    "data_type": "float32",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 2]}},
    "chunk_key_encoding": {"name": "default"},
    "fill_value": 0.0,
    "codecs": [
        {"name": "bytes", "configuration": {"endian": "little"}},
        {"name": "zstd", "configuration": {"level": 3, "checksum": False}},
        {"name": "crc32c"},
    ],
    "dimension_names": ["record", "0_0"],
}


def golden_scalar(dtype, fill):
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [3],
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8]}},
        "chunk_key_encoding": {"name": "default"},
        "fill_value": fill,
        "codecs": [
            {"name": "bytes"},
            {"name": "zstd", "configuration": {"level": 3, "checksum": False}},
            {"name": "crc32c"},
        ],
        "dimension_names": ["record"],
    }


# format 3: every group and array below the root, as zarr v3 consolidated metadata
GOLDEN_CONSOLIDATED = {
    "kind": "inline",
    "must_understand": False,
    "metadata": {
        "a": GOLDEN_GROUP,
        "a/0": GOLDEN_ARRAY,
        "b": GOLDEN_GROUP,
        "b/0": golden_scalar("int8", 0),
        "c": GOLDEN_GROUP,
        "c/x-2Fy": golden_scalar("bool", False),
    },
}


def test_golden_small_store(tmp_path):
    import collections

    like = {"a": [np.zeros(2, np.float32)], "b": (np.int8(0), None), "c": collections.OrderedDict()}
    like["c"]["x/y"] = np.bool_(False)
    plain = {"inner_chunk_bytes": None}  # the golden's chunks are plain (format.md)
    with pytreestore.create(tmp_path / "s", like, chunk_records=8, **plain) as store:
        store.extend([like] * 3)
    root = tmp_path / "s"
    assert read_json(root / "zarr.json") == {
        **GOLDEN_ROOT,
        "consolidated_metadata": GOLDEN_CONSOLIDATED,
    }
    assert read_json(root / "a" / "0" / "zarr.json") == GOLDEN_ARRAY
    for key, doc in GOLDEN_CONSOLIDATED["metadata"].items():  # what each node's zarr.json holds
        on_disk = read_json(root / key / "zarr.json")
        group = {k: v for k, v in GOLDEN_GROUP.items() if k != "consolidated_metadata"}
        assert on_disk == (doc if doc["node_type"] == "array" else group), key
    assert walk_files(root) == [
        ".pytreestore/commit.json",
        ".pytreestore/lock",
        ".pytreestore/schemas/979f370866bc96c6c641ab7a8f517f6a49d3802e.json",
        ".pytreestore/versions/00000000000000000000.json",
        ".pytreestore/versions/00000000000000000001.json",
        "a/0/c/0/0",
        "a/0/zarr.json",
        "a/zarr.json",
        "b/0/c/0",
        "b/0/zarr.json",
        "b/zarr.json",
        "c/x-2Fy/c/0",
        "c/x-2Fy/zarr.json",
        "c/zarr.json",
        "zarr.json",
    ]  # chunks holding only fill values are stored too
    commit = read_json(root / ".pytreestore" / "commit.json")
    assert re.fullmatch("[0-9a-f]{32}", commit.pop("store"))
    digest = "blake2b-160:979f370866bc96c6c641ab7a8f517f6a49d3802e"
    assert commit_core(commit, digest) == {
        "format_version": 3,
        "records": 3,
        "generation": 1,
        "operation": "append",
    }
    version = read_json(root / ".pytreestore" / "versions" / "00000000000000000001.json")
    assert version == read_json(root / ".pytreestore" / "commit.json")  # the latest version


# ---- groups and arrays ---------------------------------------------------------------------------


def test_intermediate_groups(tmp_path):
    root = written(tmp_path / "s", 3)
    keys = [c.key for c in pytreestore.open(root).schema.columns]
    prefixes = {"/".join(k.split("/")[:i]) for k in keys for i in range(1, k.count("/") + 1)}
    assert prefixes == {"layers", "layers/0", "meta", "meta/ids", "ml", "stats"}
    for prefix in prefixes:
        assert read_json(root / prefix / "zarr.json") == {
            "zarr_format": 3,
            "node_type": "group",
            "attributes": {},
        }
    metadata = {f for f in walk_files(root) if f.endswith("zarr.json")}
    assert metadata == {"zarr.json"} | {f"{p}/zarr.json" for p in prefixes | set(keys)}


def expected_codecs(codec: str | None, dtype: np.dtype) -> list[dict[str, Any]]:
    # TensorStore leaves out "endian" for one-byte types, where it means nothing
    endian = {"configuration": {"endian": "little"}} if dtype.itemsize > 1 else {}
    chain: list[dict[str, Any]] = [{"name": "bytes"} | endian]
    if codec == "zstd":
        chain.append({"name": "zstd", "configuration": {"level": 3, "checksum": False}})
    elif codec == "gzip":
        chain.append({"name": "gzip", "configuration": {"level": 5}})
    elif codec == "blosc":
        config = {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": dtype.itemsize}
        chain.append({"name": "blosc", "configuration": config | {"blocksize": 0}})
    return [*chain, {"name": "crc32c"}]


def test_array_metadata(tmp_path, codec):
    root = written(tmp_path / "s", 10, codec=codec)
    store = pytreestore.open(root)
    assert len(store) == 10
    fills = {"b": False, "i": 0, "u": 0, "f": 0.0, "c": [0.0, 0.0]}
    for c in store.schema.columns:
        meta = read_json(root / c.key / "zarr.json")
        assert meta["zarr_format"] == 3 and meta["node_type"] == "array", c.key
        assert meta["shape"] == [10, *c.shape], c.key
        assert meta["data_type"] == c.dtype.name, c.key
        assert meta["chunk_grid"] == {
            "name": "regular",
            "configuration": {"chunk_shape": [CHUNK, *c.shape]},
        }, c.key
        assert meta["chunk_key_encoding"]["name"] == "default"
        assert meta["chunk_key_encoding"].get("configuration", {}).get("separator", "/") == "/"
        assert meta["fill_value"] == fills[_dtypes.kind(c.dtype)], c.key
        assert meta["codecs"] == expected_codecs(codec, c.dtype), c.key
        name = c.key.rsplit("/", 1)[-1].replace("-2F", "/")
        assert meta["dimension_names"] == ["record"] + [f"{name}_{i}" for i in range(len(c.shape))]
        assert set(meta) <= {
            "zarr_format",
            "node_type",
            "shape",
            "data_type",
            "chunk_grid",
            "chunk_key_encoding",
            "fill_value",
            "codecs",
            "dimension_names",
            "attributes",
        }


def test_dimension_names(tmp_path):
    root = written(tmp_path / "s", 1)
    assert read_json(root / "layers/0/w/zarr.json")["dimension_names"] == ["record", "w_0", "w_1"]
    assert read_json(root / "meta/lr-2Fbase/zarr.json")["dimension_names"] == ["record"]
    assert read_json(root / "ml/bf16/zarr.json")["dimension_names"] == ["record", "bf16_0"]


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: chunks are small."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def test_uncompressed_chunks_are_little_endian_c_order_with_crc32c(tmp_path):
    assert crc32c(b"123456789") == 0xE3069283
    root = written(tmp_path / "s", 10, codec=None)
    w = np.stack([make_record(i)["layers"][0].w for i in range(10)]).astype("<f4")
    assert sorted(p.name for p in (root / "layers/0/w/c").iterdir()) == ["0", "1", "2"]
    for chunk, rows in ((0, w[0:4]), (1, w[4:8])):
        raw = (root / f"layers/0/w/c/{chunk}/0/0").read_bytes()
        assert raw[:-4] == rows.tobytes()
        assert raw[-4:] == crc32c(raw[:-4]).to_bytes(4, "little")
    tail = (root / "layers/0/w/c/2/0/0").read_bytes()  # a whole chunk: rows 8..11
    assert len(tail) == CHUNK * 6 * 4 + 4
    assert tail[: 2 * 6 * 4] == w[8:10].tobytes()
    assert tail[-4:] == crc32c(tail[:-4]).to_bytes(4, "little")


def test_large_leaves_are_split_along_leaf_axes(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"big": np.zeros((4096, 1024), np.float32)})
    store.close()
    meta = read_json(tmp_path / "s" / "big" / "zarr.json")
    assert meta["shape"] == [0, 4096, 1024]
    assert meta["chunk_grid"]["configuration"]["chunk_shape"] == [1, 2048, 1024]


def test_default_chunk_records(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"v": np.zeros(3, np.float32), "t": 0})
    store.close()
    info = read_json(tmp_path / "s" / "zarr.json")["attributes"]["pytreestore"]
    # 4 MiB // 12 bytes = 349,525 records, capped at 2**16 so that flushes stay cheap
    assert info["chunk_records"] == 2**16
    assert read_json(tmp_path / "s" / "v" / "zarr.json")["chunk_grid"]["configuration"] == {
        "chunk_shape": [2**16, 3]
    }


# ---- the commit record ---------------------------------------------------------------------------


def test_commit_record_after_flushes(tmp_path):
    root = tmp_path / "s"
    commit = root / ".pytreestore" / "commit.json"
    store = pytreestore.create(root, {"x": np.int32(0)}, chunk_records=CHUNK)
    first = read_json(commit)
    ident = first.pop("store")  # the store's identity: random, kept by every commit
    assert re.fullmatch("[0-9a-f]{32}", ident)
    schema = first["schema"]
    assert re.fullmatch("blake2b-160:[0-9a-f]{40}", schema)
    assert commit_core(first, schema) == {
        "format_version": 3,
        "records": 0,
        "generation": 0,
        "operation": "create",
    }

    def committed(records: int, generation: int) -> None:
        assert commit_core(read_json(commit), schema) == {
            "format_version": 3,
            "records": records,
            "generation": generation,
            "store": ident,
            "operation": "append",
        }

    for i in range(3):
        store.append({"x": np.int32(i)})
    assert read_json(commit)["records"] == 0  # buffered, not committed
    store.flush()
    committed(3, 1)
    store.flush()  # nothing pending: no new commit
    committed(3, 1)
    store.append({"x": np.int32(3)})
    store.append({"x": np.int32(4)})  # the full chunk [0, 4) is handed to the background writer
    store._core.writer.tables[None].writes.drain()  # which writes and commits it
    committed(4, 2)
    store.extend({"x": np.int32(i)} for i in range(5, 14))  # commits whole chunks only
    committed(12, 3)
    store.close()
    committed(14, 4)
    assert read_json(root / "x" / "zarr.json")["shape"] == [14]
    assert (root / ".pytreestore" / "lock").is_file()
    versions = sorted(p.name for p in (root / ".pytreestore" / "versions").iterdir())
    assert versions == [f"{g:020d}.json" for g in range(5)]  # one immutable record a commit


def test_readers_trust_the_commit_not_the_array_shape(tmp_path):
    root = written(tmp_path / "s", 6, ml=False)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "step") + "/"}}
    column = ts.open(spec).result()
    column.resize(exclusive_max=[9], resize_metadata_only=True).result()  # a crashed writer
    column[6:9].write(np.array([-1, -1, -1], np.int32)).result()
    reader = pytreestore.open(root)
    assert len(reader) == 6
    assert reader.load(as_numpy=True)["step"].tolist() == [1, 2, 3, 4, 5, 6]
    assert read_json(root / "step" / "zarr.json")["shape"] == [9]
    with pytreestore.open(root, mode="a") as writer:  # repair trims to the commit
        assert read_json(root / "step" / "zarr.json")["shape"] == [6]
        writer.append(make_record(6, ml=False))
    assert pytreestore.open(root).load(as_numpy=True)["step"].tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert read_json(root / "step" / "zarr.json")["shape"] == [7]


# ---- other readers -------------------------------------------------------------------------------


def test_raw_tensorstore_reads_every_column(tmp_path, codec):
    root = written(tmp_path / "s", 10, codec=codec)
    store = pytreestore.open(root)
    expected = flat_columns(store)
    assert any(a.dtype in ML_DTYPES for a in expected.values())
    for key, want in expected.items():
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / key) + "/"}}
        got = ts.open(spec).result().read().result()
        assert same_bits(got, want), key


def test_zarr_python_reads_every_column(tmp_path, codec):
    root = written(tmp_path / "s", 10, codec=codec)
    expected = flat_columns(pytreestore.open(root))
    checked = 0
    for key, want in expected.items():
        if want.dtype in ML_DTYPES:
            continue  # zarr-python 3.1 has no bfloat16 or float8 data types
        array = zarr.open_array(root / key, mode="r")
        assert same_bits(array[...], want), key
        assert (
            list(array.metadata.dimension_names)
            == read_json(root / key / "zarr.json")["dimension_names"]
        )
        checked += 1
    assert checked == len(expected) - 2


def test_zarr_python_lists_the_hierarchy(tmp_path):
    root = written(tmp_path / "s", 10, ml=False)
    store = pytreestore.open(root)
    expected = flat_columns(store)
    group = zarr.open_group(root, mode="r")
    assert group.attrs["pytreestore"] == _validate.stamped(store.schema.to_json())
    # format 3: the root's consolidated metadata lists the hierarchy, so zarr-python never
    # meets .pytreestore/ (which is no zarr node) and warns about nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        members = dict(group.members(max_depth=None))
    with pytest.warns(ZarrUserWarning, match=re.escape("Object at .pytreestore is not recognized")):
        listed = zarr.open_group(root, mode="r", use_consolidated=False)
        assert set(dict(listed.members(max_depth=None))) == set(members)
    arrays = {k for k, v in members.items() if isinstance(v, zarr.Array)}
    groups = {k for k, v in members.items() if isinstance(v, zarr.Group)}
    assert arrays == set(expected)
    assert groups == {"layers", "layers/0", "meta", "meta/ids", "stats"}
    for key in arrays:
        assert same_bits(members[key][...], expected[key]), key


# ---- roots that are not stores -------------------------------------------------------------------


def test_no_store_at_a_missing_or_empty_directory(tmp_path):
    for where in (tmp_path / "missing", tmp_path / "empty"):
        if where.name == "empty":
            where.mkdir()
        with pytest.raises(
            errors.StoreNotFoundError, match=f"^{re.escape(f'no store at {where}')}$"
        ):
            pytreestore.open(where)


def test_missing_root_metadata(tmp_path):
    root = written(tmp_path / "s", 2)
    (root / "zarr.json").unlink()
    text = f"{root} is not a pytreestore store: zarr.json is missing"
    with pytest.raises(errors.NotAStoreError, match=f"^{re.escape(text)}$"):
        pytreestore.open(root)
    with pytest.raises(errors.NotAStoreError, match=re.escape("zarr.json is missing")):
        pytreestore.open(root, mode="a")


def test_root_metadata_not_json(tmp_path):
    root = written(tmp_path / "s", 2)
    (root / "zarr.json").write_text('{"zarr_format": 3,')
    text = f"{root}/zarr.json is not valid JSON ("
    tail = "18 bytes): the store's root metadata is truncated or damaged. Restore it from a copy"
    with pytest.raises(errors.NotAStoreError, match=f"^{re.escape(text)}.*{re.escape(tail)}"):
        pytreestore.open(root)


@pytest.mark.parametrize(
    "meta",
    [
        [1, 2],
        {"zarr_format": 3, "node_type": "group"},
        {"zarr_format": 3, "node_type": "group", "attributes": {}},
        {"zarr_format": 3, "node_type": "group", "attributes": {"pytreestore": "v1"}},
        {"zarr_format": 3, "node_type": "group", "attributes": []},
    ],
    ids=["list", "no-attributes", "no-pytreestore", "not-an-object", "attributes-list"],
)
def test_root_without_pytreestore_attribute(tmp_path, meta):
    root = written(tmp_path / "s", 2)
    (root / "zarr.json").write_text(json.dumps(meta))
    text = (
        f"{root} is a zarr node but not a pytreestore store: {root}/zarr.json has no "
        "'pytreestore' attribute"
    )
    with pytest.raises(errors.NotAStoreError, match=f"^{re.escape(text)}$"):
        pytreestore.open(root)


def test_plain_zarr_group_is_not_a_store(tmp_path):
    zarr.open_group(tmp_path / "g", mode="w").create_array("x", shape=(2,), dtype="int32")
    with pytest.raises(errors.NotAStoreError, match=re.escape("has no 'pytreestore' attribute")):
        pytreestore.open(tmp_path / "g")


def rewrite_root(root: Path, **changes: Any) -> None:
    meta = read_json(root / "zarr.json")
    info = meta["attributes"]["pytreestore"]
    for k, v in changes.items():
        if v is None:
            del info[k]
        else:
            info[k] = v
    (root / "zarr.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("mode", ["r", "a"])
def test_newer_format_version(tmp_path, mode):
    root = written(tmp_path / "s", 2)
    rewrite_root(root, format_version=99)
    text = (
        f"{root}/zarr.json says {root} is in pytreestore format 99, newer than the 3 this "
        "version reads; "
        "upgrade pytreestore to read it"
    )
    with pytest.raises(errors.FormatVersionError, match=f"^{re.escape(text)}$"):
        pytreestore.open(root, mode=mode)
    assert issubclass(errors.FormatVersionError, errors.NotAStoreError)
    # the refused writer took no lock: a writer can still open once the version is fixed
    rewrite_root(root, format_version=1)
    pytreestore.open(root, mode="a").close()


@pytest.mark.parametrize("version", [0, -1, "1", 1.0, True, None], ids=repr)
def test_invalid_format_version(tmp_path, version):
    root = written(tmp_path / "s", 2)
    if version is None:
        rewrite_root(root, format_version=None)
    else:
        rewrite_root(root, format_version=version)
    text = (
        f"{root}/zarr.json has an invalid format_version {version!r}: expected an integer "
        "from 1 to 3"
    )
    with pytest.raises(errors.NotAStoreError, match=f"^{re.escape(text)}$"):
        pytreestore.open(root)


def test_missing_commit_record(tmp_path):
    root = written(tmp_path / "s", 2)
    (root / ".pytreestore" / "commit.json").unlink()
    text = f"{root}/.pytreestore/commit.json is missing: the store was never committed"
    with pytest.raises(errors.CorruptStoreError, match=f"^{re.escape(text)}$"):
        pytreestore.open(root)


@pytest.mark.parametrize(
    "content", ["not json", "{}", '{"records": "x", "generation": 0}'], ids=["text", "empty", "bad"]
)
def test_damaged_commit_record(tmp_path, content):
    root = written(tmp_path / "s", 2)
    (root / ".pytreestore" / "commit.json").write_text(content)
    text = f"{root}/.pytreestore/commit.json is not a valid commit record: "
    with pytest.raises(errors.CorruptStoreError, match=f"^{re.escape(text)}"):
        pytreestore.open(root)


def test_malformed_schema(tmp_path):
    root = written(tmp_path / "s", 2)
    rewrite_root(root, columns=None)
    text = (
        f"{root}/zarr.json does not follow the pytreestore format 3 (its JSON Schema is "
        "pytreestore/schema.json): at /attributes/pytreestore: 'columns' is a required property"
    )
    with pytest.raises(errors.CorruptStoreError, match=f"^{re.escape(text)}"):
        pytreestore.open(root).schema


def test_column_shape_disagreeing_with_schema(tmp_path):
    root = written(tmp_path / "s", 6, ml=False)
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(root / "step") + "/"}}
    ts.open(spec).result().resize(exclusive_max=[3], resize_metadata_only=True).result()
    text = "column ['step'] holds 3 records but 6 are committed"
    with pytest.raises(errors.CorruptStoreError, match=f"^{re.escape(text)}$"):
        pytreestore.open(root, mode="a")


def test_no_warnings_reading_with_zarr_python_by_path(tmp_path):
    root = written(tmp_path / "s", 2, ml=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zarr.open_array(root / "meta" / "lr-2Fbase", mode="r")[...]


def test_files_follow_the_shipped_json_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    root = written(tmp_path / "s", 10)
    schema = json.loads((Path(pytreestore.__file__).parent / "schema.json").read_text())

    def check(document: Any, definition: str | None = None) -> None:
        target = schema
        if definition is not None:
            target = {"$ref": f"#/$defs/{definition}", "$defs": schema["$defs"]}
        jsonschema.Draft202012Validator(target).validate(document)

    check(read_json(root / "zarr.json"))
    check(read_json(root / ".pytreestore" / "commit.json"), "commit")
    for c in pytreestore.open(root).schema.columns:
        check(read_json(root / c.key / "zarr.json"), "array")
