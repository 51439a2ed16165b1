"""The write path at the speed of the loop (issue 32): stalls of single appends, and a jitted
step loop appending its state.

* **append latency**: 50,000 single `store.append(record)` of the 20-leaf record of
  `bench_core` (numpy scalars and arrays), each timed with `time.perf_counter_ns`, in a fresh
  local store, then `close()`. Two rows: the slowest append against the 10 ms budget, and the
  99th percentile against the median (goal 5x). Full chunks are written by the background
  writer, so no append waits on storage.
* **append latency, MJX-sized**: the same with a wide state like MJX's `mjx.Data` (84 leaves,
  about 10 KB a step: float32 arrays of 1 to 300 values), 6,000 appends; its default chunk
  holds 2,048 steps, whose write stalled one append by about 70 ms before the background
  writer.
* **jitted loop**: a loop of 3,000 steps of a jitted function over a registered dataclass of 20
  leaves (10 float32[3], 10 int32 scalars), each step's state appended to a store
  (`state = step(state); store.append(state)`, the store created untimed and closed inside
  the timed region) against the same loop appending the state to a Python list. The appends
  make the device arrays their own (on the CPU copied into their rows, on an accelerator
  copied on the device and fetched when their chunk is written: issue 44, `bench_donate`). Goal: at most 1.3x. The step (a sine of ten 3-vectors)
  costs about what dispatching it costs: the cheapest step a loop can have.
* **jitted training loop**: the same with an Adam step of a 2-layer MLP (32-32-4, a batch of
  64), its state a registered dataclass of 16 leaves (parameters, both moments, the count, three
  metrics): a small model's real training step.

Outputs are checked against the expected values outside the timed regions.

Before issue 32 (main at f8d3c1c, this module run on it, a quiet machine): the slowest of the
84-leaf appends 172.6 ms (the chunk written inside `append`), the jitted loop 3.33x and the
training loop 3.85x (each step's arrays copied to the host by `append`, waiting for the step).
What is left of the loops is the copy of each kept array to the host, one at a time on the
CPU (about 2-3 us an array through JAX's own `np.asarray`, under the GIL): 20 arrays cost
about as much as the cheapest step itself, so 1.3x cannot be reached at this step size (a
device-side stack of the kept arrays costs about 1 us an array to dispatch, and a compile of
0.3-2 s per leaf shape). On a TPU, where a copy per array costs a round trip, the kept arrays
are stacked on the device 256 at a time, then copied: 1.73x and 1.97x there (9.2x and 8.3x
one at a time).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _common import Case, Result, Timed, Timing, at_most, format_seconds, measure_side_by_side

import pytreestore

TITLE = "The write path: stalls, and a jitted loop appending its state"

BUDGET_S = 0.010  # the slowest append's budget


@dataclass(frozen=True)
class Sizes:
    appends: int
    wide_appends: int
    steps: int
    repeats: int


FULL = Sizes(appends=50_000, wide_appends=6_000, steps=3_000, repeats=5)
QUICK = Sizes(appends=3_000, wide_appends=600, steps=200, repeats=2)


# --- append latency ---------------------------------------------------------------------------


def _latencies(path: Path, records: list[Any]) -> np.ndarray:
    """Each append's nanoseconds (the last entry: ``close``)."""
    store = pytreestore.create(str(path), records[0])
    append, clock = store.append, time.perf_counter_ns
    out = np.empty(len(records) + 1, np.int64)
    for i, record in enumerate(records):
        t = clock()
        append(record)
        out[i] = clock() - t
    t = clock()
    store.close()
    out[-1] = clock() - t
    return out


def _wide_records(n: int) -> list[dict[str, np.ndarray]]:
    """``n`` MJX-sized states: 84 float32 leaves of 1 to 300 values, about 10 KB each."""
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(1, 60, 84)]
    sizes[:4] = [300, 300, 200, 200]
    base = [rng.standard_normal(s).astype(np.float32) for s in sizes]
    return [{f"f{k:02d}": b + np.float32(i) for k, b in enumerate(base)} for i in range(n)]


