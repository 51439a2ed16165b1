"""Ray Data and stores: reading (issue 33) and writing (issue 46).

**Reads**: ``pytreestore.ray.read_store`` against ``ray.data.read_parquet`` of the same rows
(the anchor).

* **fixed**: 100,000 records of 6 leaves (``obs`` float32[16], ``act`` int32[2], ``reward``
  float32, ``done`` bool, ``p.x`` float32, ``p.y`` int64), 4,096 records a chunk (the
  default for this record), default codec.
* **ragged**: 100,000 records of a ragged list of 0-7 ``hits`` (float32) beside ``step``
  int32 and ``obs`` float32[8]: one variable-shaped tensor column.

The parquet anchor holds the same rows, written by Ray from the dataset ``read_store`` gives
(``write_parquet``: one file per read task, Ray's tensor extension types kept). Both sides
run on a local Ray instance of 2 CPUs with the same number of read tasks (one per chunk
range), each read consumed as numpy batches (``iter_batches``), rows counted; the values are
checked once, outside the timed runs. Ratio: ours over parquet (a slowdown; lower is better).

At these sizes ``read_parquet``'s time is mostly its own planning, paid per dataset whatever
the rows (its metadata and in-memory-size sampling tasks): measured here on the same 2-CPU
instance, reading 1,000 rows took 4-8 s through ``read_parquet`` and 0.1 s through
``read_store``, 100,000 rows 3.6-12 s against 0.3 s (a loaded machine). ``read_store`` plans
from the store's schema and commit alone, on the driver.

**Writes** (case ``write``): ``ray.data.from_items(rows).write_datasink(TreeStoreDatasink(p))``
of 1,000 rows of 2 scalar leaves (``x`` float32, ``y`` int32) into a new empty store, with
Ray's default block count (200 blocks for ``from_items``) against the same rows in 2 blocks
(``override_num_blocks=2``), each run a fresh store and a dataset materialized beforehand
(Ray's ``from_items`` of 200 blocks alone takes about 1.5 s here, whatever the sink); the
store's values are checked after each run, outside the timing. Ratio: default blocks over 2 blocks (the goal: at most 3x). Before
issue 46 each block was a fragment: 12-20 s against 0.33 s.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _common import Case, Result, Timed, at_most, measure_side_by_side

import pytreestore

TITLE = "Ray Data: read_store against read_parquet; writes at Ray's default block count"
RECORDS = 100_000


def _fixed(n: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(0)
    like = {
        "obs": np.zeros(16, np.float32),
        "act": np.zeros(2, np.int32),
        "reward": np.float32(0),
        "done": np.bool_(False),
        "p": {"x": np.float32(0), "y": np.int64(0)},
    }
    batch = {
        "obs": rng.standard_normal((n, 16)).astype(np.float32),
        "act": rng.integers(0, 9, (n, 2)).astype(np.int32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "done": rng.random(n) < 0.1,
        "p": {"x": rng.standard_normal(n).astype(np.float32), "y": np.arange(n, dtype=np.int64)},
    }
    return like, batch


def _write_fixed(path: Path, n: int) -> dict[str, Any]:
    like, batch = _fixed(n)
    with pytreestore.create(path, like) as store:
        store.extend_batch(batch)
    return {"declarations": {}}


def _write_ragged(path: Path, n: int) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    like = {"hits": [np.float32(0)], "step": np.int32(0), "obs": np.zeros(8, np.float32)}
    lengths = rng.integers(0, 8, n)
    with pytreestore.create(path, like, ragged=["['hits']"]) as store:
        store.extend(
            {
                "hits": list(rng.standard_normal(int(k)).astype(np.float32)),
                "step": np.int32(i),
                "obs": np.full(8, i, np.float32),
            }
            for i, k in enumerate(lengths)
        )
    return {"declarations": {"ragged": ["['hits']"]}}


def _rows(ds: Any) -> int:
    return sum(len(b["obs"]) for b in ds.iter_batches(batch_size=None, batch_format="numpy"))


def _case(kind: str, quick: bool) -> list[Result]:
    import ray

    from pytreestore.ray import TreeStoreDatasource, read_store

    n = 20_000 if quick else RECORDS
    repeats = 3 if quick else 5
    started = not ray.is_initialized()
    if started:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    try:
        store = tmp / "store"
        (_write_fixed if kind == "fixed" else _write_ragged)(store, n)
        tasks = len(TreeStoreDatasource(store).get_read_tasks(10**6))
        read_store(store, override_num_blocks=tasks).write_parquet(str(tmp / "parquet"))
        files = len(list((tmp / "parquet").glob("*.parquet")))

        def ours(_: Any) -> int:
            return _rows(read_store(store, override_num_blocks=tasks))

        def parquet(_: Any) -> int:
            return _rows(ray.data.read_parquet(str(tmp / "parquet"), override_num_blocks=tasks))

        assert ours(None) == parquet(None) == n
        got = read_store(store).take_batch(n)
        want = ray.data.read_parquet(str(tmp / "parquet")).take_batch(n)
        key = "p.y" if kind == "fixed" else "step"  # each record's own number
        mine_order, their_order = np.argsort(got[key]), np.argsort(want[key])
        for name in got:
            a, b = got[name][mine_order], want[name][their_order]
            assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), name
        mine, anchor = measure_side_by_side(
            Timed(ours, repeats, warmup=1), Timed(parquet, repeats, warmup=1)
        )
        size = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
        return [
            Result(
                f"{kind} store, {n:,} records -> numpy batches",
                n,
                mine,
                anchor,
                at_most(3.0),
                False,
                f"read_store ({tasks} read tasks)",
                f"ray.data.read_parquet ({files} files)",
                notes=(f"store {size / 2**20:.1f} MiB on disk; 2 Ray CPUs",),
            )
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if started:
            ray.shutdown()


def _started_ray() -> bool:
    """Starts a local Ray of 2 CPUs unless one runs; True if this call started it."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return True


