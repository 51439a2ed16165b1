"""Every supported dtype through a real store, bit for bit; the x64 policy of loads."""

from __future__ import annotations

import math
import re
import warnings
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format import dtypes as _dtypes
from pytreestore._read.place import X64DisabledError

RECORD_SHAPE = (2, 3)
WIDE = ("int64", "uint64", "float64", "complex128")
NARROW = {"int64": "int32", "uint64": "uint32", "float64": "float32", "complex128": "complex64"}

# Bit patterns worth keeping exactly, per IEEE float layout: a signalling NaN with a payload,
# a quiet NaN with a payload, a negative quiet NaN, +inf, -0.0 and the smallest subnormal.
_IEEE_SPECIALS = {
    "float16": [0x7C01, 0x7E01, 0xFE00, 0x7C00, 0x8000, 0x0001],
    "bfloat16": [0x7F81, 0x7FC1, 0xFFC0, 0x7F80, 0x8000, 0x0001],
    "float32": [0x7F800001, 0x7FC00001, 0xFFC00000, 0x7F800000, 0x80000000, 0x00000001],
    "float64": [
        0x7FF0000000000001,
        0x7FF8000000000001,
        0xFFF8000000000000,
        0x7FF0000000000000,
        0x8000000000000000,
        0x0000000000000001,
    ],
}


@pytest.fixture(autouse=True)
def x64_disabled():
    with jax.enable_x64(False):
        yield


