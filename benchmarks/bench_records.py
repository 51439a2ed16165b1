"""One record at a time (issue #15): `store[i]`, `store.load(i)`, iteration and random single
records, every store created and opened with its defaults (no `codec=`, `chunk_records=` or
`cache_bytes=`; `pytreestore.open(path)`), against an anchor timed side by side.

* **random load(i)**: a 100-leaf record (a nested dict / NamedTuple / flax dataclass tree of
  float32 scalars and float32[3], [16] and [4,4] arrays, and int32 counters), N records
  written with `extend_batch`; `store.load(i, as_numpy=True)` for each of 200 random indices,
  against Lance: the same columns as a dataset (fixed-size lists for array leaves),
  `dataset.take([i])` and every column to numpy, per index. Ratio: speedup, Lance over ours.
* **random store[i]**: the same store and indices, `jax.block_until_ready(store[i])`, against
  `jax.block_until_ready(jax.device_put(row))` of the same record held in memory as a numpy
  pytree (the rows are built before the timer starts). Ratio: slowdown, ours over the anchor.
* **iterate (jax)**: a 146-leaf record of about 14.5 KB (a simulation state: flax dataclasses
  and NamedTuples nested 6 deep, float32[64], [8,8], [16,16], [3] and scalars, int32 and bool
  leaves), N records; `for r in store: jax.block_until_ready(r)`, against
  `jax.block_until_ready(jax.device_put(row))` of every in-memory numpy row. The jax rows go
  through the first 1,000 records only (40 with `--quick`: `Sizes.walk`): on a small CPU VM `device_put` of 146 leaves costs milliseconds per record.
* **records (numpy)**: the same store, `for r in store.records(as_numpy=True): pass` over all
  N records, against `jax.tree.unflatten(treedef, leaves)` of every in-memory row (the leaf
  lists built before the timer starts): the least work that hands out one numpy record at a
  time.
* **store[i] loop**: the same store, `for i in range(W): jax.block_until_ready(store[i])`,
  sequential, over the same first W records; anchor as in iterate (jax), the same runs.
* **random ragged load(i)**: a ragged store (`create(path, like, ragged=True)`): each record
  `step` int32[], `score` float32[], `v` float32[3] and a list `items` of 0 to 16 `Item`
  dataclasses (float32 `x`, int32 `n`); `store.load(i, as_numpy=True)` (the exact record) for
  200 random indices, against Lance: the same data with `items` a `large_list<struct>` column,
  `dataset.take([i])` and the row back to the same record (numpy values, a list of `Item`).

Every run of the random cases uses a new set of 200 random indices (40 with `--quick`; fixed
seed, both sides get the same sets in the same order), so a warm chunk cache does not replay
the previous run; their times are per record (the run's time divided by the count). The
iteration cases keep every 7th record and check it, and the record count, after the run. Every output is checked against the
expected values outside the timed regions. A row whose anchor library is not installed is
kept with n/a times and a note.

What the profiles show (cProfile, issue 15). **random load(i)**: with the defaults the 100-leaf
store (95 MB) fits the shared decoded-chunk cache, so after a chunk's first read a record is a
copy of one row per column (`_read/cache.py`, about 9 us per column with the bookkeeping); the
first read of a chunk decodes all of it in every column (32,768 records, 62 MB for this
record), which the first run of each index set pays. **random store[i]**: three quarters of
the time is `jax.device_put` of the record's 100 leaves (the anchor itself); our read is under
a tenth. **records (numpy)**: `jax.tree.unflatten` of the record (the anchor) is about two
thirds; the rest is the per-leaf row views and the block reads. **random ragged load(i)**:
spread over the gather's Python steps (offsets read, element rows found, the exact record
rebuilt), about 0.5 ms a record; no single step dominates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np
from _common import Case, Goal, Result, Timed, Timing, at_least, at_most, measure_side_by_side
from bench_anchors import _arrow_table, _guarded, _lance_take, _leaf_names, _need, _scratch
from bench_core import _check_leaves
from flax import struct

import pytreestore

TITLE = "One record at a time (#15): store[i], load(i), iteration"

KEEP = 7  # the iteration cases keep (and check) every KEEP-th record
F32, I32 = np.dtype(np.float32), np.dtype(np.int32)


@dataclass(frozen=True)
class Sizes:
    small: int  # records of the 100-leaf store
    state: int  # records of the 146-leaf store
    ragged: int  # records of the ragged store
    pick: int  # random indices per run of the random cases
    walk: int  # records of the 146-leaf store the jax iteration rows go through
    random_repeats: int
    iterate_repeats: int


FULL = Sizes(50_000, 20_000, 50_000, pick=200, walk=1_000, random_repeats=5, iterate_repeats=2)
QUICK = Sizes(2_000, 1_000, 2_000, pick=40, walk=40, random_repeats=1, iterate_repeats=1)


# --- the 100-leaf record ------------------------------------------------------------------------


class Sensor(NamedTuple):
    reading: Any  # float32[3]
    history: Any  # float32[16]
    gain: Any  # float32[]
    count: Any  # int32[]


@struct.dataclass
class Unit:
    pose: Any  # float32[4, 4]
    velocity: Any  # float32[3]
    sensors: tuple[Sensor, Sensor]
    stats: dict[str, Any]  # mass, drag float32[], hits int32[]


def _small_record(take: Callable[[tuple[int, ...], np.dtype], Any]) -> dict[str, Any]:
    """The 100-leaf record, each leaf ``take(shape, dtype)`` in flattening order."""

    def sensor() -> Sensor:
        return Sensor(take((3,), F32), take((16,), F32), take((), F32), take((), I32))

    def unit() -> Unit:
        return Unit(
            pose=take((4, 4), F32),
            velocity=take((3,), F32),
            sensors=(sensor(), sensor()),
            stats={"drag": take((), F32), "hits": take((), I32), "mass": take((), F32)},
        )

    return {
        "clock": {"step": take((), I32), "t": take((), F32)},
        "loss": {"policy": take((), F32), "total": take((), F32), "value": take((), F32)},
        "units": [unit() for _ in range(7)],  # 7 x 13 leaves
        "world": {
            "gravity": take((3,), F32),
            "seed": take((), I32),
            "tick": take((), I32),
            "wind": take((16,), F32),
        },
    }


# --- the 146-leaf simulation state --------------------------------------------------------------


@struct.dataclass
class Joint:
    angle: Any  # float32[]
    torque: Any  # float32[]
    limits: Any  # float32[3]
    trace: Any  # float32[8, 8]


class Limb(NamedTuple):
    joints: tuple[Joint, Joint, Joint]
    frame: Any  # float32[8, 8]
    contact: Any  # bool[]


class Pose(NamedTuple):
    position: Any  # float32[3]
    velocity: Any  # float32[3]
    inertia: Any  # float32[8, 8]


@struct.dataclass
class Body:
    limbs: tuple[Limb, Limb, Limb, Limb]
    pose: Pose
    ident: Any  # int32[]


class Brain(NamedTuple):
    hidden: Any  # float32[64]
    cell: Any  # float32[64]
    steps: Any  # int32[]
    done: Any  # bool[]


class Agent(NamedTuple):
    body: Body
    sensors: dict[str, Any]  # camera float32[16, 16], imu float32[3], lidar float32[64]
    brain: Brain


@struct.dataclass
class World:
    clock: dict[str, Any]  # dt, t float32[], tick int32[]
    gravity: Any  # float32[3]
    fields: tuple[Any, ...]  # 6 x float32[8, 8]
    wind: Any  # float32[64]
    paused: Any  # bool[]


@struct.dataclass
class SimState:
    agents: tuple[Agent, Agent]
    world: World


def _state_record(take: Callable[[tuple[int, ...], np.dtype], Any]) -> SimState:
    """The 146-leaf record, each leaf ``take(shape, dtype)`` in flattening order."""
    b = np.dtype(bool)

    def joint() -> Joint:
        return Joint(take((), F32), take((), F32), take((3,), F32), take((8, 8), F32))

    def limb() -> Limb:
        return Limb((joint(), joint(), joint()), take((8, 8), F32), take((), b))

    def agent() -> Agent:
        body = Body(
            limbs=(limb(), limb(), limb(), limb()),
            pose=Pose(take((3,), F32), take((3,), F32), take((8, 8), F32)),
            ident=take((), I32),
        )
        sensors = {"camera": take((16, 16), F32), "imu": take((3,), F32), "lidar": take((64,), F32)}
        brain = Brain(take((64,), F32), take((64,), F32), take((), I32), take((), b))
        return Agent(body, sensors, brain)

    agents = (agent(), agent())
    world = World(
        clock={"dt": take((), F32), "t": take((), F32), "tick": take((), I32)},
        gravity=take((3,), F32),
        fields=tuple(take((8, 8), F32) for _ in range(6)),
        wind=take((64,), F32),
        paused=take((), b),
    )
    return SimState(agents, world)


# --- data: stacked columns, in-memory rows, a store ---------------------------------------------


@dataclass(frozen=True)
class Fixed:
    """A fixed-structure data set: its treedef, stacked columns and a store holding them."""

    treedef: Any
    columns: list[np.ndarray]  # one per leaf, [n, ...]
    path: Path

    @property
    def n(self) -> int:
        return len(self.columns[0])

    def leaves(self, i: int) -> list[np.ndarray]:
        """Record ``i``'s leaves as fresh arrays (as a user's numpy record holds them)."""
        return [c[i].copy() for c in self.columns]

    def row(self, i: int) -> Any:
        return jax.tree.unflatten(self.treedef, self.leaves(i))

    @property
    def record_bytes(self) -> int:
        return sum(c[0].nbytes for c in self.columns)


def _columns(build: Callable[[Any], Any], n: int, seed: int) -> tuple[Any, list[np.ndarray]]:
    """Stacked columns of ``n`` records of ``build``'s structure, random values (fixed seed)."""
    rng = np.random.default_rng(seed)
    shapes: list[tuple[tuple[int, ...], np.dtype]] = []
    like = build(lambda shape, dtype: shapes.append((shape, dtype)) or np.zeros(shape, dtype))
    columns = []
    for k, (shape, dtype) in enumerate(shapes):
        size = (n, *shape)
        if dtype == F32:
            columns.append(rng.standard_normal(size).astype(F32))
        elif dtype == I32:
            columns.append((rng.integers(-1000, 1000, size) + k).astype(I32))
        else:
            columns.append(rng.random(size) < 0.5)
    return jax.tree.structure(like), columns


