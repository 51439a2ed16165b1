"""Against the anchors (issue #6): the tools a user would otherwise reach for, each timed side by
side with pytreestore in the same process, through pytreestore's public API only.

* **warm-read**: `store.load(as_numpy=True)` of an uncompressed (`codec=None`) single-column
  store of 1 GiB (float32[1024] records, default chunking), page cache warm, against `np.load`
  of a `.npy` file of the same bytes. Ratio: throughput, ours over numpy.
* **cold-read**: `pytreestore.open` + the same load + `close`, after dropping the page cache
  before every run (`sync; echo 3 > /proc/sys/vm/drop_caches`, or `posix_fadvise(DONTNEED)` on
  every file where that is refused), against `dd if=<npy> of=/dev/null bs=16M`, also cold.
* **bulk-write**: `extend_batch` of a 1 GiB batch into a fresh uncompressed store, then
  `close` (a commit is durable: chunks and folders are fsynced), against `np.save` of the same
  array + `os.fsync`. The store is created before the timer starts.
* **gather**: `store.load(indices, as_numpy=True)` of 1,000 random, unsorted record indices of
  100,000 on the 20-leaf, 3-level record of the core benchmarks, from an open store, against
  Lance: the same records as a Lance dataset with one column per leaf (fixed-size-list columns
  for the array leaves), `dataset.take(indices)` and each column to numpy. Four rows: a store
  with the default codec (zstd) and one with `codec=None`, each opened with `cache_bytes=0`
  (no cache) and with `cache_bytes=256 << 20` (decoded chunks kept between gathers, as the
  shared default cache keeps them), all against the same Lance runs.
* **orbax**: create + `extend_batch` of the stacked 100,000-record pytree (jax.Array leaves) +
  `close` + `open` + `load()` (jax.Array leaves), against Orbax `StandardCheckpointer` save +
  `wait_until_finished` + `restore` with the abstract tree as target. One checkpointer is made
  beforehand and reused, as a training loop would.
* **append-lance**, **append-h5py**: 100,000 records appended one at a time with
  `store.append`, then `flush` + `close`, against one `lance.write_dataset(mode="append")` per
  record (the one-row Arrow tables are built before the timer starts), and against h5py:
  every dataset resized by one and the row written, per record, then `flush` (no fsync). The
  anchors are slow per record, so they are timed on a prefix (500 records for Lance, 2,000
  for h5py; the counts are in the notes) and their times are **extrapolated linearly** to N
  records. Each Lance append adds a fragment and a version, so its per-record cost grows with
  the dataset and the extrapolation flatters Lance.
* **peak-memory**: the peak RSS increase of a fresh Python process while it runs
  `store.load(as_numpy=True)` on the 1 GiB store (`VmHWM` of `/proc/self/status` after a reset
  with `echo 5 > /proc/self/clear_refs`, else `ru_maxrss`), against the stored bytes N. This
  row's figures are sizes in GiB: ours is the increase, the baseline is N.

The warm-read notes also give the VM's cost of first touching fresh memory (`np.empty` and a
write to every page of 1 GiB) against rewriting a buffer already touched: a fresh output
array pays it in every load and every `np.load`. Outputs are checked against the expected
values outside the timed regions. Rows whose anchor library is not installed (`pip install
-e ".[bench]"`) are kept with n/a times and a note saying why they were skipped. All files
live under one fresh temporary directory, removed afterwards.

What the profiles show (cProfile, wall-clock spans and ``strace -c``, issues 15 and 32).
**orbax**: before issue 32 ours was about 105-125 ms: `create` 22 ms (20 arrays' metadata and
the initial commit), `extend_batch` 38 ms (zstd and the fsynced chunk writes of the whole
chunks), `close` 32 ms (the tail chunk, a second round of fsynced writes: a resize of 20
arrays, 20 chunks, a commit), `open` 3 ms and the load 10-14 ms. Since, one `extend_batch`
reaching a chunk boundary writes its tail chunk with its whole ones and commits once (`close`
then writes nothing), and `create` writes the arrays' `zarr.json` as documents in one round and
the groups, schema, version and commit records in another: on a quiet machine `create` about
12-15 ms, `extend_batch` 45-55 ms (a resize of 20 arrays 7 ms, zstd and 40 fsynced chunk files
35-40 ms, the commit 3 ms), `close` 0.2 ms, the load 10-20 ms. What is left is zstd (about 16 ms
of one core for these 10 MB) and the fsyncs: 191 for create + `extend_batch` + `close` (237
before; `strace -c`), one array per leaf, each file and its folder, against Orbax's few OCDBT
files; they cost little on a quiet disk and most of our time when the disk is shared. **gather** without a cache: every chunk is read and decoded whole
(1,000 random records of 100,000 touch them all), as Lance's take reads its pages; with the
default shared cache (or `cache_bytes`) the chunks stay decoded after the first gather.
"""

