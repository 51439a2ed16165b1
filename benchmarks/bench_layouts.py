"""The layout sweep (issue 47): the records of `bench_random.py` written with plain chunks, with
inner chunks of 4, 8, 16 and 32 KiB and packed, each read with the direct reader on and off
(`RUNTIME.reads.direct`), so that the default inner-chunk size is chosen by measurement.

Out of the quick tier: `run.py --quick` leaves it out unless `--only layouts` names it. The
stores are those of `_random_data.LAYOUTS` (zstd, default chunking; "packed" is `pack=True,
inner_chunk_bytes="auto"`), written once per run, read through a cache of an eighth of the
decoded bytes as in `bench_random.py`. Each case times every layout, each with the direct
reader on and off, and its anchor side by side in one process (round by round, so a busy
spell of the machine falls on all of them alike); each row is one layout and one setting of
the switch against the case's anchor, with issue 47's goal for the default layout:

* **cold-record**: `store.load(i, as_numpy=True)` of a fresh random `i` per run whose chunks
  are not in the cache, against Lance `take([i])` (at most half its time: >= 2).
* **gather-1000**: `store.load(idx, as_numpy=True)` of 1,000 fresh random unsorted indices,
  stores opened with `cache_bytes=0`, against Lance `take(idx)` (at most its time: >= 1).
* **full-load**: `store.load(as_numpy=True)`, against the same load of the plain store with
  the direct reader off (the plain load through TensorStore before issue 47: >= 1). The row
  "plain, direct off" times that load again: its ratio shows the noise.
* **shuffled-batch**: batches of 1,024 from `store.batches(1024, shuffle=True)`, iterators of
  every layout and setting alternating round by round, against the plain store with the
  direct reader off (no slower than after issue 31: >= 1).
* **bulk-write**: `create` of a fresh store of the layout, `extend_batch` of all N records and
  `close` (durable), against the same write of a plain store; the goal (>= 0.8: at most
  1.25x plain's time) is this sweep's own, not the issue's.

Every output is checked against the expected arrays outside the timed regions. The notes give
each row's CPU time per run (the process's, every thread), which a loaded machine moves less
than the wall times. Where the direct reader does not cover a store (before issue 47's
compressed path, every zstd column), "direct on" reads through TensorStore as "direct off"
does, and the two rows differ only by noise.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from _anchors_common import _guarded, _lance_take
from _common import Case, Goal, Result, Timed, Timing, at_least
from _random_data import (
    LAYOUTS,
    CpuTimes,
    _about,
    _bounded_cache,
    _cache_bytes,
    _cpu_note,
    _Data,
    _data,
    _lance_dataset,
    _layout_name,
    _shapes,
    _side_by_side,
    write_store,
)
from bench_core import _check_leaves
from bench_random import (
    _LABELS,
    BEFORE,
    COLD_LABEL,
    LOAD_LABEL,
    PLAIN_LOAD_LABEL,
    _batch_label,
    _batch_rounds,
    _cold,
    _cold_timed,
    _draw_one,
    _gather_labels,
    _gather_timed,
    _lance_gather_timed,
    _load_timed,
)
from bench_random import Sizes as RandomSizes

import pytreestore

TITLE = "Layout sweep: inner chunks of 4 to 32 KiB, plain and packed, direct reader on and off"
IN_QUICK_TIER = False

#: the layouts swept (names of ``_random_data.LAYOUTS``) and how the rows name them
SWEPT = {
    "plain": "plain",
    "inner-4k": "inner 4 KiB",
    "inner-8k": "inner 8 KiB",
    "inner-16k": "inner 16 KiB",
    "inner-32k": "inner 32 KiB",
    "packed": "packed",
}
SETTINGS = (True, False)  # the direct reader on, off


@dataclass(frozen=True)
class Sizes:
    random: RandomSizes  # records and repeats of the reads, as bench_random's
    write_repeats: int


FULL = Sizes(RandomSizes(300_000, 3, 30, 10, 1, 100, 3, 6), 3)
QUICK = Sizes(RandomSizes(8_192, 1, 3, 1, 1, 5, 1, 1), 1)

Read = tuple[str, bool]  # a layout and the direct reader's setting
READS: list[Read] = [(layout, on) for layout in SWEPT for on in SETTINGS]


def _name(case: str, read: Read) -> str:
    return f"{case} [{SWEPT[read[0]]}, direct {'on' if read[1] else 'off'}]"


@contextlib.contextmanager
def _stores(
    sizes: RandomSizes, cache_bytes: int | None = None
) -> Iterator[tuple[_Data, dict, str]]:
    """The data and every swept layout's store, open; ``cache_bytes`` None: through the cache
    bounded to an eighth of the decoded bytes (a note says how)."""
    with contextlib.ExitStack() as stack:
        if cache_bytes is None:
            cache_bytes, how = stack.enter_context(_bounded_cache(_cache_bytes(sizes.records)))
        else:
            how = f"The stores were opened with `cache_bytes={cache_bytes}`."
        data = _data(sizes.records)
        stores = {
            layout: stack.enter_context(
                pytreestore.open(str(data.path(layout)), cache_bytes=cache_bytes)
            )
            for layout in SWEPT
        }
        yield data, stores, how


Got = dict[Any, tuple[Timing, CpuTimes]]  # per read (and "anchor"): wall and CPU times


def _rows(
    case: str,
    data: _Data,
    stores: dict[str, Any],
    got: Got,
    goal: Goal,
    labels: tuple[str, str],
    notes: tuple[str, ...] = (),
) -> list[Result]:
    """One row per read of :data:`READS` against ``got["anchor"]``."""
    anchor, anchor_cpu = got["anchor"]
    return [
        Result(
            case=_name(case, read),
            n=data.n,
            ours=got[read][0],
            baseline=anchor,
            goal=goal,
            higher_is_better=True,
            ours_label=f"{labels[0]}, direct reader {'on' if read[1] else 'off'}",
            baseline_label=labels[1],
            notes=(
                _about(data, stores[read[0]], read[0]),
                *notes,
                _cpu_note(got[read][1], anchor_cpu),
            ),
        )
        for read in READS
    ]


# --- the cases ----------------------------------------------------------------------------------


def _case_cold_record(sizes: Sizes) -> list[Result]:
    s = sizes.random
    with _stores(s) as (data, stores, how):
        _, dataset = _lance_dataset(data)
        draws = {layout: _cold(store, data.n, data.cache_bytes) for layout, store in stores.items()}
        timed = {
            read: _cold_timed(stores[read[0]], data, s.cold_repeats, read[1], draws[read[0]])
            for read in READS
        }
        got = _side_by_side({**timed, "anchor": _lance_cold(data, dataset, s.cold_repeats)})
        labels = (COLD_LABEL, _LABELS["lance"].format(what="i` (`idx=[i]`)"))
        return _rows("cold-record", data, stores, got, at_least(2.0), labels, (how,))


def _lance_cold(data: _Data, dataset: Any, repeats: int) -> Timed:
    return Timed(
        lambda i: _lance_take(dataset, np.array([i]), _shapes(data)),
        repeats,
        setup=_draw_one(data.n, 5),
        teardown=lambda i, got: _check_leaves("Lance take", got, data.picked([i])),
    )


def _case_gather(sizes: Sizes) -> list[Result]:
    s = sizes.random
    with _stores(s, cache_bytes=0) as (data, stores, how):
        lance, dataset = _lance_dataset(data)
        timed = {
            read: _gather_timed(stores[read[0]], data, s.gather_repeats, read[1], seed=60 + k)
            for k, read in enumerate(READS)
        }
        anchor = _lance_gather_timed(data, dataset, s.gather_repeats)
        got = _side_by_side({**timed, "anchor": anchor})
        labels = _gather_labels(data, lance)
        return _rows("gather-1000", data, stores, got, at_least(1.0), labels, (how,))


def _case_full_load(sizes: Sizes) -> list[Result]:
    s = sizes.random
    with _stores(s) as (data, stores, how):
        timed = {
            read: _load_timed(stores[read[0]], data, s.load_repeats, read[1]) for read in READS
        }
        anchor = _load_timed(stores[BEFORE[0]], data, s.load_repeats, BEFORE[1])
        got = _side_by_side({**timed, "anchor": anchor})
        mib = data.nbytes / 2**20
        rates = "; ".join(
            f"{_name('', r).strip() if r != 'anchor' else 'anchor'} {mib / t.median:,.0f}"
            for r, (t, _) in got.items()
        )
        notes = (how, f"Throughput (decoded MiB/s): {rates}.")
        labels = (LOAD_LABEL, PLAIN_LOAD_LABEL)
        return _rows("full-load", data, stores, got, at_least(1.0), labels, notes)


def _case_shuffled_batch(sizes: Sizes) -> list[Result]:
    s = sizes.random
    with _stores(s) as (data, stores, how):
        reads = [(stores[layout], on) for layout, on in READS]
        timings = _batch_rounds([*reads, (stores[BEFORE[0]], BEFORE[1])], s, data)
        got: Got = dict(zip([*READS, "anchor"], timings, strict=True))
        labels = (
            _batch_label(s),
            _batch_label(s, " of the plain store, direct reader off")
            + ", its iterators alternating with the others",
        )
        notes = (how, "CPU times: per batch, the median of the iterators' means.")
        return _rows("shuffled-batch", data, stores, got, at_least(1.0), labels, notes)


def _case_bulk_write(sizes: Sizes) -> list[Result]:
    data = _data(sizes.random.records)
    fresh = iter(range(1_000_000))

    def timed(layout: str) -> Timed:
        options = LAYOUTS[layout]

        def setup() -> Path:
            return data.root / f"write-{layout}-{next(fresh)}"

        def check(path: Path, _: object) -> None:
            with pytreestore.open(str(path)) as store:
                _check_leaves(
                    f"write {layout}", jax.tree.leaves(store.load(as_numpy=True)), data.expected
                )
            shutil.rmtree(path)

        return Timed(
            lambda path: write_store(path, data.like, data.batch, options),
            sizes.write_repeats,
            setup=setup,
            teardown=check,
        )

    layouts = [layout for layout in SWEPT if layout != BEFORE[0]]
    got = _side_by_side(
        {**{layout: timed(layout) for layout in layouts}, "anchor": timed(BEFORE[0])}
    )
    plain, plain_cpu = got["anchor"]
    mib = data.nbytes / 2**20
    return [
        Result(
            case=f"bulk-write [{SWEPT[layout]}]",
            n=data.n,
            ours=got[layout][0],
            baseline=plain,
            goal=at_least(0.8),
            higher_is_better=True,
            ours_label=(
                f"`create` + `extend_batch` of all N records ({mib:.0f} MiB decoded) + `close` "
                f"(durable), {_layout_name(layout)}"
            ),
            baseline_label=f"the same write of a plain store, {_layout_name(BEFORE[0])}",
            notes=(
                f"Throughput: ours {mib / got[layout][0].median:,.0f} MiB/s, plain "
                f"{mib / plain.median:,.0f} MiB/s (decoded bytes).",
                _cpu_note(got[layout][1], plain_cpu),
            ),
        )
        for layout in layouts
    ]


def cases(quick: bool) -> list[Case]:
    s = QUICK if quick else FULL
    n = s.random.records

    def case(name: str, goal: Goal, run: Callable[[Sizes], list[Result]]) -> Case:
        return _guarded(name, n, goal, lambda: run(s))

    return [
        case("cold-record", at_least(2.0), _case_cold_record),
        case("gather-1000", at_least(1.0), _case_gather),
        case("full-load", at_least(1.0), _case_full_load),
        case("shuffled-batch", at_least(1.0), _case_shuffled_batch),
        case("bulk-write", at_least(0.8), _case_bulk_write),
    ]
