"""The backend conformance suite: what every storage engine must do, as pytest tests.

Subclass :class:`BackendSuite` in a test module, name the backend, and pytest runs every case
against it::

    from pytreestore.testing.conformance import BackendSuite

    class TestMyBackend(BackendSuite):
        backend = "mybackend"

The cases go through the public API (``pytreestore.create`` / ``open`` with
``backend=...``) on real stores in temporary directories, plus a few calls of the
:class:`~pytreestore.backends.Backend` protocol itself where the guarantee lives there
(atomic keys, metadata-only resize). They cover round trips of random trees (hypothesis),
every index form, appends in pieces, reopening and appending, crash leftovers, refused records,
concurrent readers, every dtype bit for bit, in-memory stores, and damaged metadata; each
optional capability's promise where it is declared (:mod:`pytreestore.testing.capabilities`).

This module imports pytest and hypothesis; ``import pytreestore.testing`` does not.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytreestore
from pytreestore import errors
from pytreestore._format import dtypes as _dtypes
from pytreestore._format.keys import ROOT_KEY
from pytreestore._location import Location
from pytreestore.backends import Backend, ColumnLayout, get_backend
from pytreestore.testing import assert_trees_equal
from pytreestore.testing import strategies as pts
from pytreestore.testing.capabilities import CapabilityCases
from pytreestore.testing.chunk_copies import ChunkCopyCases

__all__ = ["BackendSuite", "dtype_values"]

# One method runs once per backend subclass; sharing its example database is harmless.
_EXAMPLES = settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.differing_executors]
)
_SCALAR = {"v": np.zeros(3, np.float32), "n": np.int32(0)}


def _scalar_record(i: int) -> dict[str, Any]:
    return {"v": np.arange(3, dtype=np.float32) + i, "n": np.int32(i)}


def dtype_values(dtype: np.dtype, n: int, seed: int = 0) -> np.ndarray:
    """``n`` values of ``dtype`` that stress exactness: for floats random bit patterns (NaN
    payloads, infinities, subnormals, -0.0), for ints the extremes, for bools both."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        values[:2] = [info.min, info.max][: min(n, 2)]
        return values
    bits = np.dtype(f"uint{8 * dtype.itemsize // (2 if dtype.kind == 'c' else 1)}")
    width = 2 if dtype.kind == "c" else 1
    raw = rng.integers(0, np.iinfo(bits).max, n * width, dtype=bits, endpoint=True)
    return raw.view(dtype)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


