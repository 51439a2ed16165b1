"""Core write and read paths on a 20-leaf, 3-level record, against the floors a user would
otherwise write by hand.

* **append**: one record at a time into a fresh local store, against flattening each record and
  assigning its leaves into preallocated numpy columns (the least work any append can do).
* **extend**: a list of records in one call, against the usual stacking recipe
  ``jax.tree.map(lambda *v: jnp.array(v), *records)``.
* **load**: every record back to host (numpy) and to JAX from an open store, against reading
  the same column arrays with raw TensorStore, all reads issued at once on handles opened
  beforehand; and opening plus loading, against opening plus reading with raw TensorStore.

Ours and the baseline run in alternation (see ``measure_side_by_side``), and every output is
checked against the expected values outside the timed region.

What the profiles show (cProfile). **extend**: before issue 32, of about 1.3 s for 100,000
records, `jax.tree_util.tree_flatten` of each record was 0.49 s, the structure check 0.22 s,
a dict of recent records kept for error hints 0.18 s and the column fills 0.35 s. Now a list
of records is flattened a block of 1,024 at a time by a flattener compiled from the schema's
treedef (``pytreestore/_tree/flatten.py``: one C-level ``map`` per node and block, checking the
structure as it goes), about 0.2 s; its columns are filled into whole arrays (about 0.2 s,
mostly the five shape-(3,) leaves) and written as one batch (under 0.1 s). The goal (15x the
recipe) sits within the recipe's own spread. **load**: a full load bypasses the decoded-chunk
cache (it reads a chunk or more) and goes to TensorStore as before; against raw TensorStore it
pays the request, the replaced-store check and the unflatten, a millisecond or two.
"""

from __future__ import annotations

import functools
import gc
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from _common import (
    Case,
    Result,
    Timed,
    at_least,
    at_most,
    format_rate,
    measure_side_by_side,
)
from flax import struct

import pytreestore

TITLE = "Core: append, extend, load"


@dataclass(frozen=True)
class Sizes:
    n: int
    repeats: int  # ours, and the cheap baselines
    recipe_repeats: int  # the jnp.array stacking recipe (about 11 s per 100,000 records)
    load_repeats: int


FULL = Sizes(n=100_000, repeats=3, recipe_repeats=2, load_repeats=25)
QUICK = Sizes(n=5_000, repeats=2, recipe_repeats=1, load_repeats=5)


# --- the record ---------------------------------------------------------------------------------


class Pose(NamedTuple):
    position: Any  # float32[3]
    velocity: Any  # float32[3]
    heading: Any  # float32[]


class Agent(NamedTuple):
    pose: Pose
    vitals: dict[str, Any]  # energy float32[], hits int32[], alive bool[]


@struct.dataclass
class Record:
    step: Any  # int32[]
    agent: Agent
    world: dict[str, Any]  # cell int32[3], wind float32[3], flags {...}, clock {...}
    metrics: dict[str, Any]  # loss, reward, grad_norm float32[], count int32[], ok bool[]


def _record(c: dict[str, Any]) -> Record:
    """A record (or, given whole columns, the stacked record) from a mapping of named leaves."""
    return Record(
        step=c["step"],
        agent=Agent(
            pose=Pose(position=c["position"], velocity=c["velocity"], heading=c["heading"]),
            vitals={"energy": c["energy"], "hits": c["hits"], "alive": c["alive"]},
        ),
        world={
            "cell": c["cell"],
            "wind": c["wind"],
            "flags": {"raining": c["raining"], "night": c["night"], "mask": c["mask"]},
            "clock": {"t": c["t"], "dt": c["dt"], "tick": c["tick"]},
        },
        metrics={
            "loss": c["loss"],
            "reward": c["reward"],
            "grad_norm": c["grad_norm"],
            "count": c["count"],
            "ok": c["ok"],
        },
    )


