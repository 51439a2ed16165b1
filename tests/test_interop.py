"""Reading a store without pytreestore: zarr-python's open_group and xarray's open_datatree."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import jax
import ml_dtypes
import numpy as np
import pytest
import zarr

import pytreestore
from pytreestore.backends._zarr import stores as _zarr_dtypes
from pytreestore.testing import strategies as pts
from tests import optional

xr = optional.importorskip("xarray")

N = 7


def record(i: int) -> dict[str, Any]:
    return {
        "agent": pts.State(
            position=np.arange(3, dtype=np.float32) + i,
            velocity=np.full((2, 2), -i, np.int16),
            mass=np.float64(i / 2),
        ),
        "layers": [pts.Params(x=np.float32(i), y=np.int32(i)), pts.Pair(np.bool_(i % 2), None)],
        "meta": {"lr/base": np.float32(1e-3 * i), "é": np.uint8(i)},
        "half": np.full(2, i, ml_dtypes.bfloat16),
        "zero": np.float32(0),
    }


@pytest.fixture(scope="module", params=["tensorstore", "zarr"])
def store_path(request, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp(request.param) / "s"
    with pytreestore.create(path, record(0), chunk_records=3, backend=request.param) as store:
        store.extend(record(i) for i in range(N))
    _zarr_dtypes.register()  # zarr-python learns bfloat16 and the float8 types
    return str(path)


@pytest.fixture(autouse=True)
def no_warning() -> Iterator[None]:
    """Format 3: default arguments read the root's consolidated metadata, and warn about
    nothing (before, .pytreestore/ and the missing consolidated metadata both warned)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def walk(group: zarr.Group, prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, member in sorted(group.members()):
        key = f"{prefix}{name}"
        yield key, member
        if isinstance(member, zarr.Group):
            yield from walk(member, key + "/")


def test_open_group_has_one_array_per_leaf(store_path):
    store = pytreestore.open(store_path)
    loaded = dict(
        zip((c.key for c in store.schema.columns), jax.tree.leaves(store.load(as_numpy=True)))
    )
    members = dict(walk(zarr.open_group(store_path, mode="r")))
    arrays = {k: v for k, v in members.items() if isinstance(v, zarr.Array)}
    groups = {k for k, v in members.items() if isinstance(v, zarr.Group)}
    assert set(arrays) == set(loaded)
    assert groups == {"agent", "layers", "layers/0", "layers/1", "meta"}
    for key, array in arrays.items():
        want = loaded[key]
        assert array.shape == (N, *want.shape[1:]) == want.shape, key
        got = np.asarray(array[:])
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), key


def test_open_group_dimension_names(store_path):
    group = zarr.open_group(store_path, mode="r")
    assert group["agent/velocity"].metadata.dimension_names == (
        "record",
        "velocity_0",
        "velocity_1",
    )
    assert group["layers/0/x"].metadata.dimension_names == ("record",)
    assert group["meta/lr-2Fbase"].shape == (N,)
    assert group.attrs["pytreestore"]["format_version"] == pytreestore.FORMAT_VERSION


def test_open_datatree_one_node_per_level(store_path):
    tree = xr.open_datatree(store_path, engine="zarr")
    nodes = sorted(node.path for node in tree.subtree)
    assert nodes == ["/", "/agent", "/layers", "/layers/0", "/layers/1", "/meta"]
    assert sorted(tree["/agent"].data_vars) == ["mass", "position", "velocity"]
    assert sorted(tree["/layers/0"].data_vars) == ["x", "y"]
    assert sorted(tree["/layers/1"].data_vars) == ["first"]  # the None field has no column
    assert sorted(tree["/meta"].data_vars) == ["-C3-A9", "lr-2Fbase"]
    assert sorted(tree["/"].data_vars) == ["half", "zero"]
    assert tree["/agent/velocity"].dims == ("record", "velocity_0", "velocity_1")
    assert tree["/"].sizes["record"] == N


def test_open_datatree_values(store_path):
    tree = xr.open_datatree(store_path, engine="zarr")
    want = pytreestore.open(store_path).load(as_numpy=True)
    np.testing.assert_array_equal(tree["/agent/position"].values, want["agent"].position)
    np.testing.assert_array_equal(tree["/agent/velocity"].values, want["agent"].velocity)
    np.testing.assert_array_equal(tree["/agent/mass"].values, want["agent"].mass)
    np.testing.assert_array_equal(tree["/layers/1/first"].values, want["layers"][1].first)
    half = tree["/half"].values
    assert half.dtype == np.dtype(ml_dtypes.bfloat16) and half.tobytes() == want["half"].tobytes()
    zero = tree["/zero"].values  # a zarr v3 fill_value is not a missing-value mask
    assert zero.dtype == np.float32 and not np.isnan(zero).any()
    assert tree["/meta/-C3-A9"].values.tolist() == list(range(N))


def test_docs_interop_examples_run(tmp_path, monkeypatch, capsys):
    """Every Python block of docs/interop.md runs in order; printed trees match the page."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "interop.md").read_text()
    blocks = re.findall(r"```(python|text)\n(.*?)```", text, re.S)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "docs_interop"}
    shown = []
    for kind, code in blocks:
        if kind == "python":
            exec(compile(code, "docs/interop.md", "exec"), namespace)
            shown.append(capsys.readouterr().out)
        elif shown and shown[-1]:
            assert shown[-1].strip() == code.strip()
