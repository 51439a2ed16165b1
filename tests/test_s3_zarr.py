"""The zarr backend on S3 (zarr-python's ``ObjectStore`` over obstore's ``S3Store``), against a
real S3-compatible server (``moto_server`` on 127.0.0.1).

The shipped conformance suite, then what S3 adds: the store both backends write is the same
(each reads and appends to the other's), the writer lock and the conditional commit keep two
writers apart, ``verify`` finds damaged chunk objects, and ``storage_options`` reach obstore
or are refused by name.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import NO_VALUE
from pytreestore._location import Location
from pytreestore._log.commit_record import COMMIT_KEY
from pytreestore._log.locks import LOCK_KEY
from pytreestore.backends import get_backend
from pytreestore.backends._zarr.remote import ZarrS3Backend, s3_settings
from pytreestore.testing import assert_trees_equal
from pytreestore.testing.conformance import BackendSuite
from pytreestore.testing.s3 import OutageProxy
from tests.conftest import s3_dtypes

pytestmark = pytest.mark.s3
pytest_plugins = ("tests.fixtures",)


def record(i: int) -> dict[str, Any]:
    """A record with escaped keys (``a/b``, the empty key), several dtypes and shapes."""
    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3) * i,
        "a/b": np.int16(-i),
        "": np.array([i, i + 1], ml_dtypes.bfloat16),
        "flag": np.bool_(i % 2),
    }


def stacked(start: int, stop: int) -> Any:
    return pytreestore.stack([record(i) for i in range(start, stop)], as_numpy=True)


def backend_of(url: str, opts: dict[str, Any]) -> ZarrS3Backend:
    backend = get_backend("zarr")(Location.parse(url, opts))
    assert isinstance(backend, ZarrS3Backend)
    return backend


# ---- both backends, one store ------------------------------------------------------------------


@pytest.mark.parametrize(("writer", "reader"), [("tensorstore", "zarr"), ("zarr", "tensorstore")])
def test_each_backend_reads_and_appends_to_the_others_store(s3_server, bucket, writer, reader):
    url, opts = f"s3://{bucket}/x", s3_server.options
    with pytreestore.create(
        url, record(0), backend=writer, chunk_records=4, codec="zstd", storage_options=opts
    ) as store:
        store.extend(record(i) for i in range(6))
    other = pytreestore.open(url, mode="a", backend=reader, storage_options=opts)
    assert len(other) == 6
    assert_trees_equal(other.load(as_numpy=True), stacked(0, 6))
    other.extend(record(i) for i in range(6, 9))
    other.close()
    back = pytreestore.open(url, backend=writer, storage_options=opts)
    assert_trees_equal(back.load(as_numpy=True), stacked(0, 9))
    assert back.verify().ok
    assert pytreestore.open(url, backend=reader, storage_options=opts).verify().ok


def test_keys_are_the_tensorstore_backends_keys(s3_server, bucket):
    opts = s3_server.options
    for name in ("tensorstore", "zarr"):
        with pytreestore.create(
            f"s3://{bucket}/{name}", record(0), backend=name, storage_options=opts
        ) as s:
            s.append(record(1))
    keys = [backend_of(f"s3://{bucket}/{n}", opts).list_keys("") for n in ("tensorstore", "zarr")]
    assert keys[0] == keys[1]
    assert {"-/c/0/0", "a-2Fb/zarr.json", ".pytreestore/commit.json"} <= set(keys[1])
    ts = get_backend("tensorstore")(Location.parse(f"s3://{bucket}/tensorstore", opts))
    zarr_backend = backend_of(f"s3://{bucket}/zarr", opts)
    assert ts.read_bytes("w/zarr.json") == zarr_backend.read_bytes("w/zarr.json")


# ---- the writer lock and the conditional commit ------------------------------------------------


def test_a_second_writer_is_refused_and_a_broken_lock_cannot_commit(s3_server, bucket):
    url, opts = f"s3://{bucket}/w", s3_server.options
    kw: dict[str, Any] = {"backend": "zarr", "storage_options": opts}
    with pytreestore.create(url, record(0), chunk_records=4, **kw) as store:
        store.extend(record(i) for i in range(2))
    old = pytreestore.open(url, mode="a", **kw)
    with pytest.raises(errors.StoreLockedError, match=r"held by pid \d+ on host "):
        pytreestore.open(url, mode="a", **kw)
    new = pytreestore.open(url, mode="a", break_lock=True, **kw)
    new.extend(record(i) for i in range(2, 4))
    new.flush()
    old.append(record(50))
    with pytest.raises(errors.CommitConflictError, match="has grown since this writer last"):
        old.flush()  # its conditional resize of zarr.json is refused: nothing is written
    new.close()
    with contextlib.suppress(errors.CommitConflictError):
        old.close()
    reader = pytreestore.open(url, **kw)
    assert len(reader) == 4
    assert_trees_equal(reader.load(as_numpy=True), stacked(0, 4))
    assert reader.verify().ok
    assert backend_of(url, opts).read_bytes(LOCK_KEY) is None  # the new holder released it


def test_a_stale_commit_token_is_refused(s3_server, bucket):
    """Two writers at the same length: the resizes agree, only the commit record's ETag
    tells them apart. (The loser has already rewritten the shared tail chunk by then, as with
    the TensorStore backend: the lock, not the commit, keeps that from happening.)"""
    url, opts = f"s3://{bucket}/c", s3_server.options
    kw: dict[str, Any] = {"backend": "zarr", "storage_options": opts}
    with pytreestore.create(url, record(0), chunk_records=64, **kw) as store:
        store.append(record(0))
    a = pytreestore.open(url, mode="a", **kw)
    a._lock.release()  # as if the lock had been broken behind its back
    b = pytreestore.open(url, mode="a", **kw)
    b.append(record(1))
    b.flush()
    a.append(record(9))
    with pytest.raises(errors.CommitConflictError, match="another writer committed"):
        a.flush()
    b.close()
    reader = pytreestore.open(url, **kw)
    assert len(reader) == 2
    assert_trees_equal(reader[0], pytreestore.unstack(stacked(0, 1))[0])


def test_conditional_puts_and_the_non_atomic_delete(s3_server, bucket):
    backend = backend_of(f"s3://{bucket}/t", s3_server.options)
    assert backend.read_bytes_versioned("k") == (None, NO_VALUE)
    first = backend.write_bytes_if("k", b"one", NO_VALUE)
    assert first is not None and first.startswith(b'"')  # an ETag
    assert backend.write_bytes_if("k", b"again", NO_VALUE) is None  # create only
    assert backend.read_bytes_versioned("k") == (b"one", first)
    second = backend.write_bytes_if("k", b"two", first)
    assert second is not None
    assert backend.write_bytes_if("k", b"late", first) is None
    assert backend.write_bytes_if("k", None, first) is None  # stale delete: kept
    assert backend.read_bytes("k") == b"two"
    assert backend.write_bytes_if("k", None, second) == NO_VALUE
    assert backend.read_bytes_versioned("k") == (None, NO_VALUE)
    assert backend.write_bytes_if("gone", b"x", second) is None  # If-Match on a missing key


def test_a_server_that_ignores_conditional_writes_is_refused(s3_server, bucket):
    with OutageProxy(s3_server.port, drop_headers=("if-match", "if-none-match")) as proxy:
        opts = dict(s3_server.options, endpoint=proxy.endpoint)
        url = f"s3://{bucket}/lax"
        with pytest.raises(errors.StorageError, match="ignored a conditional write"):
            pytreestore.create(url, {"x": 0}, backend="zarr", storage_options=opts)
        opts["conditional_write"] = False  # emulated with a HEAD before each PUT
        with pytreestore.create(
            url, {"x": 0}, backend="zarr", overwrite=True, storage_options=opts
        ) as s:
            s.extend({"x": i} for i in range(3))
        out = pytreestore.open(url, backend="zarr", storage_options=opts).load(as_numpy=True)
        np.testing.assert_array_equal(out["x"], [0, 1, 2])


# ---- listing, deleting, verifying ----------------------------------------------------------------


def test_listing_and_deleting_stay_inside_the_prefix(s3_server, bucket):
    opts = s3_server.options
    for name in ("runs/a", "runs/ab"):
        with pytreestore.create(
            f"s3://{bucket}/{name}", {"x": 0}, backend="zarr", storage_options=opts
        ) as s:
            s.append({"x": 1})
    a = backend_of(f"s3://{bucket}/runs/a", opts)
    assert a.list_keys(".pytreestore/co") == [COMMIT_KEY]
    assert a.list_keys("x/") == ["x/c/0", "x/zarr.json"]
    assert not a.is_empty()
    a.delete_all()
    assert a.is_empty() and a.list_keys("") == []
    assert int(pytreestore.open(f"s3://{bucket}/runs/ab", storage_options=opts)[0]["x"]) == 1


def test_verify_finds_a_damaged_and_a_missing_chunk(s3_server, bucket):
    url, opts = f"s3://{bucket}/v", s3_server.options
    with pytreestore.create(
        url,
        {"x": np.float32(0), "y": np.int32(0)},
        backend="zarr",
        chunk_records=2,
        storage_options=opts,
    ) as s:
        s.extend({"x": np.float32(i), "y": np.int32(i)} for i in range(6))
    backend = backend_of(url, opts)
    good = backend.read_bytes("x/c/1")
    assert good is not None
    backend.write_bytes("x/c/1", bytes([good[0] ^ 0xFF]) + good[1:])
    backend.write_bytes_if("y/c/2", None, backend.read_bytes_versioned("y/c/2")[1])
    report = pytreestore.open(url, backend="zarr", storage_options=opts).verify()
    assert not report.ok
    assert [(p.path, p.key, p.chunk) for p in report.problems] == [
        ("['x']", "x/c/1", (1,)),
        ("['y']", "y/c/2", (2,)),
    ]
    assert "missing" in report.problems[1].message
    store = pytreestore.open(url, backend="zarr", storage_options=opts)
    with pytest.raises(errors.CorruptChunkError, match=re.escape("chunk (1,) (x/c/1)")):
        store[2:4]
    np.testing.assert_array_equal(store[0:2]["x"], [0, 1])


def test_a_damaged_zarr_json_on_s3_is_named(s3_server, bucket):
    url, opts = f"s3://{bucket}/m", s3_server.options
    with pytreestore.create(
        url, {"x": np.float32(0), "y": np.int32(0)}, backend="zarr", storage_options=opts
    ) as s:
        s.extend({"x": np.float32(i), "y": np.int32(i)} for i in range(3))
    backend = backend_of(url, opts)
    meta = json.loads(backend.read_bytes("x/zarr.json") or b"")
    backend.write_bytes("x/zarr.json", json.dumps(meta | {"data_type": "float64"}).encode())
    store = pytreestore.open(url, backend="zarr", storage_options=opts)
    message = f"{url}/x/zarr.json disagrees with the store's schema: it has data_type 'float64'"
    with pytest.raises(errors.CorruptStoreError, match=re.escape(message)):
        store.load(as_numpy=True)
    np.testing.assert_array_equal(store.load(columns="['y']", as_numpy=True)["y"], [0, 1, 2])


# ---- storage options -----------------------------------------------------------------------------


def test_options_map_onto_the_s3store():
    opts = {
        "endpoint": "https://s3.example.com/",
        "region": "eu-west-1",
        "access_key_id": "AKID",
        "secret_access_key": "secret",
        "session_token": "tok",
        "requester_pays": True,
        "max_retries": 3,
        "retry_delay": 0.5,
        "retry_max_delay": 4,
        "request_concurrency": 8,
        "connect_timeout": 5,
        "request_timeout": 20,
        "total_timeout": 40,
    }
    assert s3_settings(Location.parse("s3://my-bucket/a/b", opts)) == {
        "bucket": "my-bucket",
        "prefix": "a/b",
        "config": {
            "endpoint": "https://s3.example.com",
            "region": "eu-west-1",
            "access_key_id": "AKID",
            "secret_access_key": "secret",
            "session_token": "tok",
            "request_payer": True,
        },
        "client_options": {
            "connect_timeout": timedelta(seconds=5),
            "timeout": timedelta(seconds=20),
        },
        "retry_config": {
            "backoff": {
                "init_backoff": timedelta(seconds=0.5),
                "max_backoff": timedelta(seconds=4),
            },
            "max_retries": 3,
            "retry_timeout": timedelta(seconds=40),
        },
        "request_concurrency": 8,
    }


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (
            "profile",
            "dev",
            "storage option 'profile' of s3://my-bucket/p is not supported by backend='zarr': obstore reads no profiles",
        ),
        (
            "credentials_file",
            "/tmp/c",
            "storage option 'credentials_file' of s3://my-bucket/p is not supported by backend='zarr'",
        ),
        (
            "host_header",
            "s3.internal",
            "storage option 'host_header' of s3://my-bucket/p is not supported by backend='zarr'",
        ),
        (
            "request_concurrency",
            0,
            "storage option 'request_concurrency' of s3://my-bucket/p must be at least 1",
        ),
    ],
)
def test_options_obstore_cannot_honour_are_refused_by_name(option, value, message):
    opts = {"endpoint": "http://127.0.0.1:9", option: value}
    with pytest.raises(errors.BadLocationError, match=re.escape(message)):
        pytreestore.create("s3://my-bucket/p", {"x": 0}, backend="zarr", storage_options=opts)


def test_a_missing_obstore_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "obstore", None)
    with pytest.raises(
        errors.BadLocationError,
        match=re.escape("through obstore, which is not installed")
        + ".*"
        + re.escape("Run `pip install obstore`"),
    ):
        pytreestore.create("s3://my-bucket/p", {"x": 0}, backend="zarr")
    with pytreestore.create("memory://zarr-without-obstore", {"x": 0}, backend="zarr") as s:
        s.append({"x": 4})  # local and memory stores need no obstore
    assert int(pytreestore.open("memory://zarr-without-obstore", backend="zarr")[0]["x"]) == 4


def test_credentials_concurrency_and_the_environment_reach_the_server(
    s3_server, bucket, monkeypatch
):
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    opts = dict(
        s3_server.options,
        access_key_id="AKIDEXAMPLE",
        secret_access_key="s3cr3t",
        request_concurrency=1,
    )
    url = f"s3://{bucket}/keys"
    with pytreestore.create(url, record(0), backend="zarr", storage_options=opts) as s:
        s.extend(record(i) for i in range(3))
    assert_trees_equal(
        pytreestore.open(url, backend="zarr", storage_options=opts).load(as_numpy=True),
        stacked(0, 3),
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    assert len(pytreestore.open(url, backend="zarr")) == 3  # endpoint and keys from the environment


def test_an_unreachable_server_is_a_storage_error(s3_server, bucket):
    proxy = OutageProxy(s3_server.port).up()
    proxy.down()
    opts = dict(s3_server.options, endpoint=proxy.endpoint, max_retries=0)
    with pytest.raises(errors.StorageError, match=re.escape(f"s3://{bucket}/down")) as info:
        pytreestore.create(f"s3://{bucket}/down", {"x": 0}, backend="zarr", storage_options=opts)
    assert "Debug source" not in str(info.value)


def test_a_missing_bucket_is_a_clear_error(s3_server):
    with pytest.raises(errors.StorageError, match="no-such-bucket-here"):
        pytreestore.create(
            "s3://no-such-bucket-here/x",
            {"x": 0},
            backend="zarr",
            storage_options=s3_server.options,
        )


# ---- the shipped backend conformance suite, on S3 --------------------------------------------------

_SERVER: dict[str, Any] = {}


@pytest.fixture(autouse=True, scope="module")
def _conformance_server(s3_server):
    _SERVER["server"], _SERVER["bucket"] = s3_server, s3_server.make_bucket()
    yield
    _SERVER.clear()


class TestZarrOnS3(BackendSuite):
    """Every conformance case, on a fresh prefix of a bucket of the moto server."""

    backend = "zarr"

    @contextlib.contextmanager
    def location(self) -> Iterator[str]:
        yield f"s3://{_SERVER['bucket']}/{uuid.uuid4().hex}"

    def create(self, path: str, like: Any, **kwargs: Any) -> pytreestore.TreeStore:
        if path.startswith("s3://"):
            kwargs.setdefault("storage_options", _SERVER["server"].options)
        return super().create(path, like, **kwargs)

    def open(self, path: str, mode: str = "r", **kwargs: Any) -> pytreestore.TreeStore:
        if path.startswith("s3://"):
            kwargs.setdefault("storage_options", _SERVER["server"].options)
        return super().open(path, mode, **kwargs)

    def raw_backend(self, path: str) -> Any:
        return get_backend(self.backend)(Location.parse(path, _SERVER["server"].options))

    @pytest.mark.skip(
        reason="edits zarr.json on local disk; test_a_damaged_zarr_json_on_s3_is_named"
    )
    def test_column_disagreeing_with_schema(self, *args: Any) -> None: ...

    @pytest.mark.skip(
        reason="deletes zarr.json on local disk; see test_verify_finds_a_damaged_and_a_missing_chunk"
    )
    def test_column_array_missing(self) -> None: ...

    @pytest.mark.skip(reason="reads the arrays with zarr-python from local disk")
    def test_bfloat16_through_zarr_python(self) -> None: ...

    @pytest.mark.parametrize("name", s3_dtypes())  # tests/fixtures.py: a few in make test
    def test_every_dtype_bit_for_bit(self, name: str) -> None:
        super().test_every_dtype_bit_for_bit(name)
