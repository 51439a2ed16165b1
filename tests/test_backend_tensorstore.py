"""What is the TensorStore backend's own (pytreestore.backends._tensorstore): kvstore specs per
location kind, removing a killed writer's ``*.__lock`` files, checked reads, and which columns
take the direct-I/O path."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pytreestore import errors
from pytreestore._location import Location
from pytreestore.backends import ColumnLayout, TensorStoreBackend
from pytreestore.backends._tensorstore import direct as _direct
from pytreestore.backends._tensorstore import direct_reads as _direct_reads
from pytreestore.backends._tensorstore.kvstore import kvstore_spec

S3 = {"endpoint": "http://127.0.0.1:9/", "region": "us-east-1"}


# ---- kvstore specs -------------------------------------------------------------------------------


def test_local_memory_and_gcs_specs(tmp_path: Path) -> None:
    assert kvstore_spec(Location.parse("memory://ts-spec"))[0] == {
        "driver": "memory",
        "path": "ts-spec/",
    }
    assert kvstore_spec(Location.parse(str(tmp_path / "s")))[0] == {
        "driver": "file",
        "path": f"{tmp_path / 's'}/",
    }
    gcs, _ = kvstore_spec(Location.parse("gs://bkt/p/q", {"user_project": "proj"}))
    assert (gcs["driver"], gcs["bucket"], gcs["path"]) == ("gcs", "bkt", "p/q/")
    assert gcs["gcs_user_project"] == {"project_id": "proj"}


def test_s3_spec_anonymous_with_options() -> None:
    opts = S3 | {"anonymous": True, "request_concurrency": 4, "host_header": "h.example"}
    spec, cleanup = kvstore_spec(Location.parse("s3://bkt/runs/a", opts))
    assert spec["driver"] == "s3" and (spec["bucket"], spec["path"]) == ("bkt", "runs/a/")
    assert spec["endpoint"] == "http://127.0.0.1:9"  # no trailing slash
    assert spec["aws_region"] == "us-east-1" and spec["use_conditional_write"] is True
    assert spec["aws_credentials"] == {"type": "anonymous"}
    assert spec["s3_request_concurrency"] == {"limit": 4}
    assert spec["host_header"] == "h.example"
    cleanup()


def test_s3_explicit_keys_go_to_a_private_file_removed_on_cleanup() -> None:
    opts = S3 | {"access_key_id": "AK", "secret_access_key": "SK", "session_token": "T"}
    spec, cleanup = kvstore_spec(Location.parse("s3://bkt/p", opts))
    creds = spec["aws_credentials"]
    assert creds["type"] == "profile" and creds["config_file"] == os.devnull
    filename = creds["credentials_file"]
    assert stat.S_IMODE(os.stat(filename).st_mode) == 0o600
    text = Path(filename).read_text()
    assert "aws_access_key_id = AK" in text and "aws_session_token = T" in text
    assert "AK" not in repr(spec.get("endpoint"))
    cleanup()
    assert not os.path.exists(filename) and not os.path.exists(os.path.dirname(filename))


# ---- a killed writer's lock files --------------------------------------------------------------


def _layout(key: str, shape: tuple[int, ...], chunks: tuple[int, ...], codec: str | None = None):
    names = ("record", *[f"{key}_{i}" for i in range(len(shape))])
    return ColumnLayout(key, np.dtype("int32"), shape, chunks, codec, names, 0)


@contextlib.contextmanager
def held(path: Path) -> Iterator[None]:
    """``path`` held as TensorStore's file kvstore holds a key's lock file while it writes the
    key (an exclusive lock on the whole file: an open file description lock on Linux, flock
    elsewhere), through a descriptor of its own, as another process's write would."""
    fd = os.open(path, os.O_RDWR)
    try:
        if hasattr(fcntl, "F_OFD_SETLK"):
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        else:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def test_remove_partial_writes_keeps_a_lock_file_whose_write_is_in_flight(tmp_path: Path) -> None:
    """Only the holder of a lock file's lock may remove it (TensorStore's rule): another
    process writing beside the writer keeps its file; a killed writer's goes."""
    root = tmp_path / "s"
    backend = TensorStoreBackend(Location.parse(str(root)))
    backend.create_columns([_layout("x", (), (2,))])
    busy, left = root / ".pytreestore" / "commit.json.__lock", root / "x" / "c" / "0.__lock"
    for name in (busy, left):
        name.parent.mkdir(parents=True, exist_ok=True)
        name.write_bytes(b"partial")
    with held(busy):
        assert backend.remove_partial_writes(["x"], 0) == [str(left)]
        assert busy.read_bytes() == b"partial"
    assert backend.remove_partial_writes(["x"], 0) == [str(busy)]