def _write_fixed(path: Path, build: Callable[[Any], Any], n: int, seed: int) -> Fixed:
    treedef, columns = _columns(build, n, seed)
    like = jax.tree.unflatten(treedef, [c[0] for c in columns])
    with pytreestore.create(str(path), like) as store:
        store.extend_batch(jax.tree.unflatten(treedef, columns))
    return Fixed(treedef, columns, path)


def _check_record(what: str, got: Any, treedef: Any, expected: Sequence[np.ndarray]) -> None:
    got_def = jax.tree.structure(got)
    if got_def != treedef:
        raise RuntimeError(f"{what}: structure {got_def} is not the record's {treedef}")
    _check_leaves(what, jax.tree.leaves(got), expected)


def _index_sets(n: int, runs: int, pick: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n, pick) for _ in range(runs)]


def _feed(sets: Sequence[Any]) -> Callable[[], Any]:
    """A ``setup`` handing out ``sets`` in order, one per run."""
    it = iter(sets)
    return lambda: next(it)


def _each_index(
    fn: Callable[[int], Any],
    sizes: Sizes,
    sets: Sequence[np.ndarray],
    check: Callable[[np.ndarray, list[Any]], None],
) -> Timed:
    """``fn(i)`` for every index of one set per run (the sets in order, after a warm-up)."""
    return Timed(
        lambda index: [fn(i) for i in index.tolist()],
        sizes.random_repeats,
        warmup=1,
        setup=_feed(sets),
        teardown=check,
    )


