"""pytreestore.copy: the same records and schema, with other chunks, codec or place."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import pytreestore
from pytreestore._open import copy as _copy
from pytreestore._runtime import RUNTIME
from pytreestore.cli import main
from pytreestore.testing import assert_trees_equal
from tests import trees

pytest_plugins = ("tests.fixtures",)


def make_source(path: Path, n: int = 23, chunk: int = 5) -> pytreestore.TreeStore:
    like = trees.AllParams([trees.Params(np.zeros(3, np.float32), 0), trees.Params(0.0, 0)])
    store = pytreestore.create(path, like, chunk_records=chunk)
    store.extend(
        trees.AllParams([trees.Params(np.full(3, i, np.float32), i), trees.Params(i / 2, -i)])
        for i in range(n)
    )
    return store


def root_attrs(path: Path) -> dict:
    return json.loads((path / "zarr.json").read_text())["attributes"]["pytreestore"]


@pytest.mark.parametrize("chunk", [None, 1, 3, 5, 64])
def test_copy_keeps_records_classes_and_schema(tmp_path: Path, chunk: int | None) -> None:
    make_source(tmp_path / "src").close()
    assert pytreestore.copy(tmp_path / "src", tmp_path / "dst", chunk_records=chunk) == 23
    src, dst = pytreestore.open(tmp_path / "src"), pytreestore.open(tmp_path / "dst")
    assert type(dst[0]) is trees.AllParams  # the classes come back, though copy never imported them
    assert_trees_equal(dst.load(as_numpy=True), src.load(as_numpy=True))
    want, got = root_attrs(tmp_path / "src"), root_attrs(tmp_path / "dst")
    assert got["tree"] == want["tree"] and got["codec"] == "zstd"
    assert got["chunk_records"] == (chunk or 5)
    assert [c["chunks"][0] for c in got["columns"]] == [chunk or 5] * 4
    assert [c["chunks"][1:] for c in got["columns"]] == [c["chunks"][1:] for c in want["columns"]]


def test_copy_in_many_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RUNTIME.reads, "copy_slice_bytes", 1)  # one source chunk per step
    make_source(tmp_path / "src", n=101, chunk=7).close()
    pytreestore.copy(tmp_path / "src", tmp_path / "dst", chunk_records=3, codec="blosc")
    src, dst = pytreestore.open(tmp_path / "src"), pytreestore.open(tmp_path / "dst")
    assert (len(dst), dst.schema.codec) == (101, "blosc")
    assert_trees_equal(dst.load(as_numpy=True), src.load(as_numpy=True))


def test_steps_are_whole_destination_chunks() -> None:
    assert _copy._step(dst_chunk=3, src_chunk=7, row_bytes=1 << 30) == 9
    assert _copy._step(dst_chunk=8, src_chunk=2, row_bytes=1 << 30) == 8
    assert _copy._step(dst_chunk=4, src_chunk=4, row_bytes=1) % 4 == 0


def test_copy_from_an_open_writer_includes_buffered_records(tmp_path: Path) -> None:
    src = make_source(tmp_path / "src", n=7)
    assert src.committed == 5
    assert pytreestore.copy(src, "memory://copy-from-writer") == 7
    src.append(src.load(0, as_numpy=True))  # the source is still open for appending
    src.close()
    assert len(pytreestore.open("memory://copy-from-writer")) == 7


def test_copy_an_empty_store(tmp_path: Path) -> None:
    make_source(tmp_path / "src", n=0).close()
    assert pytreestore.copy(tmp_path / "src", tmp_path / "dst", codec=None) == 0
    dst = pytreestore.open(tmp_path / "dst")
    assert (len(dst), dst.schema.codec) == (0, None)


def test_copy_refuses_bad_options(tmp_path: Path) -> None:
    make_source(tmp_path / "src").close()
    src = tmp_path / "src"
    with pytest.raises(ValueError, match=re.escape("unknown codec 'lzma'")):
        pytreestore.copy(src, tmp_path / "a", codec="lzma")
    with pytest.raises(ValueError, match=re.escape("chunk_records must be a positive int, got 0")):
        pytreestore.copy(src, tmp_path / "a", chunk_records=0)
    with pytest.raises(ValueError, match=re.escape(f"cannot copy {src} to {src}: the two overlap")):
        pytreestore.copy(src, src, overwrite=True)
    pytreestore.copy(src, tmp_path / "a")
    with pytest.raises(pytreestore.errors.StoreExistsError, match="pass overwrite=True"):
        pytreestore.copy(src, tmp_path / "a")
    assert pytreestore.copy(src, tmp_path / "a", overwrite=True, chunk_records=2) == 23
    assert pytreestore.open(tmp_path / "a").schema.chunk_records == 2
    assert not (tmp_path / "b").exists()


@pytest.mark.s3
def test_copy_between_local_disk_and_s3(
    tmp_path: Path, s3_server: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_source(tmp_path / "src").close()
    url = f"s3://{bucket}/copied"
    options = s3_server.options
    assert (
        pytreestore.copy(tmp_path / "src", url, chunk_records=8, dst_storage_options=options) == 23
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3_server.endpoint)  # the command reads the env
    back = tmp_path / "back"
    result = CliRunner().invoke(main, ["copy", url, str(back), "--json"], prog_name="pytreestore")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records"] == 23
    info = json.loads(CliRunner().invoke(main, ["info", url, "--json"]).stdout)
    assert info["records"] == 23 and info["stored_bytes"] is None  # not measured on S3
    src, dst = pytreestore.open(tmp_path / "src"), pytreestore.open(back)
    assert dst.schema.chunk_records == 8
    assert_trees_equal(dst.load(as_numpy=True), src.load(as_numpy=True))


# ---- issue 12: overlapping locations, and what an interrupted copy leaves -----------------------


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
@pytest.mark.parametrize("where", ["same", "src inside dst", "dst inside src"])
def test_copy_refuses_overlapping_locations(tmp_path: Path, backend: str, where: str) -> None:
    src = tmp_path / "outer" / "src"
    make_source(src).close()
    dst = {"same": src, "src inside dst": tmp_path / "outer", "dst inside src": src / "x"}[where]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(pytreestore.errors.BadLocationError, match=r"overlap .*Nothing was written"):
        pytreestore.copy(src, dst, backend=backend, overwrite=True)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert len(pytreestore.open(src)) == 23


def test_copy_refuses_overlapping_memory_stores() -> None:
    make_source("memory://overlap/inner").close()  # type: ignore[arg-type]
    with pytest.raises(pytreestore.errors.BadLocationError, match="overlap"):
        pytreestore.copy("memory://overlap/inner", "memory://overlap", overwrite=True)
    assert len(pytreestore.open("memory://overlap/inner")) == 23


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_an_interrupted_copy_can_be_replaced(tmp_path: Path, backend: str) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    make_source(src).close()
    chunk = src / "p" / "1" / "y" / "c" / "3"  # records 15..19 of one column
    saved = chunk.read_bytes()
    chunk.write_bytes(b"damaged")
    with pytest.raises(pytreestore.errors.CorruptChunkError):
        pytreestore.copy(src, dst, chunk_records=5, backend=backend)
    with pytest.raises(pytreestore.errors.StoreExistsError):
        pytreestore.copy(src, dst, backend=backend)
    assert (dst / ".pytreestore" / "incomplete").exists()  # the copy did not finish
    partial = pytreestore.open(dst, backend=backend)
    assert partial.verify().ok and len(partial) < 23  # a valid, shorter destination
    # a copy killed while the destination was being created has no root metadata and no
    # commit record yet, only the marker and some columns
    (dst / "zarr.json").unlink()
    (dst / ".pytreestore" / "commit.json").unlink()
    chunk.write_bytes(saved)
    assert pytreestore.copy(src, dst, backend=backend, overwrite=True) == 23
    assert not (dst / ".pytreestore" / "incomplete").exists()
    (dst / "zarr.json").unlink()
    (dst / ".pytreestore" / "incomplete").write_bytes(b"")
    pytreestore.create(dst, {"x": 0}, overwrite=True, backend=backend).close()
    assert len(pytreestore.open(dst)) == 0 and not (dst / ".pytreestore" / "incomplete").exists()
