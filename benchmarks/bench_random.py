"""Random access beyond memory (issue 31): shuffled batches, cold single records, gathers and
full loads of a store eight times the size of its decoded-chunk cache, against ArrayRecord
(Grain's format) and Lance holding the same records.

One store of N records of a 20-leaf, 3-level record (1,436 bytes: float32 and int leaves of a
few shapes, up to float32[10, 16]; noisy floats, with the pixels and depths quantised to 256
levels so that zstd has something to do) is written once per run with the defaults (zstd,
default chunking). Its decoded size is at least 8x the cache: `PYTREESTORE_CACHE_BYTES` is set
to a eighth of it for the run and restored afterwards. The shared cache is made when the
process opens its first store without `cache_bytes`; when an earlier module made it already
with another bound, the variable cannot apply and the stores open with `cache_bytes=` of the
same size instead (each row's notes say which). The same records are written as an ArrayRecord
file (`group_size:1`, its default zstd; each record a msgpack dict of leaf name -> bytes,
dtype and shape, as Grain users write them), read as Grain does
(`readahead_buffer_size:0`, a 32 KiB file buffer), and as a Lance dataset (one column per
leaf, fixed-size lists for array leaves).

* **shuffled-batch**: the steady time per batch of 1,024 from `store.batches(1024,
  shuffle=True)` (jax.Array leaves, `block_until_ready`), the consecutive batches of one
  iterator after a few warm-up batches (timed alone: the iterator reads ahead in the
  background, so another reader timed between its batches would share the cores with it),
  against ArrayRecord `reader.read(idx)` + msgpack decode to one numpy array per leaf, and
  against Lance `take(idx)` to numpy, each with fresh random `idx` of 1,024 per run, side by
  side. Two rows, one per anchor.
* **shuffled-epoch**: one epoch of `batches(1024, shuffle=True)` against one epoch of
  `batches(1024)` of the same store; ratio sequential time / shuffled time.
* **cold-record**: `store.load(i, as_numpy=True)` of a fresh random `i` per run whose chunks
  are not in the cache (an `i` whose chunk row is among the rows the cache could hold that
  were read last is drawn again), against ArrayRecord `read([i])` + decode and Lance
  `take([i])`, each with its own fresh random `i`. Two rows, one per anchor.
* **full-load**: `store.load(as_numpy=True)` against raw TensorStore reading every column of
  the same store (every array opened with `ts.open` beforehand, all reads issued together).
* **gather-1000**: `store.load(idx, as_numpy=True)` of 1,000 fresh random unsorted indices on
  the store opened with `cache_bytes=0`, against Lance `take(idx)`.

The bulk write of 1 GiB (`extend_batch` against `np.save` + fsync, goal >= 0.8) is the
**bulk-write** row of `bench_anchors.py`; it is not repeated here. Every output is checked
against the expected arrays outside the timed regions (a batch by the record index each record
carries). Rows whose anchor is not installed (`pip install -e ".[bench]"`) are kept with n/a
times and a note saying why.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import gc
import itertools
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from _anchors_common import (
    _arrow_table,
    _guarded,
    _lance_take,
    _leaf_names,
    _need,
    _scratch,
    _Skip,
    _skipped,
)
from _common import Case, Goal, Result, Timed, Timing, at_least
from _common import measure_side_by_side as side_by_side
from bench_core import _check_leaves, _raw_open, _raw_read

import pytreestore
from pytreestore._read import cache as _cache  # only to see whether the shared cache exists

TITLE = "Random access beyond memory: ArrayRecord, Lance, raw TensorStore"

BATCH = 1_024
GATHER = 1_000
CACHE_VAR = "PYTREESTORE_CACHE_BYTES"
CACHE_SHARE = 8  # the store's decoded bytes over the cache's bound
INDEX = "meta/index"  # the leaf holding each record's own index


@dataclass(frozen=True)
class Sizes:
    records: int
    batch_warmup: int
    batch_repeats: int
    epoch_repeats: int
    cold_repeats: int
    load_repeats: int
    gather_repeats: int


FULL = Sizes(300_000, 3, 30, 2, 200, 5, 10)
QUICK = Sizes(8_192, 1, 3, 1, 5, 1, 1)

# --- the record ---------------------------------------------------------------------------------

LEAVES: dict[str, tuple[str, tuple[int, ...]]] = {
    "obs/camera/pixels": ("float32", (10, 16)),
    "obs/camera/depth": ("float32", (32,)),
    "obs/lidar/ranges": ("float32", (48,)),
    "obs/lidar/hits": ("int32", (8,)),
    "obs/proprio/joints": ("float32", (12,)),
    "obs/proprio/velocity": ("float32", (12,)),
    "obs/proprio/contact": ("int32", (4,)),
    "action/continuous": ("float32", (8,)),
    "action/discrete": ("int32", ()),
    "action/logits": ("float32", (16,)),
    "policy/value": ("float32", ()),
    "policy/log_prob": ("float32", ()),
    "policy/hidden": ("float32", (32,)),
    "reward": ("float32", ()),
    "done": ("int32", ()),
    "meta/index": ("int32", ()),
    "meta/episode": ("int32", ()),
    "info/goal": ("float32", (3,)),
    "info/stats/returns": ("float32", (16,)),
    "info/stats/lengths": ("int32", ()),
}
QUANTISED = ("obs/camera/pixels", "obs/camera/depth")
RECORD_BYTES = sum(np.dtype(d).itemsize * math.prod(s) for d, s in LEAVES.values())


def _column(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    dtype, shape = LEAVES[name]
    if name == INDEX:
        return np.arange(n, dtype=dtype)
    if dtype != "float32":
        return rng.integers(0, 1_000, (n, *shape), dtype=dtype)
    if name in QUANTISED:
        return (rng.integers(0, 256, (n, *shape)) / np.float32(255)).astype(np.float32)
    return rng.standard_normal((n, *shape), dtype=np.float32)


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a/b/c": x}`` as ``{"a": {"b": {"c": x}}}``."""
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


