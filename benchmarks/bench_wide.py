"""Very wide trees: a dict of 4,000 float32[8] leaves, 256 records, on local disk.

* **write + open + full read**: ``create`` + ``extend_batch`` of the 256 records + ``close``,
  then ``open`` + ``load(as_numpy=True)`` of everything; ours with ``pack=True`` (the leaves
  in one shared ``[256, 32000]`` array), on each backend; the baseline is today's default,
  the file TensorStore backend with one array per leaf. Goal: at least 10x faster. The notes
  count the files each store makes.
* **one leaf**: the trade-off. ``open`` + ``load(columns=<one leaf>)`` of a packed store
  decodes the pack's whole chunks (all 4,000 leaves of the records) and copies out the leaf's
  elements alone (``PartialReads``), where an unpacked store reads that leaf's array alone;
  reported against the unpacked store, at 256 records and at 2,048 (where copying the pack's
  whole rows out, as reads did before, cost a 256 MiB buffer per one-leaf read), no goal
  beyond staying within 10x.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from _common import Case, Result, Timed, at_least, at_most, measure_side_by_side

import pytreestore
from pytreestore.backends import registered_backends

TITLE = "Wide trees: 4,000 leaves, packed and not"
BACKENDS = [b for b in ("tensorstore", "zarr", "ocdbt") if b in registered_backends()]


@dataclass(frozen=True)
class Sizes:
    leaves: int
    records: int
    repeats: int
    long: int  # records of the second one-leaf case


FULL = Sizes(leaves=4000, records=256, repeats=3, long=2048)
QUICK = Sizes(leaves=400, records=64, repeats=2, long=256)


def _like(sizes: Sizes) -> dict[str, Any]:
    return {f"k{i:04d}": np.zeros(8, np.float32) for i in range(sizes.leaves)}


def _batch(sizes: Sizes) -> dict[str, np.ndarray]:
    r = np.arange(sizes.records, dtype=np.float32)[:, None]  # compressible: zstd decodes fast
    return {f"k{i:04d}": r + np.arange(8, dtype=np.float32) + i for i in range(sizes.leaves)}


def _files(path: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(path))


class _Round:
    """Write, open and read a store in a fresh directory; keeps the file count it saw."""

    def __init__(self, sizes: Sizes, backend: str, pack: bool) -> None:
        self.sizes, self.backend, self.pack = sizes, backend, pack
        self.like, self.batch = _like(sizes), _batch(sizes)
        self.files = 0

    def setup(self) -> Path:
        return Path(tempfile.mkdtemp(prefix="pytreestore-bench-wide-")) / "s"

    def run(self, path: Path) -> dict[str, np.ndarray]:
        with pytreestore.create(path, self.like, backend=self.backend, pack=self.pack) as s:
            s.extend_batch(self.batch)
        return pytreestore.open(path, backend=self.backend).load(as_numpy=True)

    def teardown(self, path: Path, got: dict[str, np.ndarray]) -> None:
        if any(not np.array_equal(got[k], v) for k, v in self.batch.items()):
            raise RuntimeError(f"{self.backend}, pack={self.pack}: the load differs")
        self.files = _files(path)
        shutil.rmtree(path.parent, ignore_errors=True)


def _round_trip(sizes: Sizes, backend: str) -> list[Result]:
    ours, base = _Round(sizes, backend, True), _Round(sizes, "tensorstore", False)
    mine, floor = measure_side_by_side(
        Timed(ours.run, sizes.repeats, setup=ours.setup, teardown=ours.teardown),
        Timed(base.run, sizes.repeats, setup=base.setup, teardown=base.teardown),
    )
    n = sizes.leaves
    return [
        Result(
            case=f"write + open + full read, {n} leaves, packed ({backend})",
            n=n,
            ours=mine,
            baseline=floor,
            goal=at_least(10.0),
            higher_is_better=True,
            ours_label=f"`create(pack=True)` on {backend} + `extend_batch` + `open` + `load`",
            baseline_label="the same, file TensorStore, one array per leaf (the default)",
            notes=(
                f"{sizes.records} records of float32[8] leaves; files on disk: packed "
                f"{ours.files:,}, one array per leaf {base.files:,}.",
            ),
        )
    ]


def _one_leaf(sizes: Sizes) -> list[Result]:
    root = Path(tempfile.mkdtemp(prefix="pytreestore-bench-wide-"))
    try:
        like, batch = _like(sizes), _batch(sizes)
        for pack in (True, False):
            with pytreestore.create(root / str(pack), like, pack=pack) as s:
                s.extend_batch(batch)
        leaf = f"['k{sizes.leaves // 2:04d}']"

        def read(path: Path) -> np.ndarray:
            store = pytreestore.open(path, cache_bytes=0)
            return store.load(columns=leaf, as_numpy=True)[leaf[2:-2]]

        def check(_: object, got: np.ndarray) -> None:
            if not np.array_equal(got, batch[leaf[2:-2]]):
                raise RuntimeError("one leaf: the load differs")

        mine, floor = measure_side_by_side(
            Timed(lambda _: read(root / "True"), sizes.repeats * 3, warmup=1, teardown=check),
            Timed(lambda _: read(root / "False"), sizes.repeats * 3, warmup=1, teardown=check),
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    records = f", {sizes.records:,} records" if sizes.records != FULL.records else ""
    return [
        Result(
            case=f"open + read one leaf, {sizes.leaves} leaves{records}, packed (tensorstore)",
            n=sizes.leaves,
            ours=mine,
            baseline=floor,
            goal=at_most(10.0),
            higher_is_better=False,
            ours_label="`open` + `load(columns=<one leaf>)` of the packed store",
            baseline_label="the same of the store with one array per leaf",
            notes=(
                f"{sizes.records:,} records. The packed read decodes the pack's whole chunks "
                "(every leaf's values) and copies out the leaf's elements only.",
            ),
        )
    ]


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    out = [Case(f"round-trip-{b}", lambda b=b: _round_trip(sizes, b)) for b in BACKENDS]
    long = replace(sizes, records=sizes.long)
    return [
        *out,
        Case("one-leaf", lambda: _one_leaf(sizes)),
        Case("one-leaf-long", lambda: _one_leaf(long)),
    ]
