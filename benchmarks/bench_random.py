"""Random access beyond memory (issue 31): shuffled batches, cold single records, gathers and
full loads of a store eight times the size of its decoded-chunk cache, against ArrayRecord
(Grain's format) and Lance holding the same records.

One store of N records of a 20-leaf, 3-level record (1,436 bytes: float32 and int leaves of a
few shapes, up to float32[10, 16]; noisy floats, with the pixels and depths quantised to 256
levels so that zstd has something to do) is written once per run with the defaults (zstd,
default chunking). Its decoded size is at least 8x the cache: `PYTREESTORE_CACHE_BYTES` is set
to an eighth of it for the run and restored afterwards. The shared cache is made when the
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

import collections
import contextlib
import functools
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from _anchors_common import (
    _guarded,
    _lance_take,
    _Skip,
    _skipped,
)
from _common import Case, Goal, Result, Timed, Timing, at_least
from _common import measure_side_by_side as side_by_side
from _random_data import (
    _about,
    _arecord_read,
    _arecord_reader,
    _bounded_cache,
    _cache_bytes,
    _Data,
    _data,
    _lance_dataset,
    _shapes,
)
from bench_core import _check_leaves, _raw_open, _raw_read

import pytreestore

TITLE = "Random access beyond memory: ArrayRecord, Lance, raw TensorStore"

BATCH = 1_024
GATHER = 1_000


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


@contextlib.contextmanager
def _opened(sizes: Sizes, layout: str = "") -> Iterator[tuple[_Data, Any, list[str]]]:
    """The data, its store of ``layout`` (``_Data.path``) opened as the rows read it, and
    notes on both."""
    with contextlib.ExitStack() as stack:
        cache_bytes, how = stack.enter_context(_bounded_cache(_cache_bytes(sizes.records)))
        data = _data(sizes.records)  # written on first use, under the bound
        path = data.path(layout)
        store = stack.enter_context(pytreestore.open(str(path), cache_bytes=cache_bytes))
        yield data, store, [_about(data, store), how]


#: what the rows of the stores of other layouts add to their case's name
_SUFFIX = {"": "", "inner": " [inner chunks]", "packed": " [pack + inner chunks]"}


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
    stack = contextlib.ExitStack()
    try:
        reader = stack.enter_context(_arecord_reader(data))
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
    with stack:
        if timed:
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


def _case_cold_record(sizes: Sizes, layout: str = "") -> list[Result]:
    timed: dict[str, Timed] = {}
    skipped: dict[str, str] = {}
    with _opened(sizes, layout) as (data, store, notes), contextlib.ExitStack() as stack:
        n = data.n
        timed["ours"] = Timed(
            lambda i: store.load(i, as_numpy=True),
            sizes.cold_repeats,
            setup=_cold(store, n, data.cache_bytes),
            teardown=lambda i, got: _check_record("load(i)", got, data, i),
        )
        with contextlib.suppress(_Skip):
            reader = stack.enter_context(_arecord_reader(data))
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
        case, goal = f"cold-record ({name}){_SUFFIX[layout]}", goals[anchor]
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


def _case_full_load(sizes: Sizes, layout: str = "") -> list[Result]:
    with _opened(sizes, layout) as (data, store, notes):
        by_path = {
            jax.tree_util.keystr(p): e
            for (p, _), e in zip(
                jax.tree_util.tree_leaves_with_path(data.like), data.expected, strict=True
            )
        }
        packed = bool(store.schema.packs)  # raw reads give the pack arrays, not the leaves
        columns = store.schema.storage_columns if packed else store.schema.columns
        raw_expected = None if packed else [by_path[c.path] for c in columns]
        arrays = _raw_open(data.path(layout), [c.key for c in columns])
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
                teardown=lambda _, got: _check_raw(got, raw_expected, data.n),
            ),
        )
    mib = data.nbytes / 2**20
    return [
        Result(
            case="full-load" + _SUFFIX[layout],
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


def _check_raw(got: Sequence[np.ndarray], expected: list[np.ndarray] | None, n: int) -> None:
    """The raw reads' arrays: the leaves' columns, or (``expected`` None: pack arrays) N rows
    each."""
    if expected is not None:
        _check_leaves("raw tensorstore", got, expected)
    elif any(len(a) != n for a in got):
        raise RuntimeError(f"raw tensorstore: pack arrays of {[len(a) for a in got]} rows, not {n}")


# --- a gather of 1,000 records without a cache --------------------------------------------------


def _case_gather(sizes: Sizes, layout: str = "") -> list[Result]:
    data = _data(sizes.records)
    lance, dataset = _lance_dataset(data)
    k = min(GATHER, data.n)
    with pytreestore.open(str(data.path(layout)), cache_bytes=0) as store:
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
            case="gather-1000" + _SUFFIX[layout],
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
        # the same reads of the stores of the other layouts (_random_data.LAYOUTS)
        *(
            case(f"{name}-{layout}", goal, functools.partial(run, layout=layout))
            for layout in ("inner", "packed")
            for name, goal, run in (
                ("cold-record", at_least(0.5), _case_cold_record),
                ("full-load", at_least(1.0), _case_full_load),
                ("gather-1000", at_least(2.0), _case_gather),
            )
        ),
    ]