# --- the store, the ArrayRecord file and the Lance dataset, written once per run ----------------


@dataclass
class _Data:
    root: Path
    n: int
    like: Any
    names: list[str]  # leaf names in the order of ``expected``
    expected: list[np.ndarray]  # every leaf's column
    store: Path
    arecord: Path | None
    lance: Path | None
    skipped: dict[str, str]  # anchor -> why it is not there

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.expected)

    @property
    def cache_bytes(self) -> int:
        return _cache_bytes(self.n)

    @property
    def index_leaf(self) -> int:
        return self.names.index(INDEX)

    def picked(self, idx: Any) -> list[np.ndarray]:
        return [e[idx] for e in self.expected]

    def need(self, anchor: str) -> Path:
        path = {"arrayrecord": self.arecord, "lance": self.lance}[anchor]
        if path is None:
            raise _Skip(self.skipped[anchor])
        return path


def _cache_bytes(n: int) -> int:
    """The cache's bound for a store of ``n`` records: an eighth of its decoded bytes."""
    return n * RECORD_BYTES // CACHE_SHARE


def _disk_bytes(path: Path) -> int:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files)


@functools.cache
def _data(n: int) -> _Data:
    """The records in all three formats, under a directory removed when the process exits."""
    rng = np.random.default_rng(31)
    flat = {name: _column(name, n, rng) for name in LEAVES}
    batch = _nest(flat)
    like = jax.tree.map(lambda c: c[0], batch)
    names = _leaf_names(like)
    expected = [flat[name] for name in names]
    stack = contextlib.ExitStack()
    root = stack.enter_context(_scratch("pytreestore-random-"))
    atexit.register(stack.close)
    with pytreestore.create(str(root / "store"), like) as store:
        store.extend_batch(batch)
    data = _Data(root, n, like, names, expected, root / "store", None, None, {})
    for anchor, write in (("arrayrecord", _write_arecord), ("lance", _write_lance)):
        try:
            setattr(data, anchor if anchor == "lance" else "arecord", write(data))
        except _Skip as why:
            data.skipped[anchor] = str(why)
    # Move what is alive now out of the collector's way: the full collection before each
    # timed run then costs microseconds, not a walk over JAX's and the anchors' objects.
    gc.freeze()
    return data


