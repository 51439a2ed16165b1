"""Every docstring example in the package runs and prints what it shows."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import pytreestore

MODULES = [
    *sorted(
        m.name
        for m in pkgutil.walk_packages(pytreestore.__path__, "pytreestore.")
        if not m.name.endswith("__main__")
    ),
    "pytreestore_zarr_dtypes",  # shipped beside the package (docs/interop.md)
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    ray_part = name == "pytreestore.ray" or name.startswith("pytreestore._ray")
    if ray_part and importlib.util.find_spec("ray") is None:
        pytest.skip("pytreestore.ray needs the ray extra (pip install 'pytreestore[ray]')")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
