"""The root's zarr v3 consolidated metadata: zarr-python and xarray read every column with
default arguments and no warning, and see committed records only.

The readers run in a fresh interpreter that imports zarr and xarray and nothing of ours, with
every warning an error. The consolidated metadata is checked against each array's own
``zarr.json`` and against what ``zarr.consolidate_metadata`` itself writes, after every kind
of commit (append, evolve, truncate, a ragged store learning a structure) and after a crash
between the commit record and the root write.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
import zarr

import pytreestore
from pytreestore._format import dtypes as _dtypes
from pytreestore._location import Location
from pytreestore._log import metadata as consolidated
from pytreestore.backends import OcdbtBackend
from pytreestore.errors import StorageError
from pytreestore.testing.conformance import dtype_values
from tests import optional
from tests.awkward import awkward_records, ragged_records
from tests.faults import fail_root_writes

optional.importorskip("xarray")  # read by the child processes only

STORES = [("tensorstore", "zstd"), ("tensorstore", None), ("zarr", "zstd"), ("zarr", None)]

#: zarr-python's and xarray's default reads, of every array, with no pytreestore and no jax
READ = """
import json, pathlib, sys
import xarray as xr
import zarr

if sys.argv[1] == "zarrs":  # chunks decoded by zarrs, the Rust zarr v3 library
    import zarrs

    zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"})


def same(got, want, key):
    got = [str(got.dtype), list(got.shape), got.tobytes().hex()]
    assert got == want, (key, got, want)


def read(path, expected):
    group = zarr.open_group(path, mode="r")
    members = dict(group.members(max_depth=None))
    arrays = {k: v for k, v in members.items() if isinstance(v, zarr.Array)}
    assert sorted(arrays) == sorted(expected), (sorted(arrays), sorted(expected))
    for key, want in expected.items():
        same(arrays[key][...], want, key)
        same(group[key][...], want, key)
        pipeline = type(arrays[key]._async_array.codec_pipeline).__name__
        assert pipeline == ("ZarrsCodecPipeline" if sys.argv[1] == "zarrs" else "BatchedCodecPipeline")
    tree = xr.open_datatree(path, engine="zarr")
    for key, want in expected.items():
        same(tree["/" + key].values, want, key)
    assert not {"pytreestore", "jax"} & set(sys.modules), sorted({"pytreestore", "jax"} & set(sys.modules))
    return len(arrays)


stores = sys.argv[2:]
for path, manifest in zip(stores[::2], stores[1::2]):
    print(read(path, json.loads(pathlib.Path(manifest).read_text())))
"""


def with_ml(record: dict[str, Any], i: int, float8: bool = True) -> dict[str, Any]:
    """``record`` (every other dtype) with the complex types and the ml_dtypes floats (the
    float8 ones only with ``float8``), under awkward keys too."""
    ml = _dtypes.ML_FLOATS if float8 else tuple(n for n in _dtypes.ML_FLOATS if "float8" not in n)
    names = ("complex64", "complex128", *ml)
    more = {f"{n} %": dtype_values(_dtypes.SUPPORTED[n], 4, seed=i).reshape(2, 2) for n in names}
    return {**record, "ml/é": more}


def awkward_store(
    path: Path, backend: str, codec: str | None = "zstd", float8: bool = True
) -> Path:
    """A store at ``path`` of the awkward records, with :func:`with_ml`'s columns."""
    records = [with_ml(r, i, float8) for i, r in enumerate(awkward_records())]
    with pytreestore.create(
        path, records[0], backend=backend, codec=codec, chunk_records=2
    ) as store:
        store.extend(records)
    return path


def expected(path: Path) -> dict[str, list[Any]]:
    """What each array of the store at ``path`` holds, by pytreestore: dtype, shape, hex."""
    store = pytreestore.open(path)
    if store.schema.ragged is not None:  # the tables' rows, as the backend reads them
        return {
            c.key: _described(np.asarray(zarr.open_array(path / c.key, mode="r")[:]))
            for c in store.schema.storage_columns
        }
    leaves = jax.tree.leaves(store.load(as_numpy=True))
    return {c.key: _described(a) for c, a in zip(store.schema.columns, leaves)}