def _per_record(t: Timing, k: int) -> Timing:
    return Timing(tuple(x / k for x in t.times))


def _checker(fixed: Fixed, what: str) -> Callable[[np.ndarray, list[Any]], None]:
    def check(index: np.ndarray, out: list[Any]) -> None:
        if len(out) != len(index):
            raise RuntimeError(f"{what}: expected {len(index)} records, got {len(out)}")
        for i, got in zip(index.tolist(), out, strict=True):
            _check_record(f"{what} [{i}]", got, fixed.treedef, [c[i] for c in fixed.columns])

    return check


# --- random load(i) and store[i] ----------------------------------------------------------------


def _case_random(sizes: Sizes) -> list[Result]:
    lance = _need("lance", "pylance")
    runs = 1 + sizes.random_repeats
    with _scratch() as root:
        fixed = _write_fixed(root / "small", _small_record, sizes.small, seed=15)
        like = fixed.row(0)
        shapes = [c.shape[1:] for c in fixed.columns]
        lance.write_dataset(
            _arrow_table(_leaf_names(like), fixed.columns), str(root / "small.lance")
        )
        dataset = lance.dataset(str(root / "small.lance"))
        sets = _index_sets(sizes.small, runs, sizes.pick, seed=151)
        rows = {i: fixed.row(i) for s in sets for i in s.tolist()}  # the anchor's rows
        store = pytreestore.open(str(fixed.path))
        try:
            load, take = measure_side_by_side(
                _each_index(
                    lambda i: store.load(i, as_numpy=True), sizes, sets, _checker(fixed, "load(i)")
                ),
                _each_index(
                    lambda i: jax.tree.unflatten(fixed.treedef, _lance_row(dataset, i, shapes)),
                    sizes,
                    sets,
                    _checker(fixed, "lance take([i])"),
                ),
            )
            get, put = measure_side_by_side(
                _each_index(
                    lambda i: jax.block_until_ready(store[i]),
                    sizes,
                    sets,
                    _checker(fixed, "store[i]"),
                ),
                _each_index(
                    lambda i: jax.block_until_ready(jax.device_put(rows[i])),
                    sizes,
                    sets,
                    _checker(fixed, "device_put(row)"),
                ),
            )
        finally:
            store.close()
    size = f"{len(fixed.columns)}-leaf record ({fixed.record_bytes:,} B)"
    return [
        _random_row(
            "random load(i)", sizes.small, sizes.pick, load, take, at_least(2.0),
            f"`store.load(i, as_numpy=True)` per index, {size}, open store",
            f"Lance {lance.__version__}: `dataset.take([i])` on an open dataset (one column per "
            "leaf, fixed-size lists for array leaves), every column to numpy, per index",
        ),
        _random_row(
            "random store[i]", sizes.small, sizes.pick, get, put, at_most(2.0),
            f"`jax.block_until_ready(store[i])` per index, {size}, open store",
            "`jax.block_until_ready(jax.device_put(row))` of the same record held in memory "
            "as a numpy pytree",
        ),
    ]  # fmt: skip


