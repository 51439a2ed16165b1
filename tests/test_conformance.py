"""Every shipped backend runs the conformance suite (pytreestore.testing.conformance)."""

from __future__ import annotations

from pytreestore.testing.conformance import BackendSuite


class TestTensorStore(BackendSuite):
    backend = "tensorstore"


class TestZarr(BackendSuite):
    backend = "zarr"


class TestOcdbt(BackendSuite):
    backend = "ocdbt"
    zarr_readable = False