from __future__ import annotations

import gc
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _anchors_common import (
    _arrow_table,
    _guarded,
    _lance_take,
    _leaf_names,
    _need,
    _scratch,
    _Skip,
)
from _common import (
    Case,
    Result,
    Timed,
    Timing,
    at_least,
    at_most,
    format_rate,
    format_seconds,
)
from _common import measure_side_by_side as side_by_side
from bench_core import (
    _append_all,
    _check_leaves,
    _check_store,
    _check_tree,
    _columns,
    _data,
    _record,
)

import pytreestore

TITLE = "Anchors: numpy, dd, Lance, Orbax, h5py"

ROW = 1024  # float32 values per record of the single-column store: 4 KiB
GIB = 2**30
GATHER = 1_000
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Sizes:
    big_records: int  # float32[ROW] records: 262,144 make 1 GiB
    records: int  # 20-leaf records: gather, orbax, append
    read_repeats: int
    cold_repeats: int
    write_repeats: int
    gather_repeats: int
    orbax_repeats: int
    append_repeats: int
    lance_prefix: int
    h5py_prefix: int
    memory_repeats: int


FULL = Sizes(262_144, 100_000, 5, 3, 3, 25, 5, 3, 500, 2_000, 3)
QUICK = Sizes(4_096, 2_000, 1, 1, 1, 1, 1, 1, 50, 200, 1)


def _fresh(root: Path, stem: str) -> Callable[[], Path]:
    count = itertools.count()
    return lambda: root / f"{stem}-{next(count)}"


def _remove(path: Path, _: object = None) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


# --- the 1 GiB single-column store -------------------------------------------------------------


def _big_array(records: int) -> np.ndarray:
    """Every value a distinct bit pattern (no NaNs below 2**28), so a misplaced row shows."""
    return np.arange(records * ROW, dtype=np.uint32).view(np.float32).reshape(records, ROW)


def _check_big(what: str, got: np.ndarray, expected: np.ndarray) -> None:
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise RuntimeError(
            f"{what}: expected {expected.dtype}{expected.shape}, got {got.dtype}{got.shape}"
        )
    if not np.array_equal(got.view(np.uint32), expected.view(np.uint32)):
        raise RuntimeError(f"{what}: the values differ from what was written")


@dataclass(frozen=True)
class _BigFiles:
    store: Path
    npy: Path
    expected: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.expected.nbytes

    def files(self) -> list[Path]:
        return [self.npy, *(p for p in self.store.rglob("*") if p.is_file())]


def _write_big(root: Path, records: int) -> _BigFiles:
    expected = _big_array(records)
    store = root / "big-store"
    with pytreestore.create(str(store), {"x": expected[0]}, codec=None) as s:
        s.extend_batch({"x": expected})
    np.save(root / "big.npy", expected)
    return _BigFiles(store, root / "big.npy", expected)


