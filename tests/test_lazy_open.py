"""Opening a wide store parses the schema only, not the root's consolidated metadata.

The root ``zarr.json`` carries zarr v3 consolidated metadata (about 1 MB for 1,000 columns)
after the schema. An open parses what comes before it; the checks it skips are verify()'s
(a damaged consolidated tail is reported there and rewritten by the next writer), and every
check on the schema itself still runs at open.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format import validate as _validate

LIKE = {"a": {"x": np.zeros(3, np.float32), "y": np.int32(0)}, "b": np.float64(0)}


@pytest.fixture
def path(tmp_path):
    with pytreestore.create(tmp_path / "s", LIKE, chunk_records=4) as store:
        store.extend(
            {"a": {"x": np.full(3, i, np.float32), "y": np.int32(i)}, "b": i} for i in range(6)
        )
    _validate.forget_validated()
    return tmp_path / "s"


def _cut_consolidated(path, keep: int) -> bytes:
    """The root with its consolidated metadata cut after ``keep`` bytes of it (and closed)."""
    raw = (path / "zarr.json").read_bytes()
    at = raw.index(b',\n "consolidated_metadata": ')
    return raw[: at + keep]


def test_open_does_not_parse_the_consolidated_metadata(path, monkeypatch):
    parsed = []
    real = json.loads
    monkeypatch.setattr(
        _validate.json, "loads", lambda b, *a, **k: (parsed.append(len(b)), real(b, *a, **k))[1]
    )
    size = len((path / "zarr.json").read_bytes())
    store = pytreestore.open(path)
    assert parsed and max(parsed) < size  # the head alone
    np.testing.assert_array_equal(
        store.load(columns="['a']['y']", as_numpy=True)["a"]["y"], np.arange(6)
    )


def test_a_damaged_consolidated_tail_opens_is_reported_by_verify_and_rewritten(path):
    good = (path / "zarr.json").read_bytes()
    bad = good.replace(b'"consolidated_metadata": {', b'"consolidated_metadata": {"x": nope, ', 1)
    (path / "zarr.json").write_bytes(bad)
    with pytest.raises(ValueError):
        json.loads(bad)
    store = pytreestore.open(path)  # pytreestore's readers never use it
    assert store.load(as_numpy=True)["b"].tolist() == list(range(6))
    report = store.verify()
    assert not report.ok
    assert any(
        p.key == "zarr.json"
        and "consolidated metadata, which zarr readers use, is damaged" in p.message
        for p in report.problems
    )
    pytreestore.open(path, "a").close()  # a writer rewrites it
    assert json.loads((path / "zarr.json").read_bytes()) == json.loads(good)
    assert pytreestore.open(path).verify().ok


def test_a_cut_root_still_fails_to_open(path):
    (path / "zarr.json").write_bytes(_cut_consolidated(path, 200))
    with pytest.raises(errors.NotAStoreError, match=re.escape("zarr.json is not valid JSON (")):
        pytreestore.open(path).schema


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_corrupt_column_entry_is_still_refused_at_open_with_its_keypath(path, backend):
    root = path / "zarr.json"
    meta = json.loads(root.read_text())
    columns = meta["attributes"]["pytreestore"]["columns"]
    entry = next(c for c in columns if c["path"] == "['a']['y']")
    entry["dtype"] = "float32"  # the digest no longer matches: validated, then checked on use
    root.write_text(json.dumps(meta, indent=1))
    store = pytreestore.open(path, backend=backend)
    with pytest.raises(errors.CorruptStoreError, match=re.escape("a/y/zarr.json disagrees")):
        store.load(columns="['a']['y']", as_numpy=True)
    np.testing.assert_array_equal(store.load(columns="['b']", as_numpy=True)["b"], np.arange(6))
    report = store.verify()
    assert [p.path for p in report.problems] == ["['a']['y']"]


def test_class_binding_errors_come_out_on_first_use(tmp_path):
    from tests import trees

    with pytreestore.create(tmp_path / "c", {"p": trees.Params(np.int32(0), [np.bool_(0), None])}):
        pass
    root = tmp_path / "c" / "zarr.json"
    text = root.read_text().replace("tests.trees:Params", "tests.trees:NoSuchClass")
    root.write_text(text)
    with pytest.raises(errors.ClassResolutionError, match="NoSuchClass"):
        pytreestore.open(tmp_path / "c").schema
    assert pytreestore.open(tmp_path / "c", generic=True).schema.paths


def test_a_root_without_consolidated_metadata_opens(path):
    root = path / "zarr.json"
    meta = json.loads(root.read_text())
    del meta["consolidated_metadata"]  # a store of an older pytreestore
    root.write_text(json.dumps(meta))
    assert len(pytreestore.open(path)) == 6