def bit_patterns(dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Values of ``dtype`` shaped (records, 2, 3): special bit patterns, then random bits.

    Every 1-byte dtype gets all 256 bit patterns (every NaN encoding of the float8 types).
    """
    per_record = math.prod(RECORD_SHAPE)
    if dtype == np.bool_:
        flat = rng.integers(0, 2, 4 * per_record).astype(bool)
    elif dtype.itemsize == 1:
        flat = np.concatenate([np.arange(256), rng.integers(0, 256, 8)]).astype(np.uint8)
        flat = flat.view(dtype)
    else:
        part = dtype if _dtypes.kind(dtype) != "c" else np.dtype(f"float{dtype.itemsize * 4}")
        uint = np.dtype(f"uint{part.itemsize * 8}")
        specials = np.array(_IEEE_SPECIALS.get(part.name, []), dtype=uint)
        noise = rng.integers(0, 256, 6 * per_record * dtype.itemsize, dtype=np.uint8)
        flat = np.concatenate([specials.view(np.uint8), noise]).view(dtype)
    records = -(-flat.size // per_record)
    flat = np.resize(flat, records * per_record)
    return flat.reshape(records, *RECORD_SHAPE)


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def write_store(path, dtype: np.dtype, values: np.ndarray) -> pytreestore.TreeStore:
    """A store with an array leaf and a scalar leaf of ``dtype``, one record per row."""
    like = {"arr": values[0], "one": values[0, 0, 0]}
    with pytreestore.create(path, like, chunk_records=4) as store:
        for row in values:
            store.append({"arr": row, "one": row[0, 0]})
    return pytreestore.open(path)


@pytest.mark.parametrize("name", sorted(_dtypes.SUPPORTED))
def test_dtype_round_trips_exactly(tmp_path, name):
    dtype = _dtypes.SUPPORTED[name]
    values = bit_patterns(dtype, np.random.default_rng(zlib.crc32(name.encode())))
    store = write_store(tmp_path / "s", dtype, values)
    assert [(c.path, c.dtype, c.shape) for c in store.schema.columns] == [
        ("['arr']", dtype, RECORD_SHAPE),
        ("['one']", dtype, ()),
    ]
    got = store.load(as_numpy=True)
    assert same_bits(got["arr"], values)
    assert same_bits(got["one"], values[:, 0, 0])
    one = store.load(3, as_numpy=True)
    assert same_bits(one["arr"], values[3]) and same_bits(one["one"], values[3, 0, 0])
    picked = store.load([-1, 0], as_numpy=True)
    assert same_bits(picked["arr"], values[[-1, 0]])


@pytest.mark.parametrize("name", sorted(set(_dtypes.SUPPORTED) - set(WIDE)))
def test_narrow_dtypes_load_to_jax_exactly(tmp_path, name):
    dtype = _dtypes.SUPPORTED[name]
    values = bit_patterns(dtype, np.random.default_rng(7))
    store = write_store(tmp_path / "s", dtype, values)
    got = store.load()
    assert isinstance(got["arr"], jax.Array) and got["arr"].dtype == dtype
    assert same_bits(np.asarray(got["arr"]), values)
    assert same_bits(np.asarray(got["one"]), values[:, 0, 0])
    assert same_bits(np.asarray(store[1]["arr"]), values[1])


def wide_store(path) -> pytreestore.TreeStore:
    like = {name: _dtypes.SUPPORTED[name].type(0) for name in WIDE}
    with pytreestore.create(path, like) as store:
        store.append(
            {
                "int64": np.int64(-(2**31)),
                "uint64": np.uint64(2**32 - 1),
                "float64": np.float64(1 / 3),
                "complex128": np.complex128(1 / 3 - 2j),
            }
        )
        store.append(
            {
                "int64": np.int64(2**31 - 1),
                "uint64": np.uint64(0),
                "float64": np.float64(-0.0),
                "complex128": np.complex128(1e30j),
            }
        )
    return pytreestore.open(path)


@pytest.mark.parametrize("name", WIDE)
def test_wide_columns_refuse_to_load_without_x64(tmp_path, name):
    store = wide_store(tmp_path / "s")
    message = (
        f"column ['{name}'] is {name}, which JAX holds only with x64 enabled. Load it with "
        "as_numpy=True for the exact values, enable x64 "
        f"(jax.config.update('jax_enable_x64', True)), or cast it to {NARROW[name]}: open "
        "the store with pytreestore.open(..., cast=True) (every read) or pass cast=True to "
        "this read."
    )
    with pytest.raises(X64DisabledError, match=f"^{re.escape(message)}$"):
        store.load(columns=f"['{name}']")
    with pytest.raises(X64DisabledError, match=re.escape(f"column ['{name}'] is {name}")):
        store.load(0, columns=f"['{name}']")
    assert issubclass(X64DisabledError, errors.PyTreeStoreError)
    assert issubclass(X64DisabledError, TypeError)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_store_wide_cast_policy(tmp_path, backend):
    # issue 11: store[a:b], store[i], iteration and map raised X64DisabledError, with no cast=
    path = tmp_path / "s"
    with pytreestore.create(path, {"t": np.float64(0), "n": np.int64(0)}, backend=backend) as s:
        s.extend({"t": np.float64(i / 4), "n": np.int64(i)} for i in range(5))
    plain = pytreestore.open(path, backend=backend)
    for read in (lambda s: s[1:3], lambda s: s[2], lambda s: next(iter(s)), lambda s: s.load()):
        with pytest.raises(X64DisabledError, match=re.escape("pytreestore.open(..., cast=True)")):
            read(plain)
    with pytest.raises(X64DisabledError, match="column \\['n'\\] is int64"):
        plain.map(lambda r: r, batch_size=2)
    store = pytreestore.open(path, backend=backend, cast=True)
    assert store[1:3]["t"].dtype == np.float32 and store[1:3]["t"].tolist() == [0.25, 0.5]
    assert store[4]["n"].dtype == np.int32 and int(store[4]["n"]) == 4
    assert [float(r["t"]) for r in store] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [int(r["n"]) for r in store.records()] == [0, 1, 2, 3, 4]
    assert store.load()["n"].tolist() == [0, 1, 2, 3, 4]
    assert [b["n"].tolist() for b in store.batches(2)] == [[0, 1], [2, 3], [4]]
    assert store.map(lambda r: {"m": r["n"] * 2}, batch_size=2)["m"].tolist() == [0, 2, 4, 6, 8]
    with pytest.raises(X64DisabledError, match="is int64"):
        store.load(cast=False)  # a read's own cast= overrides the policy
    assert store.load(as_numpy=True)["t"].dtype == np.float64
    made = pytreestore.create(tmp_path / "c", {"t": np.float64(0)}, backend=backend, cast=True)
    made.append({"t": np.float64(0.5)})
    assert made[0]["t"].dtype == np.float32 and float(made[0]["t"]) == 0.5
    made.close()
    with pytest.raises(TypeError, match="cast must be True, False or None"):
        pytreestore.open(path, cast="yes")  # type: ignore[arg-type]


def test_wide_columns_exact_as_numpy(tmp_path):
    got = wide_store(tmp_path / "s").load(as_numpy=True)
    assert same_bits(got["int64"], np.array([-(2**31), 2**31 - 1], np.int64))
    assert same_bits(got["uint64"], np.array([2**32 - 1, 0], np.uint64))
    assert same_bits(got["float64"], np.array([1 / 3, -0.0]))
    assert same_bits(got["complex128"], np.array([1 / 3 - 2j, 1e30j]))


def test_wide_columns_cast_to_32_bits(tmp_path):
    got = wide_store(tmp_path / "s").load(cast=True)
    for name in WIDE:
        assert isinstance(got[name], jax.Array) and got[name].dtype == np.dtype(NARROW[name])
    assert got["int64"].tolist() == [-(2**31), 2**31 - 1]
    assert got["uint64"].tolist() == [2**32 - 1, 0]
    assert same_bits(np.asarray(got["float64"]), np.array([1 / 3, -0.0], np.float32))
    assert same_bits(np.asarray(got["complex128"]), np.array([1 / 3 - 2j, 1e30j], np.complex64))


@pytest.mark.parametrize(
    ("name", "value", "target"),
    [
        ("int64", np.int64(2**31), "int32"),
        ("int64", np.int64(-(2**31) - 1), "int32"),
        ("int64", np.int64(2**62), "int32"),
        ("uint64", np.uint64(2**32), "uint32"),
    ],
    ids=str,
)
def test_cast_refuses_ints_out_of_range(tmp_path, name, value, target):
    dtype = _dtypes.SUPPORTED[name]
    with pytreestore.create(tmp_path / "s", {"v": dtype.type(0)}) as store:
        store.append({"v": dtype.type(1)})
        store.append({"v": value})
    store = pytreestore.open(tmp_path / "s")
    message = (
        f"column ['v'] holds values outside {target}, so cast=True cannot load it; "
        "load it with as_numpy=True or enable x64"
    )
    with pytest.raises(X64DisabledError, match=f"^{re.escape(message)}$"):
        store.load(cast=True)
    assert store.load(0, cast=True)["v"].tolist() == 1
    assert store.load(as_numpy=True)["v"].tolist() == [1, int(value)]


def test_cast_refuses_floats_out_of_range(tmp_path):
    with pytreestore.create(tmp_path / "s", {"v": np.float64(0)}) as store:
        store.append({"v": np.float64(1e300)})
    store = pytreestore.open(tmp_path / "s")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(X64DisabledError, match="outside float32"):
            store.load(cast=True)


def test_wide_columns_load_exactly_with_x64(tmp_path):
    store = wide_store(tmp_path / "s")
    with jax.enable_x64(True):
        got = store.load()
        assert got["int64"].dtype == jnp.int64 and got["int64"].tolist() == [-(2**31), 2**31 - 1]
        assert same_bits(np.asarray(got["float64"]), np.array([1 / 3, -0.0]))
        assert same_bits(np.asarray(got["complex128"]), np.array([1 / 3 - 2j, 1e30j]))


def test_python_scalars_take_jax_dtypes(tmp_path):
    like = {"b": True, "i": 0, "f": 0.0, "c": 0j}
    with pytreestore.create(tmp_path / "s", like) as store:
        assert {c.path: c.dtype.name for c in store.schema.columns} == {
            "['b']": "bool",
            "['c']": "complex64",
            "['f']": "float32",
            "['i']": "int32",
        }
        store.append({"b": False, "i": 2**31 - 1, "f": 0.1, "c": 1.5 - 2j})
        store.append({"b": True, "i": -(2**31), "f": -1e38, "c": 0j})
    got = pytreestore.open(tmp_path / "s").load(as_numpy=True)
    assert same_bits(got["b"], np.array([False, True]))
    assert same_bits(got["i"], np.array([2**31 - 1, -(2**31)], np.int32))
    assert same_bits(got["f"], np.array([0.1, -1e38], np.float32))
    assert same_bits(got["c"], np.array([1.5 - 2j, 0j], np.complex64))


def test_python_scalars_take_64_bit_dtypes_with_x64(tmp_path):
    with jax.enable_x64(True):
        schema = pytreestore.TreeSchema.from_example({"i": 0, "f": 0.0, "c": 0j})
    assert [c.dtype.name for c in schema.columns] == ["complex128", "float64", "int64"]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (np.zeros(2, "U1"), "<U1"),
        (np.zeros(2, object), "object"),
        (np.zeros(2, "datetime64[s]"), "datetime64[s]"),
        (np.zeros(2, np.longdouble), "float128"),
        (np.zeros(2, ml_dtypes.int4), "int4"),
        (np.zeros(2, "V4"), "|V4"),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else None,
)
def test_unsupported_dtypes_refused_at_create(tmp_path, value, shown):
    message = (
        f"unsupported dtype at ['a']: {shown}. Columns hold bool, (u)int8-64, float16/32/64, "
        "bfloat16, float8 and complex64/128."
    )
    with pytest.raises(errors.UnsupportedDtypeError, match=f"^{re.escape(message)}$"):
        pytreestore.create(tmp_path / "s", {"a": value})
    assert not (tmp_path / "s").exists()


def test_supported_names_are_dtype_names():
    for name, dtype in _dtypes.SUPPORTED.items():
        assert dtype.name == name and _dtypes.from_name(name) is dtype
        assert _dtypes.is_supported(dtype)