def _lance_row(dataset: Any, i: int, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    return [leaf[0] for leaf in _lance_take(dataset, np.array([i]), shapes)]


def _random_row(
    case: str,
    n: int,
    pick: int,
    ours: Timing,
    base: Timing,
    goal: Goal,
    ours_label: str,
    base_label: str,
) -> Result:
    ours, base = _per_record(ours, pick), _per_record(base, pick)
    return Result(
        case=case,
        n=n,
        ours=ours,
        baseline=base,
        goal=goal,
        higher_is_better=goal.op == ">=",
        ours_label=ours_label,
        baseline_label=base_label,
        notes=(
            f"Times per record: each run reads {pick} random indices of N (a new set each run, "
            "the same sets on both sides; one untimed warm-up run) and is divided by "
            f"{pick}. Per record: ours {ours.median * 1e6:,.1f} us, anchor "
            f"{base.median * 1e6:,.1f} us.",
        ),
    )


# --- iteration ----------------------------------------------------------------------------------


def _kept(records: Iterable[Any], each: Callable[[Any], Any]) -> tuple[int, list[Any]]:
    """Runs ``each`` on every record; the count, and every KEEP-th record's result."""
    kept, count = [], 0
    for count, r in enumerate(records, 1):
        out = each(r)
        if count % KEEP == 1:
            kept.append(out)
    return count, kept


def _check_kept(fixed: Fixed, what: str, n: int) -> Callable[[Any, tuple[int, list[Any]]], None]:
    def check(_: Any, out: tuple[int, list[Any]]) -> None:
        count, kept = out
        if count != n:
            raise RuntimeError(f"{what}: expected {n} records, got {count}")
        _checker(fixed, what)(np.arange(0, n, KEEP), kept)

    return check


def _case_iterate(sizes: Sizes) -> list[Result]:
    walk = min(sizes.walk, sizes.state)
    with _scratch() as root:
        fixed = _write_fixed(root / "state", _state_record, sizes.state, seed=16)
        leaves = [fixed.leaves(i) for i in range(fixed.n)]
        rows = [jax.tree.unflatten(fixed.treedef, x) for x in leaves[:walk]]
        store = pytreestore.open(str(fixed.path))
        block, unflatten, treedef = jax.block_until_ready, jax.tree.unflatten, fixed.treedef

        def timed(what: str, n: int, fn: Callable[[Any], tuple[int, list[Any]]]) -> Timed:
            return Timed(fn, sizes.iterate_repeats, 1, teardown=_check_kept(fixed, what, n))

        try:  # one anchor run per round serves the two jax rows
            iterate, put, loop, numpy_, unflat = measure_side_by_side(
                timed("for r in store", walk, lambda _: _kept(islice(store, walk), block)),
                timed("device_put(row)", walk, lambda _: _kept(rows, lambda r: block(jax.device_put(r)))),
                timed("store[i]", walk, lambda _: _kept(range(walk), lambda i: block(store[i]))),
                timed("records(as_numpy=True)", fixed.n, lambda _: _kept(store.records(as_numpy=True), _same)),
                timed("unflatten", fixed.n, lambda _: _kept(leaves, lambda x: unflatten(treedef, x))),
            )  # fmt: skip
        finally:
            store.close()
    size = f"{len(fixed.columns)}-leaf record ({fixed.record_bytes:,} B), open store"
    first = f"the first {walk:,} records of a store of {fixed.n:,}" if walk < fixed.n else "all"
    put_label = (
        f"`jax.block_until_ready(jax.device_put(row))` of {first} records held in memory as "
        "numpy pytrees"
    )
    return [
        _iterate_row(
            "iterate (jax)", walk, iterate, put, at_most(2.0),
            f"`for r in store: jax.block_until_ready(r)` over {first} records, {size}", put_label,
        ),
        _iterate_row(
            "records (numpy)", fixed.n, numpy_, unflat, at_most(1.5),
            f"`for r in store.records(as_numpy=True): pass` over all N records, {size}",
            "`jax.tree.unflatten(treedef, leaves)` of every record's leaf list held in memory",
        ),
        _iterate_row(
            "store[i] loop", walk, loop, put, at_most(2.0),
            f"`for i in range({walk:,}): jax.block_until_ready(store[i])` ({first} records), "
            f"{size}",
            put_label,
        ),
    ]  # fmt: skip


def _same(r: Any) -> Any:
    return r


def _iterate_row(
    case: str, n: int, ours: Timing, base: Timing, goal: Goal, ours_label: str, base_label: str
) -> Result:
    per = lambda t: f"{t.median / n * 1e6:,.1f} us"  # noqa: E731
    return Result(
        case=case,
        n=n,
        ours=ours,
        baseline=base,
        goal=goal,
        higher_is_better=False,
        ours_label=ours_label,
        baseline_label=base_label,
        notes=(f"Per record: ours {per(ours)}, anchor {per(base)}; one untimed warm-up run.",),
    )


# --- the ragged store ---------------------------------------------------------------------------

MAX_ITEMS = 16


@struct.dataclass
class Item:
    x: Any  # float32[]
    n: Any  # int32[]


@struct.dataclass
class Entry:
    step: Any  # int32[]
    score: Any  # float32[]
    v: Any  # float32[3]
    items: list[Item]


@dataclass(frozen=True)
class Ragged:
    step: np.ndarray
    score: np.ndarray
    v: np.ndarray
    offsets: np.ndarray  # int64[n + 1]
    x: np.ndarray
    count: np.ndarray  # the items' n

    def record(self, i: int) -> Entry:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        items = [Item(self.x[k], self.count[k]) for k in range(a, b)]
        return Entry(self.step[i], self.score[i], self.v[i], items)


def _ragged_data(n: int) -> Ragged:
    rng = np.random.default_rng(17)
    lengths = rng.integers(0, MAX_ITEMS + 1, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])
    return Ragged(
        step=np.arange(n, dtype=I32),
        score=rng.standard_normal(n).astype(F32),
        v=rng.standard_normal((n, 3)).astype(F32),
        offsets=offsets,
        x=rng.standard_normal(total).astype(F32),
        count=rng.integers(-1000, 1000, total).astype(I32),
    )