def _first_touch(nbytes: int, repeats: int) -> str:
    """Seconds per GiB to write every page of fresh memory, against an already touched buffer.

    The first allocation gets pages the VM has (likely) handed back to the host, the slow case;
    the next ones mostly get the pages just freed, which only the guest kernel has to zero.
    """
    gib = nbytes / GIB
    first = Timed(lambda _: np.empty(nbytes, np.uint8).fill(1), 1).once() / gib
    touched = np.empty(nbytes, np.uint8)
    touched.fill(0)
    fresh, again = side_by_side(
        Timed(lambda _: np.empty(nbytes, np.uint8).fill(1), repeats),
        Timed(lambda _: touched.fill(1), repeats),
    )
    return (
        f"Memory on this VM (`np.empty` + a write to every page of {nbytes / 2**20:,.0f} MiB): "
        f"the first allocation {first:.2f} s/GiB, later ones (pages just freed) "
        f"{fresh.median / gib:.2f} s/GiB, rewriting a touched buffer {again.median / gib:.2f} "
        "s/GiB. Both sides return a fresh output array on every run, so both pay one of the "
        "first two, and which one varies from run to run."
    )


def _case_warm_read(sizes: Sizes) -> list[Result]:
    touch = _first_touch(sizes.big_records * ROW * 4, sizes.read_repeats)  # before any data
    with _scratch() as root:
        big = _write_big(root, sizes.big_records)
        store = pytreestore.open(str(big.store))
        try:
            ours, numpy_ = side_by_side(
                Timed(
                    lambda _: store.load(as_numpy=True),
                    sizes.read_repeats,
                    warmup=1,
                    teardown=lambda _, out: _check_big("load", out["x"], big.expected),
                ),
                Timed(
                    lambda _: np.load(big.npy),
                    sizes.read_repeats,
                    warmup=1,
                    teardown=lambda _, out: _check_big("np.load", out, big.expected),
                ),
            )
        finally:
            store.close()
    rate = _gib_rate(big.nbytes)
    return [
        Result(
            case="warm-read",
            n=sizes.big_records,
            ours=ours,
            baseline=numpy_,
            goal=at_least(0.7),
            higher_is_better=True,
            ours_label=(
                f"`store.load(as_numpy=True)` of a {big.nbytes / GIB:g} GiB uncompressed "
                "single-column store (float32[1024] records), open store, page cache warm"
            ),
            baseline_label="`np.load` of a .npy file of the same bytes, page cache warm",
            notes=(f"Throughput: ours {rate(ours)}, np.load {rate(numpy_)}.", touch),
        )
    ]


def _gib_rate(nbytes: int) -> Callable[[Timing], str]:
    return lambda t: format_rate(nbytes / GIB, t.median, "GiB")


# --- cold read ----------------------------------------------------------------------------------


