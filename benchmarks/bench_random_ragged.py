"""Random access beyond memory for ragged records (issue 31): shuffled epochs of a ragged store
eight times the size of its decoded-chunk cache.

One ragged store of N records ``{"id": int32, "hits": [float32[16]] * L}``, ``L`` uniform in
0-32 (about 1 KiB a record on average), written once per run with the defaults, its
decoded size at least 8x the cache (``PYTREESTORE_CACHE_BYTES``, as in
``bench_random.py``).

* **ragged shuffled-epoch**: one epoch of ``store.batches(1024, shuffle=True, pad_to=32)``
  (the block shuffle; every batch ``(batch, mask)`` of one shape, ``block_until_ready``)
  against one epoch of ``store.batches(1024, pad_to=32)``; ratio sequential time / shuffled
  time. The notes give the time per batch of the exact uniform shuffle
  (``shuffle="uniform"``) over the first few batches of an epoch: what ``shuffle=True`` cost
  before issue 31.

Every epoch is checked: each record's ``id`` once, its hits and mask as written.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from _anchors_common import _scratch
from _common import Case, Result, Timed, at_least
from _common import measure_side_by_side as side_by_side
from _device_workers import _ragged_columns as ragged_columns
from _device_workers import write_ragged
from _random_data import _bounded_cache

import pytreestore

TITLE = "Random access beyond memory: ragged records"
BATCH = 1024
PAD = 32
UNIFORM_BATCHES = 5


@dataclass(frozen=True)
class Sizes:
    records: int
    repeats: int


FULL = Sizes(150_000, 2)
QUICK = Sizes(6_000, 1)


@functools.cache
def _written(n: int) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    batch, mask = ragged_columns(n, PAD)
    root = _ROOTS.enter_context(_scratch("pytreestore-random-ragged-"))
    path = root / "ragged"
    write_ragged(path, batch, mask)
    return path, batch, mask


_ROOTS = contextlib.ExitStack()


@contextlib.contextmanager
def _opened(n: int) -> Iterator[tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray], str]]:
    batch, mask = ragged_columns(n, PAD)
    decoded = int(mask["hits"].sum()) * 64 + n * 4
    with _bounded_cache(decoded // 8) as (cache_bytes, how):
        path, batch, mask = _written(n)
        with pytreestore.open(path, cache_bytes=cache_bytes) as store:
            yield store, batch, mask, f"{decoded / 2**20:.0f} MiB decoded. {how}"


def _epoch(store: Any, shuffle: Any, seed: int, limit: int | None = None) -> list[Any]:
    with store.batches(BATCH, shuffle=shuffle, seed=seed, pad_to=PAD) as it:
        return [jax.block_until_ready(b) for b in itertools.islice(it, limit)]


def _check(
    what: str, out: list[Any], batch: dict[str, np.ndarray], mask: dict[str, np.ndarray]
) -> None:
    ids = np.concatenate([np.asarray(values["id"]) for values, _ in out])
    if sorted(ids.tolist()) != list(range(len(batch["id"]))):
        raise RuntimeError(f"{what}: the epoch did not visit every record once")
    for values, got_mask in out[:3]:
        i = np.asarray(values["id"])
        hits, m = np.asarray(values["hits"]), np.asarray(got_mask["hits"])
        if not (
            np.array_equal(m, mask["hits"][i])
            and np.array_equal(hits * m[..., None], batch["hits"][i])
        ):
            raise RuntimeError(f"{what}: a batch's hits or mask differ from what was written")


def _case_epoch(sizes: Sizes) -> list[Result]:
    seeds = itertools.count(7)
    with _opened(sizes.records) as (store, batch, mask, about):
        shuffled, sequential = side_by_side(
            Timed(
                lambda _: _epoch(store, True, next(seeds)),
                sizes.repeats,
                teardown=lambda _, out: _check("shuffled epoch", out, batch, mask),
            ),
            Timed(
                lambda _: _epoch(store, False, 0),
                sizes.repeats,
                teardown=lambda _, out: _check("sequential epoch", out, batch, mask),
            ),
        )
        start = time.perf_counter()
        _epoch(store, "uniform", 1, UNIFORM_BATCHES)
        uniform = (time.perf_counter() - start) / UNIFORM_BATCHES
    batches = -(-sizes.records // BATCH)
    return [
        Result(
            case="ragged shuffled-epoch",
            n=sizes.records,
            ours=shuffled,
            baseline=sequential,
            goal=at_least(0.5),
            higher_is_better=True,
            ours_label=f"one epoch of `store.batches({BATCH}, shuffle=True, pad_to={PAD})`, a new seed each run",
            baseline_label=f"one epoch of `store.batches({BATCH}, pad_to={PAD})` of the same store",
            notes=(
                about,
                f"Per batch: block-shuffled {shuffled.median / batches * 1e3:.1f} ms, sequential "
                f'{sequential.median / batches * 1e3:.1f} ms, uniform (`shuffle="uniform"`, the '
                f"first {UNIFORM_BATCHES} batches of an epoch) {uniform * 1e3:.0f} ms.",
            ),
        )
    ]


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    return [Case("ragged-shuffled-epoch", lambda: _case_epoch(sizes))]


__all__ = ["TITLE", "cases"]
