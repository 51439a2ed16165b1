"""Schemas: every node kind, static fields, JSON round trips, class resolution, errors."""

from __future__ import annotations

import collections
import json
import re
import sys

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore import TreeSchema, errors
from tests import interpreters, trees
from tests.conftest import child_env


def roundtrip(like):
    schema = TreeSchema.from_example(like)
    text = json.dumps(schema.to_json())
    return schema, TreeSchema.from_json(json.loads(text))


@pytest.mark.parametrize(
    "like",
    [
        trees.seed_records()[0],
        trees.WithStatic(np.zeros(2, np.float32), name="x", sizes=(3, 4)),
        trees.Pair(1, 2.0),
        trees.Plain(np.int8(1), [None, (1, 2)]),
        trees.Keyed(np.zeros(3), np.int32(1)),
        {"b": 1, "a": {"c": (1.0, [True])}},
        collections.OrderedDict(z=1, a=2),
        [1, (2, None), {}],
        trees.deep_record(0),
    ],
    ids=[
        "flax",
        "static",
        "namedtuple",
        "register_dataclass",
        "keys",
        "dict",
        "ordered",
        "list",
        "deep",
    ],
)
def test_treedef_round_trips_through_json(like):
    schema, again = roundtrip(like)
    assert again.treedef == jax.tree_util.tree_structure(like)
    assert again.columns == schema.columns


def test_columns_describe_leaves():
    schema = TreeSchema.from_example(trees.Pair(np.zeros((2, 3), np.float16), True))
    assert [(c.path, c.key, c.dtype.name, c.shape) for c in schema.columns] == [
        (".left", "left", "float16", (2, 3)),
        (".right", "right", "bool", ()),
    ]


def test_static_fields_are_checked_on_append(tmp_path):
    store = pytreestore.create(tmp_path / "s", trees.WithStatic(0.0, name="a"))
    store.append(trees.WithStatic(1.0, name="a"))
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.append(trees.WithStatic(2.0, name="b"))
    # issue 11: the message names the static field, not only the tuple of static data
    assert "\n  .name: stored 'a', got 'b'\n" in str(info.value)
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.append(trees.WithStatic(2.0, name="c", sizes=(1, 3)))
    assert "\n  .name: stored 'a', got 'c'\n  .sizes: stored (1, 2), got (1, 3)\n" in str(
        info.value
    )
    assert len(store) == 1
    store.close()
    reader = pytreestore.open(tmp_path / "s")
    assert reader[0].name == "a" and reader[0].sizes == (1, 2)


def test_static_value_not_json_refused():
    with pytest.raises(
        errors.UnsupportedTreeError,
        match=re.escape("WithStatic at the root has static field .name"),
    ):
        TreeSchema.from_example(trees.WithStatic(0.0, name=object()))  # type: ignore[arg-type]


def test_unsupported_leaves_and_nodes():
    with pytest.raises(
        errors.UnsupportedTreeError, match=re.escape("unsupported leaf at ['s']: str")
    ):
        TreeSchema.from_example({"s": "text"})
    with pytest.raises(
        errors.UnsupportedDtypeError, match=re.escape("unsupported dtype at [0]: object")
    ):
        TreeSchema.from_example([np.array([None, 1], dtype=object)])
    with pytest.raises(errors.UnsupportedTreeError, match=re.escape("has a key 1.5 of type float")):
        TreeSchema.from_example({"a": {1.5: 2.0}})
    with pytest.raises(errors.UnsupportedTreeError, match=re.escape("has a key True of type bool")):
        TreeSchema.from_example({"a": {True: 2.0}})
    with pytest.raises(errors.UnsupportedTreeError, match="defaultdict at the root"):
        TreeSchema.from_example(collections.defaultdict(list, a=1))
    with pytest.raises(errors.UnsupportedTreeError, match=re.escape("unsupported leaf at .x: set")):
        TreeSchema.from_example(trees.Params({1, 2}, 0))


def test_structure_mismatch_lists_every_path(tmp_path):
    store = pytreestore.create(tmp_path / "s", trees.seed_records()[0])
    bad = trees.AllParams([trees.Params(1, [1, 2]), {"x": 1, "y": 2}, trees.Params(1, 1)])
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.append(bad)
    assert "at .p: expected a list of 2, got a list of 3" in str(info.value)
    bad2 = trees.AllParams([trees.Params(1, [1, 2]), {"x": 1, "y": 2}])
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.append(bad2)
    message = str(info.value)
    assert "at .p[0].y: expected a leaf, got a list of 2" in message
    assert "at .p[1]: expected Params with fields ['x', 'y']" in message
    assert "got a dict with keys ['x', 'y']" in message
    assert len(store) == 0


