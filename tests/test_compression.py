"""The codec registry (pytreestore._format.compression): every registered codec round-trips
from its value to the zarr v3 codecs a column's ``zarr.json`` holds and back, in memory and
through stores of every kind on every backend; an unknown codec is refused by name, with
the choices, by ``create``, ``copy`` and ``pytreestore copy``."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import pytreestore
from pytreestore import errors
from pytreestore._format import compression
from pytreestore._format import validate as _validate
from pytreestore._format.schema import TreeSchema
from pytreestore.backends import ColumnLayout
from pytreestore.backends._metadata import array_document, array_metadata
from pytreestore.backends._tensorstore import direct
from pytreestore.cli import main
from tests.parity import kinds

NAMES = list(compression.CODECS)
FORMAT_MD = Path(__file__).parents[1] / "docs" / "format.md"
DTYPES = ["int8", "bool", "float16", "int32", "float64", "complex64"]
CHOICES = "choose 'zstd', 'blosc', 'gzip' or None"


def layout(name: str | None, dtype: str, inner: int | None = None) -> ColumnLayout:
    return ColumnLayout("x", np.dtype(dtype), (3,), (8, 3), name, ("record", "x_0"), 0, inner)


def test_the_registry_holds_the_formats_codecs_default_first():
    assert NAMES == ["zstd", "blosc", "gzip", None]
    for make in (pytreestore.create, TreeSchema.from_example):
        assert inspect.signature(make).parameters["codec"].default == NAMES[0]
    assert compression.choices() == "'zstd', 'blosc', 'gzip' or None"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_every_codec_round_trips_through_its_metadata(name, dtype):
    """value -> zarr.json codecs (as created, as written, sharded or not) -> the same value."""
    codec, dt = compression.named(name), np.dtype(dtype)
    assert codec.name == name
    for inner in (None, 4):
        sharded = inner is not None
        want = compression.Chain(codec, sharded=sharded, checksummed=True)
        for doc in (
            array_metadata(layout(name, dtype, inner)),
            array_document(layout(name, dtype, inner), 5),
        ):
            assert compression.parse(doc["codecs"], dt) == want
        assert compression.parse(doc["codecs"], dt).plain == (name is None and not sharded)


def format_table(itemsize: int) -> dict[str | None, Any]:
    """docs/format.md's codec table, for a column of ``itemsize`` bytes: each ``codec`` and
    the zarr v3 codec after ``bytes`` (None: none)."""
    text = FORMAT_MD.read_text()
    section = text[text.index("### Codecs") :]
    section = section[: section.index("\n### ")].replace("ITEMSIZE", str(itemsize))
    rows = re.findall(r"^\| `([^`]+)`[^|]*\| (?:`(.+)`|none) \|$", section, re.M)
    return {json.loads(name): json.loads(c) if c else None for name, c in rows}


@pytest.mark.parametrize("dtype", ["int8", "int16", "complex128"])
def test_the_registry_is_the_format_table(dtype):
    """docs/format.md's codec table, member for member and in order: bytes, the
    compressor, crc32c."""
    table = format_table(np.dtype(dtype).itemsize)
    assert list(table) == NAMES
    bytes_ = {"name": "bytes", "configuration": {"endian": "little"}}
    for name, compressor in table.items():
        middle = [] if compressor is None else [compressor]
        got = compression.chain(compression.named(name), np.dtype(dtype))
        assert json.dumps(got) == json.dumps([bytes_, *middle, {"name": "crc32c"}])
        got.append("edited")  # a caller's copy: the registry's own chain is unchanged
        assert len(compression.chain(compression.named(name), np.dtype(dtype))) == len(got) - 1


def test_the_shipped_json_schema_names_the_registrys_codecs():
    """pytreestore/schema.json, which every root metadata is checked against on open,
    allows exactly the registry's codecs, and their compressors in consolidated metadata."""
    text = json.dumps(_validate.json_schema())
    enums = [json.loads(e) for e in re.findall(r'"enum": (\[[^\]]*\])', text)]
    assert NAMES in enums
    compressors = {c.compressor for c in compression.CODECS.values() if c.compressor}
    assert any(compressors | {"bytes", "crc32c", "sharding_indexed"} == set(e) for e in enums)


@pytest.mark.parametrize(
    "codecs",
    [
        None,
        "bytes",
        [1],
        [{"name": "bytes", "configuration": {"endian": "big"}}, {"name": "crc32c"}],
        [{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 9}}, {"name": "crc32c"}],
        [{"name": "sharding_indexed", "configuration": "damaged"}],
    ],
)
def test_a_chain_pytreestore_does_not_write_names_no_codec(codecs):
    assert compression.parse(codecs, np.dtype("int32")).codec is None