def test_remove_partial_writes_removes_lock_files_from_the_tail_chunk_on(tmp_path: Path) -> None:
    root = tmp_path / "s"
    backend = TensorStoreBackend(Location.parse(str(root)))
    backend.create_columns([_layout("x", (), (2,)), _layout("w", (3,), (2, 3))])
    backend.resize(["x", "w"], 6)
    backend.write(["x", "w"], 0, [np.arange(6, dtype=np.int32), np.ones((6, 3), np.int32)])
    leftovers = [
        ".pytreestore/commit.json.__lock",
        "zarr.json.__lock",
        "x/zarr.json.__lock",
        "x/c/0.__lock",  # a 1-d column's chunks are files: every lock file is removed
        "w/c/2/0.__lock",  # chunk row 2, at the tail
    ]
    kept = "w/c/0/0.__lock"  # chunk row 0, below the tail: never written again
    for name in [*leftovers, kept]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"partial")
    removed = backend.remove_partial_writes(["x", "w"], 2)
    assert sorted(removed) == sorted(str(root / n) for n in leftovers)
    assert (root / kept).exists() and not any((root / n).exists() for n in leftovers)
    np.testing.assert_array_equal(backend.read(["x"], slice(0, 6), 6)[0], range(6))
    assert (
        TensorStoreBackend(Location.parse("memory://ts-partial")).remove_partial_writes(["x"], 0)
        == []
    )


# ---- checked reads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [None, "zstd"], ids=["direct", "compressed"])
def test_checked_reads_name_each_damaged_or_missing_chunk(tmp_path: Path, codec) -> None:
    root = tmp_path / "s"
    backend = TensorStoreBackend(Location.parse(str(root)))
    backend.create_columns([_layout("x", (), (2,), codec)])
    backend.resize(["x"], 6)
    backend.write(["x"], 0, [np.arange(6, dtype=np.int32)])
    (root / "x" / "c" / "1").write_bytes(b"not a chunk")
    (root / "x" / "c" / "2").unlink()
    reads = [("x", slice(0, 2)), ("x", slice(2, 4)), ("x", slice(4, 6))]
    ok, damaged, missing = TensorStoreBackend(Location.parse(str(root))).read_checked(reads, 6)
    assert ok is None
    assert isinstance(damaged, errors.CorruptChunkError) and "damaged" in str(damaged)
    assert (damaged.chunk, damaged.key) == ((1,), "x/c/1")
    assert isinstance(missing, errors.CorruptChunkError) and "missing" in str(missing)
    assert missing.key == "x/c/2"


def test_checked_reads_report_bad_metadata_per_column(tmp_path: Path) -> None:
    root = tmp_path / "s"
    backend = TensorStoreBackend(Location.parse(str(root)))
    backend.create_columns([_layout("x", (), (2,)), _layout("y", (), (2,))])
    backend.resize(["x", "y"], 2)
    backend.write(["x", "y"], 0, [np.arange(2, dtype=np.int32)] * 2)
    reader = TensorStoreBackend(Location.parse(str(root)))
    reader.open_columns([_layout("x", (), (2,)), _layout("y", (), (4,))])  # y's chunks differ
    x, y = reader.read_checked([("x", slice(0, 2)), ("y", slice(0, 2))], 2)
    assert x is None and isinstance(y, errors.CorruptStoreError)
    assert "chunk shape [2] where the schema says [4]" in str(y)


# ---- which columns take the direct path ----------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "codec", "direct"),
    [
        ("file", None, True),
        ("file", "zstd", True),
        ("file", "blosc", False),
        ("memory", None, False),
    ],
)
def test_direct_path_only_for_local_chunks_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, codec, direct: bool
) -> None:
    calls: list[int] = []
    real = _direct_reads.read

    def counting(requests, into=None):
        calls.append(len(requests))
        return real(requests, into)

    monkeypatch.setattr(_direct_reads, "read", counting)
    url = str(tmp_path / "s") if where == "file" else f"memory://ts-direct-{codec}"
    backend = TensorStoreBackend(Location.parse(url))
    backend.create_columns([_layout("x", (), (4,), codec)])
    backend.resize(["x"], 8)
    backend.write(["x"], 0, [np.arange(8, dtype=np.int32)])
    got = TensorStoreBackend(Location.parse(url)).read(["x"], np.array([7, 0, 3]), 8)[0]
    np.testing.assert_array_equal(got, [7, 0, 3])
    assert bool(calls) is (direct and _direct.native() is not None)
