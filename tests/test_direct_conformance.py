"""The direct reader against TensorStore (issue 47): every read gives the same bytes with
``RUNTIME.reads.direct`` on and off, on every dtype, codec, layout and kind of store.

The direct reader (pytreestore/backends/_tensorstore/direct.py and what is built beside it)
reads the local chunk files of the TensorStore backend itself; ``RUNTIME.reads.direct``
False sends every read through TensorStore, the reference. These tests use only that switch
and the public API, so they hold whatever the reader's internals become. Where the direct
reader does not cover a column (today: anything but uncompressed plain chunks), both sides
read through TensorStore and the test still checks the records written; once it covers the
column, the same test compares the two paths. Every reader here is opened with
``cache_bytes=0``, so that each read reaches the files.

* The conformance grid: every dtype a column holds (and typed PRNG keys, in fixed stores,
  the only ones that take them), scalar and shaped leaves, codecs zstd, blosc, gzip and none,
  layouts plain, inner chunks of several sizes, packed, packed with inner chunks and
  ``"auto"``, every kind of store of tests/parity/kinds.py, record counts that end at and
  inside a chunk and an inner chunk, a leaf split on its own axes, a ``memory://`` store; each
  read (``store[i]``, ``load`` of an int, a slice, a step, sorted and unsorted indices with
  repeats, one column, ``records()``, a shuffled epoch of ``batches``, ``grain_source()[i]``)
  compared byte for byte (NaN payloads and -0.0 count) between the two paths, and against the
  records written. ``make test`` runs a covering subset of the cells (every dtype, every
  codec with every layout, every kind in two layouts); ``make test-long`` (``-m slow``) the
  whole product.
* Damage: a flipped byte in a chunk, an inner chunk or a shard index, a truncated or empty
  file, a shard index that points past its end or marks an inner chunk absent, a missing
  file, a folder in a chunk's place, an unreadable file: the same error class on both paths,
  naming the column and the chunk; the records not damaged read exactly, never wrong bytes.
* Readers beside a writer (four threads of this process sharing one reader, and a reader in
  another process), and after ``truncate``, ``keep_last`` + ``vacuum`` and ``evolve``: both
  paths read the records the model holds.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.tree_util import keystr, tree_flatten_with_path

import pytreestore
from pytreestore import errors
from pytreestore._format import dtypes
from pytreestore._runtime import RUNTIME
from tests.conftest import diagonal, tiered
from tests.parity import kinds

SLOW = pytest.mark.slow
#: the backend whose local files the direct reader reads (zarr-python and OCDBT have none)
BACKEND = "tensorstore"
#: records per chunk of the grid's stores
CHUNK = 8
#: records of the grid's stores: 2 chunks and 3 records, so that the last chunk, and the
#: last inner chunk of 2 or more records, end part-filled
N = 19
#: every dtype a column holds, and typed PRNG keys
DTYPES = [*dtypes.SUPPORTED, "key"]
CODECS = [None, "zstd", "blosc", "gzip"]
#: how a store lays out its chunks: ``create`` options (inner chunks of 16 or 64 bytes give
#: the grid's leaves inner chunks of 1 to 16 records, or plain chunks where none fits)
LAYOUTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "inner16": {"inner_chunk_bytes": 16},
    "inner64": {"inner_chunk_bytes": 64},
    "packed": {"pack": True},
    "packed-inner": {"pack": True, "inner_chunk_bytes": 32},
    "auto": {"inner_chunk_bytes": "auto", "chunk_records": None},  # the default chunking
}


# ---- the switch ----------------------------------------------------------------------------------


@contextlib.contextmanager
def direct(on: bool) -> Iterator[None]:
    """Reads inside go through the direct reader where it covers a column (``on``), or all
    through TensorStore."""
    saved = RUNTIME.reads.direct
    RUNTIME.reads.direct = on
    try:
        yield
    finally:
        RUNTIME.reads.direct = saved


# ---- values as bytes -----------------------------------------------------------------------------


def host(leaf: Any) -> np.ndarray:
    """A leaf as numpy; a typed PRNG key as its key data (what ``as_numpy`` reads give)."""
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf)


Flat = tuple[Any, list[tuple[str, str, tuple[int, ...], bytes]]]


def flat(tree: Any) -> Flat:
    """``tree``'s treedef and, per leaf, its keypath, dtype, shape and bytes."""
    leaves, treedef = tree_flatten_with_path(tree)
    out = []
    for path, leaf in leaves:
        a = host(leaf)
        out.append((keystr(path), str(a.dtype), a.shape, np.ascontiguousarray(a).tobytes()))
    return treedef, out


