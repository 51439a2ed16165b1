"""Random access beyond memory (issues 31 and 47): the rows of issue 47's "Done when" on the
default layout, against ArrayRecord (Grain's format), Lance, raw TensorStore and the pre-issue
read path, all holding the same records.

One store of N records of a 20-leaf, 3-level record (1,436 bytes: float32 and int leaves of a
few shapes, up to float32[10, 16]; noisy floats, with the pixels and depths quantised to 256
levels so that zstd has something to do) is written once per run with `create(path, like)`'s
defaults, whatever they are in the checkout measured (the default layout), and once with
plain chunks (`inner_chunk_bytes=0`, the layout before issue 47), which the rows marked
"plain via TensorStore" read with `RUNTIME.reads.direct = False` (every read through
TensorStore: the read path before issue 47, measured in the same process). Each store's
decoded size is at least 8x the cache: `PYTREESTORE_CACHE_BYTES` is set to an eighth of it for
the run and restored afterwards. The shared cache is made when the process opens its first
store without `cache_bytes`; when an earlier module made it already with another bound, the
variable cannot apply and the stores open with `cache_bytes=` of the same size instead (each
row's notes say which). The same records are written as an ArrayRecord file (`group_size:1`,
its default zstd; each record a msgpack dict of leaf name -> bytes, dtype and shape, as Grain
users write them), read as Grain does (`readahead_buffer_size:0`, a 32 KiB file buffer), and
as a Lance dataset (one column per leaf, fixed-size lists for array leaves).

* **shuffled-batch**: the steady time per batch of 1,024 from `store.batches(1024,
  shuffle=True)` (jax.Array leaves, `block_until_ready`), the consecutive batches of an
  iterator after a few warm-up batches (timed alone: the iterator reads ahead in the
  background, so another reader timed between its batches would share the cores with it),
  in rounds that alternate with an iterator of the plain store via TensorStore; against
  ArrayRecord `reader.read(idx)` + msgpack decode to one numpy array per leaf, and against
  Lance `take(idx)` to numpy, each with fresh random `idx` of 1,024 per run, side by side.
  Three rows: one per anchor, with issue 31's goals, and one against the plain store via
  TensorStore (no slower than after issue 31: >= 1).
* **shuffled-epoch**: one epoch of `batches(1024, shuffle=True)` against one epoch of
  `batches(1024)` of the same store (ratio sequential time / shuffled time, issue 31's goal),
  and against a shuffled epoch of the plain store via TensorStore (>= 1).
* **cold-record**: `store.load(i, as_numpy=True)` of a fresh random `i` per run whose chunks
  are not in the cache (an `i` whose chunk row is among the rows the cache could hold that
  were read last is drawn again), against ArrayRecord `read([i])` + decode (goal: at most its
  time, >= 1) and Lance `take([i])` (goal: at most half its time, >= 2), each with its own
  fresh random `i`.
* **full-load**: `store.load(as_numpy=True)` against raw TensorStore reading every column of
  the same store (every array opened with `ts.open` beforehand, all reads issued together),
  and against `store.load(as_numpy=True)` of the plain store via TensorStore ("today's plain
  load"); both >= 1.
* **gather-1000**: `store.load(idx, as_numpy=True)` of 1,000 fresh random unsorted indices on
  the store opened with `cache_bytes=0`, against Lance `take(idx)` (goal: at most its time).

The figures after issue 31 (docs/benchmarks.md, 2026-12-06 08:32 UTC) are in the notes of the
shuffled rows, to compare the ratios against ArrayRecord, Lance and a sequential epoch. The
same reads of stores with plain chunks and with inner chunks of 4 to 32 KiB, each with the
direct reader on and off, are `bench_layouts.py`. The bulk write of 1 GiB (`extend_batch`
against `np.save` + fsync, goal >= 0.8) is the **bulk-write** row of `bench_anchors.py`. Every
output is checked against the expected arrays outside the timed regions (a batch by the record
index each record carries). Rows whose anchor is not installed (`pip install -e ".[bench]"`)
are kept with n/a times and a note saying why.
"""

from __future__ import annotations