def test_dict_keys_mismatch(tmp_path):
    store = pytreestore.create(tmp_path / "s", {"a": 1, "b": 2})
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape("expected a dict with keys ['a', 'b'], got a dict with keys ['a', 'c']"),
    ):
        store.append({"a": 1, "c": 2})


def test_generic_view(tmp_path):
    with pytreestore.create(tmp_path / "s", trees.deep_record(0)) as store:
        store.extend(trees.deep_record(i) for i in range(3))
    generic = pytreestore.open(tmp_path / "s", generic=True)[:]
    assert isinstance(generic, dict) and set(generic) == {"inner", "step"}
    pair = generic["inner"][0]["value"]
    assert set(pair) == {"left", "right"}
    np.testing.assert_array_equal(pair["right"], np.arange(3) + 3)
    view = pytreestore.open(tmp_path / "s", mode="a", generic=True)  # it can evolve only
    with pytest.raises(errors.ReadOnlyError, match="can evolve but not append"):
        view.append(trees.deep_record(3))
    view.close()


def test_class_in_main_needs_like(tmp_path):
    script = f"""
import numpy as np, pytreestore
from flax import struct
@struct.dataclass
class Local:
    a: object
with pytreestore.create({str(tmp_path / "s")!r}, Local(np.float32(0))) as s:
    s.append(Local(np.float32(7)))
"""
    interpreters.run([sys.executable, "-c", script], check=True, env=child_env())
    with pytest.raises(
        errors.ClassResolutionError, match=re.escape("cannot import class __main__:Local")
    ) as info:
        pytreestore.open(tmp_path / "s").schema
    assert "like=" in str(info.value) and "generic=True" in str(info.value)
    assert pytreestore.open(tmp_path / "s", generic=True)[0] == {"a": np.float32(7)}
    like = trees.Params(np.float32(0), np.float32(0))
    with pytest.raises(
        errors.SchemaMismatchError, match="like= does not have the stored structure"
    ):
        pytreestore.open(tmp_path / "s", like=like).schema


def test_like_supplies_classes(tmp_path):
    with pytreestore.create(tmp_path / "s", {"a": trees.Pair(0, 0)}) as store:
        store.append({"a": trees.Pair(1, 2)})
    reader = pytreestore.open(tmp_path / "s", like={"a": trees.Pair(5, 6)})
    assert isinstance(reader[0]["a"], trees.Pair)
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape("at ['a'].left: expected int32[], got float32[]"),
    ):
        pytreestore.open(tmp_path / "s", like={"a": trees.Pair(0.5, 6)}).schema


CALLED: list[str] = []


def not_a_class(*args, **kwargs):  # a callable a malicious schema might name
    CALLED.append("called")
    return trees.Pair(1, 2)


@pytest.mark.parametrize(
    ("type_name", "kind"),
    [
        ("tests.test_schema:not_a_class", "custom"),
        ("subprocess:Popen", "custom"),
        ("os:system", "namedtuple"),
        ("tests.trees:some_func", "custom"),
    ],
)
def test_schema_naming_a_callable_never_calls_it(tmp_path, type_name, kind):
    with pytreestore.create(tmp_path / "s", {"a": trees.Pair(1, 2)}) as store:
        store.append({"a": trees.Pair(1, 2)})
    root = tmp_path / "s" / "zarr.json"
    meta = json.loads(root.read_text())
    node = meta["attributes"]["pytreestore"]["tree"]["children"][0]
    node.update(
        {
            "node": kind,
            "type": type_name,
            "aux": None,
            "keys": [{"attr": "left"}, {"attr": "right"}],
        }
    )
    root.write_text(json.dumps(meta))
    with pytest.raises(errors.ClassResolutionError):
        pytreestore.open(tmp_path / "s")[0]
    assert CALLED == []


def test_str_is_a_line_per_column():
    """``print(store.schema)`` (issue 33: 2,648 characters for 10 leaves) reads as a list of
    columns; ``repr`` keeps every field."""
    import numpy as np

    from pytreestore._format.schema import TreeSchema

    like = {f"leaf{i}": np.zeros(i % 3 + 1, np.float32) for i in range(10)}
    schema = TreeSchema.from_example(like, recorded=False)
    text = str(schema)
    lines = text.splitlines()
    assert lines[0] == "TreeSchema of 10 columns, 65536 records a chunk, codec zstd:"
    assert len(lines) == 11 and len(text) < 600
    for c in schema.columns:
        assert any(line.split()[0] == c.path for line in lines[1:])
    assert "float32[3]" in text and "ColumnSpec(" in repr(schema)
