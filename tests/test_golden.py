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
from pytreestore import errors
from pytreestore._format import validate as _validate
from pytreestore.backends._zarr import stores as _zarr_dtypes
from pytreestore.testing import assert_trees_equal
from tests import trees
from tests.data import make_golden

NAMES = list(make_golden.RECIPES)
#: the fixed stores (every record one structure), whose columns are the leaves of a batch
FIXED = [n for n, r in make_golden.RECIPES.items() if r.ragged is None and r.optional is None]
RAGGED = make_golden.RECIPES["ragged"]


def expected(name: str):
    """The batch a full ``load(as_numpy=True)`` returns: for a ragged store ``(batch, mask)``."""
    recipe = make_golden.RECIPES[name]
    if recipe.ragged is None and recipe.optional is None:
        return pytreestore.stack(recipe.records(), as_numpy=True)
    return pytreestore.stack(
        recipe.records(), ragged=recipe.ragged, optional=recipe.optional, as_numpy=True
    )


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
    assert len(store) == make_golden.RECIPES[name].n - make_golden.RECIPES[name].dropped
    got, want = store.load(as_numpy=True), expected(name)
    assert_trees_equal(got, want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.tobytes() == b.tobytes()  # NaN payloads and -0.0 too


#: every older golden store, format-3 stores written with ``%XX`` keys (before ``-XX``) too
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
    info = json.loads((path / "zarr.json").read_text())["attributes"]["pytreestore"]
    assert info["format_version"] == commit["format_version"] == pytreestore.FORMAT_VERSION
    if name in FIXED:  # a fixed store is a format-2 store but for the version
        assert "tables" not in commit and "ragged" not in info
    for meta_file in path.rglob("zarr.json"):
        document = json.loads(meta_file.read_text())
        if document["node_type"] == "array":
            assert _validate.schema_errors(document, "array") == [], meta_file


@pytest.mark.parametrize("name", FIXED)
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
    for key in ("a-2Fb", "-2Ehidden", "-C3-A9", "-", "zarr-2Ejson", "-5F_dunder", "100-25"):
        assert key in keys
        assert (make_golden.CURRENT / "tree" / key / "zarr.json").is_file()
    assert pytreestore.open(make_golden.CURRENT / "root-leaf").schema.columns[0].key == "-"
    assert not Path(make_golden.CURRENT / "tree" / ".pytreestore" / "lock").exists()


# ---- format 3: the ragged golden store ---------------------------------------------------------


def ragged_copy(tmp_path: Path) -> Path:
    path = tmp_path / "ragged"
    shutil.copytree(make_golden.CURRENT / "ragged", path)
    return path


def assert_same_bytes(got, want):
    assert_trees_equal(got, want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_ragged_golden_records_read_back_exactly(backend, tmp_path):
    store = pytreestore.open(ragged_copy(tmp_path), backend=backend)
    assert len(store) == RAGGED.n
    for i in range(RAGGED.n):
        assert_same_bytes(store.load(i, as_numpy=True), RAGGED.record(i))
        assert_trees_equal(store[i], RAGGED.record(i))  # jax.Arrays, the stored dtypes
    for got, want in zip(store.records(as_numpy=True), RAGGED.records(), strict=True):
        assert_same_bytes(got, want)
    assert type(store[0]) is trees.Event and type(store[0].hits[1]) is trees.Hit
    assert store[1].calib is None and store[1].hits == [] and store[2].trace.shape == (0, 2)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_ragged_golden_padded_load(backend, tmp_path):
    store = pytreestore.open(ragged_copy(tmp_path), backend=backend)
    records = RAGGED.records()
    batch, mask = store.load(as_numpy=True)
    assert batch.hits.pos.shape == (5, 3, 3) and batch.hits.samples.shape == (5, 3, 3)
    assert batch.trace.shape == (5, 4, 2) and batch.track["q"].shape == (5, 3, 2)
    assert mask.calib.gain.tolist() == [True, False, True, True, False]
    assert mask.hits.pos.sum(axis=1).tolist() == [2, 0, 3, 1, 0]
    for pad_to in (None, 8, "pow2"):
        assert_same_bytes(
            store.load([3, 0, 1], as_numpy=True, pad_to=pad_to),
            pytreestore.stack(
                [records[3], records[0], records[1]],
                ragged=RAGGED.ragged,
                optional=RAGGED.optional,
                pad_to=pad_to,
                as_numpy=True,
            ),
        )
    lengths = {k: v.tolist() for k, v in store.lengths().items()}
    assert lengths == {
        ".hits": [2, 0, 3, 1, 0],
        ".hits[*].samples": [2, 0, 3, 1, 0],
        ".trace": [3, 1, 0, 4, 2],
        ".track": [2, 0, 1, 3, 0],
    }


def ragged_tables() -> dict[str, dict[str, np.ndarray]]:
    """The golden ragged store's arrays as the format specifies them, computed from the
    records alone: element columns concatenated along their tables, cumulative end offsets,
    presence, zeros for an absent optional subtree."""
    records = RAGGED.records()
    hits = [h for r in records for h in r.hits]
    calib = [r.calib or trees.Calib(np.float32(0), np.int8(0)) for r in records]
    return {
        "record": {
            "hits-offsets": np.cumsum([len(r.hits) for r in records]),
            "trace-offsets": np.cumsum([len(r.trace) for r in records]),
            "track-offsets": np.cumsum([len(r.track["t"]) for r in records]),
            "calib-present": np.array([r.calib is not None for r in records]),
            "calib/gain": np.stack([c.gain for c in calib]),
            "calib/offset": np.stack([c.offset for c in calib]),
            "run": np.stack([r.run for r in records]),
        },
        ".hits": {
            "hits/-2A/pos": np.stack([h.pos for h in hits]),
            "hits/-2A/samples-offsets": np.cumsum([len(h.samples) for h in hits]),
        },
        ".hits[*].samples": {"hits/-2A/samples": np.concatenate([h.samples for h in hits])},
        ".trace": {"trace": np.concatenate([r.trace for r in records])},
        ".track": {
            "track/t": np.concatenate([r.track["t"] for r in records]),
            "track/q": np.concatenate([r.track["q"] for r in records]),
        },
    }


def test_ragged_golden_layout_reads_with_plain_zarr():
    _zarr_dtypes.register()
    path = make_golden.CURRENT / "ragged"
    commit = json.loads((path / ".pytreestore" / "commit.json").read_text())
    tables = ragged_tables()
    assert commit["tables"] == {
        t: len(next(iter(a.values()))) for t, a in tables.items() if t != "record"
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Object at .pytreestore", module="zarr")
        group = zarr.open_group(path, mode="r")
        for table, arrays in tables.items():
            rows = commit["records"] if table == "record" else commit["tables"][table]
            for key, want in arrays.items():
                got = np.asarray(group[key][:rows])  # pyright: ignore[reportArgumentType]
                meta = json.loads((path / key / "zarr.json").read_text())
                first = "record" if table == "record" else "element"
                assert meta["dimension_names"][0] == first, key
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), key
    keys = {key for arrays in tables.values() for key in arrays}
    stored = {c.key for c in pytreestore.open(path).schema.storage_columns}
    assert stored == keys  # every array of the store, and no other


def test_ragged_golden_schema_section():
    info = json.loads((make_golden.CURRENT / "ragged" / "zarr.json").read_text())
    info = info["attributes"]["pytreestore"]
    assert info["format_version"] == 3
    assert info["ragged"]["declared"] == {"ragged": RAGGED.ragged, "optional": RAGGED.optional}
    assert [(a["path"], a["offsets"], a["table"]) for a in info["ragged"]["axes"]] == [
        (".hits", "hits-offsets", None),
        (".hits[*].samples", "hits/-2A/samples-offsets", ".hits"),
        (".trace", "trace-offsets", None),
        (".track", "track-offsets", None),
    ]
    assert info["ragged"]["optional"] == [
        {"path": ".calib", "presence": "calib-present", "table": None}
    ]
    assert [(c["path"], c["key"], c.get("table"), c["shape"]) for c in info["columns"]] == [
        (".hits[*].pos", "hits/-2A/pos", ".hits", [3]),
        (".hits[*].samples", "hits/-2A/samples", ".hits[*].samples", []),
        (".trace", "trace", ".trace", [2]),
        (".track['q']", "track/q", ".track", [2]),
        (".track['t']", "track/t", ".track", []),
        (".calib.gain", "calib/gain", None, []),
        (".calib.offset", "calib/offset", None, []),
        (".run", "run", None, []),
    ]  # flatten order; a ragged leading axis is not part of the shape


# ---- format 3 (issue 28): a commit record whose oldest releases were merged (`horizon`) -------


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_golden_horizon_store_refuses_what_its_merged_releases_wrote_over(backend, tmp_path):
    """Written with a bound of 2 releases: 6 records, tag 'all', then reruns from 1, 2, 3 and
    4; the first three releases are merged into one pair (``horizon``)."""
    path = tmp_path / "horizon"
    shutil.copytree(make_golden.CURRENT / "horizon", path)
    commit = json.loads((path / ".pytreestore" / "commit.json").read_text())
    assert commit["rewrites"] == [[11, 1], [14, 4]] and commit["horizon"] == 11
    store = pytreestore.open(path, backend=backend)
    readable = [v.version for v in store.versions() if v.readable]
    assert readable == [0, 4, 5, 11, 13, 14, 15]  # 7, 8, 10: refused by the merged pair
    with pytest.raises(errors.VersionNotFoundError, match="no longer known"):
        pytreestore.open(path, version="all", backend=backend)
    with pytest.raises(errors.VersionNotFoundError, match="version 14 wrote new records"):
        pytreestore.open(path, version=12, backend=backend)
    records = make_golden.RECIPES["horizon"].records()
    old = pytreestore.open(path, version=13, backend=backend).load(as_numpy=True)
    assert_trees_equal(old, pytreestore.stack(records[:4], as_numpy=True))


# ---- format 3 (issue 46): a store whose front was released (`first`) -----------------------------


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_golden_keep_last_store_reads_its_kept_records(backend, tmp_path):
    """Records 0 to 2 were released by ``keep_last(1)`` after 4 records, record 4 appended,
    and vacuum (keeping one version) deleted the chunks that held released rows only (rows 0
    and 1; row 2 stays: its offsets say where record 3's elements start)."""
    path = tmp_path / "keep-last"
    shutil.copytree(make_golden.CURRENT / "keep-last", path)
    commit = json.loads((path / ".pytreestore" / "commit.json").read_text())
    assert (commit["records"], commit["first"]) == (5, 3)
    recipe = make_golden.RECIPES["keep-last"]
    store = pytreestore.open(path, backend=backend)
    assert (len(store), store.dropped) == (2, 3)
    assert_trees_equal(list(store.records(as_numpy=True)), recipe.records())
    assert [(v.operation, v.records, v.dropped) for v in store.versions()] == [("append", 2, 3)]
    run = store.schema.columns[[c.path for c in store.schema.columns].index(".run")].key
    assert not (path / run / "c" / "0").exists() and (path / run / "c" / "1").is_file()
    assert store.verify().ok
    with pytest.raises(errors.VersionNotFoundError, match="no version 2"):
        pytreestore.open(path, version=2, backend=backend)
