"""A local TensorStore store's arrays created as files (``pytreestore.backends._tensorstore.
documents``): each ``zarr.json`` as TensorStore itself writes it, never over an existing array;
and the handles a deletion drops."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts

from pytreestore import errors
from pytreestore._format.keys import array_json
from pytreestore._location import Location
from pytreestore.backends import ColumnLayout, TensorStoreBackend
from pytreestore.backends._metadata import array_metadata
from pytreestore.backends._tensorstore.kvstore import plain_fill

LAYOUTS = [
    ColumnLayout("a/x", np.dtype("int32"), (), (8,), "zstd", ("record",), 0),
    ColumnLayout("a/b", np.dtype("int8"), (3,), (8, 3), None, ("record", "b0"), 0),
    ColumnLayout("v", np.dtype("float32"), (2, 2), (16, 2, 2), "blosc", ("record", "v0", "v1"), 0),
    ColumnLayout("s", np.dtype("uint16"), (4,), (16, 4), "gzip", ("record", "s0"), 0, inner=4),
    ColumnLayout("f", np.dtype("bool"), (), (8,), "zstd", ("record",), False),
]
#: every dtype's zero (written as a document), and fill values (evolve's defaults) TensorStore
#: rewrites, rounded to the dtype, ints as floats (made by TensorStore itself)
FILLS = [
    ("float32", 0.0),
    ("bfloat16", 0.0),
    ("float8_e8m0fnu", 0.0),
    ("float4_e2m1fn", 0.0),
    ("complex64", [0.0, 0.0]),
    ("int4", 0),
    ("int64", 0),
    ("bool", False),
    ("float32", 0.1),
    ("float32", 3),
    ("float16", 0.1),
    ("bfloat16", 1),
    ("float8_e4m3fn", 0.3),
    ("complex64", [1, 0.5]),
    ("complex128", [0.1, "NaN"]),
    ("float64", "-Infinity"),
    ("int4", -2),
    ("uint8", 7),
    ("bool", True),
]


def made_by_tensorstore(root: Path, layout: ColumnLayout) -> bytes:
    """The ``zarr.json`` ``ts.open(create=True)`` writes for ``layout`` (the old way)."""
    kv = {"driver": "file", "path": f"{root}/{layout.key}/"}
    spec = {"driver": "zarr3", "kvstore": kv, "metadata": array_metadata(layout)}
    ts.open(spec, create=True).result()
    return (root / array_json(layout.key)).read_bytes()


def test_a_local_store_s_arrays_are_written_as_tensorstore_writes_them(tmp_path: Path) -> None:
    backend = TensorStoreBackend(Location.parse(str(tmp_path / "s")))
    backend.create_columns(LAYOUTS)
    for layout in LAYOUTS:
        ours = (tmp_path / "s" / array_json(layout.key)).read_bytes()
        assert ours == made_by_tensorstore(tmp_path / "ts", layout), layout.key
    keys = [lay.key for lay in LAYOUTS]
    backend.resize(keys, 10)
    blocks = [np.arange(10 * int(np.prod(lay.shape))).reshape(10, *lay.shape) for lay in LAYOUTS]
    blocks = [b.astype(lay.dtype) for b, lay in zip(blocks, LAYOUTS)]
    backend.write(keys, 0, blocks)
    again = TensorStoreBackend(Location.parse(str(tmp_path / "s")))
    again.open_columns(LAYOUTS)
    for got, want in zip(again.read(keys, slice(0, 10), 10), blocks):
        np.testing.assert_array_equal(got, want, strict=True)


@pytest.mark.parametrize(("dtype", "fill"), FILLS)
def test_fill_values_are_written_as_tensorstore_writes_them(tmp_path: Path, dtype, fill) -> None:
    kind = np.dtype(getattr(ml_dtypes, dtype, dtype))
    layout = ColumnLayout("c", kind, (2,), (4, 2), None, ("record", "c0"), fill)
    backend = TensorStoreBackend(Location.parse(str(tmp_path / "s")))
    backend.create_columns([layout])
    ours = (tmp_path / "s" / array_json("c")).read_bytes()
    assert ours == made_by_tensorstore(tmp_path / "ts", layout)
    assert ("c" in backend._handles) != plain_fill(layout)  # a zero: no TensorStore open


def test_an_existing_array_is_never_written_over(tmp_path: Path) -> None:
    backend = TensorStoreBackend(Location.parse(str(tmp_path / "s")))
    backend.create_columns(LAYOUTS[:1])
    document = tmp_path / "s" / array_json("a/x")
    before = document.read_bytes()
    other = ColumnLayout("a/x", np.dtype("int64"), (), (4,), None, ("record",), 0)
    with pytest.raises(errors.StorageError, match=r"an array already exists at a/x/zarr\.json"):
        TensorStoreBackend(Location.parse(str(tmp_path / "s"))).create_columns([other])
    assert document.read_bytes() == before


def test_deleting_keys_drops_the_handles_of_their_columns_only(tmp_path: Path) -> None:
    backend = TensorStoreBackend(Location.parse(str(tmp_path / "s")))
    backend.create_columns(LAYOUTS[:3])
    backend.resize(["a/x", "a/b", "v"], 8)
    backend.write_bytes(".pytreestore/incomplete", b"")
    backend.delete_keys([".pytreestore/incomplete", "a/x/c/0"])
    assert sorted(backend._handles) == ["a/b", "v"]
    backend.delete_keys([array_json("v")])
    assert sorted(backend._handles) == ["a/b"]
