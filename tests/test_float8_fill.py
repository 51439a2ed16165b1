"""float8 fill values (issue 33): the forms zarr-extensions specifies (a number, ``"NaN"``,
``"Infinity"``, or the bits in hex, ``"0x00"``), read by both backends; zarr-python hands
zarrs (the Rust implementation, through its ``zarrs`` Python codec pipeline) the bits, the one
form zarrs reads.

Stores write a float8 column's fill value as a number (``0.0``), as TensorStore writes it
whenever it rewrites an array's metadata; both forms are valid."""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts
import zarr

import pytreestore
import pytreestore_zarr_dtypes
from pytreestore._format.dtypes import ML_FLOATS

FLOAT8 = [n for n in ML_FLOATS if n.startswith("float8")]
#: not a zarr-extensions data type (its ``float8_e4m3`` is the IEEE-like one), and zarrs has none
NOT_IN_ZARRS = {"float8_e4m3fn"}


def _values(name: str, i: int) -> np.ndarray:
    return np.array([2.0**-i, 2.0**i], getattr(ml_dtypes, name))


@pytest.fixture
def written(tmp_path, backend):
    """A store of one float8 column per type, 5 records, with its records."""
    like = {n: _values(n, 0) for n in FLOAT8}
    records = [{n: _values(n, i) for n in FLOAT8} for i in range(5)]
    path = tmp_path / "s"
    with pytreestore.create(path, like, codec=None, chunk_records=2, backend=backend) as store:
        store.extend(records)
    return path, records


@pytest.mark.plain_files
@pytest.mark.parametrize("form", ["0x00", 0.0])
def test_both_backends_read_a_float8_fill_value_in_either_form(written, form, backend):
    path, records = written
    for name in FLOAT8:
        meta = path / name / "zarr.json"
        document = json.loads(meta.read_text())
        meta.write_text(json.dumps(dict(document, fill_value=form)))
        array = ts.open(
            {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(meta.parent)}}
        )
        assert np.asarray(array.result().fill_value).tobytes() == b"\x00"
    for reader in ("tensorstore", "zarr"):
        store = pytreestore.open(path, backend=reader)
        for name in FLOAT8:
            got = store.load(slice(None), columns=[f"['{name}']"], as_numpy=True)[name]
            want = np.stack([r[name] for r in records])
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


@pytest.mark.parametrize("name", FLOAT8)
def test_zarr_python_writes_a_float8_fill_value_as_its_bits(name):
    pytreestore_zarr_dtypes.register()
    dtype = pytreestore_zarr_dtypes.DTYPES[name]()
    one = np.asarray(1.0, getattr(ml_dtypes, name))
    assert dtype.to_json_scalar(one, zarr_format=3) == "0x" + one.tobytes().hex()
    back = dtype.from_json_scalar(dtype.to_json_scalar(one, zarr_format=3), zarr_format=3)
    assert np.asarray(back).tobytes() == one.tobytes()
    zero = dtype.from_json_scalar("0x00", zarr_format=3)
    if name == "float8_e8m0fnu":  # no zero: 0x00 is 2**-127, and 0.0 rounds to NaN
        assert float(zero) == 2.0**-127 and np.isnan(dtype.from_json_scalar(0.0, zarr_format=3))
    else:
        assert dtype.from_json_scalar(0.0, zarr_format=3) == zero == 0


def test_bfloat16_fill_values_stay_numbers():
    pytreestore_zarr_dtypes.register()
    dtype = pytreestore_zarr_dtypes.DTYPES["bfloat16"]()
    assert dtype.to_json_scalar(np.asarray(1.5, ml_dtypes.bfloat16), zarr_format=3) == 1.5


@pytest.mark.plain_files
def test_zarrs_reads_every_float8_column_it_has_a_type_for(written):
    """zarrs 0.2.3 (the ``zarrs`` codec pipeline of zarr-python) refused every float8 array
    whose fill value zarr-python handed it as a number ("incompatible fill value metadata")."""
    zarrs = pytest.importorskip("zarrs")
    path, records = written
    pytreestore_zarr_dtypes.register()
    with zarr.config.set({"codec_pipeline.path": "zarrs.ZarrsCodecPipeline"}):
        for name in FLOAT8:
            want = np.stack([r[name] for r in records])
            if name in NOT_IN_ZARRS:
                with pytest.warns(UserWarning, match=f"data type {name} is not supported"):
                    zarr.open_array(path / name, mode="r")
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no fallback to zarr-python's own pipeline
                got = zarr.open_array(path / name, mode="r")[:]
            assert np.asarray(got).tobytes() == want.tobytes(), (name, zarrs.__name__)
