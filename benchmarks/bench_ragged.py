"""Ragged records (issue #14): a store created with ``ragged=[".p"]``, each record a fixed part
(``step`` int32[], ``v`` float32[3]) and a list ``p`` of 1 to 32 elements (uniform, fixed
seed) of an 8-leaf dataclass (float32 and int32 scalars, alternating). Local stores,
TensorStore backend, default chunking.

* **take**: `store.load(indices, ragged="pad", as_numpy=True)` of 256 random, unsorted
  records, a different index set each repeat, against Lance: the same records as a dataset
  with `step`, `v` (fixed-size list) and `p` as one `large_list<struct<8 fields>>` column;
  `dataset.take(indices)`, then the list column to padded numpy arrays and a mask (list
  offsets and the struct's flattened children scattered with one boolean-mask assignment per
  field). Ratio: speedup, Lance over ours. Four rows: the default codec (zstd, the goal row)
  and `codec=None`, each opened with `cache_bytes=0` (no cache) and with
  `cache_bytes=256 << 20`, all against the same Lance runs.
* **append**: N x `store.append(record)` of the ragged records, then `flush` + `close`,
  timed side by side with the wall clock and with CPU time (every thread; the notes),
  against the same into a fixed-structure store whose record has the same columns and about
  the same values: `step`, `v` and 8 leaves of shape [16] (float32 and int32 alternating),
  i.e. the ragged record's 8 element columns at 16 elements (the mean list length is 16.5).
  That compares the cost of raggedness (a list of dataclasses to walk, an offsets column)
  against the same column count and bytes.
* **append (vs scalar leaves)**: the same ragged appends against a fixed record holding a
  tuple of 16 Points of 8 scalar leaves: the same count of leaf values, each a Python object
  as in a ragged list (and each its own column).
* **bytes**: the bytes a ragged store holds before compression, the sum over its arrays of
  rows x itemsize x values per row read from each array's `zarr.json` (`offsets` included),
  against the bytes of the leaf values appended. Sizes in MB, not times.

Outputs are checked against the expected values outside the timed regions.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from _common import (
    Case,
    Result,
    Timed,
    Timing,
    at_least,
    at_most,
    measure_side_by_side,
)
from bench_ragged_fixed import _timed_pair as timed_pair  # the CPU time beside the wall clock
from flax import struct

import pytreestore

TITLE = "Ragged records (#14)"

MAX_LEN = 32
TAKE = 256
CACHE = 256 << 20
FIXED_LEN = 16  # elements per leaf of the fixed-structure record of the append case
F32, I32 = np.dtype(np.float32), np.dtype(np.int32)
DTYPES = (F32, I32) * 4  # the element leaves a..h


@dataclass(frozen=True)
class Sizes:
    n: int
    take_repeats: int
    append_repeats: int


FULL = Sizes(n=50_000, take_repeats=25, append_repeats=2)
QUICK = Sizes(n=5_000, take_repeats=3, append_repeats=1)


@struct.dataclass
class Point:
    a: Any
    b: Any
    c: Any
    d: Any
    e: Any
    f: Any
    g: Any
    h: Any


@struct.dataclass
class Record:
    step: Any  # int32[]
    v: Any  # float32[3]
    p: Any  # list of Point, or (fixed record) a Point of [16] leaves


@dataclass(frozen=True)
class Data:
    """The records and their values as flat columns (elements of every record, in order)."""

    records: list[Record]
    step: np.ndarray
    v: np.ndarray
    offsets: np.ndarray  # int64[n + 1], starting at 0
    elements: tuple[np.ndarray, ...]  # 8 columns of int32/float32 [total elements]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def flat_bytes(self) -> int:
        return sum(x.nbytes for x in (self.step, self.v, *self.elements))

    def padded(self, index: np.ndarray) -> tuple[Record, np.ndarray]:
        """The expected ``(batch, mask)`` of ``index``, padded to its longest list."""
        lengths = self.lengths[index]
        mask = np.arange(lengths.max()) < lengths[:, None]
        starts, ends = self.offsets[index].tolist(), self.offsets[index + 1].tolist()
        rows = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends, strict=True)])
        leaves = []
        for col in self.elements:
            out = np.zeros(mask.shape, col.dtype)
            out[mask] = col[rows]
            leaves.append(out)
        return Record(self.step[index], self.v[index], Point(*leaves)), mask


def _data(n: int) -> Data:
    rng = np.random.default_rng(14)
    lengths = rng.integers(1, MAX_LEN + 1, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    elements = tuple(
        rng.standard_normal(total).astype(F32)
        if dt == F32
        else rng.integers(-1000, 1000, total, I32)
        for dt in DTYPES
    )
    step = np.arange(n, dtype=I32)
    v = rng.standard_normal((n, 3)).astype(F32)
    points = [Point(*t) for t in zip(*(list(col) for col in elements), strict=True)]
    steps, vs = list(step), list(v)
    records = [Record(steps[i], vs[i], points[offsets[i] : offsets[i + 1]]) for i in range(n)]
    gc.freeze()  # long-lived: keep them out of the full collections before each timed run
    return Data(records, step, v, offsets, elements)


def _fixed_records(data: Data) -> list[Record]:
    rng = np.random.default_rng(15)
    cols = [
        rng.standard_normal((len(data.records), FIXED_LEN)).astype(dt)
        if dt == F32
        else rng.integers(-1000, 1000, (len(data.records), FIXED_LEN), I32)
        for dt in DTYPES
    ]
    rows = [list(col) for col in cols]
    out = [
        Record(r.step, r.v, Point(*(row[i] for row in rows))) for i, r in enumerate(data.records)
    ]
    gc.freeze()
    return out


@dataclass
class _Scratch:
    root: Path
    count: int = 0

    def new(self) -> Path:
        self.count += 1
        return self.root / f"store-{self.count}"


@contextlib.contextmanager
def _scratch() -> Iterator[_Scratch]:
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-ragged-") as tmp:
        yield _Scratch(Path(tmp))


def _append_all(path: Path, records: Sequence[Record], **create: Any) -> None:
    store = pytreestore.create(str(path), records[0], **create)
    append = store.append
    for record in records:
        append(record)
    store.flush()
    store.close()


def _check_padded(what: str, got: tuple[Any, Any], expected: tuple[Record, np.ndarray]) -> None:
    batch, mask = got
    want, want_mask = expected
    if isinstance(mask, Record):  # ours: a mask per leaf; every element leaf's is the same
        masks = jax.tree_util.tree_leaves(mask.p)
        mask = masks[0]
        if any(not np.array_equal(m, mask) for m in masks):
            raise RuntimeError(f"{what}: the element leaves' masks differ")
    if mask.shape != want_mask.shape or not np.array_equal(mask, want_mask):
        raise RuntimeError(f"{what}: mask {mask.shape} is not the expected {want_mask.shape}")
    for k, (g, e) in enumerate(
        zip(jax.tree_util.tree_leaves(batch), jax.tree_util.tree_leaves(want), strict=True)
    ):
        g = np.asarray(g)
        if g.dtype != e.dtype or g.shape != e.shape or not np.array_equal(g, e):
            raise RuntimeError(
                f"{what}: leaf {k}: expected {e.dtype}{list(e.shape)}, got {g.dtype}{list(g.shape)}"
            )


# --- take ---------------------------------------------------------------------------------------


def _need_lance() -> tuple[Any, Any]:
    import lance
    import pyarrow as pa

    return lance, pa


def _arrow_table(data: Data) -> Any:
    _, pa = _need_lance()
    names = [f.name for f in Point.__dataclass_fields__.values()]
    points = pa.StructArray.from_arrays([pa.array(c) for c in data.elements], names=names)
    p = pa.LargeListArray.from_arrays(pa.array(data.offsets, pa.int64()), points)
    v = pa.FixedSizeListArray.from_arrays(pa.array(data.v.reshape(-1)), 3)
    return pa.table({"step": pa.array(data.step), "v": v, "p": p})


def lance_padded(dataset: Any, index: np.ndarray) -> tuple[Record, np.ndarray]:
    """``dataset.take(index)``, with the list column padded to its longest list and a mask."""
    table = dataset.take(index)
    step = table.column("step").to_numpy()
    v = table.column("v").combine_chunks().flatten().to_numpy().reshape(-1, 3)
    p = table.column("p").combine_chunks()
    lengths = np.diff(p.offsets.to_numpy())
    mask = np.arange(lengths.max()) < lengths[:, None]
    leaves = []
    for child in p.flatten().flatten():  # the list's values (offset-aware), then its fields
        col = child.to_numpy(zero_copy_only=False)
        out = np.zeros(mask.shape, col.dtype)
        out[mask] = col
        leaves.append(out)
    return Record(step, v, Point(*leaves)), mask


def _index_sets(n: int, count: int, seed: int) -> Callable[[], np.ndarray]:
    rng = np.random.default_rng(seed)
    sets = iter([rng.choice(n, TAKE, replace=False) for _ in range(count)])
    return lambda: next(sets)


def _case_take(sizes: Sizes) -> list[Result]:
    lance, _ = _need_lance()
    data = _data(sizes.n)
    variants = [("zstd", 0), (None, 0), ("zstd", CACHE), (None, CACHE)]
    runs = 1 + sizes.take_repeats  # one warm-up
    with _scratch() as root:
        for codec in ("zstd", None):
            _append_all(root.root / f"store-{codec}", data.records, ragged=[".p"], codec=codec)
        stores = {
            (codec, cache): pytreestore.open(str(root.root / f"store-{codec}"), cache_bytes=cache)
            for codec, cache in variants
        }
        lance.write_dataset(_arrow_table(data), str(root.root / "records.lance"))
        dataset = lance.dataset(str(root.root / "records.lance"))

        def check(what: str) -> Callable[[np.ndarray, Any], None]:
            return lambda index, out: _check_padded(what, out, data.padded(index))

        *ours, lance_ = measure_side_by_side(
            *(
                Timed(
                    lambda index, s=stores[v]: s.load(index, ragged="pad", as_numpy=True),
                    sizes.take_repeats,
                    warmup=1,
                    setup=_index_sets(sizes.n, runs, 7),  # the same sets, in the same order
                    teardown=check(f"take {v}"),
                )
                for v in variants
            ),
            Timed(
                lambda index: lance_padded(dataset, index),
                sizes.take_repeats,
                warmup=1,
                setup=_index_sets(sizes.n, runs, 7),
                teardown=check("lance take"),
            ),
        )
        for s in stores.values():
            s.close()
    return [
        _take_row(t, lance_, codec, cache, sizes.n, lance.__version__)
        for t, (codec, cache) in zip(ours, variants, strict=True)
    ]


def _take_row(
    ours: Timing, lance_: Timing, codec: str | None, cache: int, n: int, version: str
) -> Result:
    options = [
        *([] if codec else ["codec=None"]),
        *([f"cache_bytes={cache >> 20} MiB"] if cache else []),
    ]
    return Result(
        case="take" + (f" ({', '.join(options)})" if options else ""),
        n=n,
        ours=ours,
        baseline=lance_,
        goal=at_least(1.5),
        higher_is_better=True,
        ours_label=(
            f'`store.load(indices, ragged="pad", as_numpy=True)` of {TAKE} random unsorted '
            "indices of N (a new set each repeat), open store, "
            + ("default codec (zstd)" if codec else "uncompressed (`codec=None`)")
            + (
                f", opened with `cache_bytes={cache >> 20} << 20` (the warm-up fills part of it)"
                if cache
                else ", opened with `cache_bytes=0` (no cache)"
            )
        ),
        baseline_label=(
            f"Lance {version}: `dataset.take(indices)` (same index sets), `p` a "
            "`large_list<struct>` column, to padded numpy arrays and a mask"
        ),
        notes=(f"Per take: ours {ours.median * 1e3:.2f} ms, Lance {lance_.median * 1e3:.2f} ms.",),
    )


# --- append -------------------------------------------------------------------------------------


def _fixed_scalar_records(data: Data) -> list[Record]:
    """Fixed records holding a tuple of FIXED_LEN Points of scalar leaves: 8 x FIXED_LEN leaf
    values per record as separate leaves, as many Python objects as an average ragged list."""
    out = []
    for r, row in zip(data.records, _fixed_records(data), strict=True):
        leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(row.p)]
        points = tuple(Point(*(leaf[k][()] for leaf in leaves)) for k in range(FIXED_LEN))
        out.append(Record(r.step, r.v, points))
    gc.freeze()
    return out


def _case_append_scalars(sizes: Sizes) -> list[Result]:
    return _case_append(sizes, scalars=True)


def _case_append(sizes: Sizes, *, scalars: bool = False) -> list[Result]:
    data = _data(sizes.n)
    fixed = _fixed_scalar_records(data) if scalars else _fixed_records(data)
    expected_fixed = [
        np.stack([np.asarray(x) for x in col])
        for col in zip(*(jax.tree_util.tree_leaves(r) for r in fixed[:100]), strict=True)
    ]
    with _scratch() as scratch:

        def check_ragged(path: Path, _: object) -> None:
            with pytreestore.open(str(path)) as store:
                index = np.arange(0, sizes.n, 97)
                _check_padded("ragged append", store.load(index, as_numpy=True), data.padded(index))
            shutil.rmtree(path)

        def check_fixed(path: Path, _: object) -> None:
            with pytreestore.open(str(path)) as store:
                got = jax.tree_util.tree_leaves(store.load(slice(0, 100), as_numpy=True))
                if len(store) != sizes.n or not all(
                    np.array_equal(g, e) for g, e in zip(got, expected_fixed, strict=True)
                ):
                    raise RuntimeError("fixed append: the store does not hold the records")
            shutil.rmtree(path)

        runs = {
            "ragged": (lambda path: _append_all(path, data.records, ragged=[".p"]), check_ragged),
            "fixed": (lambda path: _append_all(path, fixed), check_fixed),
        }
        ragged, flat, cpu = timed_pair(
            lambda kind: Timed(
                runs[kind][0],
                sizes.append_repeats,
                setup=scratch.new,
                teardown=runs[kind][1],
            ),
            0,
        )
    mean = float(data.lengths.mean())
    fixed_label = (
        f"`step`, `v` and a tuple of {FIXED_LEN} Points of 8 scalar leaves ({8 * FIXED_LEN} "
        "leaf values, each its own leaf and column, as many Python objects as a ragged list)"
        if scalars
        else f"`step`, `v` and 8 leaves of shape [{FIXED_LEN}] (float32/int32 alternating), "
        f"the same 10 columns at {FIXED_LEN} elements"
    )
    return [
        Result(
            case="append (vs scalar leaves)" if scalars else "append",
            n=sizes.n,
            ours=ragged,
            baseline=flat,
            goal=at_most(1.5),
            higher_is_better=False,
            ours_label=(
                'create a local store with `ragged=[".p"]`, N x `store.append(record)`, '
                f"`flush()`, `close()`; lists of 1-{MAX_LEN} elements (mean {mean:.1f})"
            ),
            baseline_label=f"the same into a fixed-structure store: {fixed_label}",
            notes=(
                f"Per record: ragged {ragged.median / sizes.n * 1e6:.1f} us, fixed "
                f"{flat.median / sizes.n * 1e6:.1f} us. CPU time (`time.process_time`, all "
                f"threads, median): ragged {cpu[0] / sizes.n * 1e6:.1f} us, fixed "
                f"{cpu[1] / sizes.n * 1e6:.1f} us a record, ratio {cpu[0] / cpu[1]:.2f}x.",
            ),
        )
    ]


# --- bytes --------------------------------------------------------------------------------------


def stored_bytes(path: Path) -> int:
    """The sum over the store's arrays of rows x itemsize x values per row (``zarr.json``)."""
    total = 0
    for meta in path.rglob("zarr.json"):
        node = json.loads(meta.read_text())
        if node.get("node_type") != "array":
            continue
        total += math.prod(node["shape"]) * np.dtype(node["data_type"]).itemsize
    return total