class BackendSuite(ChunkCopyCases, CapabilityCases):
    """Conformance cases for one backend; subclass and set :attr:`backend`.

    Override :meth:`location` to run the cases somewhere other than a fresh local directory
    (a bucket prefix, say).
    """

    backend: ClassVar[str]
    zarr_readable: ClassVar[bool] = True  # whether zarr-python reads it (not OCDBT)

    # ---- helpers -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def location(self) -> Iterator[str]:
        """A fresh, empty store location, removed afterwards."""
        with tempfile.TemporaryDirectory(prefix="pytreestore-conformance-") as tmp:
            yield str(Path(tmp) / "store")

    def create(self, path: str, like: Any, **kwargs: Any) -> pytreestore.TreeStore:
        return pytreestore.create(path, like, backend=self.backend, **kwargs)

    def open(self, path: str, mode: str = "r", **kwargs: Any) -> pytreestore.TreeStore:
        return pytreestore.open(path, mode, backend=self.backend, **kwargs)  # type: ignore[arg-type]

    def raw_backend(self, path: str) -> Any:
        return get_backend(self.backend)(Location.parse(path))

    def capable(self, path: str, capability: type) -> Any:
        """The raw backend at ``path``, or a skip where it lacks ``capability``."""
        backend = self.raw_backend(path)
        if not isinstance(backend, capability):
            pytest.skip(f"backend {self.backend!r} does not declare {capability.__name__}")
        return backend

    # ---- properties over random trees ----------------------------------------------------------

    @_EXAMPLES
    @given(data=st.data())
    def test_load_of_appends_is_stack(self, data: st.DataObject) -> None:
        schema = data.draw(pts.tree_schemas(max_leaves=6), label="schema")
        xs = data.draw(pts.records(schema, data.draw(st.integers(0, 7))), label="records")
        chunk = data.draw(st.integers(1, 4), label="chunk_records")
        with self.location() as path:
            with self.create(path, schema.like, chunk_records=chunk) as store:
                store.extend(xs)
            got = self.open(path).load(as_numpy=True)
            assert_trees_equal(got, pytreestore.stack(xs, like=schema.like, as_numpy=True))

    @_EXAMPLES
    @given(data=st.data())
    def test_appending_in_pieces_equals_appending_once(self, data: st.DataObject) -> None:
        schema = data.draw(pts.tree_schemas(max_leaves=4), label="schema")
        xs = data.draw(pts.records(schema, 7), label="records")
        cuts = sorted(data.draw(st.lists(st.integers(0, 7), max_size=3), label="cuts"))
        pieces = [xs[a:b] for a, b in zip([0, *cuts], [*cuts, 7])]
        with self.location() as path:
            store = self.create(path, schema.like, chunk_records=3)
            for k, piece in enumerate(pieces):
                if k % 3 == 0:
                    store.extend(piece)
                elif k % 3 == 1 and piece:
                    store.extend_batch(pytreestore.stack(piece, like=schema.like, as_numpy=True))
                else:
                    for x in piece:
                        store.append(x)
                store.flush()
                if k == 1:  # reopen in the middle: the tail chunk is read back
                    store.close()
                    store = self.open(path, "a")
            store.close()
            got = self.open(path).load(as_numpy=True)
            assert_trees_equal(got, pytreestore.stack(xs, like=schema.like, as_numpy=True))

    @_EXAMPLES
    @given(data=st.data())
    def test_item_equals_unstacked_slice(self, data: st.DataObject) -> None:
        schema = data.draw(pts.tree_schemas(max_leaves=4), label="schema")
        xs = data.draw(pts.records(schema, 5), label="records")
        with self.location() as path:
            with self.create(path, schema.like, chunk_records=2) as store:
                store.extend(xs)
            store = self.open(path)
            whole = pytreestore.unstack(store.load(as_numpy=True))
            for i in (0, 3, -1):
                assert_trees_equal(store.load(i, as_numpy=True), whole[i])

    # ---- indexing ------------------------------------------------------------------------------

    @pytest.mark.parametrize(
        "index",
        [
            slice(None),
            slice(2, 9),
            slice(1, None, 3),
            slice(None, None, -2),
            [9, 0, 4, 4, 1],
            np.array([-1, 2]),
            np.arange(10) % 3 == 0,
            [],
            slice(5, 5),
        ],
        ids=repr,
    )
    def test_index_forms(self, index: Any) -> None:
        with self.location() as path:
            with self.create(path, _SCALAR, chunk_records=4) as store:
                store.extend(_scalar_record(i) for i in range(10))
            got = self.open(path).load(index, as_numpy=True)
            want = np.arange(10)[index]
            np.testing.assert_array_equal(got["n"], want.astype(np.int32))
            np.testing.assert_array_equal(got["v"], (want[:, None] + np.arange(3)).astype("f4"))

    def test_int_index_and_jax_load(self) -> None:
        with self.location() as path:
            with self.create(path, _SCALAR, chunk_records=4) as store:
                store.extend(_scalar_record(i) for i in range(6))
            store = self.open(path)
            assert int(store[4]["n"]) == 4
            assert isinstance(store[1:3]["v"], jax.Array)
            assert store.load(columns="['n']", as_numpy=True)["v"] is None

    # ---- lifecycle -----------------------------------------------------------------------------

    def test_reopen_append_across_chunks(self) -> None:
        with self.location() as path:
            for start, stop in ((0, 3), (3, 9), (9, 10)):
                with (
                    self.create(path, _SCALAR, chunk_records=4)
                    if start == 0
                    else self.open(path, "a")
                ) as store:
                    store.extend(_scalar_record(i) for i in range(start, stop))
                assert len(self.open(path)) == stop
            np.testing.assert_array_equal(self.open(path).load(as_numpy=True)["n"], np.arange(10))

    def test_reader_refresh_sees_new_commits(self) -> None:
        with self.location() as path:
            writer = self.create(path, _SCALAR, chunk_records=2)
            writer.extend(_scalar_record(i) for i in range(3))
            writer.flush()
            reader = self.open(path)
            np.testing.assert_array_equal(reader.load(as_numpy=True)["n"], [0, 1, 2])
            writer.extend(_scalar_record(i) for i in range(3, 8))
            writer.flush()
            assert len(reader) == 3
            assert reader.refresh() == 8
            np.testing.assert_array_equal(reader.load(as_numpy=True)["n"], np.arange(8))
            writer.close()

    def test_refused_record_leaves_store_unchanged(self) -> None:
        with self.location() as path:
            with self.create(path, _SCALAR, chunk_records=4) as store:
                store.extend(_scalar_record(i) for i in range(5))
                bad = [_scalar_record(5), {"v": np.zeros(4, np.float32), "n": np.int32(0)}]
                with pytest.raises(errors.SchemaMismatchError, match="refused record 1"):
                    store.extend(bad)
                assert len(store) == 5
                store.append(_scalar_record(5))
            np.testing.assert_array_equal(self.open(path).load(as_numpy=True)["n"], np.arange(6))

    def test_uncommitted_rows_are_invisible_and_trimmed(self) -> None:
        """A writer that resized and wrote chunks but died before its commit."""
        with self.location() as path:
            with self.create(path, _SCALAR, chunk_records=4) as store:
                store.extend(_scalar_record(i) for i in range(6))
            crashed = self.raw_backend(path)
            keys = [c.key for c in store.schema.columns]
            crashed.resize(keys, 11)
            junk = {"['v']": np.full((5, 3), -1, np.float32), "['n']": np.full(5, -1, np.int32)}
            crashed.write(keys, 6, [junk[c.path] for c in store.schema.columns])
            crashed.close()
            assert len(self.open(path)) == 6
            with self.open(path, "a") as store:
                assert len(store) == 6
                store.append(_scalar_record(6))
            reader = self.open(path)
            np.testing.assert_array_equal(reader.load(as_numpy=True)["n"], np.arange(7))
            shapes = dict(zip(keys, self.raw_backend(path).column_shapes(keys)))
            assert shapes == {"v": (7, 3), "n": (7,)}

    def test_read_only_and_single_writer(self) -> None:
        with self.location() as path:
            writer = self.create(path, _SCALAR)
            with pytest.raises(errors.StoreLockedError):
                self.open(path, "a")
            with pytest.raises(errors.ReadOnlyError):
                self.open(path).append(_scalar_record(0))
            writer.close()
            self.open(path, "a").close()

    def test_overwrite_replaces_the_store(self) -> None:
        with self.location() as path:
            with self.create(path, _SCALAR, chunk_records=2) as store:
                store.extend(_scalar_record(i) for i in range(5))
            with pytest.raises(errors.StoreExistsError):
                self.create(path, {"y": np.int8(0)})
            with self.create(path, {"y": np.int8(0)}, overwrite=True) as store:
                store.append({"y": np.int8(7)})
            got = self.open(path).load(as_numpy=True)
            assert list(got) == ["y"] and _same_bits(got["y"], np.array([7], np.int8))

    def test_verify_finds_nothing_wrong(self) -> None:
        with self.location() as path:
            with self.create(path, _SCALAR, chunk_records=2) as store:
                store.extend(_scalar_record(i) for i in range(5))
            report = self.open(path).verify()
            assert report.ok and report.records == 5 and report.chunks == 6, str(report)

    def test_memory_store_reopens(self) -> None:
        path = f"memory://conformance-{self.backend}-{uuid.uuid4().hex}"
        with self.create(path, _SCALAR, chunk_records=2) as store:
            store.extend(_scalar_record(i) for i in range(5))
        np.testing.assert_array_equal(self.open(path).load(as_numpy=True)["n"], np.arange(5))
        with self.open(path, "a") as store:
            store.append(_scalar_record(5))
        assert len(self.open(path)) == 6

    def test_empty_store_and_zero_size_leaf(self) -> None:
        like = {"e": np.zeros((0, 2), np.float32), "x": np.int8(0)}
        with self.location() as path:
            self.create(path, like).close()
            got = self.open(path).load(as_numpy=True)
            assert got["e"].shape == (0, 0, 2) and got["x"].shape == (0,)
            with self.open(path, "a") as store:
                store.extend({"e": np.zeros((0, 2), np.float32), "x": np.int8(i)} for i in range(3))
            got = self.open(path).load(as_numpy=True)
            assert got["e"].shape == (3, 0, 2)
            np.testing.assert_array_equal(got["x"], [0, 1, 2])

    # ---- dtypes --------------------------------------------------------------------------------

    @pytest.mark.parametrize("name", list(_dtypes.SUPPORTED))
    def test_every_dtype_bit_for_bit(self, name: str) -> None:
        dtype = _dtypes.SUPPORTED[name]
        values = dtype_values(dtype, 14, seed=len(name)).reshape(7, 2)
        with self.location() as path:
            with self.create(path, {"x": values[0]}, chunk_records=3, codec=None) as store:
                store.extend_batch({"x": values[:5]})
                store.append({"x": values[5]})
                store.append({"x": values[6]})
            assert _same_bits(self.open(path).load(as_numpy=True)["x"], values)

    # ---- the backend protocol ------------------------------------------------------------------

    def test_keeps_the_core_contract(self) -> None:
        with self.location() as path:
            assert isinstance(self.raw_backend(path), Backend)

    def test_bytes_are_replaced_whole(self) -> None:
        with self.location() as path:
            backend = self.raw_backend(path)
            assert backend.read_bytes("a/b.json") is None
            backend.write_bytes("a/b.json", b"one")
            backend.write_many_bytes({"a/b.json": b"two!", "c": b""})
            assert (backend.read_bytes("a/b.json"), backend.read_bytes("c")) == (b"two!", b"")
            assert not backend.is_empty()
            backend.delete_all()
            assert backend.is_empty() and backend.read_bytes("c") is None

    def test_shrinking_is_metadata_only(self) -> None:
        """Shrinking must not delete chunks: growing again shows the old rows, not zeros."""
        lay = ColumnLayout("x", np.dtype("int32"), (), (4,), "zstd", ("record",), 0)
        with self.location() as path:
            backend = self.raw_backend(path)
            backend.create_columns([lay])
            backend.resize(["x"], 12)
            backend.write(["x"], 0, [np.arange(12, dtype=np.int32) + 1])
            backend.resize(["x"], 2)
            assert backend.column_shapes(["x"]) == [(2,)]
            np.testing.assert_array_equal(backend.read(["x"], slice(0, 2), 2)[0], [1, 2])
            backend.resize(["x"], 12)
            np.testing.assert_array_equal(
                backend.read(["x"], np.array([11, 5, 0]), 12)[0], [12, 6, 1]
            )

    def test_array_metadata_names_dimensions(self) -> None:
        like = {"w": np.zeros((2, 3), np.float32), "s": np.float32(0)}
        with self.location() as path:
            store = self.create(path, like)
            store.close()
            backend = self.raw_backend(path)
            w = json.loads(backend.read_bytes("w/zarr.json"))
            s = json.loads(backend.read_bytes("s/zarr.json"))
            assert w["dimension_names"] == ["record", "w_0", "w_1"]
            assert s["dimension_names"] == ["record"]
            assert (w["shape"], w["data_type"]) == ([0, 2, 3], "float32")

    # ---- damaged metadata ----------------------------------------------------------------------

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            ({"data_type": "float64"}, "data_type 'float64' where the schema says 'float32'"),
            ({"shape": [6, 4]}, "shape [6, 4] where the schema says [records, 3]"),
            (
                {"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [2, 3]}}},
                "chunk shape [2, 3] where the schema says [4, 3]",
            ),
            ({"shape": [2, 3]}, "2 records where 6 are committed"),
        ],
        ids=["dtype", "shape", "chunks", "short"],
    )
    def test_column_disagreeing_with_schema(self, change: dict, message: str) -> None:
        with self.location() as path:
            with self.create(path, _SCALAR, chunk_records=4) as store:
                store.extend(_scalar_record(i) for i in range(6))
            key = f"v/{ROOT_KEY}"  # edited through the backend: its keys need not be files
            backend = self.raw_backend(path)
            meta = json.loads(backend.read_bytes(key))
            backend.write_bytes(key, json.dumps(meta | change).encode())
            backend.close()
            store = self.open(path)
            with pytest.raises(errors.CorruptStoreError, match=re.escape(message)) as info:
                store.load(as_numpy=True)
            assert f"{path}/{key}" in str(info.value)
            np.testing.assert_array_equal(store.load(columns="['n']", as_numpy=True)["n"], range(6))
            with pytest.raises(errors.CorruptStoreError):
                self.open(path, "a")

    def test_column_array_missing(self) -> None:
        with self.location() as path:
            with self.create(path, _SCALAR, chunk_records=4) as store:
                store.extend(_scalar_record(i) for i in range(2))
            self.raw_backend(path).delete_keys([f"v/{ROOT_KEY}"])
            with pytest.raises(errors.CorruptStoreError, match=re.escape("v/zarr.json")):
                self.open(path).load(as_numpy=True)

    def test_bfloat16_through_zarr_python(self) -> None:
        """ML dtypes written by this backend read back through zarr-python too."""
        if not self.zarr_readable:
            pytest.skip(f"zarr-python cannot read stores of backend {self.backend!r}")
        import zarr

        from pytreestore.backends._zarr import stores as _zarr_dtypes

        _zarr_dtypes.register()
        values = np.array([[1.5, -2.0], [np.inf, 0.25]], ml_dtypes.bfloat16)
        with self.location() as path:
            with self.create(path, {"b": values[0]}) as store:
                store.extend_batch({"b": values})
            array = zarr.open_array(f"{path}/b", mode="r")
            assert _same_bits(np.asarray(array[:]), values)