def _pack(data: _Data, i: int) -> bytes:
    msgpack = _need("msgpack", "msgpack")
    record = {
        name: {"data": e[i].tobytes(), "dtype": e.dtype.str, "shape": list(e.shape[1:])}
        for name, e in zip(data.names, data.expected, strict=True)
    }
    return msgpack.packb(record)


def _write_arecord(data: _Data) -> Path:
    module = _need("array_record.python.array_record_module", "array-record")
    path = data.root / "records.arecord"
    writer = module.ArrayRecordWriter(str(path), "group_size:1")
    try:
        for i in range(data.n):
            writer.write(_pack(data, i))
    finally:
        writer.close()
    return path


def _write_lance(data: _Data) -> Path:
    lance = _need("lance", "pylance")
    path = data.root / "records.lance"
    lance.write_dataset(_arrow_table(data.names, data.expected), str(path))
    return path


def _arecord_reader(data: _Data) -> Any:
    path = data.need("arrayrecord")
    module = _need("array_record.python.array_record_module", "array-record")
    return module.ArrayRecordReader(
        str(path), "readahead_buffer_size:0", file_reader_buffer_size=32768
    )


def _arecord_read(reader: Any, idx: Sequence[int], names: Sequence[str]) -> list[np.ndarray]:
    """Records ``idx`` as one array per leaf: each record unpacked, each leaf's bytes joined."""
    unpackb = _need("msgpack", "msgpack").unpackb
    records = [unpackb(blob) for blob in reader.read(list(idx))]
    out = []
    for name in names:
        first = records[0][name]
        joined = b"".join(r[name]["data"] for r in records)
        array = np.frombuffer(joined, dtype=np.dtype(first["dtype"]))
        out.append(array.reshape(len(records), *first["shape"]))
    return out


def _lance_dataset(data: _Data) -> tuple[Any, Any]:
    lance = _need("lance", "pylance")
    return lance, lance.dataset(str(data.need("lance")))


def _shapes(data: _Data) -> list[tuple[int, ...]]:
    return [e.shape[1:] for e in data.expected]


# --- the cache bound ----------------------------------------------------------------------------


@contextlib.contextmanager
def _bounded_cache(limit: int) -> Iterator[tuple[int | None, str]]:
    """``PYTREESTORE_CACHE_BYTES=limit`` for the block (restored after): the ``cache_bytes`` to
    open a store with (None: the default) so that it reads through a cache of ``limit`` bytes,
    and a note saying how."""
    old = os.environ.get(CACHE_VAR)
    os.environ[CACHE_VAR] = str(limit)
    made = _cache._SHARED  # the shared cache, once a store made it (pytreestore/_read/cache.py)
    fresh = not made
    try:
        if fresh or (made[0] is not None and made[0].limit == limit):
            yield (
                None,
                (
                    "The store was opened with the defaults (no `cache_bytes`): the shared cache "
                    f"was made under `{CACHE_VAR}={limit}` ({limit / 2**20:.1f} MiB)."
                ),
            )
        else:
            yield (
                limit,
                (
                    "The shared cache was made before this module ran, under another bound, so "
                    f"`{CACHE_VAR}` could not apply: the store was opened with "
                    f"`cache_bytes={limit}` ({limit / 2**20:.1f} MiB), a cache of its own."
                ),
            )
    finally:
        if old is None:
            os.environ.pop(CACHE_VAR, None)
        else:
            os.environ[CACHE_VAR] = old
        if fresh:  # the next store makes the shared cache again, under the restored bound
            made.clear()


