"""zarrita.js, a JavaScript zarr v3 reader, opens our stores: every column by its stored key.

zarrita resolves array paths as URLs and percent-decodes them, so keys written with ``%XX``
escapes were not found ("NotFoundError", "URIError: URI malformed"); keys are now escaped with
``-XX`` and use only zarr v3's portable characters. One ``npm install`` per session (skipped
where node or npm is missing or the registry cannot be reached), one node run reading every
store, values compared byte for byte with ``store.load(as_numpy=True)``.

bfloat16 and the float8 types are left out: zarr v3 has no standard name for them and zarrita
reads none. float16 needs ``Float16Array``, which node 20 lacks: the script then reads float16
columns through a ``Uint16Array`` stand-in, which still checks every byte.
"""

from __future__ import annotations

import base64
import json
import shutil
import string
import subprocess
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
import zarr

import pytreestore
from tests.awkward import awkward_records, ragged_records

NPM_PACKAGES = ("zarrita@0.7", "@zarrita/storage@0.2")
#: from npm's cache when it can; offline, fail within seconds rather than retry for minutes
NPM_OPTIONS = (
    "--no-audit",
    "--no-fund",
    "--loglevel=error",
    "--prefer-offline",
    "--fetch-retries=0",
    "--fetch-timeout=30000",
)
PORTABLE = set(string.ascii_letters + string.digits + "-_.")

#: reads every store given on the command line; prints {store: {key: array or error}}
SCRIPT = r"""
import * as zarr from "zarrita";
import { FileSystemStore } from "@zarrita/storage";

if (globalThis.Float16Array === undefined) {  // node < 22: the float16 bits, as uint16
  globalThis.Float16Array = class Float16Array extends Uint16Array {};
}

async function readArray(root, key) {
  try {
    const array = await zarr.open(root.resolve(key), { kind: "array" });
    const { data, shape } = await zarr.get(array);
    const bytes = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    const out = { shape, dtype: array.dtype, bytes: bytes.toString("base64") };
    if (!array.dtype.startsWith("float")) {
      out.values = Array.from({ length: data.length }, (_, i) => String(data.get ? data.get(i) : data[i]));
    }
    return out;
  } catch (err) {
    return { error: `${err.name}: ${err.message}` };
  }
}

const result = {};
for (const path of process.argv.slice(2)) {
  const root = zarr.root(new FileSystemStore(path));
  const group = await zarr.open(root, { kind: "group" });
  const info = group.attrs.pytreestore;
  const keys = info.columns.map((c) => c.key);
  for (const axis of info.ragged?.axes ?? []) keys.push(axis.offsets);
  for (const part of info.ragged?.optional ?? []) keys.push(part.presence);
  result[path] = {};
  for (const key of keys) result[path][key] = await readArray(root, key);
}
console.log(JSON.stringify(result));
"""


@pytest.fixture(scope="session")
def zarrita(tmp_path_factory) -> Path:
    """A folder with zarrita and @zarrita/storage installed (once per session)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("zarrita.js test: node or npm is not installed")
    folder = tmp_path_factory.mktemp("zarrita")
    (folder / "package.json").write_text('{"type": "module", "private": true}')
    try:
        done = subprocess.run(
            [npm, "install", *NPM_OPTIONS, *NPM_PACKAGES],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("zarrita.js test: npm install timed out (offline?)")
    if done.returncode != 0:
        pytest.skip(f"zarrita.js test: npm install failed (offline?): {done.stderr[-500:]}")
    (folder / "read.mjs").write_text(SCRIPT)
    return folder


STORES = [
    ("tensorstore", "zstd"),
    ("tensorstore", None),
    ("zarr", "zstd"),
    ("zarr", None),
]


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stores")
    records = awkward_records()
    out = {}
    for backend, codec in STORES:
        path = root / f"{backend}-{codec}"
        with pytreestore.create(
            path, records[0], backend=backend, codec=codec, chunk_records=2, overwrite=True
        ) as store:
            store.extend(records)
        out[f"{backend}-{codec}"] = path
    path = root / "ragged"
    rows = ragged_records()
    with pytreestore.create(path, rows[0], ragged=["['hits/é']"], optional=["['calib']"]) as store:
        store.extend(rows)
    out["ragged"] = path
    return out


@pytest.fixture(scope="module")
def read_by_zarrita(zarrita, stores) -> dict[str, dict[str, Any]]:
    done = subprocess.run(
        ["node", str(zarrita / "read.mjs"), *map(str, stores.values())],
        cwd=zarrita,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _as_numpy(got: dict[str, Any], dtype: np.dtype) -> np.ndarray:
    assert "error" not in got, got["error"]
    return np.frombuffer(base64.b64decode(got["bytes"]), dtype.newbyteorder("<")).reshape(
        got["shape"]
    )


def _same(got: dict[str, Any], want: np.ndarray, key: str) -> None:
    array = _as_numpy(got, want.dtype)
    assert got["dtype"] == want.dtype.name, key
    assert array.shape == want.shape and array.tobytes() == want.tobytes(), key
    if want.dtype.kind in "iub":
        values = [str(v).lower() if want.dtype.kind == "b" else str(v) for v in want.ravel()]
        assert got["values"] == values, key


@pytest.mark.parametrize("name", [f"{b}-{c}" for b, c in STORES])
def test_zarrita_reads_every_column_by_its_stored_key(name, stores, read_by_zarrita):
    store = pytreestore.open(stores[name])
    got = read_by_zarrita[str(stores[name])]
    batch = store.load(as_numpy=True)
    leaves = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(batch)}
    assert sorted(got) == sorted(c.key for c in store.schema.columns)
    for column in store.schema.columns:
        assert set(column.key) <= PORTABLE | {"/"}, column.key
        _same(got[column.key], leaves[column.path], column.key)


def test_zarrita_reads_a_ragged_store(stores, read_by_zarrita):
    path = stores["ragged"]
    got = read_by_zarrita[str(path)]
    columns = pytreestore.open(path).schema.storage_columns
    assert sorted(got) == sorted(c.key for c in columns)
    assert {"hits-2F-C3-A9-offsets", "calib-present", "hits-2F-C3-A9/-2A/x-20y"} <= set(got)
    for column in columns:
        assert set(column.key) <= PORTABLE | {"/"}, column.key
        want = np.asarray(zarr.open_array(path / column.key, mode="r")[:])
        _same(got[column.key], want, column.key)
