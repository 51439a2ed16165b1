"""An installed pytreestore teaches zarr-python bfloat16 and float8 with no import.

Each reader runs in a fresh process that imports zarr (or xarray) and nothing of ours, with
every warning an error: the entry points of the distribution (pyproject.toml) must register
the data types before zarr-python parses an array's metadata, without importing pytreestore
or jax. The pytreestore_zarr_dtypes and pytreestore_zarr_autoload modules, and why a
``zarr.buffer`` entry point: docs/interop.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
import zarr
import zarr.registry
from zarr.core.buffer import cpu

import pytreestore
import pytreestore_zarr_dtypes
from pytreestore._format import dtypes as _dtypes
from pytreestore.backends._zarr import stores as _zarr_dtypes

N = 8  # records: with 32 values a record, the float8 columns hold all 256 bit patterns
# zarr-python listing a store (use_consolidated=False) warns about .pytreestore/: no zarr node
PYTREESTORE_FOLDER = "Object at .pytreestore"


def record(i: int) -> dict[str, Any]:
    def bits(name: str) -> np.ndarray:
        dtype = np.dtype(getattr(ml_dtypes, name))
        if dtype.itemsize == 1:
            return (np.arange(32, dtype=np.uint8) + 32 * i).view(dtype)
        return (np.arange(32, dtype=np.uint16) * 2039 + 8191 * i).view(dtype)  # NaNs, infs too

    return {
        "ml": {name: bits(name) for name in _dtypes.ML_FLOATS},
        "std": {
            "f32": np.arange(3, dtype=np.float32) / (i + 1),
            "i64": np.int64(-(2**40) * i),
            "flag": np.bool_(i % 2),
            "c64": np.full(2, 1 - 1j * i, np.complex64),
        },
        "half": np.full(2, i / 4, ml_dtypes.bfloat16),
    }


def write_store(path: Path, *, backend: str, codec: str | None) -> Path:
    """A store of N records and, beside it, what each array holds (dtype, shape, hex bytes)."""
    with pytreestore.create(path, record(0), backend=backend, codec=codec, chunk_records=3) as s:
        s.extend(record(i) for i in range(N))
    store = pytreestore.open(path)
    leaves = jax.tree.leaves(store.load(as_numpy=True))
    expected = {
        c.key: [str(a.dtype), list(a.shape), a.tobytes().hex()]
        for c, a in zip(store.schema.columns, leaves)
    }
    manifest = path.parent / f"{path.name}.json"
    manifest.write_text(json.dumps(expected))
    return manifest


def run_isolated(code: str, *args: object, cwd: Path) -> str:
    """Runs ``code`` in a fresh interpreter, every warning an error; returns its stdout."""
    env = {**os.environ, "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,  # not the repository: what is installed, not the source tree, is tried
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


# The end of every reader: zarr-python found our data types without pytreestore or jax.
NOTHING_ELSE_IMPORTED = """
assert "pytreestore_zarr_dtypes" in sys.modules
assert not {"pytreestore", "jax"} & set(sys.modules), sorted({"pytreestore", "jax"} & set(sys.modules))
"""

READ_WITH_ZARR = f"""
import json, pathlib, sys, warnings
import zarr

consolidated = None if sys.argv[1] == "default" else False
if consolidated is False:  # listing the folders, zarr-python meets .pytreestore/
    warnings.filterwarnings("ignore", message={PYTREESTORE_FOLDER!r})


def walk(group, prefix=""):
    for name, member in sorted(group.members()):
        if isinstance(member, zarr.Group):
            yield from walk(member, f"{{prefix}}{{name}}/")
        else:
            yield f"{{prefix}}{{name}}", member