import collections
import contextlib
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
    CpuTimes,
    _about,
    _arecord_read,
    _arecord_reader,
    _bounded_cache,
    _cache_bytes,
    _cpu_note,
    _Data,
    _data,
    _direct,
    _lance_dataset,
    _metered,
    _shapes,
    _side_by_side,
    _through,
)
from bench_core import _check_leaves, _raw_open, _raw_read

import pytreestore

TITLE = "Random access beyond memory: ArrayRecord, Lance, raw TensorStore, the plain load"

BATCH = 1_024
GATHER = 1_000

#: the store and read path the pre-issue-47 rows read: plain chunks, every read through
#: TensorStore (``RUNTIME.reads.direct = False``)
BEFORE = ("plain", False)
#: what a row against it adds to its case's name
VIA_TS = "plain via TensorStore"

#: the shuffled rows' figures after issue 31 (docs/benchmarks.md, run of 2026-12-06 08:32 UTC,
#: 300,000 records): per case, ours and the ratio
AFTER_31 = {
    "shuffled-batch (ArrayRecord)": "5.0 ms a batch, 7.35x ArrayRecord",
    "shuffled-batch (Lance)": "5.0 ms a batch, 14.22x Lance",
    "shuffled-epoch": "1.40 s an epoch, 0.62x a sequential one",
}


@dataclass(frozen=True)
class Sizes:
    records: int
    batch_warmup: int
    batch_repeats: int
    batch_rounds: int  # iterators of each store, alternating; batch_repeats timed in all
    epoch_repeats: int
    cold_repeats: int
    load_repeats: int
    gather_repeats: int


FULL = Sizes(300_000, 3, 30, 10, 2, 200, 5, 10)
QUICK = Sizes(8_192, 1, 3, 1, 1, 5, 1, 1)


@contextlib.contextmanager
def _opened(
    sizes: Sizes, layouts: Sequence[str] = ("",)
) -> Iterator[tuple[_Data, dict[str, Any], list[str]]]:
    """The data, its stores of ``layouts`` (``_Data.path``) opened as the rows read them, and
    notes on the first one and on the cache."""
    with contextlib.ExitStack() as stack:
        cache_bytes, how = stack.enter_context(_bounded_cache(_cache_bytes(sizes.records)))
        data = _data(sizes.records)  # written on first use, under the bound
        stores = {
            layout: stack.enter_context(
                pytreestore.open(str(data.path(layout)), cache_bytes=cache_bytes)
            )
            for layout in layouts
        }
        yield data, stores, [_about(data, stores[layouts[0]], layouts[0]), how]


def _via_ts_note(data: _Data, store: Any) -> str:
    return f"The anchor's store: {_about(data, store, BEFORE[0])}"


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


def _check_record(what: str, got: Any, data: _Data, i: Any) -> None:
    if jax.tree.structure(got) != jax.tree.structure(data.like):
        raise RuntimeError(f"{what}: structure {jax.tree.structure(got)} is not the record's")
    _check_leaves(what, jax.tree.leaves(got), data.picked(i))


# --- shuffled batches ---------------------------------------------------------------------------


def _batch_times(
    store: Any, direct: bool, warmup: int, k: int, seed: int
) -> tuple[list[float], float, list[Any]]:
    """Seconds per batch of ``k`` consecutive shuffled batches of one iterator after ``warmup``
    ones, with the direct reader on or off; the process's CPU seconds per timed batch; and
    the batches."""
    times, batches, cpu = [], [], 0.0
    with _direct(direct), store.batches(BATCH, shuffle=True, seed=seed) as it:
        for j in range(warmup + k):
            if j == warmup:
                cpu = time.process_time()
            start = time.perf_counter()
            batch = jax.block_until_ready(next(it))
            times.append(time.perf_counter() - start)
            batches.append(batch)
        cpu = (time.process_time() - cpu) / k
    return times[warmup:], cpu, batches  # the batches are checked after the iterator closed