def _described(array: np.ndarray) -> list[Any]:
    return [str(array.dtype), list(array.shape), array.tobytes().hex()]


def read_isolated(paths: list[Path], tmp_path: Path, pipeline: str = "zarr") -> list[int]:
    """Runs :data:`READ` on the stores at ``paths`` in one fresh interpreter, warnings as
    errors, with zarr-python's codec pipeline or (``"zarrs"``) zarrs'; the number of arrays it
    read in each."""
    args = []
    for k, path in enumerate(paths):
        manifest = tmp_path / f"manifest-{k}.json"
        manifest.write_text(json.dumps(expected(path)))
        args += [str(path), str(manifest)]
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", READ, pipeline, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # what is installed, not the source tree
        env={"PYTHONWARNINGS": "error", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout=180,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    counts = [int(n) for n in proc.stdout.split()]
    assert len(counts) == len(paths), proc.stdout
    return counts


@pytest.fixture(scope="module")
def default_reads(tmp_path_factory) -> dict[str, tuple[Path, int]]:
    """The awkward store of each of :data:`STORES` and a ragged store on each file backend,
    each with the count of arrays zarr-python and xarray read from it by default: one
    interpreter for all of them (each start imports zarr and xarray)."""
    root = tmp_path_factory.mktemp("default-reads")
    paths = {f"{b}-{c}": awkward_store(root / f"{b}-{c}", b, c) for b, c in STORES}
    for backend in ("tensorstore", "zarr"):
        rows = ragged_records()
        path = root / f"ragged-{backend}"
        with pytreestore.create(
            path, rows[0], ragged=["['hits/é']"], optional=["['calib']"], backend=backend
        ) as store:
            store.extend(rows)
        paths[f"ragged-{backend}"] = path
    counts = read_isolated(list(paths.values()), root)
    return {name: (path, n) for (name, path), n in zip(paths.items(), counts)}


@pytest.fixture(scope="module")
def zarrs_reads(tmp_path_factory) -> dict[str, int]:
    """The count of arrays zarrs read from the awkward store (no float8 types) of each of
    :data:`STORES`, in one interpreter."""
    pytest.importorskip("zarrs", reason="zarrs (the test extra) is not installed")
    root = tmp_path_factory.mktemp("zarrs-reads")
    paths = [awkward_store(root / f"{b}-{c}", b, c, float8=False) for b, c in STORES]
    counts = read_isolated(paths, root, "zarrs")
    return {f"{b}-{c}": n for (b, c), n in zip(STORES, counts)}


def root_metadata(path: Path) -> dict[str, Any]:
    return json.loads((path / "zarr.json").read_text())["consolidated_metadata"]


def check_in_step(path: Path) -> None:
    """The consolidated metadata lists every group and array of the store's schema, each
    array as its ``zarr.json`` with the record axis cut to its table's committed rows."""
    store = pytreestore.open(path)
    commit = json.loads((path / ".pytreestore" / "commit.json").read_text())
    meta = root_metadata(path)["metadata"]
    arrays = {k for k, v in meta.items() if v["node_type"] == "array"}
    assert arrays == {c.key for c in store.schema.storage_columns}
    for column in store.schema.storage_columns:
        rows = commit["records"] if column.table is None else commit["tables"][column.table]
        on_disk = json.loads((path / column.key / "zarr.json").read_text())
        assert on_disk["shape"][0] >= rows, column.key
        assert meta[column.key] == {**on_disk, "shape": [rows, *on_disk["shape"][1:]]}
    for key in set(meta) - arrays:
        assert json.loads((path / key / "zarr.json").read_text())["node_type"] == "group"


@pytest.mark.parametrize(("backend", "codec"), STORES)
def test_defaults_read_every_column_with_no_warning(default_reads, backend, codec):
    path, read = default_reads[f"{backend}-{codec}"]
    check_in_step(path)
    columns = pytreestore.open(path).schema.columns
    assert {c.dtype.name for c in columns} == set(_dtypes.SUPPORTED)
    assert read == len(columns) == 19 + len(_dtypes.ML_FLOATS)


@pytest.mark.parametrize(("backend", "codec"), STORES)
def test_zarrs_reads_every_column_with_no_warning(zarrs_reads, backend, codec):
    """The same reads with zarrs (a test extra) decoding the chunks: every standard dtype and
    bfloat16. zarrs 0.2 refuses the float8 types' fill value (``incompatible fill value
    metadata: data_type=float8_e3m4, fill_value=0.0``), so they are left out here
    (docs/interop.md)."""
    assert zarrs_reads[f"{backend}-{codec}"] == 19 + 1


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_defaults_read_a_ragged_store(default_reads, backend):
    path, read = default_reads[f"ragged-{backend}"]
    check_in_step(path)
    assert read == len(pytreestore.open(path).schema.storage_columns)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_it_equals_zarr_pythons_own(tmp_path, backend):
    """On a quiescent store, what zarr.consolidate_metadata writes is what we wrote."""
    path = awkward_store(tmp_path / "s", backend)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    (copy / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group"}))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Object at .pytreestore")
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(str(copy))
    ours = zarr.open_group(path, mode="r").metadata.consolidated_metadata
    theirs = zarr.open_group(copy, mode="r").metadata.consolidated_metadata
    assert ours is not None and theirs is not None
    assert ours.to_dict() == theirs.to_dict()
    assert len(ours.flattened_metadata) == len(theirs.flattened_metadata) > 20


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_zarr_readers_see_committed_records_only(tmp_path, backend):
    """A writer cut off inside extend has grown the arrays past the commit: zarr-python and
    xarray with default arguments still see the committed records."""
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.float32(0)}, chunk_records=4, backend=backend)
    store.extend({"x": np.float32(i)} for i in range(6))
    store.close()
    array = zarr.open_array(path / "x", mode="r+")  # a writer cut off inside extend
    array.resize((20,))
    array[6:] = np.arange(6, 20, dtype=np.float32)
    assert json.loads((path / "x" / "zarr.json").read_text())["shape"] == [20]
    assert zarr.open_group(path, mode="r")["x"].shape == (6,)
    assert zarr.open_group(path, mode="r")["x"][:].tolist() == list(range(6))
    xr = pytest.importorskip("xarray")
    assert xr.open_datatree(path, engine="zarr")["/x"].values.tolist() == list(range(6))
    assert pytreestore.open(path).load(as_numpy=True)["x"].tolist() == list(range(6))


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_in_step_after_every_kind_of_commit(tmp_path, backend):
    path = tmp_path / "s"
    with pytreestore.create(
        path, {"a": {"x": np.int16(0)}}, chunk_records=3, backend=backend
    ) as store:
        store.extend({"a": {"x": np.int16(i)}} for i in range(7))
        store.flush()
        check_in_step(path)
        store.evolve(add={"['a']['y z']": np.full(2, 1.5, ml_dtypes.bfloat16)})
        check_in_step(path)
        assert "a/y-20z" in root_metadata(path)["metadata"]
        store.truncate(2)
        check_in_step(path)
        assert root_metadata(path)["metadata"]["a/x"]["shape"] == [2]
        store.evolve(drop=["['a']['x']"])
        check_in_step(path)
        assert "a/x" not in root_metadata(path)["metadata"]  # its array stays on disk
    assert zarr.open_group(path, mode="r")["a/y-20z"].shape == (2, 2)
    assert (path / "a" / "x" / "zarr.json").exists()