stores = sys.argv[2:]  # each store's path, then the file of what it holds
for path, manifest in zip(stores[::2], stores[1::2]):
    expected = json.loads(pathlib.Path(manifest).read_text())
    arrays = dict(walk(zarr.open_group(path, mode="r", use_consolidated=consolidated)))
    assert sorted(arrays) == sorted(expected), (sorted(arrays), sorted(expected))
    for key, want in expected.items():
        got = arrays[key][:]
        assert [str(got.dtype), list(got.shape), got.tobytes().hex()] == want, key
    print(len(arrays))
{NOTHING_ELSE_IMPORTED}
"""


@pytest.fixture(scope="module", params=[("tensorstore", "zstd"), ("zarr", None)])
def written(request, tmp_path_factory) -> tuple[Path, Path]:
    backend, codec = request.param
    path = tmp_path_factory.mktemp(f"{backend}-{codec}") / "s"
    return path, write_store(path, backend=backend, codec=codec)


def test_names_equal_the_format_ml_floats():
    assert pytreestore_zarr_dtypes.NAMES == _dtypes.ML_FLOATS
    assert _zarr_dtypes.DTYPES is pytreestore_zarr_dtypes.DTYPES
    assert _zarr_dtypes.register is pytreestore_zarr_dtypes.register


def test_the_distribution_declares_the_entry_points():
    data_types = {e.name: e for e in entry_points(group="zarr.data_type")}
    assert set(_dtypes.ML_FLOATS) <= set(data_types)
    for name in _dtypes.ML_FLOATS:
        cls = data_types[name].load()
        assert cls is pytreestore_zarr_dtypes.DTYPES[name] and cls._zarr_v3_name == name
        assert getattr(pytreestore_zarr_dtypes, cls.__qualname__) is cls  # pickles by name
    (buffer,) = [e for e in entry_points(group="zarr.buffer") if e.name == "pytreestore"]
    assert buffer.value == "pytreestore_zarr_autoload:Buffer"
    # zarr-python registers it under its qualified name, already zarr's CPU Buffer: no change
    assert buffer.load() is cpu.Buffer
    assert zarr.registry.fully_qualified_name(buffer.load()) == "zarr.core.buffer.cpu.Buffer"
    assert zarr.registry.get_buffer_class() is cpu.Buffer


STORES = [("tensorstore", "zstd"), ("tensorstore", None), ("zarr", "zstd"), ("zarr", None)]


@pytest.fixture(scope="module")
def reads(tmp_path_factory) -> dict[str, tuple[Path, list[int]]]:
    """A store of each of :data:`STORES` (its manifest) and the count of arrays zarr-python
    read from it, by the root's consolidated metadata and by listing: one fresh interpreter
    for every store, per way (each start imports zarr)."""
    root = tmp_path_factory.mktemp("reads")
    manifests = {f"{b}-{c}": write_store(root / f"{b}-{c}", backend=b, codec=c) for b, c in STORES}
    args = [str(x) for name, m in manifests.items() for x in (root / name, m)]
    counts = {
        way: [int(n) for n in run_isolated(READ_WITH_ZARR, way, *args, cwd=root).split()]
        for way in ("default", "off")  # the root's consolidated metadata, the listing
    }
    assert all(len(c) == len(STORES) for c in counts.values()), counts
    return {
        name: (m, [counts[way][k] for way in counts])
        for k, (name, m) in enumerate(manifests.items())
    }


@pytest.mark.parametrize(("backend", "codec"), STORES)
def test_zarr_python_reads_every_array_with_no_import(reads, backend, codec):
    manifest, got = reads[f"{backend}-{codec}"]
    want = len(json.loads(manifest.read_text()))
    assert got == [want, want] and want == len(_dtypes.ML_FLOATS) + 5


def test_consolidated_metadata_is_parsed_after_the_types_are_registered(written, tmp_path):
    """The root's consolidated metadata (format 3) parses every array's metadata as the group
    opens: zarr-python's own consolidation of the store reads the same, with no import."""
    path, manifest = written
    copy = tmp_path / "consolidated"
    shutil.copytree(path, copy)
    (copy / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PYTREESTORE_FOLDER)
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        zarr.consolidate_metadata(str(copy))
    run_isolated(READ_WITH_ZARR, "default", copy, manifest, cwd=tmp_path)


def test_xarray_reads_the_ml_columns_with_no_import(written, tmp_path):
    path, manifest = written
    code = f"""
import json, pathlib, sys, warnings
import xarray as xr

path, expected = sys.argv[1], json.loads(pathlib.Path(sys.argv[2]).read_text())
tree = xr.open_datatree(path, engine="zarr")  # default arguments: no warning
ml = xr.open_zarr(path, group="ml")
for key, want in expected.items():
    values = tree["/" + key].values
    assert [str(values.dtype), list(values.shape), values.tobytes().hex()] == want, key
    if key.startswith("ml/"):
        again = ml[key[3:]].values
        assert again.tobytes().hex() == want[2], key
{NOTHING_ELSE_IMPORTED}
"""
    run_isolated(code, path, manifest, cwd=tmp_path)


def test_opening_an_array_first_needs_register(written, tmp_path):
    """zarr-python 3.1 reads an array's own zarr.json before it looks up its buffer class, so
    a process whose first read is ``open_array`` of such an array calls register() (no jax).
    If the first read starts passing, zarr-python loads the data type entry points itself:
    update docs/interop.md."""
    path, _ = written
    code = f"""
import sys
import zarr

try:
    zarr.open_array(sys.argv[1] + "/half", mode="r")
except ValueError as err:
    assert "No Zarr data type found that matches 'bfloat16'" in str(err), err
else:
    raise AssertionError("open_array found bfloat16 with no import")
import pytreestore_zarr_dtypes

pytreestore_zarr_dtypes.register()
assert str(zarr.open_array(sys.argv[1] + "/half", mode="r").dtype) == "bfloat16"
{NOTHING_ELSE_IMPORTED}
"""
    run_isolated(code, path, cwd=tmp_path)


def test_a_failing_registration_leaves_zarr_working(written, tmp_path):
    """Without ml_dtypes the hook registers nothing and says nothing: zarr-python keeps its
    buffer, and every other column still reads."""
    path, manifest = written
    code = f"""
import json, pathlib, sys, warnings
sys.modules["ml_dtypes"] = None  # import ml_dtypes now raises ImportError
import zarr
from zarr.core.buffer import cpu
from zarr.core.dtype import data_type_registry

warnings.filterwarnings("ignore", message={PYTREESTORE_FOLDER!r})
path, expected = sys.argv[1], json.loads(pathlib.Path(sys.argv[2]).read_text())
assert zarr.registry.get_buffer_class() is cpu.Buffer
assert "pytreestore_zarr_autoload" in sys.modules and "bfloat16" not in data_type_registry.contents
root = zarr.open_group(path, mode="r", use_consolidated=False)
for key, want in expected.items():
    if key.startswith("std/"):
        got = root[key][:]
        assert [str(got.dtype), list(got.shape), got.tobytes().hex()] == want, key
try:
    root["half"]
except ValueError as err:
    assert "No Zarr data type found that matches 'bfloat16'" in str(err), err
else:
    raise AssertionError("bfloat16 read without ml_dtypes")
assert not {{"pytreestore", "jax"}} & set(sys.modules)
"""
    run_isolated(code, path, manifest, cwd=tmp_path)