def _batch_rounds(
    reads: Sequence[tuple[Any, bool]], sizes: Sizes, data: _Data, seed: int = 31
) -> list[tuple[Timing, CpuTimes]]:
    """Per ``(store, direct)`` of ``reads``, the seconds per batch of ``sizes.batch_repeats``
    shuffled batches in ``sizes.batch_rounds`` iterators, the reads' iterators alternating
    round by round (the order reversed every other round), and the CPU seconds per batch of
    each iterator."""
    per_round = math.ceil(sizes.batch_repeats / sizes.batch_rounds)
    times: list[list[float]] = [[] for _ in reads]
    cpus = [CpuTimes() for _ in reads]
    for r in range(sizes.batch_rounds):
        order = list(enumerate(reads))
        for k, (store, direct) in order if r % 2 == 0 else order[::-1]:
            seed_k = seed + r * len(reads) + k  # a seed of its own: no order read twice
            got, cpu, batches = _batch_times(store, direct, sizes.batch_warmup, per_round, seed_k)
            for batch in batches:
                _check_batch("batches(shuffle=True)", batch, data)
            times[k].extend(got)
            cpus[k].times.append(cpu)
    return [(Timing(tuple(t[: sizes.batch_repeats])), c) for t, c in zip(times, cpus, strict=True)]


def _draw(n: int, k: int, seed: int) -> Callable[[], np.ndarray]:
    rng = np.random.default_rng(seed)
    return lambda: rng.choice(n, k, replace=False)


def _draw_one(n: int, seed: int) -> Callable[[], int]:
    rng = np.random.default_rng(seed)
    return lambda: int(rng.integers(n))


def _anchor_batches(sizes: Sizes, data: _Data) -> dict[str, tuple[Timing, CpuTimes] | str]:
    """Per anchor, the seconds per batch of 1,024 random records and the CPU seconds, or why
    it was skipped."""
    timed: dict[str, Timed] = {}
    out: dict[str, tuple[Timing, CpuTimes] | str] = {}
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
    metered = {anchor: _metered(t) for anchor, t in timed.items()}
    with stack:
        if metered:
            got = side_by_side(*(t for t, _ in metered.values()))
            out.update((a, (g, m[1])) for (a, m), g in zip(metered.items(), got, strict=True))
    return out


def _batch_label(sizes: Sizes, what: str = "") -> str:
    return (
        f"one batch of {BATCH:,} from `store.batches({BATCH}, shuffle=True)`{what} (jax.Array "
        f"leaves, `block_until_ready`): consecutive batches of {sizes.batch_rounds} iterators "
        f"after {sizes.batch_warmup} warm-up batches each, timed alone"
    )


