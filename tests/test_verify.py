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
from pytreestore._inspect.verify import Problem, VerifyReport
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


# ---- issue 12: corruption that load, verify and open(mode="a") must all report -----------------

X = {"x": np.int32(0)}


def xs(path: Path, backend: str, n: int = 10, codec: str | None = "zstd") -> Path:
    with pytreestore.create(path, X, chunk_records=4, codec=codec, backend=backend) as s:
        s.extend({"x": np.int32(i)} for i in range(n))
    return path


def committed(path: Path) -> bytes:
    return (path / ".pytreestore" / "commit.json").read_bytes()


@pytest.mark.parametrize("codec", ["zstd", None])
@pytest.mark.plain_files
def test_a_missing_tail_chunk_refuses_append_and_never_reads_as_zeros(tmp_path, backend, codec):
    path = xs(tmp_path / "s", backend, codec=codec)
    before = committed(path)
    (path / "x" / "c" / "2").unlink()
    reader = pytreestore.open(path, backend=backend)
    with pytest.raises(errors.CorruptChunkError, match=re.escape("chunk (2,) (x/c/2) is missing")):
        reader.load(as_numpy=True)
    np.testing.assert_array_equal(reader.load(slice(0, 8), as_numpy=True)["x"], np.arange(8))
    want = "the tail chunk of column ['x'] (x/c/2) holds committed records 8..9 and is missing"
    with pytest.raises(errors.CorruptChunkError, match=re.escape(want)) as info:
        pytreestore.open(path, mode="a", backend=backend)
    assert "To go on appending, restore x/c/2 from a backup" in str(info.value)
    assert (info.value.path, info.value.key) == ("['x']", "x/c/2")
    assert committed(path) == before and not (path / "x" / "c" / "2").exists()
    problems = reader.verify().problems
    assert [(p.path, p.chunk) for p in problems] == [("['x']", (2,))]


@pytest.mark.plain_files
def test_a_damaged_tail_chunk_refuses_append(tmp_path, backend):
    path = xs(tmp_path / "s", backend)
    before = committed(path)
    (path / "x" / "c" / "2").write_bytes(b"garbage")
    with pytest.raises(
        errors.CorruptChunkError, match=r"\(x/c/2\) holds committed records 8\.\.9 and is damaged"
    ):
        pytreestore.open(path, mode="a", backend=backend)
    assert committed(path) == before and (path / "x" / "c" / "2").read_bytes() == b"garbage"


@pytest.mark.plain_files
def test_trailing_bytes_on_an_uncompressed_chunk_fail_verify_like_load(tmp_path, backend):
    path = xs(tmp_path / "s", backend, codec=None)
    with (path / "x" / "c" / "1").open("ab") as f:
        f.write(b"junk")
    store = pytreestore.open(path, backend=backend)
    with pytest.raises(errors.CorruptChunkError):
        store.load(as_numpy=True)
    report = store.verify()
    assert [(p.path, p.chunk) for p in report.problems] == [("['x']", (1,))]
    assert not report.ok


@pytest.mark.parametrize(
    "value",
    [True, 5.7, "7", 2**63, -1, None, [3]],
    ids=["bool", "float", "str", "2**63", "neg", "null", "list"],
)
def test_a_commit_record_of_the_wrong_type_is_refused(tmp_path, value):
    path = xs(tmp_path / "s", "tensorstore")
    (path / ".pytreestore" / "commit.json").write_text(
        json.dumps({"format_version": 1, "records": value, "generation": 3})
    )
    want = f"its 'records' must be an integer in [0, 2**63), got {json.dumps(value)}"
    for mode in ("r", "a"):
        with pytest.raises(errors.CorruptStoreError, match=re.escape(want)):
            pytreestore.open(path, mode=mode)  # type: ignore[arg-type]
    assert json.loads(committed(path))["records"] == value  # nothing rewritten


@pytest.mark.plain_files
def test_a_damaged_chunk_past_the_commit_is_removed_on_append(tmp_path, backend):
    path = xs(tmp_path / "s", backend, n=8)
    (path / "x" / "c" / "2").write_bytes(b"garbage from a crashed writer")
    (path / "x" / "c" / "5").write_bytes(b"more garbage")
    report = pytreestore.open(path, backend=backend).verify()
    assert report.ok and report.past_commit == ("x/c/2", "x/c/5")
    assert "2 chunk(s) past the commit, removed by the next open(mode='a')" in str(report)
    with pytreestore.open(path, mode="a", backend=backend) as store:
        assert store.verify().ok
        store.extend({"x": np.int32(i)} for i in range(8, 11))
    again = pytreestore.open(path, backend=backend)
    np.testing.assert_array_equal(again.load(as_numpy=True)["x"], np.arange(11))
    assert again.verify().ok and not (path / "x" / "c" / "5").exists()


def test_the_verify_command_exits_non_zero_on_each_problem(tmp_path):
    from click.testing import CliRunner

    from pytreestore.cli import main

    def verify_exit(path: Path) -> int:
        return CliRunner().invoke(main, ["verify", str(path)]).exit_code

    trailing = xs(tmp_path / "trailing", "tensorstore", codec=None)
    assert verify_exit(trailing) == 0
    with (trailing / "x" / "c" / "1").open("ab") as f:
        f.write(b"junk")
    missing = xs(tmp_path / "missing", "tensorstore")
    (missing / "x" / "c" / "0").unlink()
    typed = xs(tmp_path / "typed", "tensorstore")
    (typed / ".pytreestore" / "commit.json").write_text(
        json.dumps({"format_version": 1, "records": True, "generation": 1})
    )
    assert [verify_exit(p) for p in (trailing, missing, typed)] == [1, 1, 1]


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_a_learnt_array_before_its_first_stored_row_is_not_missing(tmp_path, backend):
    """Regression: a ragged store that learnt a structure mid-chunk (its new arrays start at
    record 3 of a 4-record chunk) and has committed no record showing it yet has no chunk of
    them; verify called that a lost chunk."""
    from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record

    path = tmp_path / "s"
    store = pytreestore.create(
        path, ragged_like(True), backend=backend, chunk_records=4, **RAGGED_DECL
    )
    store.extend(ragged_record(i) for i in range(3))
    store.flush()
    store.append(ragged_record(9))  # learns every structure; the record is buffered
    reader = pytreestore.open(path, backend=backend)
    # the root holds the learnt schema, but no commit names it yet: a reader reads with the
    # schema its commit record names (issue 28), whose structures are still pending
    assert len(reader) == 3 and reader.schema.pending
    report = reader.verify()
    assert report.ok, report.problems
    store.close()
    assert pytreestore.open(path, backend=backend).verify().ok