def _latency_rows(name: str, records: list[Any], repeats: int, check: Any) -> list[Result]:
    runs: list[np.ndarray] = []
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-") as tmp:
        for k in range(repeats):
            path = Path(tmp) / f"store-{k}"
            runs.append(_latencies(path, records))
            check(path)
            shutil.rmtree(path)
    appends = [r[:-1] / 1e9 for r in runs]
    slowest = Timing(tuple(float(a.max()) for a in appends))
    p99 = Timing(tuple(float(np.percentile(a, 99)) for a in appends))
    p50 = Timing(tuple(float(np.median(a)) for a in appends))
    close = Timing(tuple(float(r[-1]) / 1e9 for r in runs))
    notes = (
        f"Per run: median {format_seconds(p50.median)}, p99 {format_seconds(p99.median)}, "
        f"slowest {format_seconds(slowest.median)}, `close()` {format_seconds(close.median)}.",
    )
    n, label = len(records), f"N x `store.append(record)` ({name}), each timed"
    return [
        Result(
            case=f"slowest append ({name})",
            n=n,
            ours=slowest,
            baseline=Timing((BUDGET_S,) * repeats),
            goal=at_most(1.0),
            higher_is_better=False,
            ours_label=f"{label}: the slowest",
            baseline_label="the budget, 10 ms",
            notes=notes,
        ),
        Result(
            case=f"append p99 / p50 ({name})",
            n=n,
            ours=p99,
            baseline=p50,
            goal=at_most(5.0),
            higher_is_better=False,
            ours_label=f"{label}: the 99th percentile",
            baseline_label="the median append of the same runs",
        ),
    ]


def _case_latency(sizes: Sizes) -> list[Result]:
    from bench_core import _check_store, _data  # flax's records: imported when run

    records, expected = _data(sizes.appends)
    if len(records) > sizes.appends:
        records = records[: sizes.appends]
    return _latency_rows(
        "20 leaves",
        list(records),
        sizes.repeats,
        lambda path: _check_store(path, records[0], [e[: len(records)] for e in expected]),
    )


def _case_latency_wide(sizes: Sizes) -> list[Result]:
    records = _wide_records(sizes.wide_appends)

    def check(path: Path) -> None:
        got = pytreestore.open(str(path)).load(as_numpy=True)
        for key in ("f00", "f83"):
            want = np.stack([r[key] for r in records])
            if not np.array_equal(got[key], want):
                raise RuntimeError(f"{path}: column {key} differs")

    return _latency_rows("84 leaves, 10 KB", records, sizes.repeats, check)


# --- a jitted loop ------------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    pos: dict[str, Any]  # ten float32[3]
    count: tuple[Any, ...]  # ten int32 scalars


def _start() -> State:
    return State(
        {f"x{i}": jnp.full(3, i, jnp.float32) for i in range(10)},
        tuple(jnp.int32(i) for i in range(10)),
    )


@jax.jit
def _step(s: State) -> State:
    pos = {k: jnp.sin(v) * 0.5 + 0.25 for k, v in s.pos.items()}
    return State(pos, tuple(c + 1 for c in s.count))


def _loop_list(steps: int, start: Any = _start, step: Any = _step) -> list[Any]:
    state, out = start(), []
    for _ in range(steps):
        state = step(state)
        out.append(state)
    jax.block_until_ready(state)
    return out


def _loop_store(store: Any, steps: int, start: Any = _start, step: Any = _step) -> None:
    state, append = start(), store.append
    for _ in range(steps):
        state = step(state)
        append(state)
    store.close()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Train:
    params: dict[str, Any]  # a 2-layer MLP: w1 f32[32, 32], b1 f32[32], w2 f32[32, 4], b2 f32[4]
    mu: dict[str, Any]  # Adam's moments, like params
    nu: dict[str, Any]
    count: Any  # int32
    metrics: dict[str, Any]  # loss, grad_norm: float32; ok: bool


