"""register_backend: a backend registered by name works through create/open/copy, and the
conformance suite runs on it with the capability cases it lacks skipped."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._location import Location
from pytreestore.backends import (
    Backend,
    BatchedReads,
    CheckedReads,
    ColumnLayout,
    ColumnShape,
    ConditionalWrites,
    KeyListing,
    PartialWriteCleanup,
    TensorStoreBackend,
    get_backend,
    register_backend,
    registered_backends,
)
from pytreestore.testing.conformance import BackendSuite


class CoreOnly:
    """The core contract and nothing more: a TensorStore backend seen through a narrow door."""

    def __init__(self, location: Location, **options: Any) -> None:
        self._inner = TensorStoreBackend(location, **options)

    def read_bytes(self, key: str) -> bytes | None:
        return self._inner.read_bytes(key)

    def write_bytes(self, key: str, data: bytes) -> None:
        self._inner.write_bytes(key, data)

    def write_many_bytes(self, items: dict[str, bytes]) -> None:
        self._inner.write_many_bytes(items)

    def delete_keys(self, keys: Sequence[str]) -> None:
        self._inner.delete_keys(keys)

    def delete_all(self) -> None:
        self._inner.delete_all()

    def is_empty(self) -> bool:
        return self._inner.is_empty()

    def create_columns(self, layouts: Sequence[ColumnLayout]) -> None:
        self._inner.create_columns(layouts)

    def open_columns(self, columns: Sequence[ColumnShape]) -> None:
        self._inner.open_columns(columns)

    def column_shapes(self, keys: Sequence[str]) -> list[tuple[int, ...]]:
        return self._inner.column_shapes(keys)

    def resize(self, keys: Sequence[str], records: int) -> None:
        self._inner.resize(keys, records)

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> None:
        self._inner.write(keys, start, blocks)

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        return self._inner.read(keys, index, records)

    def close(self) -> None:
        self._inner.close()


register_backend("test-core-only", CoreOnly)


class TestCoreOnly(BackendSuite):
    """Every core case passes; the fallbacks of verify, sharded reads and the lock are used."""

    backend = "test-core-only"


def test_the_wrapper_declares_only_the_core(tmp_path):
    backend = get_backend("test-core-only")(Location.parse(str(tmp_path / "s")))
    assert isinstance(backend, Backend)
    capabilities = (ConditionalWrites, KeyListing, CheckedReads, BatchedReads, PartialWriteCleanup)
    assert not any(isinstance(backend, c) for c in capabilities)
    assert registered_backends()[:2] == ["tensorstore", "zarr"]
    assert "test-core-only" in registered_backends()


def test_a_registered_backend_round_trips_and_copies(tmp_path):
    like = {"x": np.zeros(2, np.float32)}
    with pytreestore.create(str(tmp_path / "a"), like, backend="test-core-only") as store:
        store.extend({"x": np.full(2, i, np.float32)} for i in range(3))
    source = pytreestore.open(str(tmp_path / "a"), backend="test-core-only")
    pytreestore.copy(source, str(tmp_path / "b"), backend="zarr")
    got = pytreestore.open(str(tmp_path / "b"), backend="zarr").load(as_numpy=True)["x"]
    np.testing.assert_array_equal(got, np.repeat(np.arange(3, dtype=np.float32), 2).reshape(3, 2))


def test_an_unknown_backend_is_refused_before_anything_is_written(tmp_path):
    msg = "unknown backend 'nope'; registered backends: tensorstore, zarr, "
    with pytest.raises(errors.UnknownBackendError, match=msg) as info:
        pytreestore.create(str(tmp_path / "s"), {"x": 0.0}, backend="nope")
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "s").exists()
    with pytest.raises(errors.UnknownBackendError, match="unknown backend 'nope'"):
        pytreestore.open(str(tmp_path / "s"), backend="nope")


def test_registering_is_checked():
    with pytest.raises(errors.UnknownBackendError, match="already registered as 'zarr'"):
        register_backend("zarr", CoreOnly)
    with pytest.raises(errors.UnknownBackendError, match="must be callable"):
        register_backend("test-not-callable", 3)  # type: ignore[arg-type]
    with pytest.raises(errors.UnknownBackendError, match="non-empty string"):
        register_backend("", CoreOnly)
    register_backend("test-core-only", CoreOnly)  # the same factory again: nothing changes
    register_backend("test-replaced", CoreOnly)
    register_backend("test-replaced", TensorStoreBackend, replace=True)
    assert get_backend("test-replaced") is TensorStoreBackend


def test_zarr_factory_picks_the_class_by_location(tmp_path) -> None:
    from pytreestore.backends import ZarrBackend
    from pytreestore.backends._zarr.remote import ZarrS3Backend

    zarr = get_backend("zarr")
    s3 = zarr(Location.parse("s3://bucket/x", {"endpoint": "http://127.0.0.1:9"}))
    assert type(s3) is ZarrS3Backend and isinstance(s3, ZarrBackend)
    assert type(zarr(Location.parse(str(tmp_path / "s")))) is ZarrBackend
    assert type(zarr(Location.parse("memory://registry-zarr-kind"))) is ZarrBackend
    assert type(ZarrBackend(Location.parse(str(tmp_path / "t")))) is ZarrBackend


def test_zarr_factory_refuses_gcs() -> None:
    with pytest.raises(
        errors.BadLocationError,
        match=re.escape(
            "the zarr backend stores on local disk, memory:// and s3:// only, not at "
            "gs://bucket/x; use backend='tensorstore' there"
        ),
    ):
        get_backend("zarr")(Location.parse("gs://bucket/x"))
    with pytest.raises(errors.BadLocationError, match="use backend='tensorstore' there"):
        pytreestore.create("gs://bucket/x", {"x": 0.0}, backend="zarr")
