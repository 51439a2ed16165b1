"""Root metadata is validated on open against pytreestore/schema.json; bad files get clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings

import pytreestore
from pytreestore import errors
from pytreestore._format import dtypes as _dtypes
from pytreestore._format import validate as _validate
from pytreestore._format.schema import TreeSchema
from pytreestore.testing import strategies as pts
from tests import trees

LIKE = {"v": np.zeros(3, np.float32), "p": trees.Params(np.int32(0), [np.bool_(0), None])}


@pytest.fixture
def path(tmp_path) -> Path:
    with pytreestore.create(tmp_path / "s", LIKE, chunk_records=2) as store:
        store.extend([LIKE] * 3)
    return tmp_path / "s"


def edit_root(path: Path, change) -> Path:
    root = path / "zarr.json"
    meta = json.loads(root.read_text())
    change(meta["attributes"]["pytreestore"])
    root.write_text(json.dumps(meta))
    return root


def test_the_schema_is_valid_and_shipped():
    schema = _validate.json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$defs"]["column"]["properties"]["dtype"]["enum"] == list(_dtypes.SUPPORTED)
    assert schema["$defs"]["schema"]["properties"]["format_version"] == {
        "enum": list(range(1, pytreestore.FORMAT_VERSION + 1)),  # every version it reads
        "description": schema["$defs"]["schema"]["properties"]["format_version"]["description"],
    }


def test_what_create_writes_validates(path):
    assert _validate.schema_errors(json.loads((path / "zarr.json").read_text())) == []
    commit = json.loads((path / ".pytreestore" / "commit.json").read_text())
    assert _validate.schema_errors(commit, "commit") == []
    for array in ("v", "p/x", "p/y/0"):
        document = json.loads((path / array / "zarr.json").read_text())
        assert _validate.schema_errors(document, "array") == [], array


@settings(max_examples=40, deadline=None)
@given(schema=pts.tree_schemas(max_depth=5, max_leaves=8))
def test_every_schema_of_a_random_tree_validates(schema):
    document = {
        "zarr_format": 3,
        "node_type": "group",
        "attributes": {"pytreestore": TreeSchema.from_example(schema.like).to_json()},
    }
    assert _validate.schema_errors(json.loads(json.dumps(document))) == []


def test_deep_and_keyed_trees_validate():
    for like in (trees.deep_record(), trees.Keyed(np.float32(0), [np.int8(0)]), np.zeros(2)):
        doc = {
            "zarr_format": 3,
            "node_type": "group",
            "attributes": {"pytreestore": TreeSchema.from_example(like).to_json()},
        }
        assert _validate.schema_errors(doc) == []


# ---- missing, truncated, not JSON --------------------------------------------------------------


def test_missing_root(path):
    (path / "zarr.json").unlink()
    with pytest.raises(
        errors.NotAStoreError,
        match=re.escape(f"{path} is not a pytreestore store: zarr.json is missing"),
    ):
        pytreestore.open(path)


def test_empty_directory(tmp_path):
    (tmp_path / "e").mkdir()
    with pytest.raises(errors.StoreNotFoundError, match="no store at"):
        pytreestore.open(tmp_path / "e")


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b"\x89PNG\r\n\x1a\n\x00\x00", b'{"zarr_format": 3, "node_type": "gr'],
    ids=["empty", "brace", "binary", "cut"],
)
def test_truncated_or_not_json(path, content):
    (path / "zarr.json").write_bytes(content)
    with pytest.raises(errors.NotAStoreError) as info:
        pytreestore.open(path)
    message = str(info.value)
    assert message.startswith(f"{path}/zarr.json is not valid JSON (")
    assert f"; {len(content)} bytes): the store's root metadata is truncated or damaged" in message


def test_truncated_half_of_real_root(path):
    raw = (path / "zarr.json").read_bytes()
    (path / "zarr.json").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(errors.NotAStoreError, match="is not valid JSON"):
        pytreestore.open(path).schema


@pytest.mark.parametrize(
    "content",
    ["[]", "3", '{"zarr_format": 3, "node_type": "group"}', '{"attributes": {"pytreestore": 1}}'],
)
def test_json_but_not_a_store(path, content):
    (path / "zarr.json").write_text(content)
    with pytest.raises(
        errors.NotAStoreError, match=re.escape(f"{path}/zarr.json has no 'pytreestore' attribute")
    ):
        pytreestore.open(path)


# ---- format versions -----------------------------------------------------------------------------


def test_newer_format_version(path):
    edit_root(path, lambda info: info.update(format_version=4, columns="the future"))
    with pytest.raises(
        errors.FormatVersionError,
        match=re.escape(
            f"{path} is in pytreestore format 4, newer than the 3 this version reads; upgrade pytreestore to read it"
        ),
    ):
        pytreestore.open(path)


@pytest.mark.parametrize("version", [0, -1, "1", 1.0, True, None])
def test_invalid_format_version(path, version):
    edit_root(path, lambda info: info.update(format_version=version))
    with pytest.raises(
        errors.NotAStoreError,
        match=re.escape(
            f"zarr.json has an invalid format_version {version!r}: expected an integer from 1 to 3"
        ),
    ):
        pytreestore.open(path)


def test_missing_format_version(path):
    edit_root(path, lambda info: info.pop("format_version"))
    with pytest.raises(errors.NotAStoreError, match="invalid format_version None"):
        pytreestore.open(path)


# ---- the JSON Schema -----------------------------------------------------------------------------


def _set(path_in_doc, value):
    def change(info):
        node = info
        for part in path_in_doc[:-1]:
            node = node[part]
        if value is KeyError:
            del node[path_in_doc[-1]]
        else:
            node[path_in_doc[-1]] = value

    return change


SCHEMA_CASES = [
    (
        ("columns", 0, "dtype"),
        "float33",
        "at /attributes/pytreestore/columns/0/dtype: 'float33' is not one of",
    ),
    (("columns",), KeyError, "at /attributes/pytreestore: 'columns' is a required property"),
    (("columns",), [], "at /attributes/pytreestore/columns: [] should be non-empty"),
    (
        ("chunk_records",),
        0,
        "at /attributes/pytreestore/chunk_records: 0 is less than the minimum of 1",
    ),
    (
        ("chunk_records",),
        "2",
        "at /attributes/pytreestore/chunk_records: '2' is not of type 'integer'",
    ),
    (
        ("codec",),
        "lz4",
        "at /attributes/pytreestore/codec: 'lz4' is not one of ['zstd', 'blosc', 'gzip', None]",
    ),
    (
        ("shiny",),
        True,
        "at /attributes/pytreestore: Additional properties are not allowed ('shiny' was unexpected)",
    ),
    (
        ("columns", 0, "shape"),
        [-1],
        "at /attributes/pytreestore/columns/0/shape/0: -1 is less than the minimum of 0",
    ),
    (
        ("columns", 0, "chunks"),
        [],
        "at /attributes/pytreestore/columns/0/chunks: [] should be non-empty",
    ),
    (
        ("columns", 0, "key"),
        "../escape",
        "at /attributes/pytreestore/columns/0/key: '../escape' does not match",
    ),
    (
        ("columns", 0, "key"),
        "a//b",
        "at /attributes/pytreestore/columns/0/key: 'a//b' does not match",
    ),
    (
        ("columns", 0, "extra"),
        1,
        "at /attributes/pytreestore/columns/0: Additional properties are not allowed",
    ),
    (("tree", "node"), "set", "at /attributes/pytreestore/tree/node: 'set' is not one of"),
    (("tree", "keys"), KeyError, "at /attributes/pytreestore/tree: 'keys' is a required property"),
    (
        ("tree", "children", 0, "type"),
        7,
        "at /attributes/pytreestore/tree/children/0/type: 7 is not of type 'string'",
    ),
    (
        ("tree", "children", 0, "keys", 0),
        {"attr": "x", "index": 1},
        "at /attributes/pytreestore/tree/children/0/keys/0: {'attr': 'x', 'index': 1} has too many properties",
    ),
    (
        ("tree", "children", 1, "children"),
        [],
        "at /attributes/pytreestore/tree/children/1: {'node': 'leaf', 'children': []} should not be valid under",
    ),
]


@pytest.mark.parametrize(
    ("where", "value", "message"),
    SCHEMA_CASES,
    ids=[" ".join(map(str, c[0])) + f"={c[1]!r}"[:20] for c in SCHEMA_CASES],
)
def test_schema_violations(path, where, value, message):
    root = edit_root(path, _set(where, value))
    with pytest.raises(errors.CorruptStoreError) as info:
        pytreestore.open(path).schema
    text = str(info.value)
    assert text.startswith(
        f"{root} does not follow the pytreestore format 3 (its JSON Schema is pytreestore/schema.json): "
    )
    assert message in text
    assert text.endswith("The store's root metadata was damaged or written by another program.")


def test_group_metadata_must_be_a_group(path):
    root = path / "zarr.json"
    meta = json.loads(root.read_text())
    meta["node_type"] = "array"
    root.write_text(json.dumps(meta))
    with pytest.raises(
        errors.CorruptStoreError, match=re.escape("at /node_type: 'group' was expected")
    ):
        pytreestore.open(path)


def test_a_changed_document_is_validated_again(path):
    pytreestore.open(path)  # the good document is now remembered
    edit_root(path, _set(("codec",), "lz4"))
    with pytest.raises(errors.CorruptStoreError, match="'lz4' is not one of"):
        pytreestore.open(path).schema


def test_every_schema_violation_is_listed():
    doc = {
        "zarr_format": 2,
        "node_type": "group",
        "attributes": {"pytreestore": {"format_version": 1}},
    }
    found = _validate.schema_errors(doc)
    assert "at /zarr_format: 3 was expected" in found
    assert any("'columns' is a required property" in f for f in found)


# ---- column arrays -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
@pytest.mark.parametrize(
    ("content", "message"),
    [(b'{"shape": [3, ', "cannot"), (b"[1, 2]", "")],
    ids=["truncated", "not-an-object"],
)
def test_damaged_array_metadata(path, backend, content, message):
    (path / "v" / "zarr.json").write_bytes(content)
    store = pytreestore.open(path, backend=backend)
    with pytest.raises(errors.CorruptStoreError, match=re.escape(str(path / "v" / "zarr.json"))):
        store.load(as_numpy=True)
    np.testing.assert_array_equal(store.load(columns="['p'].x", as_numpy=True)["p"].x, [0, 0, 0])


# ---- the digest ----------------------------------------------------------------------------------


def test_writers_stamp_a_digest(path):
    info = json.loads((path / "zarr.json").read_text())["attributes"]["pytreestore"]
    assert info["digest"] == _validate.digest(info)
    assert re.fullmatch(r"blake2b-160:[0-9a-f]{40}", info["digest"])


def test_matching_digest_skips_full_validation(path, monkeypatch):
    calls = []
    monkeypatch.setattr(_validate, "_validate_root", lambda doc, file: calls.append(file))
    _validate.forget_validated()
    pytreestore.open(path).schema
    assert calls == []
    edit_root(path, lambda info: info.pop("digest"))  # an older writer, or another program
    pytreestore.open(path).schema
    assert calls == [f"{path}/zarr.json"]


def test_stale_digest_means_full_validation(path):
    edit_root(path, lambda info: info.update(chunk_records=-3))
    with pytest.raises(errors.CorruptStoreError, match="-3 is less than the minimum of 1"):
        pytreestore.open(path).schema
    edit_root(path, lambda info: info.update(chunk_records=2, digest="md5:0"))
    with pytest.raises(
        errors.CorruptStoreError,
        match=re.escape("at /attributes/pytreestore/digest: 'md5:0' does not match"),
    ):
        pytreestore.open(path).schema


def test_store_without_digest_opens(path):
    edit_root(path, lambda info: info.pop("digest"))
    assert len(pytreestore.open(path)) == 3


# ---- the specification ---------------------------------------------------------------------------

FORMAT_MD = Path(__file__).parents[1] / "docs" / "format.md"


def test_format_md_renders_the_shipped_schema():
    text = FORMAT_MD.read_text()
    rendered = text[text.index("## The JSON Schema") :]
    block = re.search(r"```json\n(.*?)```", rendered, re.S)
    assert block is not None
    assert json.loads(block.group(1)) == _validate.json_schema()


def test_format_md_example_root_validates_and_its_digest_matches():
    blocks = re.findall(r"```json\n(.*?)```", FORMAT_MD.read_text(), re.S)
    (root,) = [json.loads(b) for b in blocks if b.startswith('{\n "zarr_format": 3')]
    assert _validate.schema_errors(root) == []
    info = root["attributes"]["pytreestore"]
    assert info["digest"] == _validate.digest(info)


# ---- reopening ---------------------------------------------------------------------------------


def test_reopening_reuses_the_parsed_schema(path):
    first = pytreestore.open(path).schema
    assert pytreestore.open(path).schema is first
    assert pytreestore.open(path, generic=True).schema is not first
    assert pytreestore.open(path, like=LIKE).schema is not first
    edit_root(path, lambda info: info.update(chunk_records=2))  # same content, new bytes
    assert pytreestore.open(path).schema is not first


def test_reopening_after_a_class_was_redefined(path, monkeypatch):
    from flax import struct

    old = pytreestore.open(path)[0]["p"]
    assert type(old) is trees.Params

    @struct.dataclass
    class Params:  # what importlib.reload or %autoreload leaves behind: a new class object
        x: object
        y: object

    Params.__module__, Params.__qualname__ = "tests.trees", "Params"
    monkeypatch.setattr(trees, "Params", Params)
    assert type(pytreestore.open(path)[0]["p"]) is Params