def _train_start() -> Train:
    key = jax.random.key(0)
    k1, k2 = jax.random.split(key)
    params = {
        "w1": jax.random.normal(k1, (32, 32)) * 0.1,
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 4)) * 0.1,
        "b2": jnp.zeros(4),
    }
    zeros = jax.tree.map(jnp.zeros_like, params)
    metrics = {"loss": jnp.float32(0), "grad_norm": jnp.float32(0), "ok": jnp.bool_(True)}
    return Train(params, zeros, zeros, jnp.int32(0), metrics)


_X = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
_Y = np.random.default_rng(2).standard_normal((64, 4)).astype(np.float32)


def train_step(s: Train) -> Train:
    """One Adam step of the MLP (bench_donate.py jits it donating the state)."""

    def loss(p: dict[str, Any]) -> Any:
        h = jnp.tanh(_X @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - _Y) ** 2)

    value, grads = jax.value_and_grad(loss)(s.params)
    count = s.count + 1
    mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, s.mu, grads)
    nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, s.nu, grads)
    t = count.astype(jnp.float32)
    params = jax.tree.map(
        lambda p, m, v: p - 1e-3 * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8),
        s.params,
        mu,
        nu,
    )
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    metrics = {"loss": value, "grad_norm": norm, "ok": jnp.isfinite(value)}
    return Train(params, mu, nu, count, metrics)


_train_step = jax.jit(train_step)


def _case_jit_loop(sizes: Sizes) -> list[Result]:
    return _jit_loop_rows("jitted loop", _start, _step, sizes.steps, sizes.repeats)


def _case_train_loop(sizes: Sizes) -> list[Result]:
    return _jit_loop_rows(
        "jitted training loop", _train_start, _train_step, sizes.steps, sizes.repeats
    )


def measure_loops(
    name: str, start: Any, expected: list[Any], ours: Any, anchor: Any, repeats: int
) -> tuple[Timing, Timing]:
    """``ours(store)`` (a loop appending to a new store created like ``start()``, then
    closing it) against ``anchor()``, side by side; each store checked to hold the states of
    ``expected``, in order (bench_donate.py measures its loop with it too)."""
    want = jax.tree.map(lambda *v: np.stack([np.asarray(x) for x in v]), *expected)
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-") as tmp:
        count = [0]

        def new_store() -> tuple[Path, Any]:
            count[0] += 1
            path = Path(tmp) / f"store-{count[0]}"
            return path, pytreestore.create(str(path), start())

        def check(state: tuple[Path, Any], _: object) -> None:
            got = pytreestore.open(str(state[0])).load(as_numpy=True)
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                if not np.array_equal(g, w):
                    raise RuntimeError(f"{name}: the store does not hold the states")
            shutil.rmtree(state[0])

        return measure_side_by_side(
            Timed(lambda s: ours(s[1]), repeats, 1, new_store, check),
            Timed(lambda _: anchor(), repeats, 1),
        )


def _jit_loop_rows(name: str, start: Any, step: Any, steps: int, repeats: int) -> list[Result]:
    expected = _loop_list(steps, start, step)  # also compiles the step
    ours, base = measure_loops(
        name,
        start,
        expected,
        lambda store: _loop_store(store, steps, start, step),
        lambda: _loop_list(steps, start, step),
        repeats,
    )
    per = (ours.median - base.median) / steps
    leaves = len(jax.tree.leaves(start()))
    return [
        Result(
            case=name,
            n=steps,
            ours=ours,
            baseline=base,
            goal=at_most(1.3),
            higher_is_better=False,
            ours_label=(
                f"`state = step(state); store.append(state)` ({leaves}-leaf registered dataclass), "
                "then `close()`"
            ),
            baseline_label="the same loop appending the state to a Python list",
            notes=(
                f"Per step: the list loop {format_seconds(base.median / steps)}, the append "
                f"adds {format_seconds(per)}.",
            ),
        )
    ]


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    return [
        Case("latency", lambda: _case_latency(sizes)),
        Case("latency_wide", lambda: _case_latency_wide(sizes)),
        Case("jit_loop", lambda: _case_jit_loop(sizes)),
        Case("train_loop", lambda: _case_train_loop(sizes)),
    ]
