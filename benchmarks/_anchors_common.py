"""What the benchmarks against other libraries share: rows skipped when an anchor library is
not installed, a scratch directory, and the same records as a Lance dataset.

A case raises :class:`_Skip` (``_need`` does, for a library that does not import) and
:func:`_guarded` turns it into a row with n/a times whose note says why.
"""

from __future__ import annotations

import contextlib
import gc
import math
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from _common import Case, Goal, Result, Timing


class _Skip(Exception):
    """An anchor (or the means to measure it) is missing here; the row says why."""


def _skipped(case: str, n: int, goal: Goal, why: str) -> Result:
    nan = Timing((math.nan,))
    return Result(
        case=f"{case} (skipped)",
        n=n,
        ours=nan,
        baseline=nan,
        goal=goal,
        higher_is_better=goal.op == ">=",
        ours_label="not run",
        baseline_label="not run",
        notes=(f"Skipped: {why}",),
    )


def _guarded(case: str, n: int, goal: Goal, run: Callable[[], list[Result]]) -> Case:
    def guarded() -> list[Result]:
        try:
            return run()
        except _Skip as why:
            return [_skipped(case, n, goal, str(why))]
        finally:
            gc.collect()

    return Case(case, guarded)


def _need(module: str, dist: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as err:
        raise _Skip(f"{dist} is not installed (`pip install -e '.[bench]'`): {err}") from err


@contextlib.contextmanager
def _scratch(prefix: str = "pytreestore-anchors-") -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _leaf_names(like: Any) -> list[str]:
    paths = jax.tree_util.tree_flatten_with_path(like)[0]
    return [jax.tree_util.keystr(p, simple=True, separator="/") for p, _ in paths]


def _arrow_table(names: Sequence[str], leaves: Sequence[np.ndarray]) -> Any:
    """One Arrow column per leaf: fixed-size lists for leaves with per-record shape."""
    pa = _need("pyarrow", "pyarrow")
    columns = []
    for leaf in leaves:
        if leaf.ndim == 1:
            columns.append(pa.array(leaf))
        else:
            width = math.prod(leaf.shape[1:])
            columns.append(pa.FixedSizeListArray.from_arrays(pa.array(leaf.reshape(-1)), width))
    return pa.table(dict(zip(names, columns, strict=True)))


def _lance_take(dataset: Any, indices: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list:
    table = dataset.take(indices)
    out = []
    for k, shape in enumerate(shapes):
        column = table.column(k).combine_chunks()
        column = column.flatten() if shape else column
        out.append(column.to_numpy(zero_copy_only=False).reshape(-1, *shape))
    return out