def test_in_step_after_a_ragged_store_learns_a_structure(tmp_path):
    path = tmp_path / "r"
    with pytreestore.create(path, {"h": []}, ragged=["['h']"]) as store:
        store.extend([{"h": []}, {"h": []}])
        store.flush()
        check_in_step(path)
        before = set(root_metadata(path)["metadata"])
        store.append({"h": [{"e": np.int8(2), "f": np.float32(3)}]})  # the elements: learned
        store.flush()
    check_in_step(path)
    assert set(root_metadata(path)["metadata"]) > before
    assert zarr.open_group(path, mode="r")["h/-2A/e"][:].tolist() == [2]


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_crash_before_the_root_write_is_mended_by_the_next_writer(tmp_path, backend, monkeypatch):
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.int32(0)}, chunk_records=2, backend=backend)
    store.extend({"x": np.int32(i)} for i in range(3))
    store.flush()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt("the writer dies after its commit record")

    monkeypatch.setattr(consolidated, "write", crash)
    with pytest.raises(KeyboardInterrupt):
        store.extend({"x": np.int32(i)} for i in range(3, 5))
        store.flush()
    monkeypatch.undo()
    # the commit at the chunk boundary (4 records) stands, the root is a commit behind
    assert pytreestore.open(path).load(as_numpy=True)["x"].tolist() == list(range(4))
    assert root_metadata(path)["metadata"]["x"]["shape"] == [3]
    assert zarr.open_group(path, mode="r")["x"][:].tolist() == list(range(3))
    (path / ".pytreestore" / "lock").unlink()  # the writer's process is gone
    pytreestore.open(path, "a", backend=backend).close()  # the next writer mends the root
    assert root_metadata(path)["metadata"]["x"]["shape"] == [4]
    check_in_step(path)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_writer_opening_a_store_in_step_writes_no_root(tmp_path, backend):
    path = tmp_path / "s"
    with pytreestore.create(path, {"x": np.int32(0)}, backend=backend) as store:
        store.extend({"x": np.int32(i)} for i in range(3))
    before = (path / "zarr.json").stat()
    pytreestore.open(path, "a", backend=backend).close()
    after = (path / "zarr.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    check_in_step(path)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_failed_root_write_warns_and_keeps_the_commit(tmp_path, backend, monkeypatch):
    """A full disk at the root write: the records are committed, so flush must not raise (a
    caller would append them again); it warns, and the next writer mends the root."""
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.int32(0)}, chunk_records=2, backend=backend)
    store.extend({"x": np.int32(i)} for i in range(3))
    store.flush()
    full = StorageError("writing zarr.json: [Errno 28] No space left on device")
    fail_root_writes(monkeypatch, store._backend, full)
    with pytest.warns(RuntimeWarning, match="records are committed, but the root zarr.json") as w:
        store.extend({"x": np.int32(i)} for i in range(3, 5))
        store.flush()
    monkeypatch.undo()
    assert [str(x.message).split(" records")[0] for x in w] == ["4", "5"]  # two commits
    assert len(store) == 5
    assert pytreestore.open(path).load(as_numpy=True)["x"].tolist() == list(range(5))
    assert root_metadata(path)["metadata"]["x"]["shape"] == [3]  # the commit before
    store.close()
    pytreestore.open(path, "a", backend=backend).close()
    check_in_step(path)