WRITE_ROWS = 1_000


def _write_case(quick: bool) -> list[Result]:
    import ray

    from pytreestore.ray import TreeStoreDatasink

    repeats = 3 if quick else 5
    started = _started_ray()
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-write-"))
    items = [{"x": np.float32(i), "y": np.int32(i)} for i in range(WRITE_ROWS)]
    like = {"x": np.float32(0), "y": np.int32(0)}
    runs = iter(range(10**6))
    blocks = {"default": ray.data.from_items(items).materialize().num_blocks()}

    def fresh(count: int | None) -> Any:
        def setup() -> tuple[Path, Any]:  # the dataset's blocks made outside the timing
            path = tmp / f"s{next(runs)}"
            pytreestore.create(path, like).close()
            return path, ray.data.from_items(items, override_num_blocks=count).materialize()

        return setup

    def write(state: tuple[Path, Any]) -> Path:
        path, ds = state
        ds.write_datasink(TreeStoreDatasink(path))
        return path

    def check(_: Any, path: Path) -> None:
        got = pytreestore.open(path).load(as_numpy=True)
        assert got["y"].tolist() == list(range(WRITE_ROWS)), "rows out of order or lost"
        shutil.rmtree(path)

    try:
        default, two = measure_side_by_side(
            Timed(write, repeats, warmup=1, setup=fresh(None), teardown=check),
            Timed(write, repeats, warmup=1, setup=fresh(2), teardown=check),
        )
        return [
            Result(
                f"write {WRITE_ROWS:,} rows: default blocks vs 2 blocks",
                WRITE_ROWS,
                default,
                two,
                at_most(3.0),
                False,
                f"write_datasink, Ray's default ({blocks['default']} blocks)",
                "write_datasink, 2 blocks",
                notes=("a new store each run; 2 Ray CPUs",),
            )
        ]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if started:
            ray.shutdown()


def cases(quick: bool) -> list[Case]:
    reads = [Case(kind, lambda k=kind: _case(k, quick)) for kind in ("fixed", "ragged")]
    return [*reads, Case("write", lambda: _write_case(quick))]