def _ragged_arrow(data: Ragged) -> Any:
    pa = _need("pyarrow", "pyarrow")
    items = pa.StructArray.from_arrays([pa.array(data.x), pa.array(data.count)], names=["x", "n"])
    return pa.table(
        {
            "step": pa.array(data.step),
            "score": pa.array(data.score),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(data.v.reshape(-1)), 3),
            "items": pa.LargeListArray.from_arrays(pa.array(data.offsets, pa.int64()), items),
        }
    )


def _lance_entry(dataset: Any, i: int) -> Entry:
    """``dataset.take([i])``, back to the record: numpy values and a list of ``Item``."""
    table = dataset.take([i])
    v = table.column("v").combine_chunks().flatten().to_numpy()
    items = table.column("items").combine_chunks().flatten()  # the row's structs
    x, count = (f.to_numpy(zero_copy_only=False) for f in items.flatten())
    return Entry(
        table.column("step").to_numpy()[0],
        table.column("score").to_numpy()[0],
        v,
        [Item(x[k], count[k]) for k in range(len(x))],
    )


def _check_entries(data: Ragged, what: str) -> Callable[[np.ndarray, list[Any]], None]:
    def check(index: np.ndarray, out: list[Any]) -> None:
        if len(out) != len(index):
            raise RuntimeError(f"{what}: expected {len(index)} records, got {len(out)}")
        for i, got in zip(index.tolist(), out, strict=True):
            want = data.record(i)
            if len(got.items) != len(want.items):
                raise RuntimeError(
                    f"{what} [{i}]: expected {len(want.items)} items, got {len(got.items)}"
                )
            _check_record(
                f"{what} [{i}]",
                got,
                jax.tree.structure(want),
                [np.asarray(x) for x in jax.tree.leaves(want)],
            )

    return check


