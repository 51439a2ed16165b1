"""A ragged or optional store's records from columns of per-record values
(pytreestore/_tree/flatten.py, what the Ray datasink reads from Arrow rows)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pytreestore
from pytreestore._tree.flatten import records_from_columns
from pytreestore.errors import SchemaMismatchError
from pytreestore.testing import assert_trees_equal

LIKE = {"p": [{"x": np.float32(0)}], "n": np.int8(0), "o": {"w": np.float32(0)}}


@pytest.fixture
def schema(tmp_path):
    store = pytreestore.create(tmp_path / "s", LIKE, ragged=["['p']"], optional=["['o']"])
    store.close()
    return store.schema


def _columns(n: list, xs: list, ws: list) -> dict[str, list]:
    return {"['n']": n, "['p'][*]['x']": xs, "['o']['w']": ws}


def test_rows_become_records(schema):
    got = records_from_columns(schema, _columns([1, 2], [[], [1.5, 2.5]], [None, 3.0]))
    assert_trees_equal(got[0], {"n": 1, "p": [], "o": None})
    assert_trees_equal(got[1], {"n": 2, "p": [{"x": 1.5}, {"x": 2.5}], "o": {"w": 3.0}})
    assert records_from_columns(schema, _columns([], [], [])) == []


@pytest.mark.parametrize(
    ("value", "kind"),
    [({"a": 1}, "dict {'a': 1}"), ("ab", "str 'ab'"), (None, "NoneType None"), (7, "int 7")],
)
def test_a_column_below_a_ragged_list_needs_a_list(schema, value, kind):
    """A struct (dict) or a string in the column of a leaf below a ragged list is refused
    with the keypath, not a raw KeyError nor split into characters."""
    with pytest.raises(
        SchemaMismatchError,
        match=re.escape(
            f"row 0: the column of ['p'][*]['x'], below the ragged list at ['p'], holds {kind}"
        ),
    ):
        records_from_columns(schema, _columns([1], [value], [None]))


def test_a_list_of_lists_of_different_lengths_is_a_list_of_elements(tmp_path):
    """A leaf below two ragged lists holds, per record, a list of lists of different
    lengths: it is a list (numpy cannot make it one array), not a refusal or a raw
    ValueError; an ndarray of zero dimensions is still refused."""
    like = {"p": [{"q": [np.float32(0)]}]}
    store = pytreestore.create(tmp_path / "s", like, ragged=["['p']", "['p'][*]['q']"])
    store.close()
    column = "['p'][*]['q'][*]"
    got = records_from_columns(store.schema, {column: [[[1.0], [2.0, 3.0]], [[]]]})
    assert_trees_equal(got[0], {"p": [{"q": [1.0]}, {"q": [2.0, 3.0]}]})
    assert_trees_equal(got[1], {"p": [{"q": []}]})
    with pytest.raises(SchemaMismatchError, match="holds ndarray"):
        records_from_columns(store.schema, {column: [np.array(1.0)]})
