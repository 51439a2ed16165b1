"""A commit record's ``tables`` (and a fragment's), read through the store's record model.

On disk (format 3) a fixed store's commit records and fragments list no ``tables``; a ragged
or optional store's list each axis table's rows (``{}`` when it has no axis). The record model
(:class:`~pytreestore._format.ragged.RaggedInfo`, :class:`~pytreestore._format.ragged.NoTables`)
says which fits, so no caller tests the store's kind.
"""

from __future__ import annotations

import json
import re

import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import COMMIT_KEY
from pytreestore._format.ragged import NO_TABLES, AxisInfo, RaggedInfo, tables_entry
from pytreestore._fragments.fragment import Fragment
from pytreestore._log.commit_record import Commit
from tests.parity import kinds

AXIS = RaggedInfo(("['p']",), (), (AxisInfo("['p']", "p-offsets", None, 8),), ())
ONLY_OPTIONAL = RaggedInfo((), ("['o']",), (), ())


def test_a_fixed_store_lists_no_tables_and_a_ragged_one_each_axis():
    assert tables_entry(None) == {}
    assert tables_entry(()) == {"tables": {}}  # an optional store's: no axis, still listed
    assert tables_entry((("['p']", 3),)) == {"tables": {"['p']": 3}}
    assert Commit(2, 1).to_json().get("tables", "absent") == "absent"
    assert Commit(2, 1, tables=(("['p']", 3),)).to_json()["tables"] == {"['p']": 3}


def test_the_record_model_says_which_tables_fit():
    assert NO_TABLES.fits(None) and not NO_TABLES.fits(())
    assert AXIS.fits((("['p']", 0),)) and not AXIS.fits(None)
    assert ONLY_OPTIONAL.fits(()) and not ONLY_OPTIONAL.fits(None)
    assert NO_TABLES.lists_axes(None) and not NO_TABLES.lists_axes((("['p']", 1),))
    assert AXIS.lists_axes((("['p']", 1),))
    assert not AXIS.lists_axes((("['q']", 1),)) and not AXIS.lists_axes(None)
    assert ONLY_OPTIONAL.lists_axes(()) and not ONLY_OPTIONAL.lists_axes(None)


def test_a_fragment_lists_tables_as_a_commit_record_does():
    ids = ("a" * 32, "b" * 32, "blake2b-160:" + "c" * 40)
    when = "2026-01-01T00:00:00.000000Z"
    fixed = Fragment(*ids, records=3, generation=1, time=when, tables=None)
    ragged = Fragment(*ids, records=3, generation=1, time=when, tables=(("['p']", 5),))
    assert "tables" not in json.loads(fixed.to_json())
    assert json.loads(ragged.to_json())["tables"] == {"['p']": 5}
    assert Fragment.from_json(ragged.to_json()) == ragged
    assert Fragment.from_json(fixed.to_json()) == fixed
    assert not fixed.own_schema and ragged.own_schema


def _damage(path, edit) -> None:
    record = json.loads((path / COMMIT_KEY).read_text())
    edit(record)
    (path / COMMIT_KEY).write_text(json.dumps(record))


@pytest.mark.plain_files
@pytest.mark.parametrize("name", kinds.KINDS)
def test_a_commit_record_that_departs_from_the_schema_is_refused(tmp_path, backend, name):
    path = tmp_path / "s"
    recs = kinds.filled(path, name, backend, n=4)
    got = pytreestore.open(path, backend=backend)
    kinds.assert_same(got[3], recs[3])  # the commit record as written fits
    if name == "fixed":
        _damage(path, lambda r: r.update(tables={}))
        listed = "{}"
    else:
        _damage(path, lambda r: r.pop("tables"))
        listed = "none"
    says = f"the commit record's tables: {listed}); the store's"
    with pytest.raises(errors.CorruptStoreError, match=re.escape(says)):
        pytreestore.open(path, backend=backend)[0]  # the schema is checked on first use