@contextlib.contextmanager
def _opened(sizes: Sizes) -> Iterator[tuple[_Data, Any, list[str]]]:
    """The data, its store opened as the rows read it, and notes on both."""
    with contextlib.ExitStack() as stack:
        cache_bytes, how = stack.enter_context(_bounded_cache(_cache_bytes(sizes.records)))
        data = _data(sizes.records)  # written on first use, under the bound
        store = stack.enter_context(pytreestore.open(str(data.store), cache_bytes=cache_bytes))
        yield data, store, [_about(data, store), how]


def _about(data: _Data, store: Any) -> str:
    chunk = min(c.chunks[0] for c in store.schema.columns)
    sizes = [f"store {_disk_bytes(data.store) / 2**20:.0f} MiB on disk"]
    if data.arecord is not None:
        sizes.append(f"ArrayRecord {_disk_bytes(data.arecord) / 2**20:.0f} MiB")
    if data.lance is not None:
        sizes.append(f"Lance {_disk_bytes(data.lance) / 2**20:.0f} MiB")
    return (
        f"{data.n:,} records of {data.nbytes // data.n:,} bytes in {len(data.names)} leaves: "
        f"{data.nbytes / 2**20:.0f} MiB decoded, {chunk:,} records per chunk; "
        f"{', '.join(sizes)}."
    )


# --- checks (outside the timed regions) ---------------------------------------------------------


def _check_batch(what: str, batch: Any, data: _Data) -> np.ndarray:
    """Checks a batch of jax.Array leaves by the index each record carries; returns those."""
    expected_def = jax.tree.structure(data.like)
    if jax.tree.structure(batch) != expected_def:
        raise RuntimeError(f"{what}: structure {jax.tree.structure(batch)} is not the record's")
    leaves = [np.asarray(x) for x in jax.tree.leaves(batch)]
    idx = leaves[data.index_leaf]
    if idx.min() < 0 or idx.max() >= data.n:
        raise RuntimeError(f"{what}: record indices out of range: {idx.min()}..{idx.max()}")
    _check_leaves(what, leaves, data.picked(idx))
    return idx


def _check_epoch(what: str, batches: Sequence[Any], data: _Data, shuffled: bool) -> None:
    idx = np.concatenate([_check_batch(what, b, data) for b in batches])
    if not np.array_equal(np.sort(idx), np.arange(data.n)):
        raise RuntimeError(f"{what}: the epoch is not every record once")
    if shuffled == np.array_equal(idx, np.arange(data.n)):
        raise RuntimeError(f"{what}: the records came {'in' if shuffled else 'out of'} order")


def _check_record(what: str, got: Any, data: _Data, i: int) -> None:
    if jax.tree.structure(got) != jax.tree.structure(data.like):
        raise RuntimeError(f"{what}: structure {jax.tree.structure(got)} is not the record's")
    _check_leaves(what, jax.tree.leaves(got), data.picked(i))


# --- shuffled batches ---------------------------------------------------------------------------


def _our_batches(store: Any, sizes: Sizes, data: _Data) -> Timing:
    """Seconds per batch of consecutive shuffled batches, after the warm-up ones."""
    times, batches = [], []
    with store.batches(BATCH, shuffle=True, seed=31) as it:
        for _ in range(sizes.batch_warmup + sizes.batch_repeats):
            start = time.perf_counter()
            batch = jax.block_until_ready(next(it))
            times.append(time.perf_counter() - start)
            batches.append(batch)
    for batch in batches:  # after the iterator closed: its reads ahead are over
        _check_batch("batches(shuffle=True)", batch, data)
    return Timing(tuple(times[sizes.batch_warmup :]))


def _draw(n: int, k: int, seed: int) -> Callable[[], np.ndarray]:
    rng = np.random.default_rng(seed)
    return lambda: rng.choice(n, k, replace=False)