def _columns(n: int) -> dict[str, np.ndarray]:
    """The expected column of every leaf: values differ from record to record."""
    i = np.arange(n)
    three = np.arange(3)
    f32, i32 = np.float32, np.int32
    return {
        "step": i.astype(i32),
        "position": (i[:, None] * 0.5 + three).astype(f32),
        "velocity": np.sin(i[:, None] + three).astype(f32),
        "heading": (i * 1e-3).astype(f32),
        "energy": (1.0 - i / n).astype(f32),
        "hits": (i % 7).astype(i32),
        "alive": i % 3 != 0,
        "cell": ((i[:, None] + three) % 64).astype(i32),
        "wind": np.cos(i[:, None] * 0.1 + three).astype(f32),
        "raining": i % 2 == 0,
        "night": i % 5 == 0,
        "mask": ((i[:, None] >> three) & 1).astype(bool),
        "t": (i * 0.01).astype(f32),
        "dt": (0.01 + (i % 3) * 1e-3).astype(f32),
        "tick": (i * 3).astype(i32),
        "loss": (1.0 / (1.0 + i)).astype(f32),
        "reward": np.cos(i).astype(f32),
        "grad_norm": np.sqrt(i).astype(f32),
        "count": (i * 2).astype(i32),
        "ok": i % 4 != 0,
    }


@functools.cache
def _data(n: int) -> tuple[list[Record], list[np.ndarray]]:
    """``n`` records of numpy scalars and fresh shape-(3,) arrays, and the expected columns."""
    cols = _columns(n)
    scalars = {k: v for k, v in cols.items() if v.ndim == 1}
    arrays = {k: v for k, v in cols.items() if v.ndim > 1}
    records = []
    for i in range(n):
        leaves = {k: v[i] for k, v in scalars.items()}  # numpy scalars: np.float32, np.bool_...
        leaves.update((k, v[i].copy()) for k, v in arrays.items())
        records.append(_record(leaves))
    expected = jax.tree_util.tree_leaves(_record(cols))
    assert len(expected) == 20, len(expected)
    # Move the records out of the collector's way: the full collection before each timed run
    # then costs microseconds instead of a walk over millions of long-lived objects.
    gc.freeze()
    return records, expected


# --- checks (outside the timed regions) ---------------------------------------------------------


def _check_leaves(what: str, got: Sequence[Any], expected: Sequence[np.ndarray]) -> None:
    if len(got) != len(expected):
        raise RuntimeError(f"{what}: expected {len(expected)} leaves, got {len(got)}")
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        g = np.asarray(g)
        if g.dtype != e.dtype or g.shape != e.shape or not np.array_equal(g, e):
            raise RuntimeError(
                f"{what}: leaf {k} differs: expected {e.dtype}{list(e.shape)}, "
                f"got {g.dtype}{list(g.shape)}"
                + ("" if g.shape != e.shape else f", {int((g != e).sum())} values differ")
            )


def _check_tree(what: str, got: Any, like: Record, expected: Sequence[np.ndarray]) -> None:
    got_def, like_def = jax.tree.structure(got), jax.tree.structure(like)
    if got_def != like_def:
        raise RuntimeError(f"{what}: structure {got_def} is not the record's {like_def}")
    _check_leaves(what, jax.tree_util.tree_leaves(got), expected)


def _check_store(path: Path, like: Record, expected: Sequence[np.ndarray]) -> None:
    with pytreestore.open(str(path)) as store:
        if len(store) != len(expected[0]):
            raise RuntimeError(f"{path}: expected {len(expected[0])} records, got {len(store)}")
        _check_tree(f"{path}: load(as_numpy=True)", store.load(as_numpy=True), like, expected)


class _Scratch:
    """Fresh store paths under one temporary directory."""

    def __init__(self, root: str) -> None:
        self.root = Path(root)
        self.count = 0

    def new(self) -> Path:
        self.count += 1
        return self.root / f"store-{self.count}"


# --- append -------------------------------------------------------------------------------------


def _floor_columns(records: Sequence[Record]) -> list[np.ndarray]:
    leaves = jax.tree_util.tree_leaves(records[0])
    cols = [np.empty((len(records), *np.shape(x)), np.asarray(x).dtype) for x in leaves]
    tree_leaves = jax.tree_util.tree_leaves
    for i, record in enumerate(records):
        for col, leaf in zip(cols, tree_leaves(record), strict=False):
            col[i] = leaf
    return cols