def _case_ragged(sizes: Sizes) -> list[Result]:
    lance = _need("lance", "pylance")
    data = _ragged_data(sizes.ragged)
    runs = 1 + sizes.random_repeats
    with _scratch() as root:
        path = str(root / "ragged")
        with pytreestore.create(path, data.record(0), ragged=True) as s:
            s.extend(data.record(i) for i in range(sizes.ragged))
        lance.write_dataset(_ragged_arrow(data), str(root / "ragged.lance"))
        dataset = lance.dataset(str(root / "ragged.lance"))
        sets = _index_sets(sizes.ragged, runs, sizes.pick, seed=171)
        store = pytreestore.open(path)
        try:
            ours, take = measure_side_by_side(
                _each_index(
                    lambda i: store.load(i, as_numpy=True),
                    sizes,
                    sets,
                    _check_entries(data, "ragged load(i)"),
                ),
                _each_index(
                    lambda i: _lance_entry(dataset, i),
                    sizes,
                    sets,
                    _check_entries(data, "lance take([i])"),
                ),
            )
        finally:
            store.close()
    mean = float(np.diff(data.offsets).mean())
    return [
        _random_row(
            "random ragged load(i)", sizes.ragged, sizes.pick, ours, take, at_least(2.0),
            "`store.load(i, as_numpy=True)` (the exact record) per index of a store created "
            f"with `ragged=True`: `step`, `score`, `v` float32[3] and a list of 0-{MAX_ITEMS} "
            f"`Item(x float32, n int32)` (mean {mean:.1f}), open store",
            f"Lance {lance.__version__}: `dataset.take([i])` on an open dataset (`items` a "
            "`large_list<struct>` column), back to the same record (numpy values, a list of "
            "`Item`), per index",
        )
    ]  # fmt: skip


def cases(quick: bool) -> list[Case]:
    s = QUICK if quick else FULL
    return [
        _guarded("random", s.small, at_least(2.0), lambda: _case_random(s)),
        Case("iterate", lambda: _case_iterate(s)),
        _guarded("ragged", s.ragged, at_least(2.0), lambda: _case_ragged(s)),
    ]
