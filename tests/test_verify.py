"""Damaged stores: ``store.verify()`` names the column (by tree path) and the chunk of every
damaged or missing object, and reading a damaged chunk raises an error naming them too.

Chunks carry a zarr v3 ``crc32c`` checksum, so a flipped bit is found even in uncompressed
columns, where no decoder would notice it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._verify import Problem, VerifyReport
from tests.trees import Pair

pytest_plugins = ("tests.fixtures",)
LIKE = {"a": np.zeros(4, np.float32), "b": Pair(np.int32(0), np.zeros(2, np.float64))}


def rec(i: int) -> dict:
    return {
        "a": np.arange(4, dtype=np.float32) + i,
        "b": Pair(np.int32(i), np.full(2, -i, np.float64)),
    }


def make(path, codec="zstd", n=10, **kw):
    with pytreestore.create(path, LIKE, chunk_records=4, codec=codec, **kw) as s:
        s.extend(rec(i) for i in range(n))
    return path


def flip(path: Path, offset: int = -5) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("codec", ["zstd", None, "blosc", "gzip"])
def test_a_flipped_bit_is_found_and_named(tmp_path, codec):
    path = make(str(tmp_path / "s"), codec=codec)
    flip(tmp_path / "s" / "b" / "right" / "c" / "1" / "0", offset=8)
    store = pytreestore.open(path)
    report = store.verify()
    assert not report.ok
    assert [(p.path, p.chunk, p.key) for p in report.problems] == [
        ("['b'].right", (1, 0), "b/right/c/1/0")
    ]
    assert str(report).startswith(f"{path}: 10 records, 3 columns, 9 chunks checked: 1 problem")
    assert "column ['b'].right chunk (1, 0) [b/right/c/1/0]: damaged:" in str(report)
    with pytest.raises(
        errors.CorruptChunkError,
        match=re.escape("column ['b'].right: chunk (1, 0) (b/right/c/1/0) is damaged"),
    ) as caught:
        store[4:8]
    assert (caught.value.path, caught.value.chunk) == ("['b'].right", (1, 0))
    assert isinstance(caught.value, OSError)
    # what is not damaged still reads
    np.testing.assert_array_equal(
        store.load(slice(0, 4), as_numpy=True)["b"].right[:, 0], [0, -1, -2, -3]
    )
    np.testing.assert_array_equal(store.load(columns="['a']", as_numpy=True)["a"][:, 0], range(10))


def test_a_truncated_and_a_deleted_chunk(tmp_path):
    path = make(str(tmp_path / "s"))
    chunk = tmp_path / "s" / "a" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[:3])
    (tmp_path / "s" / "b" / "left" / "c" / "2").unlink()
    report = pytreestore.open(path).verify()
    found = [(p.path, p.chunk, p.message.split(":")[0]) for p in report.problems]
    assert found == [
        ("['a']", (0, 0), "damaged"),
        ("['b'].left", (2,), "the chunk is missing"),
    ]


def test_damaged_column_metadata(tmp_path):
    path = make(str(tmp_path / "s"))
    (tmp_path / "s" / "b" / "left" / "zarr.json").write_text("{not json")
    report = pytreestore.open(path).verify()
    assert [(p.path, p.key, p.chunk) for p in report.problems] == [
        ("['b'].left", "b/left/zarr.json", None)
    ]
    assert "zarr.json is damaged" in report.problems[0].message
    with pytest.raises(errors.CorruptStoreError, match=re.escape("b/left")):
        pytreestore.open(path)[:]


def test_metadata_that_disagrees_with_the_schema(tmp_path):
    path = make(str(tmp_path / "s"))
    meta_path = tmp_path / "s" / "a" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["shape"] = [3, 4]  # fewer records than committed
    meta_path.write_text(json.dumps(meta))
    report = pytreestore.open(path).verify()
    assert [p.path for p in report.problems] == ["['a']"]
    assert "3 records, 10 are committed" in report.problems[0].message


def test_a_damaged_commit_record(tmp_path):
    path = make(str(tmp_path / "s"))
    store = pytreestore.open(path)
    (tmp_path / "s" / ".pytreestore" / "commit.json").write_text('{"records": "many"')
    report = store.verify()
    assert [(p.path, p.key) for p in report.problems] == [(None, ".pytreestore/commit.json")]
    assert str(report.problems[0]).startswith("store [.pytreestore/commit.json]: ")
    with pytest.raises(errors.CorruptStoreError, match="is not a valid commit record"):
        pytreestore.open(path)


def test_a_healthy_store_and_an_empty_one(tmp_path):
    assert pytreestore.open(make(str(tmp_path / "s"))).verify().ok
    empty = pytreestore.create(str(tmp_path / "e"), LIKE)
    report = empty.verify()
    assert (report.ok, report.records, report.chunks) == (True, 0, 0)
    empty.close()


def test_only_committed_chunks_are_checked(tmp_path):
    """Garbage past the commit (a crashed writer's) is not a problem: it is never read."""
    path = make(str(tmp_path / "s"), n=8)
    writer = pytreestore.open(path, mode="a")
    writer.extend(rec(i) for i in range(8, 11))
    assert writer.verify().ok  # three records buffered, not committed
    writer.close()
    assert pytreestore.open(path).verify().records == 11


def test_split_leaf_axes_name_the_whole_chunk_index(tmp_path):
    big = {"w": np.zeros((5, 1 << 19), np.float32)}  # 10 MiB per record: leaf axes split
    path = str(tmp_path / "big")
    with pytreestore.create(path, big, chunk_records=1, codec=None) as s:
        s.append({"w": np.ones((5, 1 << 19), np.float32)})
    chunks = sorted(
        p.relative_to(tmp_path / "big")
        for p in (tmp_path / "big" / "w" / "c").rglob("*")
        if p.is_file()
    )
    assert len(chunks) > 1
    flip(tmp_path / "big" / chunks[-1], offset=100)
    (problem,) = pytreestore.open(path).verify().problems
    assert problem.key == str(chunks[-1]) and len(problem.chunk) == 3


def test_the_report_is_plain_data():
    report = VerifyReport("x", 1, 1, 1, (Problem("['a']", "a/c/0", (0,), "damaged: bad"),))
    assert not report.ok
    assert str(report) == (
        "x: 1 records, 1 columns, 1 chunks checked: 1 problem(s)\n"
        "  column ['a'] chunk (0,) [a/c/0]: damaged: bad"
    )


@pytest.mark.s3
def test_a_damaged_chunk_on_s3(s3_server, bucket):
    url = f"s3://{bucket}/damaged"
    make(url, storage_options=s3_server.options)
    store = pytreestore.open(url, storage_options=s3_server.options)
    backend = store._backend
    raw = backend.read_bytes("a/c/1/0")
    backend.write_bytes("a/c/1/0", raw[:-1] + bytes([raw[-1] ^ 1]))
    (problem,) = store.verify().problems
    assert (problem.path, problem.chunk) == ("['a']", (1, 0))
    with pytest.raises(errors.CorruptChunkError, match=re.escape("column ['a']: chunk (1, 0)")):
        store[5]


def test_the_zarr_backend_is_verified_too(tmp_path):
    path = make(str(tmp_path / "z"), backend="zarr")
    flip(tmp_path / "z" / "a" / "c" / "0" / "0")
    (problem,) = pytreestore.open(path, backend="zarr").verify().problems
    assert (problem.path, problem.chunk) == ("['a']", (0, 0))


def test_verify_progress_counts_every_chunk(tmp_path, capsys):
    store = pytreestore.open(make(tmp_path / "s", n=10))
    report = store.verify(progress=True)
    assert (report.ok, report.chunks) == (True, 9)  # 3 columns of 3 chunks
    bar = capsys.readouterr().err.split("\r")[-1]
    assert (
        bar.startswith("verify: 100%") and "9/9 " in bar and " chunks/s" in bar and "MB/s" in bar
    ), bar
    store.verify()
    assert capsys.readouterr().err == ""
