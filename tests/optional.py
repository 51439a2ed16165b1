"""Optional libraries of the tests, imported when a test first uses them, not as pytest collects.

``make test`` runs two pytest-xdist workers, and each imports every test module to collect it.
A ``pytest.importorskip`` at a module's top made both workers import the library, whether
they ran the module or not: gymnax (with matplotlib and scipy) about 10 s of CPU, Ray 4.5 s,
MJX 2.7 s, xarray 1.6 s. :func:`importorskip` skips the module, as pytest's does, where the
library is not installed, and returns a stand-in that imports it at its first attribute
access; a library installed but not importable there skips that test with the reason.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import pytest


def importorskip(name: str, reason: str | None = None) -> Any:
    """``pytest.importorskip(name, reason=reason)``, the import put off until first use.

    Example:
        >>> json = importorskip("json")
        >>> json.dumps([1])
        '[1]'
    """
    top = name.split(".")[0]
    if importlib.util.find_spec(top) is None:
        pytest.skip(reason or f"could not import {name!r}: not installed", allow_module_level=True)
    return Deferred(name, reason)


class Deferred:
    """Module ``name``, imported at the first attribute access (a test's first use)."""

    def __init__(self, name: str, reason: str | None) -> None:
        self._name, self._reason = name, reason

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_") or attr == "pytestmark":  # pytest's probes as it collects
            raise AttributeError(attr)
        try:
            module = importlib.import_module(self._name)
        except ImportError as err:
            pytest.skip(self._reason or f"could not import {self._name!r}: {err}")
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported at first use (tests/optional.py)>"