def _drop_caches(files: Sequence[Path]) -> str:
    """Drops the page cache (globally, else of ``files``); returns the method that worked."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "`sync; echo 3 > /proc/sys/vm/drop_caches`"
    except OSError as err:
        refused = err
    if not hasattr(os, "posix_fadvise"):
        raise _Skip(
            f"cannot drop the page cache: drop_caches refused ({refused}), no posix_fadvise"
        )
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return f"`posix_fadvise(POSIX_FADV_DONTNEED)` on every file (drop_caches refused: {refused})"


def _open_load(path: Path) -> Any:
    with pytreestore.open(str(path)) as store:
        return store.load(as_numpy=True)


def _dd(path: Path) -> None:
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"], check=True, capture_output=True)


def _case_cold_read(sizes: Sizes) -> list[Result]:
    if shutil.which("dd") is None:
        raise _Skip("no `dd` on this machine")
    with _scratch() as root:
        big = _write_big(root, sizes.big_records)
        files = big.files()
        method = _drop_caches(files)  # fails early (a skip) when neither way works

        def drop() -> None:
            _drop_caches(files)

        ours, dd = side_by_side(
            Timed(
                lambda _: _open_load(big.store),
                sizes.cold_repeats,
                setup=drop,
                teardown=lambda _, out: _check_big("cold load", out["x"], big.expected),
            ),
            Timed(lambda _: _dd(big.npy), sizes.cold_repeats, setup=drop),
        )
    rate = _gib_rate(big.nbytes)
    return [
        Result(
            case="cold-read",
            n=sizes.big_records,
            ours=ours,
            baseline=dd,
            goal=at_least(0.8),
            higher_is_better=True,
            ours_label="`pytreestore.open` + `load(as_numpy=True)` + `close`, page cache dropped",
            baseline_label="`dd if=<the .npy file> of=/dev/null bs=16M`, page cache dropped",
            notes=(
                f"Throughput: ours {rate(ours)}, dd {rate(dd)}.",
                f"Page cache dropped before every run with {method}.",
            ),
        )
    ]


# --- bulk write ---------------------------------------------------------------------------------


def _np_save_fsync(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


def _case_bulk_write(sizes: Sizes) -> list[Result]:
    expected = _big_array(sizes.big_records)
    like = {"x": expected[0]}
    with _scratch() as root:
        new_store, new_npy = _fresh(root, "store"), _fresh(root, "npy")

        def create() -> tuple[Path, Any]:
            path = new_store()
            return path, pytreestore.create(str(path), like, codec=None)

        def write(state: tuple[Path, Any]) -> None:
            state[1].extend_batch({"x": expected})
            state[1].close()

        def check_store(state: tuple[Path, Any], _: object) -> None:
            _check_big("extend_batch", _open_load(state[0])["x"], expected)
            _remove(state[0])

        def check_npy(path: Path, _: object) -> None:
            _check_big("np.save", np.load(path), expected)
            _remove(path)

        ours, save = side_by_side(
            Timed(write, sizes.write_repeats, setup=create, teardown=check_store),
            Timed(
                lambda p: _np_save_fsync(p, expected),
                sizes.write_repeats,
                setup=new_npy,
                teardown=check_npy,
            ),
        )
    rate = _gib_rate(expected.nbytes)
    return [
        Result(
            case="bulk-write",
            n=sizes.big_records,
            ours=ours,
            baseline=save,
            goal=at_least(0.8),
            higher_is_better=True,
            ours_label=(
                f"`extend_batch` of a {expected.nbytes / GIB:g} GiB batch into a fresh "
                "uncompressed store (created untimed), then `close` (durable: fsynced)"
            ),
            baseline_label="`np.save` of the same array to a new file, `flush`, `os.fsync`",
            notes=(f"Throughput: ours {rate(ours)}, np.save + fsync {rate(save)}.",),
        )
    ]


# --- the 20-leaf record: gather, orbax, append ---------------------------------------------------


def _stacked(n: int) -> tuple[Any, Any, list[np.ndarray]]:
    """The stacked record of ``n`` records, one record (``like``) and the expected leaves."""
    cols = _columns(n)
    batch = _record(cols)
    like = jax.tree.map(lambda c: c[0], batch)
    return batch, like, jax.tree_util.tree_leaves(batch)


CACHE = 256 << 20  # bytes of decoded chunks a gathering reader keeps (open(cache_bytes=...))


def _case_gather(sizes: Sizes) -> list[Result]:
    lance = _need("lance", "pylance")
    n = sizes.records
    batch, like, expected = _stacked(n)
    indices = np.random.default_rng(6).choice(n, min(GATHER, n), replace=False)
    picked = [e[indices] for e in expected]
    shapes = [e.shape[1:] for e in expected]
    variants = [("zstd", 0), (None, 0), ("zstd", CACHE), (None, CACHE)]
    with _scratch() as root:
        stores = {}
        for codec in ("zstd", None):
            with pytreestore.create(str(root / f"store-{codec}"), like, codec=codec) as s:
                s.extend_batch(batch)
        for codec, cache in variants:
            path = str(root / f"store-{codec}")
            stores[codec, cache] = pytreestore.open(path, cache_bytes=cache)
        table = _arrow_table(_leaf_names(like), expected)
        lance.write_dataset(table, str(root / "records.lance"))
        dataset = lance.dataset(str(root / "records.lance"))
        del table
        check = lambda what: lambda _, out: _check_tree(what, out, like, picked)  # noqa: E731
        *ours, lance_ = side_by_side(
            *(
                Timed(
                    lambda _, s=stores[v]: s.load(indices, as_numpy=True),
                    sizes.gather_repeats,
                    warmup=1,
                    teardown=check(f"gather {v}"),
                )
                for v in variants
            ),
            Timed(
                lambda _: _lance_take(dataset, indices, shapes),
                sizes.gather_repeats,
                warmup=1,
                teardown=lambda _, out: _check_leaves("lance take", out, picked),
            ),
        )
        for s in stores.values():
            s.close()
    return [
        _gather_row(t, lance_, codec, cache, len(indices), n, lance)
        for t, (codec, cache) in zip(ours, variants)
    ]


def _gather_row(
    ours: Timing, lance_: Timing, codec: str | None, cache: int, k: int, n: int, lance: Any
) -> Result:
    options = [
        *([] if codec else ["codec=None"]),
        *([f"cache_bytes={cache >> 20} MiB"] if cache else []),
    ]
    return Result(
        case="gather" + (f" ({', '.join(options)})" if options else ""),
        n=n,
        ours=ours,
        baseline=lance_,
        goal=at_least(2.0),
        higher_is_better=True,
        ours_label=(
            f"`store.load(indices, as_numpy=True)` of {k:,} random unsorted indices of N, open "
            f"store, {'default codec (zstd)' if codec else 'uncompressed (`codec=None`)'}, "
            "default chunking"
            + (
                f", opened with `cache_bytes={cache >> 20} << 20` (decoded chunks kept; the "
                "warm-up run fills the cache)"
                if cache
                else ", opened with `cache_bytes=0` (no cache)"
            )
        ),
        baseline_label=(
            f"Lance {lance.__version__}: `dataset.take(indices)` on an open dataset (one column "
            "per leaf, fixed-size lists for array leaves), then every column to numpy"
        ),
        notes=(
            f"Per gather: ours {ours.median * 1e3:.2f} ms, Lance {lance_.median * 1e3:.2f} ms.",
        ),
    )


def _case_orbax(sizes: Sizes) -> list[Result]:
    ocp = _need("orbax.checkpoint", "orbax-checkpoint")
    batch, like, expected = _stacked(sizes.records)
    tree = jax.tree.map(jnp.asarray, batch)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    checkpointer = ocp.StandardCheckpointer()
    with _scratch() as root:
        new_store, new_ckpt = _fresh(root, "store"), _fresh(root, "ckpt")

        def ours(path: Path) -> Any:
            with pytreestore.create(str(path), like) as store:
                store.extend_batch(tree)
            with pytreestore.open(str(path), like=like) as store:
                return jax.block_until_ready(store.load())

        def orbax(path: Path) -> Any:
            checkpointer.save(str(path), tree)
            checkpointer.wait_until_finished()
            return jax.block_until_ready(checkpointer.restore(str(path), target))

        def check(what: str) -> Callable[[Path, Any], None]:
            def check_and_remove(path: Path, out: Any) -> None:
                _check_tree(what, out, like, expected)
                _remove(path)

            return check_and_remove

        try:
            mine, theirs = side_by_side(
                Timed(ours, sizes.orbax_repeats, 1, new_store, check("pytreestore")),
                Timed(orbax, sizes.orbax_repeats, 1, new_ckpt, check("orbax restore")),
            )
        finally:
            checkpointer.close()
    mib = sum(e.nbytes for e in expected) / 2**20
    return [
        Result(
            case="orbax",
            n=sizes.records,
            ours=mine,
            baseline=theirs,
            goal=at_least(2.0),
            higher_is_better=True,
            ours_label=(
                "`create` + `extend_batch(stacked pytree)` + `close` + `open` + `load()` "
                "(jax.Array leaves) + `block_until_ready`"
            ),
            baseline_label=(
                f"Orbax {ocp.__version__} `StandardCheckpointer`: `save` + `wait_until_finished` "
                "+ `restore(path, abstract tree)` + `block_until_ready` (checkpointer made once)"
            ),
            notes=(f"The stacked pytree: 20 leaves, {mib:.1f} MiB; one untimed warm-up run each.",),
        )
    ]


# --- one record at a time -----------------------------------------------------------------------


def _lance_appends(path: Path, tables: Sequence[Any]) -> None:
    lance = _need("lance", "pylance")
    lance.write_dataset(tables[0], str(path), mode="create")
    for table in tables[1:]:
        lance.write_dataset(table, str(path), mode="append")


def _h5py_appends(path: Path, records: Sequence[Any], names: Sequence[str]) -> None:
    h5py = _need("h5py", "h5py")
    leaves = jax.tree_util.tree_leaves
    with h5py.File(path, "w") as f:
        sets = []
        for name, leaf in zip(names, leaves(records[0]), strict=True):
            shape = np.shape(leaf)
            sets.append(
                f.create_dataset(
                    name, (0, *shape), np.asarray(leaf).dtype, maxshape=(None, *shape), chunks=True
                )
            )
        for i, record in enumerate(records):
            for dataset, leaf in zip(sets, leaves(record), strict=True):
                dataset.resize(i + 1, axis=0)
                dataset[i] = leaf
        f.flush()


def _check_lance(path: Path, expected: Sequence[np.ndarray]) -> None:
    dataset = _need("lance", "pylance").dataset(str(path))
    k = len(expected[0])
    if dataset.count_rows() != k:
        raise RuntimeError(f"lance: expected {k} rows, got {dataset.count_rows()}")
    _check_leaves(
        "lance", _lance_take(dataset, np.arange(k), [e.shape[1:] for e in expected]), expected
    )


def _check_h5py(path: Path, names: Sequence[str], expected: Sequence[np.ndarray]) -> None:
    with _need("h5py", "h5py").File(path, "r") as f:
        _check_leaves("h5py", [f[name][()] for name in names], expected)


def _case_append(sizes: Sizes, anchor: str) -> list[Result]:
    if anchor == "lance":
        _need("lance", "pylance")
    else:
        _need("h5py", "h5py")
    records, expected = _data(sizes.records)
    prefix = min(sizes.lance_prefix if anchor == "lance" else sizes.h5py_prefix, len(records))
    head = [e[:prefix] for e in expected]
    names = _leaf_names(records[0])
    with _scratch() as root:
        new_store, new_other = _fresh(root, "store"), _fresh(root, anchor)

        def check_store(path: Path, _: object) -> None:
            _check_store(path, records[0], expected)
            _remove(path)

        if anchor == "lance":
            full = _arrow_table(names, head)
            tables = [full.slice(i, 1) for i in range(prefix)]
            run = lambda path: _lance_appends(path, tables)  # noqa: E731
            check = lambda path: _check_lance(path, head)  # noqa: E731
        else:
            run = lambda path: _h5py_appends(path, records[:prefix], names)  # noqa: E731
            check = lambda path: _check_h5py(path, names, head)  # noqa: E731
        ours, other = side_by_side(
            Timed(
                lambda p: _append_all(p, records),
                sizes.append_repeats,
                setup=new_store,
                teardown=check_store,
            ),
            Timed(
                run,
                sizes.append_repeats,
                setup=new_other,
                teardown=lambda p, _: _check_and_remove(check, p),
            ),
        )
    return [_append_row(sizes.records, prefix, ours, other, anchor)]


def _check_and_remove(check: Callable[[Path], None], path: Path) -> None:
    check(path)
    _remove(path)


def _append_row(n: int, prefix: int, ours: Timing, other: Timing, anchor: str) -> Result:
    scaled = Timing(tuple(t * n / prefix for t in other.times))
    per = lambda t, k: f"{t.median / k * 1e6:,.1f} us"  # noqa: E731
    if anchor == "lance":
        label = (
            '`lance.write_dataset(one_row_table, path, mode="append")` per record (tables built '
            "untimed)"
        )
    else:
        label = (
            "h5py: every dataset `resize`d by one and the row written, per record, then `flush` "
            "(no fsync)"
        )
    return Result(
        case=f"append-{anchor}",
        n=n,
        ours=ours,
        baseline=scaled,
        goal=at_least(100.0),
        higher_is_better=True,
        ours_label="create, N x `store.append(record)`, `flush()`, `close()`",
        baseline_label=(
            f"{label}; timed on the first {prefix:,} records, extrapolated linearly to N"
        ),
        notes=(
            f"Per record: ours {per(ours, n)}, {anchor} {per(other, prefix)} "
            f"(measured on {prefix:,} records: {other}).",
        ),
    )


# --- peak memory --------------------------------------------------------------------------------

_PEAK = r"""
import json, resource, sys, time
import numpy as np
import pytreestore

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

