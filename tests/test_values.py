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
from pytreestore.errors import ClassResolutionError, PyTreeStoreError


class Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2


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
        (np.zeros(2), "of type ndarray"),
        (object(), "of type object"),
    ],
    ids=["lambda", "local", "mutable-dataclass", "set", "int-keys", "array", "object"],
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