def _case_shuffled_batch(sizes: Sizes) -> list[Result]:
    with _opened(sizes, ("", BEFORE[0])) as (data, stores, notes):
        (ours, cpu), (before, before_cpu) = _batch_rounds(
            [(stores[""], True), (stores[BEFORE[0]], BEFORE[1])], sizes, data
        )
        via_ts = _via_ts_note(data, stores[BEFORE[0]])
    anchors = _anchor_batches(sizes, data)
    rows = []
    for anchor, goal in (("arrayrecord", at_least(1.0)), ("lance", at_least(3.0))):
        case, got = f"shuffled-batch ({_NAMES[anchor]})", anchors[anchor]
        if isinstance(got, str):
            rows.append(_skipped(case, data.n, goal, got))
            continue
        theirs, their_cpu = got
        rows.append(
            Result(
                case=case,
                n=data.n,
                ours=ours,
                baseline=theirs,
                goal=goal,
                higher_is_better=True,
                ours_label=_batch_label(sizes),
                baseline_label=_LABELS[anchor].format(what=f"idx` of {BATCH:,}"),
                notes=(
                    *notes,
                    f"After issue 31: {AFTER_31[case]}.",
                    _cpu_note(cpu, their_cpu),
                ),
            )
        )
    rows.append(
        Result(
            case=f"shuffled-batch ({VIA_TS})",
            n=data.n,
            ours=ours,
            baseline=before,
            goal=at_least(1.0),
            higher_is_better=True,
            ours_label=_batch_label(sizes),
            baseline_label=_batch_label(sizes, " of the plain store via TensorStore")
            + ", its iterators alternating with ours",
            notes=(*notes, via_ts, _cpu_note(cpu, before_cpu)),
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


def _epoch_timed(
    store: Any, plain: Any, sizes: Sizes, data: _Data, seeds: Iterator[int]
) -> tuple[Timed, Timed, Timed]:
    """A shuffled and a sequential epoch of ``store``; a shuffled one of the ``plain`` store
    via TensorStore."""
    return (
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
        Timed(
            _through(BEFORE[1], lambda _: _epoch(plain, True, next(seeds))),
            sizes.epoch_repeats,
            teardown=lambda _, out: _check_epoch("shuffled epoch (plain)", out, data, True),
        ),
    )


def _case_shuffled_epoch(sizes: Sizes) -> list[Result]:
    seeds = itertools.count(100)
    with _opened(sizes, ("", BEFORE[0])) as (data, stores, notes):
        store = stores[""]
        metered = [_metered(t) for t in _epoch_timed(store, stores[BEFORE[0]], sizes, data, seeds)]
        shuffled, sequential, before = side_by_side(*(t for t, _ in metered))
        cpu, sequential_cpu, before_cpu = (c for _, c in metered)
        via_ts = _via_ts_note(data, stores[BEFORE[0]])
    batches = math.ceil(data.n / BATCH)
    per_batch = (
        f"Per batch: shuffled {shuffled.median / batches * 1e3:.1f} ms, sequential "
        f"{sequential.median / batches * 1e3:.1f} ms, shuffled plain via TensorStore "
        f"{before.median / batches * 1e3:.1f} ms."
    )
    ours_label = (
        f"one epoch of `store.batches({BATCH}, shuffle=True)` ({batches} batches, "
        "jax.Array leaves, each `block_until_ready`), a new seed each run"
    )
    return [
        Result(
            case="shuffled-epoch",
            n=data.n,
            ours=shuffled,
            baseline=sequential,
            goal=at_least(0.5),
            higher_is_better=True,
            ours_label=ours_label,
            baseline_label=f"one epoch of `store.batches({BATCH})` of the same store",
            notes=(
                *notes,
                per_batch,
                f"After issue 31: {AFTER_31['shuffled-epoch']}.",
                _cpu_note(cpu, sequential_cpu),
            ),
        ),
        Result(
            case=f"shuffled-epoch ({VIA_TS})",
            n=data.n,
            ours=shuffled,
            baseline=before,
            goal=at_least(1.0),
            higher_is_better=True,
            ours_label=ours_label,
            baseline_label=(
                f"one epoch of `store.batches({BATCH}, shuffle=True)` of the plain store via "
                "TensorStore, a new seed each run"
            ),
            notes=(*notes, via_ts, per_batch, _cpu_note(cpu, before_cpu)),
        ),
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


def _cold_timed(
    store: Any,
    data: _Data,
    repeats: int,
    direct: bool = True,
    draw: Callable[[], int] | None = None,
) -> Timed:
    """A cold ``store.load(i, as_numpy=True)`` with the direct reader on or off, of indices
    from ``draw`` (default: a :func:`_cold` of its own; the reads of one store share one, so
    that none reads a record another has just brought into the cache)."""
    return Timed(
        _through(direct, lambda i: store.load(i, as_numpy=True)),
        repeats,
        setup=draw or _cold(store, data.n, data.cache_bytes),
        teardown=lambda i, got: _check_record("load(i)", got, data, i),
    )


def _cold_anchors(data: _Data, repeats: int, stack: contextlib.ExitStack) -> dict[str, Timed]:
    """The anchors of a cold record that are installed (their readers closed by ``stack``)."""
    timed: dict[str, Timed] = {}
    with contextlib.suppress(_Skip):
        reader = stack.enter_context(_arecord_reader(data))
        timed["arrayrecord"] = Timed(
            lambda i: _arecord_read(reader, [i], data.names),
            repeats,
            setup=_draw_one(data.n, 4),
            teardown=lambda i, got: _check_leaves("ArrayRecord", got, data.picked([i])),
        )
    with contextlib.suppress(_Skip):
        _, dataset = _lance_dataset(data)
        timed["lance"] = Timed(
            lambda i: _lance_take(dataset, np.array([i]), _shapes(data)),
            repeats,
            setup=_draw_one(data.n, 5),
            teardown=lambda i, got: _check_leaves("Lance take", got, data.picked([i])),
        )
    return timed


#: issue 47: a cold record in at most ArrayRecord's time and at most half Lance's
COLD_GOALS = {"arrayrecord": at_least(1.0), "lance": at_least(2.0)}
COLD_LABEL = (
    "`store.load(i, as_numpy=True)` of a fresh random `i` per run whose chunks are not in "
    "the cache, open store"
)


def _case_cold_record(sizes: Sizes) -> list[Result]:
    with _opened(sizes) as (data, stores, notes), contextlib.ExitStack() as stack:
        timed = {"ours": _cold_timed(stores[""], data, sizes.cold_repeats)}
        timed.update(_cold_anchors(data, sizes.cold_repeats, stack))
        got = _side_by_side(timed)
    rows = []
    for anchor, name in _NAMES.items():
        case, goal = f"cold-record ({name})", COLD_GOALS[anchor]
        if anchor not in got:
            rows.append(_skipped(case, data.n, goal, data.skipped[anchor]))
            continue
        rows.append(
            Result(
                case=case,
                n=data.n,
                ours=got["ours"][0],
                baseline=got[anchor][0],
                goal=goal,
                higher_is_better=True,
                ours_label=COLD_LABEL,
                baseline_label=_LABELS[anchor].format(what="i` (`idx=[i]`)"),
                notes=(*notes, _cpu_note(got["ours"][1], got[anchor][1])),
            )
        )
    return rows


# --- full load ----------------------------------------------------------------------------------


def _load_timed(store: Any, data: _Data, repeats: int, direct: bool = True) -> Timed:
    """``store.load(as_numpy=True)`` of every record, with the direct reader on or off."""
    return Timed(
        _through(direct, lambda _: store.load(as_numpy=True)),
        repeats,
        warmup=1,
        teardown=lambda _, got: _check_leaves("load", jax.tree.leaves(got), data.expected),
    )


def _raw_timed(store: Any, data: _Data, repeats: int) -> Timed:
    """Raw TensorStore reads of every stored array of ``store`` (the default layout's)."""
    by_path = {
        jax.tree_util.keystr(p): e
        for (p, _), e in zip(
            jax.tree_util.tree_leaves_with_path(data.like), data.expected, strict=True
        )
    }
    packed = bool(store.schema.packs)  # raw reads give the pack arrays, not the leaves
    columns = store.schema.storage_columns if packed else store.schema.columns
    raw_expected = None if packed else [by_path[c.path] for c in columns]
    arrays = _raw_open(data.store, [c.key for c in columns])
    return Timed(
        lambda _: _raw_read(arrays, data.n),
        repeats,
        warmup=1,
        teardown=lambda _, got: _check_raw(got, raw_expected, data.n),
    )


LOAD_LABEL = "`store.load(as_numpy=True)` of all N records on an open store"
PLAIN_LOAD_LABEL = (
    "today's plain load: `store.load(as_numpy=True)` of all N records of the plain store "
    "(`inner_chunk_bytes=0`), open, with `RUNTIME.reads.direct = False` (every read through "
    "TensorStore)"
)


def _case_full_load(sizes: Sizes) -> list[Result]:
    with _opened(sizes, ("", BEFORE[0])) as (data, stores, notes):
        got = _side_by_side(
            {
                "ours": _load_timed(stores[""], data, sizes.load_repeats),
                "raw": _raw_timed(stores[""], data, sizes.load_repeats),
                "before": _load_timed(stores[BEFORE[0]], data, sizes.load_repeats, BEFORE[1]),
            }
        )
        via_ts = _via_ts_note(data, stores[BEFORE[0]])
    (ours, cpu), (raw, raw_cpu), (before, before_cpu) = got.values()
    mib = data.nbytes / 2**20
    rates = (
        f"Throughput: ours {mib / ours.median:,.0f} MiB/s, raw TensorStore "
        f"{mib / raw.median:,.0f} MiB/s, the plain load via TensorStore "
        f"{mib / before.median:,.0f} MiB/s (decoded bytes)."
    )
    return [
        Result(
            case="full-load (raw TensorStore)",
            n=data.n,
            ours=ours,
            baseline=raw,
            goal=at_least(1.0),
            higher_is_better=True,
            ours_label=LOAD_LABEL,
            baseline_label=(
                "raw TensorStore: all `arr[0:N].read()` futures of every column of the same "
                "store issued together, then waited for, on handles opened beforehand "
                "(`ts.open`, untimed)"
            ),
            notes=(*notes, rates, _cpu_note(cpu, raw_cpu)),
        ),
        Result(
            case=f"full-load ({VIA_TS})",
            n=data.n,
            ours=ours,
            baseline=before,
            goal=at_least(1.0),
            higher_is_better=True,
            ours_label=LOAD_LABEL,
            baseline_label=PLAIN_LOAD_LABEL,
            notes=(*notes, via_ts, rates, _cpu_note(cpu, before_cpu)),
        ),
    ]


def _check_raw(got: Sequence[np.ndarray], expected: list[np.ndarray] | None, n: int) -> None:
    """The raw reads' arrays: the leaves' columns, or (``expected`` None: pack arrays) N rows
    each."""
    if expected is not None:
        _check_leaves("raw tensorstore", got, expected)
    elif any(len(a) != n for a in got):
        raise RuntimeError(f"raw tensorstore: pack arrays of {[len(a) for a in got]} rows, not {n}")


# --- a gather of 1,000 records without a cache --------------------------------------------------


def _gather_timed(
    store: Any, data: _Data, repeats: int, direct: bool = True, seed: int = 6
) -> Timed:
    """``store.load(idx, as_numpy=True)`` of fresh random unsorted indices."""
    return Timed(
        _through(direct, lambda idx: store.load(idx, as_numpy=True)),
        repeats,
        warmup=1,
        setup=_draw(data.n, min(GATHER, data.n), seed),
        teardown=lambda idx, got: _check_record("gather", got, data, idx),
    )


def _lance_gather_timed(data: _Data, dataset: Any, repeats: int) -> Timed:
    return Timed(
        lambda idx: _lance_take(dataset, idx, _shapes(data)),
        repeats,
        warmup=1,
        setup=_draw(data.n, min(GATHER, data.n), 7),
        teardown=lambda idx, got: _check_leaves("Lance take", got, data.picked(idx)),
    )


def _gather_labels(data: _Data, lance: Any) -> tuple[str, str]:
    k = min(GATHER, data.n)
    return (
        f"`store.load(idx, as_numpy=True)` of {k:,} fresh random unsorted indices per run, "
        "the store opened with `cache_bytes=0` (no cache)",
        f"Lance {lance.__version__}: `dataset.take(idx)` of {k:,} fresh random indices per "
        "run, every column to numpy",
    )


def _case_gather(sizes: Sizes) -> list[Result]:
    data = _data(sizes.records)
    lance, dataset = _lance_dataset(data)
    with pytreestore.open(str(data.store), cache_bytes=0) as store:
        got = _side_by_side(
            {
                "ours": _gather_timed(store, data, sizes.gather_repeats),
                "lance": _lance_gather_timed(data, dataset, sizes.gather_repeats),
            }
        )
        about = _about(data, store)
    (ours, cpu), (theirs, their_cpu) = got.values()
    ours_label, lance_label = _gather_labels(data, lance)
    return [
        Result(
            case="gather-1000",
            n=data.n,
            ours=ours,
            baseline=theirs,
            goal=at_least(1.0),
            higher_is_better=True,
            ours_label=ours_label,
            baseline_label=lance_label,
            notes=(about, _cpu_note(cpu, their_cpu)),
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
        case("cold-record", at_least(2.0), _case_cold_record),
        case("full-load", at_least(1.0), _case_full_load),
        case("gather-1000", at_least(1.0), _case_gather),
    ]