def assert_same_bytes(got: Flat, want: Flat, what: str) -> None:
    """Asserts one treedef and the same dtype, shape and bytes leaf by leaf."""
    assert got[0] == want[0], f"{what}: treedefs differ:\n  {got[0]}\n  {want[0]}"
    for g, w in zip(got[1], want[1], strict=True):
        if g != w:
            where = g[0] or "the root"
            if g[1:3] != w[1:3]:
                raise AssertionError(f"{what}: {where}: {g[1]}{list(g[2])} != {w[1]}{list(w[2])}")
            first = next(k for k, (a, b) in enumerate(zip(g[3], w[3])) if a != b)
            raise AssertionError(
                f"{what}: {where} ({g[1]}{list(g[2])}): bytes differ from byte {first} on "
                f"({g[3][first : first + 8].hex()} != {w[3][first : first + 8].hex()})"
            )


Outcome = Flat | type


def outcome(read: Callable[[], Any]) -> Outcome:
    """What ``read`` gives, as bytes, or the class of the ``PyTreeStoreError`` it raised
    (any other exception fails the test)."""
    try:
        return flat(read())
    except errors.PyTreeStoreError as err:
        return type(err)


def assert_same_outcome(on: Outcome, off: Outcome, what: str) -> None:
    """Asserts the same bytes, or the same error class."""
    if isinstance(on, tuple) and isinstance(off, tuple):
        assert_same_bytes(on, off, f"{what} (direct reader vs TensorStore)")
        return
    assert on is off, f"{what}: direct reader gave {on}, TensorStore {off}"


# ---- the grid's records --------------------------------------------------------------------------


def special(dtype: np.dtype) -> np.ndarray:
    """NaN with a payload, -0.0 and infinities in ``dtype`` (what it has of them), for floats
    and complex; nothing for others."""
    if dtypes.kind(dtype) not in "fc":
        return np.zeros(0, dtype)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        values = np.array([np.nan, -0.0, np.inf, -np.inf], np.float64).astype(dtype)
    raw = values.view(np.uint8).reshape(len(values), -1).copy()
    raw[0, 0] ^= 1  # a NaN payload bit (where the NaN has mantissa bits to spare)
    return raw.reshape(-1).view(dtype)


def values(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random values of every bit pattern (bools 0 or 1), specials first."""
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    count = int(np.prod(shape))
    raw = rng.integers(0, 256, count * dtype.itemsize, dtype=np.uint8).view(dtype)
    marks = special(dtype)[:count]
    raw[: len(marks)] = marks
    return raw.reshape(shape)


def dtype_leaves(dtype: str, i: int) -> dict[str, Any]:
    """Record ``i``'s leaves of ``dtype``: a scalar, a vector and a matrix (PRNG keys: a key
    and an array of 3 keys)."""
    if dtype == "key":
        return {"s": jax.random.key(i), "v": jax.random.split(jax.random.key(1000 + i), 3)}
    rng, dt = np.random.default_rng([47, i]), dtypes.from_name(dtype)
    return {
        "s": values(dt, (), rng)[()],
        "v": values(dt, (5,), np.random.default_rng([47, i, 1])),
        "m": values(dt, (3, 2), rng),
    }


def ragged_leaf(dtype: str, i: int) -> np.ndarray:
    """Record ``i``'s leaf of ``dtype`` whose leading axis varies (0 to 4 rows)."""
    rng = np.random.default_rng([48, i])
    return values(dtypes.from_name(dtype), (int(rng.integers(0, 5)), 3), rng)


def record(kind: str, dtype: str, i: int) -> dict[str, Any]:
    """Record ``i`` of a grid store: a record of ``kind`` and leaves of ``dtype`` (in a
    ragged or optional store also a ragged leaf of ``dtype``)."""
    out: dict[str, Any] = {"d": dtype_leaves(dtype, i), "step": kinds.record(kind, i)}
    if kind != "fixed":
        out["r"] = ragged_leaf(dtype, i)
    return out


def declarations(kind: str) -> dict[str, list[str]]:
    """``create``'s declarations for a grid store of ``kind``."""
    if kind == "fixed":
        return {}
    found = kinds.kind(kind).declarations
    ragged = [f"['step']{p}" for p in found.get("ragged", [])] + ["['r']"]
    optional = [f"['step']{p}" for p in found.get("optional", [])]
    return {"ragged": ragged, **({"optional": optional} if optional else {})}


def like(kind: str, dtype: str) -> dict[str, Any]:
    out = {**record(kind, dtype, 0), "step": kinds.like(kind)}
    if kind != "fixed":
        out["r"] = values(dtypes.from_name(dtype), (1, 3), np.random.default_rng(0))
    return out