def _append_all(path: Path, records: Sequence[Record]) -> None:
    store = pytreestore.create(str(path), records[0])
    append = store.append
    for record in records:
        append(record)
    store.flush()
    store.close()


def _case_append(sizes: Sizes) -> list[Result]:
    records, expected = _data(sizes.n)
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-") as tmp:
        scratch = _Scratch(tmp)

        def check_and_remove(path: Path, _: object) -> None:
            _check_store(path, records[0], expected)
            shutil.rmtree(path)

        ours, floor = measure_side_by_side(
            Timed(
                lambda path: _append_all(path, records),
                repeats=sizes.repeats,
                setup=scratch.new,
                teardown=check_and_remove,
            ),
            Timed(
                lambda _: _floor_columns(records),
                repeats=sizes.repeats,
                teardown=lambda _, cols: _check_leaves("floor", cols, expected),
            ),
        )
    per_record_us = ours.median / sizes.n * 1e6
    floor_us = floor.median / sizes.n * 1e6
    return [
        Result(
            case="append",
            n=sizes.n,
            ours=ours,
            baseline=floor,
            goal=at_most(1.5),
            higher_is_better=False,
            ours_label="create a local store, N x `store.append(record)`, `flush()`, `close()`",
            baseline_label=(
                "flatten each record (`jax.tree_util.tree_leaves`) and assign its leaves into "
                "preallocated numpy columns"
            ),
            notes=(f"Per record: ours {per_record_us:.1f} us, floor {floor_us:.1f} us.",),
        )
    ]


# --- extend -------------------------------------------------------------------------------------


def _stack_recipe(records: Sequence[Record]) -> Any:
    return jax.block_until_ready(jax.tree.map(lambda *v: jnp.array(v), *records))


def _case_extend(sizes: Sizes) -> list[Result]:
    records, expected = _data(sizes.n)
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-") as tmp:
        scratch = _Scratch(tmp)

        def new_store() -> tuple[Path, Any]:
            path = scratch.new()
            return path, pytreestore.create(str(path), records[0])

        def extend(state: tuple[Path, Any]) -> None:
            store = state[1]
            store.extend(records)
            store.flush()

        def close_check_remove(state: tuple[Path, Any], _: object) -> None:
            path, store = state
            store.close()
            _check_store(path, records[0], expected)
            shutil.rmtree(path)

        ours, recipe = measure_side_by_side(
            Timed(extend, repeats=sizes.repeats, setup=new_store, teardown=close_check_remove),
            Timed(
                lambda _: _stack_recipe(records),
                repeats=sizes.recipe_repeats,
                teardown=lambda _, out: _check_tree("recipe", out, records[0], expected),
            ),
        )
    return [
        Result(
            case="extend",
            n=sizes.n,
            ours=ours,
            baseline=recipe,
            goal=at_least(15.0),
            higher_is_better=True,
            ours_label="`store.extend(list_of_N_records)` + `flush()` on a fresh local store",
            baseline_label="`jax.tree.map(lambda *v: jnp.array(v), *records)` + `block_until_ready`",
            notes=(
                f"Throughput: ours {format_rate(sizes.n, ours.median, 'records')}, "
                f"recipe {format_rate(sizes.n, recipe.median, 'records')}.",
            ),
        )
    ]


# --- load ---------------------------------------------------------------------------------------


