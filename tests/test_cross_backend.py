"""A store written by either backend reads identically through the other, for every dtype."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytreestore
from pytreestore._format import dtypes as _dtypes
from pytreestore.testing import assert_trees_equal
from pytreestore.testing import strategies as pts
from pytreestore.testing.conformance import dtype_values
from tests.conftest import FILE_BACKENDS

BACKENDS = FILE_BACKENDS  # the files each writes are compared byte for byte: not OCDBT
NAMES = list(_dtypes.SUPPORTED)
N = 11


def dtype_like() -> dict[str, np.ndarray]:
    return {name: np.zeros(2, dtype) for name, dtype in _dtypes.SUPPORTED.items()}


def dtype_columns() -> dict[str, np.ndarray]:
    return {
        name: dtype_values(dtype, 2 * N, seed=i).reshape(N, 2)
        for i, (name, dtype) in enumerate(_dtypes.SUPPORTED.items())
    }


@pytest.fixture(scope="module", params=BACKENDS)
def written(request, tmp_path_factory) -> tuple[str, Path]:
    """One store per writer: a column of every dtype, in whole chunks and a partial one,
    compressed (zstd) and not; appended by two sessions."""
    root = tmp_path_factory.mktemp(f"written-{request.param}")
    columns = dtype_columns()
    for codec in ("zstd", None):
        path = root / str(codec)
        with pytreestore.create(
            path, dtype_like(), chunk_records=4, codec=codec, backend=request.param
        ) as store:
            store.extend_batch({k: v[:6] for k, v in columns.items()})
        with pytreestore.open(path, "a", backend=request.param) as store:
            for i in range(6, N):
                store.append({k: v[i] for k, v in columns.items()})
    return request.param, root


@pytest.mark.parametrize("reader", BACKENDS)
@pytest.mark.parametrize("codec", ["zstd", None])
def test_every_dtype_reads_identically(written, reader, codec):
    _, root = written
    got = pytreestore.open(root / str(codec), backend=reader).load(as_numpy=True)
    for name, want in dtype_columns().items():
        assert got[name].dtype == want.dtype, name
        assert got[name].tobytes() == want.tobytes(), f"{name}: bits differ"


@pytest.mark.parametrize("reader", BACKENDS)
def test_gathers_read_identically(written, reader):
    _, root = written
    store = pytreestore.open(root / "zstd", backend=reader)
    index = np.array([10, 0, 5, 5, 3])
    got = store.load(index, as_numpy=True)
    for name, want in dtype_columns().items():
        assert got[name].tobytes() == want[index].tobytes(), name


def test_metadata_is_byte_identical(tmp_path):
    """Both backends write the same bytes for every metadata document: every dtype (with
    blosc, whose configuration depends on the dtype), every codec, nested groups."""
    stores = {
        "blosc": (dtype_like(), "blosc"),
        "zstd": ({"a/b": np.zeros((2, 3), np.float32), "n": [np.int8(0)]}, "zstd"),
        "none": ({"é": np.zeros(3, np.uint16)}, None),
    }
    for backend in BACKENDS:
        for name, (like, codec) in stores.items():
            path = tmp_path / backend / name
            with pytreestore.create(path, like, chunk_records=2, codec=codec, backend=backend) as s:
                s.extend([like] * 3)
    files = sorted(
        p.relative_to(tmp_path / "tensorstore") for p in (tmp_path / "tensorstore").rglob("*.json")
    )
    assert files == sorted(
        p.relative_to(tmp_path / "zarr") for p in (tmp_path / "zarr").rglob("*.json")
    )
    # arrays, groups, root + commit; then per store a schema and its versions (create, commits)
    versions = sum(
        len(list((tmp_path / "tensorstore" / n / ".pytreestore" / "versions").iterdir()))
        for n in stores
    )
    assert len(files) == (len(NAMES) + 2) + (2 + 1 + 2) + (1 + 2) + 3 + versions
    # create, then the list's one commit (written as one batch: the chunk of 2 and the tail)
    assert versions == 3 * 2
    for rel in files:
        ts_bytes, zarr_bytes = ((tmp_path / b / rel).read_bytes() for b in BACKENDS)
        if rel.name == "commit.json" or rel.parent.name == "versions":  # id and time differ
            ts_bytes, zarr_bytes = (
                re.sub(rb'"(store|time)": "[^"]+"', b"", x) for x in (ts_bytes, zarr_bytes)
            )
        assert ts_bytes == zarr_bytes, rel


@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_alternating_backends_append_and_read(data):
    """Sessions alternate engines on one store; every reader sees every record."""
    import tempfile

    schema = data.draw(pts.tree_schemas(max_leaves=4), label="schema")
    xs = data.draw(pts.records(schema, 6), label="records")
    order = data.draw(st.lists(st.sampled_from(BACKENDS), min_size=3, max_size=3), label="order")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s"
        pytreestore.create(path, schema.like, chunk_records=2, backend=order[0]).close()
        for k, backend in enumerate(order):
            with pytreestore.open(path, "a", backend=backend) as store:
                store.extend(xs[2 * k : 2 * k + 2])
        want = pytreestore.stack(xs, like=schema.like, as_numpy=True)
        for backend in BACKENDS:
            assert_trees_equal(pytreestore.open(path, backend=backend).load(as_numpy=True), want)