what, path = sys.argv[1:]
store = pytreestore.open(path) if what == "store" else None
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    method = "VmHWM after clear_refs"
except OSError:
    method = "ru_maxrss"
before = status("VmRSS:")
start = time.perf_counter()
out = store.load(as_numpy=True)["x"] if store is not None else np.load(path)
seconds = time.perf_counter() - start
if method == "ru_maxrss":
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
else:
    peak = status("VmHWM:")
result = {"increase": peak - before, "seconds": seconds, "method": method, "nbytes": out.nbytes}
print(json.dumps(result))
"""


def _peak(what: str, path: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, what, str(path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"peak-memory subprocess failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _case_peak_memory(sizes: Sizes) -> list[Result]:
    if not Path("/proc/self/status").exists():
        raise _Skip("needs Linux's /proc/self/status")
    with _scratch() as root:
        big = _write_big(root, sizes.big_records)
        nbytes, store, npy = big.nbytes, big.store, big.npy
        del big  # the subprocesses need only the files
        gc.collect()
        ours = [_peak("store", store) for _ in range(sizes.memory_repeats)]
        numpy_ = [_peak("npy", npy) for _ in range(sizes.memory_repeats)]
    if any(r["nbytes"] != nbytes for r in ours + numpy_):
        raise RuntimeError(f"peak-memory: a load did not return {nbytes} bytes: {ours + numpy_}")
    gib = lambda runs: Timing(tuple(r["increase"] / GIB for r in runs))  # noqa: E731
    np_ratio = gib(numpy_).median / (nbytes / GIB)
    return [
        Result(
            case="peak-memory",
            n=sizes.big_records,
            ours=gib(ours),
            baseline=Timing((nbytes / GIB,) * len(ours)),
            goal=at_most(1.3),
            higher_is_better=False,
            unit="GiB",
            ours_label=(
                "peak RSS increase of a fresh process during `store.load(as_numpy=True)` of "
                "the 1 GiB uncompressed store"
            ),
            baseline_label="N: the bytes loaded",
            notes=(
                f"Peak increases: {', '.join(f'{g:.3f}' for g in gib(ours).times)} GiB, "
                f"measured with {ours[0]['method']}; the load took "
                f"{', '.join(format_seconds(r['seconds']) for r in ours)} in those processes.",
                f"For reference, `np.load` of the .npy file peaks at {np_ratio:.2f} x N.",
            ),
        )
    ]


def cases(quick: bool) -> list[Case]:
    s = QUICK if quick else FULL
    return [
        _guarded("warm-read", s.big_records, at_least(0.7), lambda: _case_warm_read(s)),
        _guarded("cold-read", s.big_records, at_least(0.8), lambda: _case_cold_read(s)),
        _guarded("bulk-write", s.big_records, at_least(0.8), lambda: _case_bulk_write(s)),
        _guarded("gather", s.records, at_least(2.0), lambda: _case_gather(s)),
        _guarded("orbax", s.records, at_least(2.0), lambda: _case_orbax(s)),
        _guarded("append-lance", s.records, at_least(100.0), lambda: _case_append(s, "lance")),
        _guarded("append-h5py", s.records, at_least(100.0), lambda: _case_append(s, "h5py")),
        _guarded("peak-memory", s.big_records, at_most(1.3), lambda: _case_peak_memory(s)),
    ]