def test_a_failed_root_write_fails_the_ocdbt_commit(tmp_path, monkeypatch):
    """On OCDBT the root is inside the commit's transaction: a failed root write fails the
    whole commit (nothing of it lands, no warning), the records stay buffered, and the
    retry commits them once."""
    path = tmp_path / "s"
    store = pytreestore.create(path, {"x": np.int32(0)}, chunk_records=2, backend="ocdbt")
    store.extend({"x": np.int32(i)} for i in range(3))
    store.flush()
    engine = OcdbtBackend(Location.parse(str(path)))
    generation, root = engine.latest_generation(), engine.read_bytes("zarr.json")
    full = StorageError("writing zarr.json: [Errno 28] No space left on device")
    fail_root_writes(monkeypatch, store._backend, full)
    store.append({"x": np.int32(3)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning: nothing was committed
        with pytest.raises(StorageError, match="No space left on device"):
            store.flush()
    assert (engine.latest_generation(), engine.read_bytes("zarr.json")) == (generation, root)
    assert len(pytreestore.open(path)) == 3 and len(store) == 4  # still buffered
    monkeypatch.undo()
    store.flush()  # the retry
    store.close()
    reader = pytreestore.open(path)
    assert reader.load(as_numpy=True)["x"].tolist() == [0, 1, 2, 3]
    assert [v.records for v in reader.versions()] == [0, 2, 3, 4]
    meta = json.loads(engine.read_bytes("zarr.json") or b"")
    assert meta["consolidated_metadata"]["metadata"]["x"]["shape"] == [4]
