"""Every docstring example in the package runs and prints what it shows."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
from pathlib import Path

import pytest

import pytreestore

PACKAGE = Path(pytreestore.__file__).parent
#: every module of the package, found by file (``pkgutil.walk_packages`` imports each package
#: as pytest collects, pytreestore._ray with Ray: seconds of CPU in every worker)
MODULES = [
    *sorted(
        ".".join(("pytreestore", *f.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(
            ".__init__"
        )
        for f in PACKAGE.rglob("*.py")
        if f.name != "__main__.py" and f != PACKAGE / "__init__.py"
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
