"""The static codec registry (pytreestore._format.statics): lookup by class import path,
MJX's wrapper registered without importing MJX, and registration by users."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import pytreestore
from pytreestore._format import statics as _statics
from pytreestore.errors import ArgumentTypeError
from pytreestore.testing.strategies import HashableArray


def test_mjx_wrapper_is_registered_by_path_without_importing_mjx():
    code = (
        "import sys, pytreestore; from pytreestore._format import statics; "
        "print(statics.MJX_WRAPPER in statics._REGISTRY, 'mujoco' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == ["True", "False"]


def test_lookup_by_value_and_by_path():
    codec = _statics.for_value(HashableArray(np.zeros(1)))
    assert codec is not None and codec.path == "pytreestore.testing.strategies:HashableArray"
    assert _statics.for_path(codec.path) is codec
    assert _statics.for_value(np.zeros(1)) is None
    array = np.arange(3)
    assert codec.decode(codec.encode(HashableArray(array))) == HashableArray(array)


def test_a_path_without_a_codec_is_a_lookup_error():
    with pytest.raises(LookupError, match=re.escape("no static codec is registered for re:Match")):
        _statics.for_path("re:Match")
    with pytest.raises(LookupError, match="cannot be imported"):
        _statics.for_path("no_such_module_xyz:W")


def test_the_public_function_is_the_registry_s():
    assert pytreestore.register_static_codec is _statics.register_static_codec
    with pytest.raises(ArgumentTypeError, match="int values are stored as static values already"):
        pytreestore.register_static_codec(int, abs, abs)
