"""Opening wide trees: stores of 10, 100 and 1,000 leaves (a dict of layers, each a float32[4]
weight and a float32 bias), 64 records each, on local disk.

* **open**: `pytreestore.open(path)` against opening the 10-leaf store, on every backend
  registered among tensorstore, zarr and ocdbt; the goal is at most 3x from 10 to 1,000
  leaves. A reader's open reads two objects whatever the width (the root `zarr.json` and the
  commit record) and checks the format version from the root's first bytes; the schema is
  parsed on first use (pytreestore/_spec.py), which *open + first load* below times.
  *cold* forgets the schemas parsed before (as the first open of a store in a process);
  *again* is a later open of the same unchanged store.
* **open + first load**: open and `load(as_numpy=True)` of every record, which reads every
  column's `zarr.json` (all at once) and every chunk, against the same reads done directly:
  raw TensorStore (every `ts.open` issued together, then every read) for the TensorStore
  backend, raw zarr-python (`zarr.api.asynchronous.open_array` and a read per column, all
  gathered) for the zarr backend.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts
import zarr.api.asynchronous as zarr_async
from _common import Case, Result, Timed, at_most, measure_side_by_side
from zarr.core.sync import sync

import pytreestore
from pytreestore._format import validate as _validate
from pytreestore.backends import registered_backends

TITLE = "Open: wide trees"
RECORDS = 64


@dataclass(frozen=True)
class Sizes:
    widths: tuple[int, ...]
    open_repeats: int
    load_repeats: int


FULL = Sizes(widths=(10, 100, 1000), open_repeats=9, load_repeats=5)
QUICK = Sizes(widths=(10, 100), open_repeats=3, load_repeats=2)


def _like(leaves: int) -> dict[str, Any]:
    return {
        f"layer{i:04d}": {"w": np.zeros(4, np.float32), "b": np.float32(0)}
        for i in range(leaves // 2)
    }


def _batch(leaves: int) -> dict[str, Any]:
    r = np.arange(RECORDS, dtype=np.float32)
    return {
        f"layer{i:04d}": {"w": r[:, None] + np.arange(4, dtype=np.float32) + i, "b": r * i}
        for i in range(leaves // 2)
    }


class _Stores:
    """One store per width under a temporary directory, written once (untimed)."""

    def __init__(self, root: Path, widths: Sequence[int], backend: str) -> None:
        self.paths: dict[int, Path] = {}
        for n in widths:
            path = root / f"{backend}-{n}"
            with pytreestore.create(path, _like(n), chunk_records=32, backend=backend) as s:
                s.extend_batch(_batch(n))
            self.paths[n] = path


def _open(path: Path, backend: str, *, cold: bool) -> pytreestore.TreeStore:
    if cold:
        _validate.forget_validated()
    return pytreestore.open(path, backend=backend)


def _close(_: object, store: pytreestore.TreeStore) -> None:
    store.close()


def _check_load(n: int, leaves: Sequence[np.ndarray]) -> None:
    want = _batch(n)
    flat = [v for layer in want.values() for v in (layer["b"], layer["w"])]
    if len(leaves) != len(flat) or not all(np.array_equal(a, b) for a, b in zip(leaves, flat)):
        raise RuntimeError(f"{n} leaves: the load differs from what was written")


def _open_rows(stores: _Stores, sizes: Sizes, backend: str) -> list[Result]:
    rows = []
    base = stores.paths[min(sizes.widths)]
    for cold in (True, False):
        label = "cold" if cold else "again"
        for n in sizes.widths:
            ours, baseline = measure_side_by_side(
                Timed(
                    lambda _, p=stores.paths[n], c=cold: _open(p, backend, cold=c),
                    sizes.open_repeats,
                    warmup=1,
                    teardown=_close,
                ),
                Timed(
                    lambda _, c=cold: _open(base, backend, cold=c),
                    sizes.open_repeats,
                    warmup=1,
                    teardown=_close,
                ),
            )
            rows.append(
                Result(
                    case=f"open ({label}, {backend}), {n} leaves",
                    n=n,
                    ours=ours,
                    baseline=baseline,
                    goal=at_most(3.0),
                    higher_is_better=False,
                    ours_label=f"`pytreestore.open` of the {n}-leaf store ({label})",
                    baseline_label=f"the same for the {min(sizes.widths)}-leaf store",
                )
            )
    return rows


def _raw_tensorstore(path: Path, keys: Sequence[str]) -> list[np.ndarray]:
    context = ts.Context()
    specs = [
        {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{path}/{k}/"}} for k in keys
    ]
    handles = [f.result() for f in [ts.open(s, context=context) for s in specs]]
    return [f.result() for f in [h[0:RECORDS].read() for h in handles]]


def _raw_zarr(path: Path, keys: Sequence[str]) -> list[np.ndarray]:
    async def one(key: str) -> np.ndarray:
        array = await zarr_async.open_array(store=str(path / key), mode="r")
        return np.asarray(await array.getitem(slice(0, RECORDS)))

    async def every() -> list[np.ndarray]:
        return list(await asyncio.gather(*(one(k) for k in keys)))

    return sync(every())


def _load_rows(stores: _Stores, sizes: Sizes, backend: str) -> list[Result]:
    raw = _raw_tensorstore if backend == "tensorstore" else _raw_zarr
    rows = []
    for n in sizes.widths:
        path = stores.paths[n]
        keys = [c.key for c in pytreestore.open(path).schema.columns]

        def ours(_: object, p: Path = path) -> list[np.ndarray]:
            store = pytreestore.open(p, backend=backend)
            leaves = list(
                v for layer in store.load(as_numpy=True).values() for v in (layer["b"], layer["w"])
            )
            store.close()
            return leaves

        mine, floor = measure_side_by_side(
            Timed(ours, sizes.load_repeats, warmup=1, teardown=lambda _, o, n=n: _check_load(n, o)),
            Timed(lambda _, p=path, k=keys: raw(p, k), sizes.load_repeats, warmup=1),
        )
        rows.append(
            Result(
                case=f"open + first load ({backend}), {n} leaves",
                n=n,
                ours=mine,
                baseline=floor,
                goal=at_most(1.5),
                higher_is_better=False,
                ours_label="`pytreestore.open` + `load(as_numpy=True)` of all records",
                baseline_label=(
                    "raw TensorStore: every `ts.open`, then every read, issued together"
                    if backend == "tensorstore"
                    else "raw zarr-python: `open_array` + read of every column, gathered"
                ),
                notes=(f"{RECORDS} records; per leaf: ours {mine.median / n * 1e6:.0f} us.",),
            )
        )
    return rows


def _case(sizes: Sizes, backend: str, what: str) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-open-") as tmp:
        stores = _Stores(Path(tmp), sizes.widths, backend)
        try:
            return (_open_rows if what == "open" else _load_rows)(stores, sizes, backend)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    opens = [b for b in ("tensorstore", "zarr", "ocdbt") if b in registered_backends()]
    return [
        *(Case(f"open-{b}", lambda b=b: _case(sizes, b, "open")) for b in opens),
        *(Case(f"load-{b}", lambda b=b: _case(sizes, b, "load")) for b in ("tensorstore", "zarr")),
    ]
