"""Reading older formats (pytreestore/_format/upgrades.py): each upgrade, an old document in and
today's shape out, and binding that reads the upgrade's markers rather than the version."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any, NamedTuple

import jax
import numpy as np
import pytest

from pytreestore import TreeSchema, errors
from pytreestore._format import upgrades
from pytreestore._log.commit_record import Commit
from tests import trees

GOLDEN = pathlib.Path(__file__).parent / "data" / "golden"


class Plain(NamedTuple):
    a: Any
    b: Any


class Reversed(NamedTuple):
    """A NamedTuple whose registered flatten returns its fields in reverse order."""

    a: Any
    b: Any


jax.tree_util.register_pytree_node(
    Reversed, lambda t: ((t.b, t.a), None), lambda _, kids: Reversed(a=kids[1], b=kids[0])
)


def _root(fmt: int, name: str) -> dict[str, Any]:
    raw = (GOLDEN / f"format-{fmt}" / name / "zarr.json").read_text()
    return json.loads(raw)["attributes"]["pytreestore"]


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for c in node.get("children", ()) for n in _nodes(c))]


def _commit(fmt: int, name: str) -> dict[str, Any]:
    return json.loads(
        (GOLDEN / f"format-{fmt}" / name / ".pytreestore" / "commit.json").read_text()
    )


def test_format_1_schema_marks_namedtuples_and_unnamed_statics():
    info = _root(1, "tree")
    before = copy.deepcopy(info)
    today = upgrades.schema(info)
    assert info == before  # the document as read is left as it is
    nodes = _nodes(today["tree"])
    pairs = [n for n in nodes if n["node"] == "namedtuple"]
    customs = [n for n in nodes if n["node"] == "custom"]
    assert [n["type"] for n in pairs] == ["pytreestore.testing.strategies:Pair"]
    assert all(n[upgrades.FLATTEN_ORDER] is True for n in pairs)
    assert [n["type"] for n in customs if n.get(upgrades.STATIC_BY_POSITION)] == [
        "pytreestore.testing.strategies:Tagged",
        "tests.trees:Keyed",
        "tests.trees:WithStatic",
    ]
    assert today["format_version"] == 1


@pytest.mark.parametrize("fmt", [2, 3])
def test_format_2_and_3_schemas_are_today_shape_already(fmt):
    info = _root(fmt, "tree")
    assert upgrades.schema(info) == info


def test_schema_without_a_version_is_in_todays_format():
    assert upgrades.schema({"tree": {"node": "leaf"}})["format_version"] == upgrades.FORMAT_VERSION


def test_format_1_commit_record_gets_every_later_member_as_none():
    obj = _commit(1, "tree")
    assert obj == {"format_version": 1, "records": 5, "generation": 3}
    assert upgrades.commit(obj) == {
        **obj,
        "store": None,
        "schema": None,
        "time": None,
        "operation": None,
    }
    assert Commit.from_bytes(json.dumps(obj).encode(), "golden").store is None


def test_format_2_commit_record_keeps_its_store_id():
    obj = _commit(2, "tree")
    today = upgrades.commit(obj)
    assert today["store"] == "90de0000000000000000000000000000"
    assert (today["schema"], today["time"], today["operation"]) == (None, None, None)


def test_format_3_commit_record_is_unchanged():
    obj = _commit(3, "versions")
    assert upgrades.commit(obj) == obj


def _namedtuple_info(fmt: int) -> dict[str, Any]:
    info = TreeSchema.from_example(Plain(a=np.float32(1), b=np.float32(2))).to_json()
    info["tree"]["type"] = f"{__name__}:Reversed"
    info["format_version"] = fmt
    return info


def test_format_1_namedtuple_binds_in_the_registered_flatten_order():
    schema = TreeSchema.from_json(_namedtuple_info(1))
    assert schema.unflatten([np.float32(10), np.float32(20)]) == Reversed(a=20, b=10)
    assert upgrades.FLATTEN_ORDER not in schema.tree  # the marker is never kept to be written


def test_today_plain_namedtuple_later_registered_binds_by_field_name():
    """Regression: a plain NamedTuple of format 2 or 3 whose class got a flatten of its own
    since was bound in that flatten's order (fields swapped); its stored names decide."""
    schema = TreeSchema.from_json(_namedtuple_info(3))
    assert schema.unflatten([np.float32(10), np.float32(20)]) == Reversed(a=10, b=20)


def _static_info(fmt: int) -> dict[str, Any]:
    like = trees.WithStatic(np.zeros(2, np.float32), name="x", sizes=(3, 4))
    info = TreeSchema.from_example(like).to_json()
    del info["tree"]["aux_fields"]
    info["format_version"] = fmt
    return info


def test_format_1_static_fields_bind_by_position():
    schema = TreeSchema.from_json(_static_info(1))
    got = schema.unflatten([np.ones(2, np.float32)])
    assert (got.name, got.sizes) == ("x", (3, 4))
    np.testing.assert_array_equal(got.value, np.ones(2, np.float32))


def test_unnamed_static_fields_of_today_format_are_refused():
    with pytest.raises(errors.SchemaMismatchError, match="did not record static field names"):
        TreeSchema.from_json(_static_info(3))
