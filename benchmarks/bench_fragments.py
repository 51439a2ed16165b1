"""Fragments (issue 17, part 2): many writers, one store.

* **commit of 1,000 fragments**: ``store.commit_fragments`` of 1,000 chunk-aligned fragments
  (16 records each, ``chunk_records=16``, a tree of 4 scalar leaves: float32, int32, float64,
  int64), each written beforehand by ``pytreestore.write_fragment`` (not timed), on a local
  store. The issue's goal is at most 100 ms; the anchor, run side by side, is one plain commit
  of the same store kind (``append`` of one record, then ``flush``). Lance's commit of 1,000
  fragments (``lance.LanceOperation.Append``) would be the natural anchor, but pylance is not
  installed here. Ratio: ours over the anchor; the absolute time is the figure to hold
  against the 100 ms goal (in the notes).
* **2 writer processes vs 1**: 16 fragments of 8,192 records (a float32[16] leaf among the
  same 4 scalars, zstd, ``chunk_records=4096``), each made by a worker as a list of records
  (Python objects, as a producer hands them over) and written with ``write_fragment``, by a
  pool of 2 worker processes against a pool of 1 writing the same fragments, then committed
  by the store's writer; the pools are started (and have imported pytreestore) before
  timing. A batch (struct of arrays) is mostly TensorStore's encoding, which already uses
  both cores from one process: 2 processes gain nothing there (0.9x measured). Ratio: throughput, 2
  processes over 1; goal at least 1.6x. The machine has 2 cores, shared with other work
  while this ran.
"""

from __future__ import annotations

import multiprocessing
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _common import Case, Result, Timed, at_least, at_most, measure_side_by_side

import pytreestore

TITLE = "Fragments: many writers, one store"
FRAGMENTS = 1000
SMALL = {"a": np.float32(0), "b": np.int32(0), "c": np.float64(0), "d": np.int64(0)}
WIDE = {**SMALL, "v": np.zeros(16, np.float32)}
INGEST_FRAGMENTS, INGEST_RECORDS, INGEST_CHUNK = 16, 8192, 4096


def _batch(like: dict[str, Any], start: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(start)
    return {
        k: rng.standard_normal((n, *np.shape(v))).astype(np.asarray(v).dtype)
        for k, v in like.items()
    }


def _commit_rows(tmp: Path, backend: str, repeats: int) -> list[Result]:
    count = iter(range(10**6))

    def setup() -> tuple[pytreestore.TreeStore, list[pytreestore.Fragment]]:
        path = tmp / f"commit-{backend}-{next(count)}"
        store = pytreestore.create(path, SMALL, chunk_records=16, backend=backend)
        batch = _batch(SMALL, 0, 16)
        frags = [pytreestore.write_fragment(path, batch, backend=backend) for _ in range(FRAGMENTS)]
        return store, frags

    def teardown(state: Any, _: Any) -> None:
        store, _frags = state
        assert len(store) == 16 * FRAGMENTS and store.version == 1
        path = store.path
        store.close()
        shutil.rmtree(path, ignore_errors=True)

    anchor_store = pytreestore.create(
        tmp / f"anchor-{backend}", SMALL, chunk_records=16, backend=backend
    )
    one = {k: v[0] for k, v in _batch(SMALL, 0, 1).items()}

    def plain(_: Any) -> None:
        anchor_store.append(one)
        anchor_store.flush()

    ours, base = measure_side_by_side(
        Timed(lambda s: s[0].commit_fragments(s[1]), repeats, setup=setup, teardown=teardown),
        Timed(plain, repeats, warmup=2),
    )
    anchor_store.close()
    return [
        Result(
            f"commit_fragments of {FRAGMENTS:,} fragments ({backend})",
            FRAGMENTS,
            ours,
            base,
            at_most(10.0),
            False,
            f"commit_fragments({FRAGMENTS:,} aligned fragments of 16 records, 4 leaves)",
            "one plain commit (append one record + flush)",
            notes=(
                f"absolute: {ours.median * 1e3:.0f} ms against the issue's goal of 100 ms "
                f"({4 * FRAGMENTS:,} chunks placed as hard links, no data copied)",
            ),
        )
    ]


def _write(args: tuple[str, int]) -> str:
    """A worker's task: make its records (Python objects, as a producer would hand them
    over) and write them as one fragment."""
    path, start = args
    data = _batch(WIDE, start, INGEST_RECORDS)
    records = [{k: v[i] for k, v in data.items()} for i in range(INGEST_RECORDS)]
    return pytreestore.write_fragment(path, records).to_json()


def _warm(_: int) -> int:
    return len(pytreestore.__name__)


def _ingest_rows(tmp: Path, repeats: int) -> list[Result]:
    spawn = multiprocessing.get_context("spawn")
    count = iter(range(10**6))
    pools = {n: spawn.Pool(n) for n in (2, 1)}
    try:
        for pool in pools.values():
            pool.map(_warm, range(4))

        def setup() -> tuple[pytreestore.TreeStore, Path]:
            path = tmp / f"ingest-{next(count)}"
            return pytreestore.create(path, WIDE, chunk_records=INGEST_CHUNK), path

        def ingest(state: Any, processes: int) -> None:
            store, path = state
            jobs = [(str(path), i * INGEST_RECORDS) for i in range(INGEST_FRAGMENTS)]
            texts = pools[processes].map(_write, jobs, chunksize=1)
            store.commit_fragments([pytreestore.Fragment.from_json(t) for t in texts])

        def teardown(state: Any, _: Any) -> None:
            store, path = state
            assert len(store) == INGEST_FRAGMENTS * INGEST_RECORDS
            store.close()
            shutil.rmtree(path, ignore_errors=True)

        two, one = measure_side_by_side(
            Timed(lambda s: ingest(s, 2), repeats, warmup=1, setup=setup, teardown=teardown),
            Timed(lambda s: ingest(s, 1), repeats, warmup=1, setup=setup, teardown=teardown),
        )
    finally:
        for pool in pools.values():
            pool.terminate()
    total = INGEST_FRAGMENTS * INGEST_RECORDS
    nbytes = total * sum(np.asarray(v).nbytes for v in WIDE.values())
    return [
        Result(
            "ingest: 2 writer processes vs 1",
            total,
            two,
            one,
            at_least(1.6),
            True,
            f"2 processes write {INGEST_FRAGMENTS} fragments, then one commit",
            "1 process writes the same fragments, then one commit",
            notes=(
                f"{total:,} records, {nbytes / 2**20:.0f} MiB; "
                f"2 processes: {nbytes / 2**20 / two.median:.0f} MiB/s, "
                f"1 process: {nbytes / 2**20 / one.median:.0f} MiB/s; "
                "2 cores, shared with other processes",
            ),
        )
    ]


def _case(what: str, backend: str, quick: bool) -> list[Result]:
    tmp = Path(tempfile.mkdtemp(prefix="pytreestore-bench-fragments-"))
    try:
        if what == "commit":
            return _commit_rows(tmp, backend, 1 if quick else 3)
        return _ingest_rows(tmp, 1 if quick else 3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cases(quick: bool) -> list[Case]:
    return [
        Case("commit-tensorstore", lambda: _case("commit", "tensorstore", quick)),
        Case("commit-zarr", lambda: _case("commit", "zarr", quick)),
        Case("ingest", lambda: _case("ingest", "tensorstore", quick)),
    ]