def _draw_one(n: int, seed: int) -> Callable[[], int]:
    rng = np.random.default_rng(seed)
    return lambda: int(rng.integers(n))


def _anchor_batches(sizes: Sizes, data: _Data) -> dict[str, Timing | str]:
    """Per anchor, the seconds per batch of 1,024 random records, or why it was skipped."""
    timed: dict[str, Timed] = {}
    out: dict[str, Timing | str] = {}
    repeats, warmup = sizes.batch_repeats, sizes.batch_warmup
    try:
        reader = _arecord_reader(data)
        timed["arrayrecord"] = Timed(
            lambda idx: _arecord_read(reader, idx, data.names),
            repeats,
            warmup,
            setup=_draw(data.n, BATCH, 1),
            teardown=lambda idx, got: _check_leaves("ArrayRecord", got, data.picked(idx)),
        )
    except _Skip as why:
        out["arrayrecord"] = str(why)
    try:
        _, dataset = _lance_dataset(data)
        timed["lance"] = Timed(
            lambda idx: _lance_take(dataset, idx, _shapes(data)),
            repeats,
            warmup,
            setup=_draw(data.n, BATCH, 2),
            teardown=lambda idx, got: _check_leaves("Lance take", got, data.picked(idx)),
        )
    except _Skip as why:
        out["lance"] = str(why)
    out.update(zip(timed, side_by_side(*timed.values()), strict=True))
    return out


def _case_shuffled_batch(sizes: Sizes) -> list[Result]:
    with _opened(sizes) as (data, store, notes):
        ours = _our_batches(store, sizes, data)
    anchors = _anchor_batches(sizes, data)
    rows = []
    for anchor, goal in (("arrayrecord", at_least(1.0)), ("lance", at_least(3.0))):
        case, theirs = f"shuffled-batch ({_NAMES[anchor]})", anchors[anchor]
        if isinstance(theirs, str):
            rows.append(_skipped(case, data.n, goal, theirs))
            continue
        rows.append(
            Result(
                case=case,
                n=data.n,
                ours=ours,
                baseline=theirs,
                goal=goal,
                higher_is_better=True,
                ours_label=(
                    f"one batch of {BATCH:,} from `store.batches({BATCH}, shuffle=True)` "
                    "(jax.Array leaves, `block_until_ready`): consecutive batches of one "
                    f"iterator after {sizes.batch_warmup} warm-up batches, timed alone"
                ),
                baseline_label=_LABELS[anchor].format(what=f"idx` of {BATCH:,}"),
                notes=tuple(notes),
            )
        )
    return rows


_NAMES = {"arrayrecord": "ArrayRecord", "lance": "Lance"}
_LABELS = {
    "arrayrecord": (
        "ArrayRecord: `reader.read(idx)`, `msgpack.unpackb` of each record and each leaf's "
        "bytes joined into one numpy array; a fresh random `{what} per run"
    ),
    "lance": (
        "Lance: `dataset.take(idx)` on an open dataset, every column to numpy; a fresh random "
        "`{what} per run"
    ),
}


# --- shuffled and sequential epochs -------------------------------------------------------------


def _epoch(store: Any, shuffle: bool, seed: int) -> list[Any]:
    with store.batches(BATCH, shuffle=shuffle, seed=seed) as it:
        return [jax.block_until_ready(batch) for batch in it]