def _raw_open(path: Path, keys: Sequence[str]) -> list[ts.TensorStore]:
    context = ts.Context()
    futures = [
        ts.open(
            {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{path}/{key}"}},
            context=context,
        )
        for key in keys
    ]
    return [f.result() for f in futures]


def _raw_read(arrays: Sequence[ts.TensorStore], n: int) -> list[np.ndarray]:
    futures = [a[0:n].read() for a in arrays]
    return [f.result() for f in futures]


def _open_and_load(path: Path) -> tuple[Any, Any]:
    store = pytreestore.open(str(path))
    return store, store.load(as_numpy=True)


def _case_load(sizes: Sizes) -> list[Result]:
    records, expected = _data(sizes.n)
    like = records[0]
    by_path = {
        jax.tree_util.keystr(p): e
        for (p, _), e in zip(jax.tree_util.tree_leaves_with_path(like), expected, strict=True)
    }
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-") as tmp:
        path = Path(tmp) / "store"
        with pytreestore.create(str(path), like) as store:
            store.extend(records)
        store = pytreestore.open(str(path))
        keys = [c.key for c in store.schema.columns]
        raw_expected = [by_path[c.path] for c in store.schema.columns]
        arrays = _raw_open(path, keys)

        def check(what: str) -> Callable[[Any, Any], None]:
            return lambda _, out: _check_tree(what, out, like, expected)

        def check_raw(_: object, cols: Sequence[np.ndarray]) -> None:
            _check_leaves("raw tensorstore", cols, raw_expected)

        def close_check(_: object, out: tuple[Any, Any]) -> None:
            out[0].close()
            _check_tree("open + load(as_numpy=True)", out[1], like, expected)

        # One untimed warm-up run each: our store's handles, TensorStore's thread pools, JAX's
        # first transfer. Then the store and the raw handles stay open, as in a reader's loop.
        repeats, warm = sizes.load_repeats, 1
        raw, as_numpy, to_jax, raw_cold, cold = measure_side_by_side(
            Timed(lambda _: _raw_read(arrays, sizes.n), repeats, warm, teardown=check_raw),
            Timed(lambda _: store.load(as_numpy=True), repeats, warm, teardown=check("numpy")),
            Timed(
                lambda _: jax.block_until_ready(store.load()), repeats, warm, teardown=check("jax")
            ),
            Timed(
                lambda _: _raw_read(_raw_open(path, keys), sizes.n),
                repeats,
                warm,
                teardown=check_raw,
            ),
            Timed(lambda _: _open_and_load(path), repeats, warm, teardown=close_check),
        )
        store.close()
    mib = sum(e.nbytes for e in expected) / 2**20
    raw_label = (
        "raw TensorStore: all `arr[0:N].read()` futures issued together, then waited for, on "
        "handles opened beforehand (`ts.open` of every column, untimed)"
    )
    common: dict[str, Any] = {"n": sizes.n, "goal": at_least(1.0), "higher_is_better": True}
    rate = functools.partial(format_rate, mib, unit="MiB")
    return [
        Result(
            case="load (numpy)",
            ours=as_numpy,
            baseline=raw,
            ours_label="`store.load(as_numpy=True)` of all N records on an open store",
            baseline_label=raw_label,
            notes=(
                f"{mib:.1f} MiB in {len(keys)} columns: ours {rate(as_numpy.median)}, raw "
                f"TensorStore {rate(raw.median)}.",
            ),
            **common,
        ),
        Result(
            case="load (jax)",
            ours=to_jax,
            baseline=raw,
            ours_label=(
                "`store.load()` (jax.Array leaves) + `block_until_ready` on an open store; it "
                "includes the host-to-device copy, which the baseline does not make"
            ),
            baseline_label=raw_label,
            notes=(f"Throughput: ours {rate(to_jax.median)}.",),
            **common,
        ),
        Result(
            case="open + load (numpy)",
            ours=cold,
            baseline=raw_cold,
            ours_label="`pytreestore.open(path)` + `store.load(as_numpy=True)`",
            baseline_label=(
                "raw TensorStore: `ts.open` every column (all at once, fresh `ts.Context`), then "
                "all `arr[0:N].read()` futures together"
            ),
            notes=(f"Throughput: ours {rate(cold.median)}, raw {rate(raw_cold.median)}.",),
            **common,
        ),
    ]


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    return [
        Case("append", lambda: _case_append(sizes)),
        Case("extend", lambda: _case_extend(sizes)),
        Case("load", lambda: _case_load(sizes)),
    ]
