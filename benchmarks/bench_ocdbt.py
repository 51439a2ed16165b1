"""The OCDBT backend (issue 17, part 1) against today's file TensorStore backend and Orbax.

* **wide tree**: `create` + `extend_batch` + `close`, then `open` + `load(as_numpy=True)`, of
  a 4,000-leaf tree (a dict of float32[8] leaves), 256 records, with `backend="ocdbt"`
  against `backend="tensorstore"` (one folder and files per leaf); goal at least 3x faster,
  and at most 20 files on disk (counted, in the notes).
* **orbax**: the same batched tree saved and restored by Orbax `StandardCheckpointer`
  against ours on OCDBT (`create` + `extend_batch` + `close` + `open` + `load`); goal ours
  at least 2x faster.
* **commit**: one `append` + `flush` (a commit: resize, tail chunk, version record, commit
  record and root in one OCDBT transaction) of a 20-leaf record, OCDBT against the file
  backend; reported, goal at most 1.5x.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _common import Case, Result, Timed, at_least, at_most, measure_side_by_side

import pytreestore

TITLE = "The OCDBT backend"


@dataclass(frozen=True)
class Sizes:
    leaves: int
    records: int
    repeats: int
    commits: int


FULL = Sizes(leaves=4000, records=256, repeats=3, commits=30)
QUICK = Sizes(leaves=200, records=16, repeats=1, commits=5)


def _tree(sizes: Sizes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    like = {f"leaf{i:04d}": np.zeros(8, np.float32) for i in range(sizes.leaves)}
    rows = np.arange(sizes.records, dtype=np.float32)[:, None]
    batch = {k: rows + np.arange(8, dtype=np.float32) + i for i, k in enumerate(like)}
    return like, batch


def _files(path: Path) -> int:
    return sum(len(names) for _, _, names in os.walk(path))


@contextmanager
def _scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="pytreestore-bench-ocdbt-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check(batch: dict[str, np.ndarray], got: Any) -> None:
    if set(got) != set(batch) or not all(np.array_equal(got[k], batch[k]) for k in batch):
        raise RuntimeError("the load differs from what was written")


def _case_wide(sizes: Sizes) -> list[Result]:
    like, batch = _tree(sizes)
    counts: dict[str, int] = {}
    with _scratch() as root:

        def fresh(backend: str) -> Path:  # untimed: the last run's store removed
            shutil.rmtree(root / backend, ignore_errors=True)
            return root / backend

        def run(backend: str) -> Any:
            path = root / backend
            with pytreestore.create(str(path), like, backend=backend) as store:
                store.extend_batch(batch)
            with pytreestore.open(str(path)) as store:
                got = store.load(as_numpy=True)
            counts[backend] = _files(path)
            return got

        ours, theirs = measure_side_by_side(
            Timed(
                lambda _: run("ocdbt"),
                sizes.repeats,
                1,
                lambda: fresh("ocdbt"),
                lambda _, o: _check(batch, o),
            ),
            Timed(
                lambda _: run("tensorstore"),
                sizes.repeats,
                1,
                lambda: fresh("tensorstore"),
                lambda _, o: _check(batch, o),
            ),
        )
    return [
        Result(
            case=f"wide tree, {sizes.leaves} leaves",
            n=sizes.leaves,
            ours=ours,
            baseline=theirs,
            goal=at_least(3.0),
            higher_is_better=True,
            ours_label='`backend="ocdbt"`: `create` + `extend_batch` + `close` + `open` + `load`',
            baseline_label='the same with `backend="tensorstore"` (file kvstore)',
            notes=(
                f"{sizes.records} records of float32[8] leaves. Files on disk: OCDBT "
                f"{counts['ocdbt']} (goal at most 20), file backend {counts['tensorstore']}.",
            ),
        )
    ]


def _case_orbax(sizes: Sizes) -> list[Result]:
    import jax
    import orbax.checkpoint as ocp

    like, batch = _tree(sizes)
    tree = jax.tree.map(np.asarray, batch)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    checkpointer = ocp.StandardCheckpointer()
    with _scratch() as root:

        def fresh(name: str) -> Path:  # untimed: the last run's output removed
            shutil.rmtree(root / name, ignore_errors=True)
            return root / name

        def ours(path: Path) -> Any:
            with pytreestore.create(str(path), like, backend="ocdbt") as store:
                store.extend_batch(tree)
            with pytreestore.open(str(path)) as store:
                return store.load(as_numpy=True)

        def orbax(path: Path) -> Any:
            checkpointer.save(str(path), tree)
            checkpointer.wait_until_finished()
            return jax.tree.map(np.asarray, checkpointer.restore(str(path), target))

        try:
            mine, theirs = measure_side_by_side(
                Timed(ours, sizes.repeats, 1, lambda: fresh("ours"), lambda _, o: _check(batch, o)),
                Timed(
                    orbax, sizes.repeats, 1, lambda: fresh("ckpt"), lambda _, o: _check(batch, o)
                ),
            )
        finally:
            checkpointer.close()
    return [
        Result(
            case=f"orbax, {sizes.leaves} leaves",
            n=sizes.leaves,
            ours=mine,
            baseline=theirs,
            goal=at_least(2.0),
            higher_is_better=True,
            ours_label='`backend="ocdbt"`: `create` + `extend_batch` + `close` + `open` + `load`',
            baseline_label=(
                f"Orbax {ocp.__version__} `StandardCheckpointer`: `save` + "
                "`wait_until_finished` + `restore(path, abstract tree)` (also OCDBT)"
            ),
            notes=(f"The batched tree: {sizes.records} records of float32[8] leaves.",),
        )
    ]


def _case_commit(sizes: Sizes) -> list[Result]:
    like = {f"c{i:02d}": np.float32(0) for i in range(20)}
    record = {k: np.float32(1) for k in like}
    with _scratch() as root:
        stores = {
            b: pytreestore.create(str(root / b), like, backend=b) for b in ("ocdbt", "tensorstore")
        }

        def commit(backend: str) -> None:
            stores[backend].append(record)
            stores[backend].flush()

        try:
            ours, theirs = measure_side_by_side(
                Timed(lambda _: commit("ocdbt"), sizes.commits, 3),
                Timed(lambda _: commit("tensorstore"), sizes.commits, 3),
            )
        finally:
            for store in stores.values():
                store.close()
    return [
        Result(
            case="commit of one append",
            n=1,
            ours=ours,
            baseline=theirs,
            goal=at_most(1.5),
            higher_is_better=False,
            ours_label='`append` + `flush` of a 20-leaf record, `backend="ocdbt"` (one transaction)',
            baseline_label='the same with `backend="tensorstore"` (file kvstore, one put per key)',
        )
    ]


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    return [
        Case("wide", lambda: _case_wide(sizes)),
        Case("orbax", lambda: _case_orbax(sizes)),
        Case("commit", lambda: _case_commit(sizes)),
    ]
