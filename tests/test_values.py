"""Static (aux) values as JSON: every supported kind round-trips exactly; others are refused."""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
import re

import jax
import ml_dtypes
import numpy as np
import pytest

from pytreestore._format import values as _values
from pytreestore.errors import ClassResolutionError, CorruptStoreError, PyTreeStoreError
from pytreestore.testing.strategies import HashableArray


class Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2


class Bits(enum.IntFlag):
    A = 1
    B = 2


@dataclasses.dataclass(frozen=True)
class Settings:
    mode: Mode
    rate: float
    shape: tuple[int, ...]


@dataclasses.dataclass
class Mutable:
    x: int


class Token:
    """A stateless sentinel, like equinox's MISSING."""


TOKEN = Token()


def helper(x):
    return x


STATIC = [
    None,
    True,
    3,
    "s",
    1.5,
    float("inf"),
    complex(1, -2),
    [1, (2, "a")],
    {"k": (None, 1.0)},
    collections.OrderedDict([("b", 1), ("a", (2, "x"))]),
    np.float32(0.1),
    np.int64(2**40),
    np.bool_(True),
    np.complex64(1 - 1j),
    ml_dtypes.bfloat16(1.5),
    np.dtype("int8"),
    np.dtype(ml_dtypes.float8_e4m3fn),
    Mode.EVAL,
    Settings(Mode.TRAIN, 0.5, (2, 3)),
    helper,
    jax.nn.relu,
    np.float32,
    TOKEN,
    b"\x00\xffab",
    Bits.A,
    Bits(0),
    Bits.A | Bits.B,
    HashableArray(np.arange(6, dtype=np.int32).reshape(2, 3)),
    HashableArray(np.array(2.5, ml_dtypes.bfloat16)),
    (HashableArray(np.zeros((0, 3), np.float64)), "x"),
]


@pytest.mark.parametrize("value", STATIC, ids=lambda v: type(v).__name__)
def test_static_values_round_trip_exactly(value):
    encoded = _values.encode(value)
    again = _values.decode(json.loads(json.dumps(encoded)))
    assert type(again) is type(value)
    if isinstance(value, float) and math.isnan(value):
        assert math.isnan(again)
    else:
        assert again == value
    if isinstance(value, np.generic):
        assert again.dtype == value.dtype
    if callable(value) or value is TOKEN:
        assert again is value


def test_static_encodings():
    assert _values.encode(np.float32(0.5)) == {"scalar": {"dtype": "float32", "value": 0.5}}
    assert _values.encode(Mode.EVAL) == {"enum": {"type": f"{__name__}:Mode", "name": "EVAL"}}
    assert _values.encode(jax.nn.relu) == {"ref": "jax._src.nn.functions:relu"}
    assert _values.encode(TOKEN) == {"sentinel": {"type": f"{__name__}:Token", "name": "TOKEN"}}
    assert _values.encode(Settings(Mode.TRAIN, 0.5, (2,))) == {
        "dataclass": {
            "type": f"{__name__}:Settings",
            "fields": {
                "mode": {"enum": {"type": f"{__name__}:Mode", "name": "TRAIN"}},
                "rate": 0.5,
                "shape": {"tuple": [2]},
            },
        }
    }


def _local():
    def inner(x):
        return x

    return inner


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (lambda x: x, "is a lambda, which cannot be stored by import path"),
        (_local(), "is a local or unnamed object, which cannot be stored by import path"),
        (Mutable(1), "is a dataclass that is not frozen"),
        ({1, 2}, "{1, 2} of type set"),
        ({1: "a"}, "dict with non-str keys [1]"),
        (np.zeros(2), "array(float64, shape=(2,), [0. 0.]) is a bare numpy array"),
        (object(), "of type object (the class builtins:object has no static codec"),
        (HashableArray(np.array(["a"])), "arrays of dtype <U1 cannot be stored"),
    ],
    ids=["lambda", "local", "mutable-dataclass", "set", "int-keys", "array", "object", "str-array"],
)
def test_unsupported_static_values_raise_type_error(value, text):
    with pytest.raises(TypeError, match=re.escape(text)):
        _values.encode(value)


def test_a_function_that_imports_as_another_object_is_refused():
    def impostor(x):
        return x

    impostor.__qualname__ = "helper"
    impostor.__module__ = __name__
    with pytest.raises(TypeError, match="importing that name gives another object"):
        _values.encode(impostor)