def make(path: Path, kind: str, dtype: str, codec: str | None, layout: str, n: int = N) -> list:
    """A grid store at ``path``, its ``n`` records written (half by ``extend``, the rest
    one by one); the records."""
    options = {"chunk_records": CHUNK, **LAYOUTS[layout]}
    written = [record(kind, dtype, i) for i in range(n)]
    store = pytreestore.create(
        path, like(kind, dtype), backend=BACKEND, codec=codec, **declarations(kind), **options
    )
    with store:
        store.extend(written[: n // 2])
        for r in written[n // 2 :]:
            store.append(r)
    return written


# ---- the reads -----------------------------------------------------------------------------------


Read = Callable[[pytreestore.TreeStore], Any]


def reads(n: int) -> list[tuple[str, Read]]:
    """Every read form the grid compares, on a store of ``n`` records."""
    out: list[tuple[str, Read]] = []
    for i in sorted({0, n // 2, n - 1, -min(3, n)}):
        out.append((f"store[{i}]", lambda s, i=i: s[i]))
        out.append((f"load({i}, as_numpy=True)", lambda s, i=i: s.load(i, as_numpy=True)))
    for name, index in indexes(n).items():
        out.append((f"load({name})", lambda s, index=index: s.load(index, as_numpy=True)))
    out += [
        ("load(columns=)", lambda s: s.load(columns=["['d']['v']"], as_numpy=True)),
        ("records()", lambda s: list(s.records(as_numpy=True))),
        ("batches(shuffle=True)", lambda s: list(s.batches(4, shuffle=True, seed=3))),
        ("grain_source()[i]", lambda s: [s.grain_source()[i] for i in (n - 1, 0, n // 2)]),
    ]
    return out


def indexes(n: int) -> dict[str, Any]:
    """The batched indexes the grid loads: all, a slice, a step, sorted and unsorted
    indices with repeats."""
    picks = np.array([n - 1, 0, n // 2, n // 2, 1, n - 2, 0]) % n
    return {
        "all": slice(None),
        "slice": slice(min(3, n - 1), max(n - 2, 1)),
        "step": slice(1, None, 4),
        "sorted": np.unique(picks),
        "unsorted": picks,
    }


# ---- the grid ------------------------------------------------------------------------------------


def as_host(tree: Any) -> Any:
    return jax.tree.map(host, tree)


def check_written(got: dict[str, Outcome], written: list, kind: str) -> None:
    """The reads that return records exactly (``load(i)``, ``records()``; in a fixed store
    every numpy load and Grain's records) hold the records written."""
    rows = [as_host(r) for r in written]
    n = len(rows)
    want: dict[str, Any] = {"records()": rows}
    for i in sorted({0, n // 2, n - 1, -min(3, n)}):
        want[f"load({i}, as_numpy=True)"] = rows[i]
    if kind == "fixed":
        stacked = jax.tree.map(lambda *x: np.stack(x), *rows)
        for name, index in indexes(n).items():
            want[f"load({name})"] = jax.tree.map(lambda a, index=index: a[index], stacked)
        want["load(columns=)"] = jax.tree_util.tree_map_with_path(
            lambda path, a: a if keystr(path) == "['d']['v']" else None, stacked
        )
        want["grain_source()[i]"] = [rows[i] for i in (n - 1, 0, n // 2)]
    for what, tree in want.items():
        if what not in got:
            continue
        value = got[what]
        assert isinstance(value, tuple), f"{what} raised {value}"
        assert_same_bytes(value, flat(tree), f"{what} against the records written")


def compare(path: Path, written: list, kind: str) -> None:
    """Every read of :func:`reads` through both paths (a reader each, no cache): the same
    bytes or the same error class; and the records written."""
    got: dict[bool, dict[str, Outcome]] = {}
    for on in (True, False):
        with direct(on), pytreestore.open(path, backend=BACKEND, cache_bytes=0) as reader:
            got[on] = {
                what: outcome(lambda read=read: read(reader)) for what, read in reads(len(written))
            }
    for what in got[True]:
        assert_same_outcome(got[True][what], got[False][what], what)
    check_written(got[False], written, kind)


GRID = list(itertools.product(DTYPES, CODECS, LAYOUTS))
#: every dtype once and every codec with every layout: the cells ``make test`` runs
GRID_DEFAULT = [
    (DTYPES[i % len(DTYPES)], *pair) for i, pair in enumerate(itertools.product(CODECS, LAYOUTS))
]


@pytest.mark.parametrize(("dtype", "codec", "layout"), tiered(GRID, GRID_DEFAULT))
def test_every_dtype_codec_and_layout_reads_the_same_bytes(tmp_path, dtype, codec, layout):
    written = make(tmp_path / "s", "fixed", dtype, codec, layout)
    compare(tmp_path / "s", written, "fixed")


#: the dtypes the kinds' grid puts in each kind of store: each item size, a float8, bfloat16
KIND_DTYPES = ("bool", "float8_e5m2", "bfloat16", "int32", "complex128")
KINDS = [k for k in kinds.KINDS if k != "fixed"]  # a fixed store: the grid above
KIND_GRID = list(itertools.product(KINDS, CODECS, LAYOUTS, KIND_DTYPES))
#: every kind in two layouts (every layout in some kind), the codecs and dtypes in turn
KIND_DEFAULT = [
    (kind, CODECS[i % len(CODECS)], layout, KIND_DTYPES[i % len(KIND_DTYPES)])
    for i, (kind, layout) in enumerate(
        diagonal(KINDS, list(LAYOUTS)) + diagonal(KINDS, list(LAYOUTS), 3)
    )
]


@pytest.mark.parametrize(("kind", "codec", "layout", "dtype"), tiered(KIND_GRID, KIND_DEFAULT))
def test_every_kind_of_store_reads_the_same_bytes(tmp_path, kind, codec, layout, dtype):
    written = make(tmp_path / "s", kind, dtype, codec, layout)
    compare(tmp_path / "s", written, kind)


@pytest.mark.parametrize("n", [1, pytest.param(5, marks=SLOW), 8, pytest.param(16, marks=SLOW), 17])
@pytest.mark.parametrize(("codec", "layout"), [("zstd", "inner16"), (None, "plain")])
def test_stores_ending_at_and_inside_a_chunk_read_the_same_bytes(tmp_path, n, codec, layout):
    """One record; less than a chunk; a chunk exactly; two chunks exactly; one more."""
    written = make(tmp_path / "s", "fixed", "float32", codec, layout, n=n)
    compare(tmp_path / "s", written, "fixed")


@pytest.mark.parametrize(("codec", "layout"), [(None, "plain"), ("zstd", "inner16")])
def test_a_memory_store_reads_the_same_bytes(codec, layout, request):
    path = f"memory://direct-conformance-{request.node.callspec.id}"
    written = make(path, "ragged_list", "bfloat16", codec, layout)  # type: ignore[arg-type]
    compare(path, written, "ragged_list")  # type: ignore[arg-type]


#: a leaf whose chunks split its own axes too: 16 records of it exceed twice the 4 MiB chunk
#: target, so each chunk holds 2 of its 3 rows (``chunks[1:] != shape``); its chunk grid has a
#: part-filled edge on the leaf's axis as well as on the record axis
BIG = (3, 45_000)


@pytest.mark.parametrize(("codec", "layout"), [(None, "plain"), ("zstd", "inner64")])
def test_a_leaf_split_on_its_own_axes_reads_the_same_bytes(tmp_path, codec, layout):
    def row(i: int) -> dict[str, Any]:
        big = (np.arange(np.prod(BIG), dtype=np.float32).reshape(BIG) * 3 + i) % 65_521
        return {"big": big, "t": np.int32(i), "u": np.array([i, -i], np.float32)}

    written = [row(i) for i in range(6)]
    options = {"chunk_records": 16, "codec": codec, **LAYOUTS[layout]}
    with pytreestore.create(tmp_path / "s", row(0), backend=BACKEND, **options) as store:
        (column,) = [c for c in store.schema.columns if c.path == "['big']"]
        assert column.chunks == (16, 2, BIG[1]), column.chunks
        store.extend(written)
    rows = [as_host(r) for r in written]
    stacked = jax.tree.map(lambda *x: np.stack(x), *rows)
    loads: dict[str, Any] = {"5": 5, "-2": -2, "1:5": slice(1, 5), "[5, 0, 4, 4]": [5, 0, 4, 4]}
    for on in (True, False):
        with direct(on), pytreestore.open(tmp_path / "s", backend=BACKEND, cache_bytes=0) as r:
            for what, index in loads.items():
                want = (
                    rows[index]
                    if isinstance(index, int)
                    else jax.tree.map(lambda a, index=index: a[index], stacked)
                )
                got = flat(r.load(index, as_numpy=True))
                assert_same_bytes(got, flat(want), f"load({what}), direct={on}")
            assert_same_bytes(flat(list(r.records(as_numpy=True))), flat(rows), "records()")


# ---- damage --------------------------------------------------------------------------------------

#: the damaged store: 11 records in chunks of 4; column ``['a']`` (12 bytes a record: one record
#: an inner chunk at ``inner16``) is damaged in its chunk 1, records 4 to 7
DAMAGED_CHUNK = "a/c/1/0"
DAMAGE_LAYOUTS = [(None, "plain"), ("zstd", "plain"), (None, "inner16"), ("zstd", "inner16")]
#: the layouts ``make test`` damages every way (the others: a flipped byte only)
DAMAGE_DEFAULT = [(None, "plain"), ("zstd", "inner16")]


def damage_rows(i: int) -> dict[str, Any]:
    return {"a": np.array([i, -i, i / 7], np.float32), "b": np.int64(i * 1_000_003)}


def damage_store(path: Path, codec: str | None, layout: str) -> list[dict[str, Any]]:
    written = [damage_rows(i) for i in range(11)]
    options = {"chunk_records": 4, "codec": codec, **LAYOUTS[layout]}
    with pytreestore.create(path, written[0], backend=BACKEND, **options) as store:
        store.extend(written)
    return written


def inner_chunks(path: Path, key: str) -> int:
    """Inner chunks in a shard of column ``key`` (from its ``zarr.json``, docs/format.md)."""
    meta = json.loads((path / key / "zarr.json").read_text())
    (codec,) = meta["codecs"]
    outer, inner = meta["chunk_grid"]["configuration"]["chunk_shape"], codec["configuration"]
    return int(np.prod([o // i for o, i in zip(outer, inner["chunk_shape"])]))


def shard_index(data: bytes, count: int) -> np.ndarray:
    """A shard's index (its end: ``(offset, nbytes)`` per inner chunk, then a crc32c)."""
    return np.frombuffer(data[-(16 * count + 4) : -4], "<u8").reshape(count, 2).copy()


def with_index(data: bytes, index: np.ndarray) -> bytes:
    """``data`` with its shard index replaced by ``index``, whose checksum is right."""
    body = index.astype("<u8").tobytes()
    return data[: -(len(body) + 4)] + body + google_crc32c.value(body).to_bytes(4, "little")


def flip(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x10
    return bytes(out)


Damage = Callable[[Path, int], set[int]]


def _flip_data(file: Path, inner: int) -> set[int]:
    """A flipped byte in the chunk's data (in a shard, in inner chunk 0's)."""
    data = file.read_bytes()
    at = 2 if not inner else int(shard_index(data, inner)[0, 0]) + 2
    file.write_bytes(flip(data, at))
    return {4} if inner else {4, 5, 6, 7}


def _flip_index(file: Path, inner: int) -> set[int]:
    data = file.read_bytes()
    file.write_bytes(flip(data, len(data) - 4 - 16 * inner + 3))
    return {4, 5, 6, 7}


def _truncate(file: Path, inner: int) -> set[int]:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    return {4, 5, 6, 7}


def _empty(file: Path, inner: int) -> set[int]:
    file.write_bytes(b"")
    return {4, 5, 6, 7}


def _past_the_end(file: Path, inner: int) -> set[int]:
    """Inner chunk 1's index entry points past the shard's end (its checksum right)."""
    data = file.read_bytes()
    index = shard_index(data, inner)
    index[1, 0] = len(data) + 64
    file.write_bytes(with_index(data, index))
    return {5}


def _index_entry_missing(file: Path, inner: int) -> set[int]:
    """Inner chunk 2 marked absent in the index (its checksum right): committed records lost."""
    data = file.read_bytes()
    index = shard_index(data, inner)
    index[2] = np.iinfo(np.uint64).max
    file.write_bytes(with_index(data, index))
    return {6}


def _missing(file: Path, inner: int) -> set[int]:
    file.unlink()
    return {4, 5, 6, 7}


def _folder(file: Path, inner: int) -> set[int]:
    file.unlink()
    file.mkdir()
    return {4, 5, 6, 7}


def _unreadable(file: Path, inner: int) -> set[int]:
    if os.geteuid() == 0:
        pytest.skip("root reads a file whatever its mode")
    file.chmod(0)
    return {4, 5, 6, 7}


#: each damage, and whether it needs inner chunks (a shard index)
DAMAGES: dict[str, tuple[Damage, bool]] = {
    "flipped byte": (_flip_data, False),
    "flipped index byte": (_flip_index, True),
    "truncated": (_truncate, False),
    "empty": (_empty, False),
    "index past the end": (_past_the_end, True),
    "index entry missing": (_index_entry_missing, True),
    "missing": (_missing, False),
    "folder": (_folder, False),
    "unreadable": (_unreadable, False),
}


def damage_reads() -> list[tuple[str, Any, list[int]]]:
    """``(what, index, rows read)``: every record alone, and batched reads."""
    out: list[tuple[str, Any, list[int]]] = [(f"load({i})", i, [i]) for i in range(11)]
    out += [("load()", slice(None), list(range(11))), ("load(4:8)", slice(4, 8), [4, 5, 6, 7])]
    out += [
        ("load(2:5)", slice(2, 5), [2, 3, 4]),
        ("load([9, 5, 0, 6])", [9, 5, 0, 6], [9, 5, 0, 6]),
    ]
    return out


def attempt(read: Callable[[], Any]) -> Any:
    """What ``read`` gives, or the ``PyTreeStoreError`` it raised."""
    try:
        return read()
    except errors.PyTreeStoreError as err:
        return err


def damage_cells() -> list[Any]:
    cells = []
    for (codec, layout), (name, (_, needs_inner)) in itertools.product(
        DAMAGE_LAYOUTS, DAMAGES.items()
    ):
        if needs_inner and layout == "plain":
            continue
        marks = [] if (codec, layout) in DAMAGE_DEFAULT or name == "flipped byte" else [SLOW]
        cells.append(pytest.param(codec, layout, name, marks=marks, id=f"{codec}-{layout}-{name}"))
    return cells


@pytest.mark.parametrize(("codec", "layout", "damage"), damage_cells())
def test_damage_raises_the_same_error_on_both_paths(tmp_path, codec, layout, damage):
    """Every read that needs a damaged record raises ``CorruptChunkError`` naming the
    column, the chunk and its key (``StorageError`` for a file that cannot be opened), the
    same class through the direct reader and through TensorStore; every other read returns
    exactly the records written: never wrong bytes. Each read has a reader of its own (one
    reader's reads of records in turn read ahead: see the test below)."""
    written = damage_store(tmp_path / "s", codec, layout)
    inner = 0 if layout == "plain" else inner_chunks(tmp_path / "s", "a")
    lost = DAMAGES[damage][0](tmp_path / "s" / DAMAGED_CHUNK, inner)
    rows = [as_host(r) for r in written]
    stacked = jax.tree.map(lambda *x: np.stack(x), *rows)
    want_class = errors.StorageError if damage == "unreadable" else errors.CorruptChunkError
    got: dict[bool, list[Any]] = {True: [], False: []}
    for (_, index, _), on in itertools.product(damage_reads(), (True, False)):
        with direct(on), pytreestore.open(tmp_path / "s", backend=BACKEND, cache_bytes=0) as r:
            got[on].append(attempt(lambda: r.load(index, as_numpy=True)))  # noqa: B023
    for k, (what, index, read) in enumerate(damage_reads()):
        note = f"{what} with {damage}"
        for on in (True, False):
            value, path = got[on][k], "direct reader" if on else "TensorStore"
            if not lost & set(read):
                assert not isinstance(value, Exception), f"{note}, {path}: {value!r}"
                want = (
                    rows[index]
                    if isinstance(index, int)
                    else jax.tree.map(lambda a, index=index: a[index], stacked)
                )
                assert_same_bytes(flat(value), flat(want), f"{note}, {path}")
                continue
            assert type(value) is want_class, f"{note}, {path}: {value!r}"
            if isinstance(value, errors.CorruptChunkError):
                where = (value.path, value.chunk, value.key)
                assert where == ("['a']", (1, 0), DAMAGED_CHUNK), f"{note}, {path}: {value!r}"
                assert f"['a']: chunk (1, 0) ({DAMAGED_CHUNK})" in str(value), f"{value}"


@pytest.mark.parametrize("on", [True, False], ids=["direct", "engine"])
def test_records_read_in_turn_before_a_damaged_chunk_read(tmp_path, on):
    """``load(i)`` for ``i`` in turn (read ahead in blocks) returns records 0 to 3, intact,
    though chunk 1 after them is damaged; record 4 raises."""
    written = damage_store(tmp_path / "s", "zstd", "plain")
    _flip_data(tmp_path / "s" / DAMAGED_CHUNK, 0)
    with direct(on), pytreestore.open(tmp_path / "s", backend=BACKEND, cache_bytes=0) as r:
        for i in range(4):
            assert_same_bytes(flat(r.load(i, as_numpy=True)), flat(written[i]), f"load({i})")
        with pytest.raises(errors.CorruptChunkError, match=r"\['a'\]: chunk \(1, 0\)"):
            r.load(4, as_numpy=True)


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_inner_chunks_are_found_through_the_shard_index(tmp_path, codec):
    """Two entries of a shard's index swapped (its checksum right): each inner chunk is where
    the index says, so both paths read records 4 and 5 swapped, not where a fixed layout
    would put them."""
    written = damage_store(tmp_path / "s", codec, "inner16")
    file = tmp_path / "s" / DAMAGED_CHUNK
    data = file.read_bytes()
    index = shard_index(data, inner_chunks(tmp_path / "s", "a"))
    file.write_bytes(with_index(data, index[[1, 0, *range(2, len(index))]]))
    want = np.stack([r["a"] for r in written])
    want[[4, 5]] = want[[5, 4]]
    for on in (True, False):
        with direct(on), pytreestore.open(tmp_path / "s", backend=BACKEND, cache_bytes=0) as r:
            np.testing.assert_array_equal(r.load(as_numpy=True)["a"], want)
            np.testing.assert_array_equal(r.load(5, as_numpy=True)["a"], want[5])
            np.testing.assert_array_equal(r.load([5, 9, 4], as_numpy=True)["a"], want[[5, 9, 4]])


#: the direct reader on; off (TensorStore alone, the control) in ``make test-long``
ON_OFF = [pytest.param(True, id="direct"), pytest.param(False, id="engine", marks=SLOW)]


# ---- readers beside a writer ---------------------------------------------------------------------


def beside_row(i: int) -> dict[str, Any]:
    """Record ``i`` of the stores read beside their writer: its values say which it is."""
    return {
        "a": np.array([i, i + 0.5, -i], np.float32),
        "i": np.int64(i),
        "m": np.full((2, 2), i % 251, np.uint8),
    }


def check_rows(got: Any, index: Any, what: str) -> None:
    """``got`` (``load(index, as_numpy=True)``) holds records ``index`` of :func:`beside_row`."""
    one = isinstance(index, int | np.integer)
    picks = np.atleast_1d(np.arange(1 << 20)[index] if isinstance(index, slice) else index)
    want = jax.tree.map(lambda *x: np.stack(x), *[beside_row(int(i)) for i in picks])
    if one:
        want = jax.tree.map(lambda a: a[0], want)
    assert_same_bytes(flat(got), flat(want), what)


class ThreadReads:
    """Threads that read one shared reader (refreshed by the test's thread) until stopped:
    single records, the tail, gathers, each checked against :func:`beside_row`."""

    def __init__(self, reader: pytreestore.TreeStore, threads: int) -> None:
        self.reader, self.stop, self.reads = reader, threading.Event(), 0
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(k,)) for k in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self, k: int) -> None:
        rng = np.random.default_rng(k)
        try:
            while not self.stop.is_set():
                n = len(self.reader)
                for index in (n - 1, slice(max(n - 5, 0), n), rng.integers(0, n, 6)):
                    check_rows(self.reader.load(index, as_numpy=True), index, f"thread {k}")
                    self.reads += 1
        except BaseException as err:  # handed to the test's thread
            self.errors.append(err)

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        if self.errors:
            raise self.errors[0]


@pytest.mark.parametrize("on", ON_OFF)
@pytest.mark.parametrize(("codec", "layout"), [(None, "plain"), ("zstd", "inner16")])
def test_threads_reading_while_the_writer_rewrites_the_last_chunk(tmp_path, on, codec, layout):
    """Four threads share one reader while the writer, in this process, appends and commits
    3 records at a time, so that each commit rewrites the last chunk (or shard) under them;
    the test's thread refreshes the reader after each commit. Every record read is the one
    written."""
    options = {"chunk_records": 8, "codec": codec, **LAYOUTS[layout]}
    writer = pytreestore.create(tmp_path / "s", beside_row(0), backend=BACKEND, **options)
    writer.extend([beside_row(i) for i in range(5)])
    writer.flush()
    with direct(on), pytreestore.open(tmp_path / "s", backend=BACKEND, cache_bytes=0) as reader:
        readers = ThreadReads(reader, 4)
        try:
            for start in range(5, 20, 3):
                writer.extend([beside_row(i) for i in range(start, start + 3)])
                writer.flush()
                assert reader.refresh() == start + 3
        finally:
            readers.join()
            writer.close()
        assert readers.reads >= 4, readers.reads
        check_rows(reader.load(as_numpy=True), slice(0, 20), "the whole store")


def read_beside_a_writer(args: tuple[str, bool]) -> dict[str, Any]:
    """Runs in another process: opens the store at ``path``, says so (a file ``opened``),
    waits for ``go`` and reads every record it saw at open, then refreshes and reads again;
    returns the counts and what differed."""
    path, on = args
    with direct(on):  # this worker process runs other jobs afterwards
        return _read_beside_a_writer(Path(path))


def _read_beside_a_writer(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with pytreestore.open(path, backend=BACKEND, cache_bytes=0) as reader:
        out["opened"] = len(reader)
        (path.parent / "opened").touch()
        deadline = time.monotonic() + 60
        while not (path.parent / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        for step in ("before refresh", "after refresh"):
            n = len(reader)
            out[step] = n
            try:
                check_rows(reader.load(as_numpy=True), slice(0, n), step)
                for i in range(n):
                    check_rows(reader.load(i, as_numpy=True), i, f"{step}: load({i})")
                picks = np.arange(n)[::-1]
                check_rows(reader.load(picks, as_numpy=True), picks, f"{step}: a gather")
            except AssertionError as err:
                out["error"] = str(err)
            reader.refresh()
    return out


@pytest.mark.parametrize("on", ON_OFF)
@pytest.mark.parametrize(("codec", "layout"), [(None, "plain"), ("zstd", "inner16")])
def test_a_reader_process_sees_committed_records_only(tmp_path, pool, on, codec, layout):
    """A reader in another process, opened before the writer grows the last chunk: it reads
    the records it saw at open, exactly, while that chunk holds more; after a refresh, the
    records committed since, and none of those still buffered."""
    path = tmp_path / "s"
    options = {"chunk_records": 8, "codec": codec, **LAYOUTS[layout]}
    writer = pytreestore.create(path, beside_row(0), backend=BACKEND, **options)
    writer.extend([beside_row(i) for i in range(10)])
    writer.flush()
    job = pool.apply_async(read_beside_a_writer, ((str(path), on),))
    deadline = time.monotonic() + 60
    while not (tmp_path / "opened").exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert (tmp_path / "opened").exists(), "the reader process did not open the store"
    writer.extend([beside_row(i) for i in range(10, 12)])  # chunk 1 grows: 8-11
    writer.flush()
    writer.extend([beside_row(i) for i in range(12, 14)])  # buffered, not committed
    (tmp_path / "go").touch()
    got = job.get(timeout=120)
    assert writer.committed == 12
    writer.close()
    assert got.pop("error", None) is None, got
    assert got == {"opened": 10, "before refresh": 10, "after refresh": 12}


# ---- after truncate, keep_last and vacuum, evolve ------------------------------------------------


#: the reads compared after each operation on versions
VERSION_READS = ("store[-3]", "load(0, as_numpy=True)", "load(all)", "load(unsorted)", "records()")


def model_reads(path: Path, written: list, kind: str, **options: Any) -> None:
    """Some of :func:`compare`'s reads at ``path`` (and ``open`` options): both paths, and
    the records written."""
    got: dict[bool, dict[str, Outcome]] = {}
    chosen = [(w, r) for w, r in reads(len(written)) if w in VERSION_READS]
    for on in (True, False):
        with direct(on), pytreestore.open(path, backend=BACKEND, cache_bytes=0, **options) as r:
            got[on] = {what: outcome(lambda read=read: read(r)) for what, read in chosen}
    for what in got[True]:
        assert_same_outcome(got[True][what], got[False][what], f"{what} {options}")
    check_written(got[False], written, kind)


def evolved(row: dict[str, Any], default: Any) -> dict[str, Any]:
    """``row`` after the evolve of :func:`test_versions_read_the_same_bytes`: ``['e']``
    added, ``['d']['m']`` renamed ``['d']['mm']``, ``['d']['s']`` dropped."""
    d = {k: v for k, v in row["d"].items() if k != "s"}
    d["mm"] = d.pop("m")
    return {**row, "d": d, "e": default}


@pytest.mark.parametrize(
    ("kind", "codec", "layout"),
    [
        ("fixed", None, "plain"),
        ("fixed", "zstd", "inner16"),
        ("ragged_axis", "blosc", "packed-inner"),
    ],
)
def test_versions_read_the_same_bytes(tmp_path, kind, codec, layout):
    """After ``truncate`` (and appends over the cut records), ``keep_last`` then ``vacuum``,
    and ``evolve`` (a column added, whose chunks before it are no files but its default; one
    renamed; one dropped), every read gives the same bytes on both paths and the model's
    records; so does every version still kept, opened by number."""
    path, dtype = tmp_path / "s", "float16"
    written = make(path, kind, dtype, codec, layout)
    kept: dict[int, list] = {}
    with pytreestore.open(path, "a", backend=BACKEND) as store:
        store.truncate(13)  # inside chunk 1, and inside an inner chunk
        written = written[:13]
        model_reads(path, written, kind)
        more = [record(kind, dtype, 100 + i) for i in range(6)]
        store.extend(more)
        store.flush()
        written += more
        model_reads(path, written, kind)
        kept[store.version] = list(written)
        assert store.keep_last(9) == 10
        store.vacuum()
        written = written[-9:]
        model_reads(path, written, kind)
        kept[store.version] = list(written)
        default = np.full(2, 7.25, np.float32)
        store.evolve(
            add={"['e']": default}, rename={"['d']['m']": "['d']['mm']"}, drop=["['d']['s']"]
        )
        written = [evolved(r, default) for r in written]
        assert (path / "e").is_dir() and not list((path / "e").rglob("c/0*")), "chunk 0 of ['e']"
        more = [
            evolved(record(kind, dtype, 200 + i), np.array([i, -i], np.float32)) for i in range(5)
        ]
        store.extend(more)
        store.flush()
        written += more
        kept[store.version] = list(written)
        versions = [v.version for v in store.versions() if v.readable]
    model_reads(path, written, kind)
    for number, records in kept.items():
        if number in versions:
            model_reads(path, records, kind, version=number)


@pytest.mark.parametrize("default", [0.0, -2.5])
@pytest.mark.parametrize(("codec", "layout"), tiered(DAMAGE_LAYOUTS, DAMAGE_DEFAULT))
def test_chunks_an_evolved_column_never_wrote_read_its_default(tmp_path, codec, layout, default):
    """A column added by ``evolve`` has no chunk files for the records before it (the
    column's fill value, 0, or another default): both paths read its default there, and
    what was appended after."""
    written = damage_store(tmp_path / "s", codec, layout)
    with pytreestore.open(tmp_path / "s", "a", backend=BACKEND) as store:
        store.evolve(add={"['c']": np.full(2, default, np.float32)})
        store.extend([{**damage_rows(i), "c": np.array([i, 1], np.float32)} for i in range(11, 13)])
    assert not list((tmp_path / "s" / "c").rglob("c/0*")), "a chunk 0 of ['c']"
    want = np.stack(
        [np.full(2, default, np.float32)] * 11 + [np.array([i, 1], np.float32) for i in (11, 12)]
    )
    for on in (True, False):
        with direct(on), pytreestore.open(tmp_path / "s", backend=BACKEND, cache_bytes=0) as r:
            np.testing.assert_array_equal(r.load(as_numpy=True)["c"], want)
            np.testing.assert_array_equal(r.load(3, as_numpy=True)["c"], want[3])
            np.testing.assert_array_equal(r.load([12, 2, 9], as_numpy=True)["c"], want[[12, 2, 9]])
            assert len(r) == len(written) + 2