def _case_shuffled_epoch(sizes: Sizes) -> list[Result]:
    seeds = itertools.count(100)
    with _opened(sizes) as (data, store, notes):
        shuffled, sequential = side_by_side(
            Timed(
                lambda _: _epoch(store, True, next(seeds)),
                sizes.epoch_repeats,
                teardown=lambda _, out: _check_epoch("shuffled epoch", out, data, True),
            ),
            Timed(
                lambda _: _epoch(store, False, 0),
                sizes.epoch_repeats,
                teardown=lambda _, out: _check_epoch("sequential epoch", out, data, False),
            ),
        )
    batches = math.ceil(data.n / BATCH)
    return [
        Result(
            case="shuffled-epoch",
            n=data.n,
            ours=shuffled,
            baseline=sequential,
            goal=at_least(0.5),
            higher_is_better=True,
            ours_label=(
                f"one epoch of `store.batches({BATCH}, shuffle=True)` ({batches} batches, "
                "jax.Array leaves, each `block_until_ready`), a new seed each run"
            ),
            baseline_label=f"one epoch of `store.batches({BATCH})` of the same store",
            notes=(
                *notes,
                f"Per batch: shuffled {shuffled.median / batches * 1e3:.1f} ms, sequential "
                f"{sequential.median / batches * 1e3:.1f} ms.",
            ),
        )
    ]


# --- cold single records ------------------------------------------------------------------------