@pytest.mark.parametrize(
    "obj",
    [
        {"ref": "no_such_module_xyz:f"},
        {"enum": {"type": f"{__name__}:Mode", "name": "GONE"}},
        {"enum": {"type": f"{__name__}:Settings", "name": "TRAIN"}},
        {"sentinel": {"type": f"{__name__}:Token", "name": "helper"}},
        {"dataclass": {"type": f"{__name__}:Settings", "fields": {"mode": None}}},
        {"dataclass": {"type": f"{__name__}:Mode", "fields": {}}},
        {"bogus": 1},
    ],
    ids=["module", "member", "not-enum", "not-sentinel", "fields", "not-dataclass", "tag"],
)
def test_undecodable_static_values_raise_a_store_error(obj):
    with pytest.raises(ClassResolutionError, match=r"^cannot rebuild the static value "):
        _values.decode(obj)
    assert issubclass(ClassResolutionError, PyTreeStoreError)


# ---- arrays, bytes and wrapped values (format 3) ---------------------------------------------


ARRAYS = [
    np.arange(6, dtype=np.int32).reshape(2, 3),
    np.array(7, np.uint8),
    np.zeros((0, 4), np.float32),
    np.array([1.5, -0.0, np.nan, np.inf], ml_dtypes.bfloat16),
    np.array([True, False]),
    np.array([1 + 2j], np.complex128),
    np.array([0.5, 2.0], ml_dtypes.float8_e4m3fn),
    np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not C-contiguous
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype.name}{list(a.shape)}")
def test_wrapped_arrays_round_trip_exactly(array):
    encoded = _values.encode(HashableArray(array))
    back = _values.decode(json.loads(json.dumps(encoded))).array
    assert (back.dtype, back.shape) == (array.dtype, array.shape)
    assert back.tobytes() == np.ascontiguousarray(array).tobytes()
    assert back.flags.writeable and back.flags.c_contiguous


def test_a_codec_that_does_not_round_trip_is_refused():
    big_endian = HashableArray(np.arange(3, dtype=">i4"))  # stored by dtype name: native order
    with pytest.raises(TypeError, match="its static codec does not round-trip"):
        _values.encode(big_endian)


def test_array_encoding():
    encoded = _values.encode(HashableArray(np.array([1, 258], np.int16)))
    assert encoded == {
        "wrapped": {
            "type": "pytreestore.testing.strategies:HashableArray",
            "value": {"ndarray": {"dtype": "int16", "shape": [2], "data": "AQACAQ=="}},
        }
    }
    assert _values.encode(b"ab") == {"bytes": "YWI="}
    assert _values.encode(Bits(0)) == {"enum": {"type": f"{__name__}:Bits", "value": 0}}


class Opaque:
    """A wrapper of an array with no codec: its refusal shows its contents, not an address."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


def test_an_unregistered_wrapper_is_refused_by_its_contents():
    with pytest.raises(TypeError) as info:
        _values.encode(Opaque(np.array([1, 2], np.int32)))
    text = str(info.value)
    assert text.startswith(
        "Opaque(array=array(int32, shape=(2,), [1 2])) of type Opaque (the class "
        "tests.test_values:Opaque has no static codec"
    )
    assert "0x" not in text and "register_static_codec" in text


def test_describe_shortens_large_arrays():
    text = _values.describe(np.arange(1000, dtype=np.int64))
    assert text == "array(int64, shape=(1000,), [0 1 ... 998 999])"


def _ndarray(**inner):
    base = {"dtype": "int32", "shape": [2], "data": "AQAAAAIAAAA="}
    return {
        "wrapped": {
            "type": "pytreestore.testing.strategies:HashableArray",
            "value": {"ndarray": {**base, **inner}},
        }
    }


@pytest.mark.parametrize(
    ("obj", "text"),
    [
        (_ndarray(dtype="float128"), "'float128' is not a dtype name a store holds"),
        (_ndarray(shape=[3]), "array data holds 8 bytes, its dtype int32 and shape (3,) need 12"),
        (_ndarray(shape=[-1]), "array shape [-1] is not a list of sizes"),
        (_ndarray(data="***"), "array data is not base64"),
        ({"bytes": "%%"}, "bytes are not base64"),
    ],
    ids=["dtype", "length", "shape", "base64", "bytes"],
)
def test_malformed_arrays_are_a_corrupt_store(obj, text):
    with pytest.raises(CorruptStoreError, match=re.escape(text)):
        _values.decode(obj)


def test_an_unknown_codec_is_a_class_resolution_error():
    obj = {"wrapped": {"type": f"{__name__}:Opaque", "value": 1}}
    with pytest.raises(ClassResolutionError, match="no static codec is registered for"):
        _values.decode(obj)
    gone = {"wrapped": {"type": "no_such_module_xyz:W", "value": 1}}
    with pytest.raises(ClassResolutionError, match="cannot be imported"):
        _values.decode(gone)
