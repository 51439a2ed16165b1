"""The golden stores in tests/data/golden: read back exactly, and rewritten identically.

A failure here means the on-disk format changed. If that was intended: bump FORMAT_VERSION
when old readers must refuse the new stores, add a CHANGELOG.md entry under **Format**,
update docs/format.md, and regenerate with ``python tests/data/make_golden.py``.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest
import zarr

import pytreestore
from pytreestore._format import validate as _validate
from pytreestore.backends._zarr import dtypes as _zarr_dtypes
from pytreestore.testing import assert_trees_equal
from tests.data import make_golden

NAMES = list(make_golden.RECIPES)


def expected(name: str):
    return pytreestore.stack(make_golden.RECIPES[name].records(), as_numpy=True)


def test_golden_stores_exist_for_the_current_format():
    assert sorted(p.name for p in make_golden.CURRENT.iterdir()) == sorted(NAMES)
    for format_dir in make_golden.GOLDEN.iterdir():
        assert format_dir.name.startswith("format-"), format_dir


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
@pytest.mark.parametrize("name", NAMES)
def test_golden_store_reads_back_exactly(name, backend, tmp_path):
    path = tmp_path / name  # a copy: opening may not write, but the golden files stay pristine
    shutil.copytree(make_golden.CURRENT / name, path)
    store = pytreestore.open(path, backend=backend)
    assert len(store) == make_golden.RECIPES[name].n
    got, want = store.load(as_numpy=True), expected(name)
    assert_trees_equal(got, want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.tobytes() == b.tobytes()  # NaN payloads and -0.0 too


OLDER = [
    (d.name, name)
    for d in sorted(make_golden.GOLDEN.iterdir())
    if d != make_golden.CURRENT
    for name in sorted(p.name for p in d.iterdir())
]


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
@pytest.mark.parametrize(("version", "name"), OLDER)
def test_older_format_stores_read_back_exactly(version, name, backend, tmp_path):
    path = tmp_path / name
    shutil.copytree(make_golden.GOLDEN / version / name, path)
    store = pytreestore.open(path, backend=backend)
    got, want = store.load(as_numpy=True), expected(name)
    assert_trees_equal(got, want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", NAMES)
def test_current_code_writes_the_golden_store(name, tmp_path):
    fresh = tmp_path / name
    make_golden.write(name, fresh)
    problems = make_golden.differences(name, make_golden.CURRENT / name, fresh)
    assert not problems, "the on-disk format changed:\n" + "\n".join(problems) + "\n" + __doc__


@pytest.mark.parametrize("name", NAMES)
def test_golden_metadata_follows_the_json_schema(name):
    path = make_golden.CURRENT / name
    assert _validate.schema_errors(json.loads((path / "zarr.json").read_text())) == []
    commit = json.loads((path / ".pytreestore" / "commit.json").read_text())
    assert _validate.schema_errors(commit, "commit") == []
    assert commit["records"] == make_golden.RECIPES[name].n
    for meta_file in path.rglob("zarr.json"):
        document = json.loads(meta_file.read_text())
        if document["node_type"] == "array":
            assert _validate.schema_errors(document, "array") == [], meta_file


@pytest.mark.parametrize("name", NAMES)
def test_golden_store_reads_with_plain_zarr(name):
    _zarr_dtypes.register()
    path = make_golden.CURRENT / name
    store = pytreestore.open(path)
    want = jax.tree.leaves(expected(name))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Object at .pytreestore", module="zarr")
        group = zarr.open_group(path, mode="r")
        for column, value in zip(store.schema.columns, want):
            got = np.asarray(group[column.key][:])
            assert got.dtype == value.dtype and got.tobytes() == value.tobytes(), column.path


def test_golden_paths_are_escaped_as_specified():
    keys = {c.key for c in pytreestore.open(make_golden.CURRENT / "tree").schema.columns}
    for key in ("a%2Fb", "%2Ehidden", "%C3%A9", "%", "zarr%2Ejson", "%5F_dunder", "100%25"):
        assert key in keys
        assert (make_golden.CURRENT / "tree" / key / "zarr.json").is_file()
    assert pytreestore.open(make_golden.CURRENT / "root-leaf").schema.columns[0].key == "%"
    assert not Path(make_golden.CURRENT / "tree" / ".pytreestore" / "lock").exists()