def _cold(store: Any, n: int, limit: int) -> Callable[[], int]:
    """Random record indices whose chunks are not in a cache of ``limit`` bytes: an index in a
    chunk row among the last rows read that the cache could hold is drawn again."""
    columns = store.schema.columns
    per_chunk = sorted({c.chunks[0] for c in columns})
    row = sum(c.chunks[0] * c.dtype.itemsize * math.prod(c.shape) for c in columns)
    recent: collections.deque[int] = collections.deque(maxlen=limit // max(row, 1) + 1)
    rng = np.random.default_rng(3)

    def near(i: int) -> bool:
        return any(i // k == j // k for j in recent for k in per_chunk)

    def draw() -> int:
        i = int(rng.integers(n))
        for _ in range(1_000):  # a few tries at most, unless the store is a handful of rows
            if not near(i):
                break
            i = int(rng.integers(n))
        recent.append(i)
        return i

    return draw


def _case_cold_record(sizes: Sizes) -> list[Result]:
    timed: dict[str, Timed] = {}
    skipped: dict[str, str] = {}
    with _opened(sizes) as (data, store, notes):
        n = data.n
        timed["ours"] = Timed(
            lambda i: store.load(i, as_numpy=True),
            sizes.cold_repeats,
            setup=_cold(store, n, data.cache_bytes),
            teardown=lambda i, got: _check_record("load(i)", got, data, i),
        )
        with contextlib.suppress(_Skip):
            reader = _arecord_reader(data)
            timed["arrayrecord"] = Timed(
                lambda i: _arecord_read(reader, [i], data.names),
                sizes.cold_repeats,
                setup=_draw_one(n, 4),
                teardown=lambda i, got: _check_leaves("ArrayRecord", got, data.picked([i])),
            )
        with contextlib.suppress(_Skip):
            _, dataset = _lance_dataset(data)
            timed["lance"] = Timed(
                lambda i: _lance_take(dataset, np.array([i]), _shapes(data)),
                sizes.cold_repeats,
                setup=_draw_one(n, 5),
                teardown=lambda i, got: _check_leaves("Lance take", got, data.picked([i])),
            )
        skipped.update((a, data.skipped[a]) for a in _NAMES if a not in timed)
        got = dict(zip(timed, side_by_side(*timed.values()), strict=True))
    goals = {"arrayrecord": at_least(0.5), "lance": at_least(2.0)}
    rows = []
    for anchor, name in _NAMES.items():
        case, goal = f"cold-record ({name})", goals[anchor]
        if anchor in skipped:
            rows.append(_skipped(case, n, goal, skipped[anchor]))
            continue
        rows.append(
            Result(
                case=case,
                n=n,
                ours=got["ours"],
                baseline=got[anchor],
                goal=goal,
                higher_is_better=True,
                ours_label=(
                    "`store.load(i, as_numpy=True)` of a fresh random `i` per run whose chunks "
                    "are not in the cache, open store"
                ),
                baseline_label=_LABELS[anchor].format(what="i` (`idx=[i]`)"),
                notes=tuple(notes),
            )
        )
    return rows


# --- full load ----------------------------------------------------------------------------------


def _case_full_load(sizes: Sizes) -> list[Result]:
    with _opened(sizes) as (data, store, notes):
        by_path = {
            jax.tree_util.keystr(p): e
            for (p, _), e in zip(
                jax.tree_util.tree_leaves_with_path(data.like), data.expected, strict=True
            )
        }
        columns = store.schema.columns
        raw_expected = [by_path[c.path] for c in columns]
        arrays = _raw_open(data.store, [c.key for c in columns])
        ours, raw = side_by_side(
            Timed(
                lambda _: store.load(as_numpy=True),
                sizes.load_repeats,
                warmup=1,
                teardown=lambda _, got: _check_leaves("load", jax.tree.leaves(got), data.expected),
            ),
            Timed(
                lambda _: _raw_read(arrays, data.n),
                sizes.load_repeats,
                warmup=1,
                teardown=lambda _, got: _check_leaves("raw tensorstore", got, raw_expected),
            ),
        )
    mib = data.nbytes / 2**20
    return [
        Result(
            case="full-load",
            n=data.n,
            ours=ours,
            baseline=raw,
            goal=at_least(1.0),
            higher_is_better=True,
            ours_label="`store.load(as_numpy=True)` of all N records on an open store",
            baseline_label=(
                "raw TensorStore: all `arr[0:N].read()` futures of every column issued "
                "together, then waited for, on handles opened beforehand (`ts.open`, untimed)"
            ),
            notes=(
                *notes,
                f"Throughput: ours {mib / ours.median:,.0f} MiB/s, raw TensorStore "
                f"{mib / raw.median:,.0f} MiB/s (decoded bytes).",
                "The bulk write of 1 GiB is the bulk-write row of `bench_anchors.py`.",
            ),
        )
    ]


# --- a gather of 1,000 records without a cache --------------------------------------------------


def _case_gather(sizes: Sizes) -> list[Result]:
    data = _data(sizes.records)
    lance, dataset = _lance_dataset(data)
    k = min(GATHER, data.n)
    with pytreestore.open(str(data.store), cache_bytes=0) as store:
        ours, theirs = side_by_side(
            Timed(
                lambda idx: store.load(idx, as_numpy=True),
                sizes.gather_repeats,
                warmup=1,
                setup=_draw(data.n, k, 6),
                teardown=lambda idx, got: _check_record("gather", got, data, idx),
            ),
            Timed(
                lambda idx: _lance_take(dataset, idx, _shapes(data)),
                sizes.gather_repeats,
                warmup=1,
                setup=_draw(data.n, k, 7),
                teardown=lambda idx, got: _check_leaves("Lance take", got, data.picked(idx)),
            ),
        )
        about = _about(data, store)
    return [
        Result(
            case="gather-1000",
            n=data.n,
            ours=ours,
            baseline=theirs,
            goal=at_least(2.0),
            higher_is_better=True,
            ours_label=(
                f"`store.load(idx, as_numpy=True)` of {k:,} fresh random unsorted indices per "
                "run, the store opened with `cache_bytes=0` (no cache)"
            ),
            baseline_label=(
                f"Lance {lance.__version__}: `dataset.take(idx)` of {k:,} fresh random indices "
                "per run, every column to numpy"
            ),
            notes=(about,),
        )
    ]


def cases(quick: bool) -> list[Case]:
    s = QUICK if quick else FULL
    n = s.records

    def case(name: str, goal: Goal, run: Callable[[Sizes], list[Result]]) -> Case:
        return _guarded(name, n, goal, lambda: run(s))

    return [
        case("shuffled-batch", at_least(1.0), _case_shuffled_batch),
        case("shuffled-epoch", at_least(0.5), _case_shuffled_epoch),
        case("cold-record", at_least(0.5), _case_cold_record),
        case("full-load", at_least(1.0), _case_full_load),
        case("gather-1000", at_least(2.0), _case_gather),
    ]