def _case_bytes(sizes: Sizes) -> list[Result]:
    data = _data(sizes.n)
    with _scratch() as scratch:
        path = scratch.new()
        _append_all(path, data.records, ragged=[".p"])
        stored = stored_bytes(path)
        offsets = sum(
            math.prod(json.loads(m.read_text())["shape"]) * 8
            for m in path.rglob("*-offsets/zarr.json")
        )
    flat = data.flat_bytes()
    mb = 1e6
    return [
        Result(
            case="bytes",
            n=sizes.n,
            ours=Timing((stored / mb,)),
            baseline=Timing((flat / mb,)),
            goal=at_most(1.05),
            higher_is_better=False,
            ours_label=(
                "bytes before compression: the sum over the store's arrays of rows x itemsize x "
                "values per row, from each array's `zarr.json` (offsets included)"
            ),
            baseline_label="the bytes of the leaf values appended (`step`, `v`, 8 element leaves)",
            notes=(
                f"Stored {stored:,} B, of which {offsets:,} B of offsets (8 B per record); "
                f"values {flat:,} B ({int(data.offsets[-1]):,} elements).",
            ),
            unit="MB",
        )
    ]


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    return [
        Case("take", lambda: _case_take(sizes)),
        Case("append", lambda: _case_append(sizes)),
        Case("append_scalars", lambda: _case_append_scalars(sizes)),
        Case("bytes", lambda: _case_bytes(sizes)),
    ]