def test_checksums_are_seen_in_foreign_chains_too():
    unchecked = [{"name": "bytes", "configuration": {"endian": "little"}}]
    assert not compression.parse(unchecked, np.dtype("int32")).checksummed
    inner = [*unchecked, {"name": "blosc", "configuration": {}}, {"name": "crc32c"}]
    sharded = [
        {"name": "transpose"},
        {"name": "sharding_indexed", "configuration": {"codecs": inner}},
    ]
    got = compression.parse(sharded, np.dtype("int32"))
    assert (got.codec, got.sharded, got.checksummed) == (None, True, True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NAMES)
def test_the_direct_reader_takes_exactly_the_chains_it_reads(tmp_path, name, dtype):
    """Plain chunks always (their writes too); zstd and shards where the compiled loop is."""
    loop = direct.native() is not None
    for inner in (None, 4):
        doc = array_document(layout(name, dtype, inner), 0)
        plan = direct.plan(tmp_path, doc)
        readable = name is None or (name == "zstd" and loop and direct.native().zstd)
        assert (plan is not None) == (readable and (inner is None or loop))
        if plan is not None:
            assert plan.plain == (name is None and inner is None)
            assert plan.inner == inner


@pytest.mark.parametrize("kind", ["fixed", "optional", "nested"])
@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_every_codec_round_trips_through_a_store(tmp_path, name, backend, kind):
    """Every array a store writes (record table, axis tables, offsets, presence) carries the
    chain of the store's codec; its records read back exactly and verify finds them all
    checksummed."""
    recs = kinds.filled(tmp_path / "s", kind, backend, n=6, codec=name)
    store = pytreestore.open(tmp_path / "s", backend=backend)
    assert store.schema.codec == name
    backend_ = store._backend
    for column in store.schema.storage_columns:
        doc = json.loads(backend_.read_bytes(f"{column.key}/zarr.json"))
        assert compression.parse(doc["codecs"], column.dtype).codec is compression.named(name)
    for got, want in zip(store.records(as_numpy=True), recs, strict=True):
        kinds.assert_same(got, want)
    report = store.verify()
    assert (report.problems, report.unchecksummed) == ((), ())


@pytest.mark.parametrize("codec", ["lzma", "none", "ZSTD", 3, ["zstd"]])
def test_create_refuses_an_unknown_codec_with_the_choices(tmp_path, codec):
    message = f"unknown codec {codec!r}; {CHOICES}"
    with pytest.raises(errors.ArgumentError, match=re.escape(message)):
        pytreestore.create(tmp_path / "s", {"x": np.float32(0)}, codec=codec)
    with pytest.raises(errors.ArgumentError, match=re.escape(message)):
        kinds.create(tmp_path / "r", "nested", "tensorstore", codec=codec)
    assert not (tmp_path / "s").exists() and not (tmp_path / "r").exists()


def test_copy_refuses_an_unknown_codec_with_the_choices(tmp_path):
    kinds.filled(tmp_path / "src", "fixed", "tensorstore", n=2)
    with pytest.raises(errors.ArgumentError, match=re.escape(f"unknown codec 'lzma'; {CHOICES}")):
        pytreestore.copy(tmp_path / "src", tmp_path / "dst", codec="lzma")
    assert not (tmp_path / "dst").exists()


def test_the_cli_offers_and_checks_the_registrys_codecs(tmp_path):
    kinds.filled(tmp_path / "src", "fixed", "tensorstore", n=2)
    runner = CliRunner()
    bad = runner.invoke(
        main, ["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--codec", "lzma"]
    )
    assert bad.exit_code == 2
    assert "'lzma' is not one of 'zstd', 'blosc', 'gzip', 'none', 'keep'" in bad.stderr
    assert not (tmp_path / "dst").exists()
    good = runner.invoke(
        main, ["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "--codec", "gzip"]
    )
    assert good.exit_code == 0, good.output
    assert pytreestore.open(tmp_path / "dst").schema.codec == "gzip"


def test_a_codec_this_version_does_not_know_refuses_new_columns_only():
    with pytest.raises(errors.FormatVersionError, match=re.escape("names the codec 'lz4'")):
        array_metadata(layout("lz4", "int32"))


def test_verify_lists_columns_whose_chunks_carry_no_checksum(tmp_path):
    with pytreestore.create(tmp_path / "s", {"a": np.int32(0), "b": np.int32(0)}, codec=None):
        pass
    meta_path = tmp_path / "s" / "a" / "zarr.json"
    meta: dict[str, Any] = json.loads(meta_path.read_text())
    meta["codecs"] = meta["codecs"][:1]  # bytes only: no crc32c
    meta_path.write_text(json.dumps(meta))
    report = pytreestore.open(tmp_path / "s").verify()
    assert (report.problems, report.unchecksummed) == ((), ("['a']",))
