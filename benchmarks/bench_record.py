"""Recording every step of a compiled loop (issue 46): a recorder in a loop of jitted steps,
and `record_scan`, against the same loops recording nothing.

The two steps of bench_write.py: the "60 us step" (`_step`, a sine of ten 3-vectors over a
registered dataclass of 20 leaves: the cheapest step a loop can have, its cost the dispatch)
and the Adam step of a 2-layer MLP (`train_step`, 16 leaves). Each row times ours and its
anchor side by side in one process (interleaved), the store created untimed and closed
inside the timed region, after one untimed run of each (compiles); every store is checked
to hold the list loop's states exactly.

The anchor of the loop rows is defined once (`bench_write._loop_list`): the same Python loop
of the same jitted step from the same start, each state kept in a Python list (what recording
nothing costs in a Python loop: a reference), ending with `jax.block_until_ready` of the last
state; ours ends with `store.close()` (every record written and committed). CPU time is given
for the process and for the loop's own thread (the rest: the recorder's writer thread,
TensorStore's and XLA's threads).

* **recorder**: `state = step(state); rec.append(state)` with `rec = store.recorder()`,
  then `store.close()`, against the anchor. Goals: 1.5x (60 us step), 1.2x (Adam).
* **store.append**: the same loop appending each state to the store (today's way; the rows
  of bench_write.py, here interleaved with the others).
* **record_scan vs scan**: `pytreestore.record_scan(store, step, start, steps)`, blocks of
  256 steps compiled with `jax.lax.scan`, then `store.close()`, against the same blocks of
  scan recording nothing. Goals as above. A scan runs the step without Python: its "60 us
  step" costs about 1 us, so what recording costs per step (the store's write and its
  `close()`, about 1.3 us a record plus a fixed 20-60 ms commit here) is what the ratio shows.
* **record_scan vs the Python loop**: the same `record_scan` against the Python loop keeping
  a list: what a user gains by moving the loop into a scan and recording it.

Run it alone on an accelerator's host (JAX picks the default backend)::

    python benchmarks/bench_record.py [--quick] [--only NAME] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # `_common`; this checkout's pytreestore

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    Case,
    Result,
    Timed,
    at_most,
    format_seconds,
    measure_side_by_side,
)
from bench_write import _loop_list, _start, _step, _train_start, _train_step  # noqa: E402

import pytreestore  # noqa: E402

TITLE = "Recording every step of a compiled loop"

STEPS, QUICK_STEPS = 3_000, 600
BLOCK = 256
#: whether the stores are created with ``pack=True`` (``--pack``: small leaves side by side in
#: shared arrays, so a commit writes 2-3 arrays instead of one per leaf)
PACK = [False]
STEPS_OF = {"60 us step": (_start, _step, 1.5), "Adam step": (_train_start, _train_step, 1.2)}


def loop_recorder(store: Any, steps: int, start: Callable[[], Any], step: Any) -> None:
    """Ours: a Python loop of jitted steps, each state given to a recorder; then close()."""
    state, rec = start(), store.recorder(block=BLOCK)
    append = rec.append
    for _ in range(steps):
        state = step(state)
        append(state)
    store.close()


def loop_wrapped(store: Any, steps: int, start: Callable[[], Any], step: Any) -> None:
    """Ours: a Python loop of the step wrapped by a recorder (``rec.wrap(step)``: the pack
    compiled into the step); then close()."""
    state, rec = start(), store.recorder(block=BLOCK)
    recorded = rec.wrap(step)
    for _ in range(steps):
        state = recorded(state)
    store.close()


def loop_append(store: Any, steps: int, start: Callable[[], Any], step: Any) -> None:
    """Today's way: each state appended with ``store.append``; then close()."""
    state, append = start(), store.append
    for _ in range(steps):
        state = step(state)
        append(state)
    store.close()


def scan_recorded(store: Any, steps: int, start: Callable[[], Any], step: Any) -> None:
    """Ours: ``record_scan`` of ``steps`` steps, then close()."""
    pytreestore.record_scan(store, step, start(), steps, block=BLOCK)
    store.close()


@functools.cache
def _scan_blocks(step: Any, length: int) -> Any:
    def body(c: Any, _: None) -> tuple[Any, None]:
        return step(c), None

    return jax.jit(lambda c: jax.lax.scan(body, c, None, length=length)[0])


def scan_only(steps: int, start: Callable[[], Any], step: Any) -> Any:
    """The anchor: the same blocks of scan recording nothing, waited for."""
    carry = start()
    full, rest = divmod(steps, BLOCK)
    for length in [BLOCK] * full + ([rest] if rest else []):
        carry = _scan_blocks(step, length)(carry)
    return jax.block_until_ready(carry)


class _Clock:
    """Each run's CPU seconds (the process's, and the loop's own thread's), beside the wall
    times measure_side_by_side keeps."""

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.loop_cpu: list[float] = []

    def wrap(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def timed(state: Any) -> Any:
            start, thread = time.process_time(), time.thread_time()
            out = fn(state)
            self.loop_cpu.append(time.thread_time() - thread)
            self.cpu.append(time.process_time() - start)
            return out

        return timed


def _measure(
    name: str, start: Callable[[], Any], steps: int, ours: Any, anchor: Any, repeats: int
) -> tuple[Any, Any, list[float], list[float]]:
    """``ours(store)`` against ``anchor()`` side by side (one untimed run of each first);
    each store checked to hold the list loop's states exactly."""
    expected = _loop_list(steps, start, _STEP[name])
    want = jax.tree.map(lambda *v: np.stack([np.asarray(x) for x in v]), *expected)
    del expected
    ours_clock, anchor_clock = _Clock(), _Clock()
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-") as tmp:
        count = [0]

        def new_store() -> tuple[Path, Any]:
            count[0] += 1
            path = Path(tmp) / f"store-{count[0]}"
            return path, pytreestore.create(str(path), start(), pack=PACK[0])

        def check(state: tuple[Path, Any], _: object) -> None:
            got = pytreestore.open(str(state[0])).load(as_numpy=True)
            if jax.tree.structure(got) != jax.tree.structure(want):
                raise RuntimeError(f"{name}: the records' classes differ from the states'")
            for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
                if not np.array_equal(g, w):
                    raise RuntimeError(f"{name}: the store does not hold the states")
            shutil.rmtree(state[0])

        ours_t, anchor_t = measure_side_by_side(
            Timed(ours_clock.wrap(lambda s: ours(s[1])), repeats, 1, new_store, check),
            Timed(anchor_clock.wrap(lambda _: anchor()), repeats, 1),
        )
    _LOOP_CPU[name] = (ours_clock.loop_cpu[1:], anchor_clock.loop_cpu[1:])
    return ours_t, anchor_t, ours_clock.cpu[1:], anchor_clock.cpu[1:]


#: the last row's CPU seconds of the loop's own thread (ours, the anchor's), by step: the rest
#: of the process's is the recorder's writer thread, TensorStore's and XLA's threads
_LOOP_CPU: dict[str, tuple[list[float], list[float]]] = {}


_STEP = {name: step for name, (_, step, _) in STEPS_OF.items()}

#: row kind -> (ours, anchor, what ours is, what the anchor is, goal from the step's)
ROWS: dict[str, tuple[Any, Any, str, str, bool]] = {
    "recorder": (
        loop_recorder,
        lambda steps, start, step: _loop_list(steps, start, step),
        "`state = step(state); rec.append(state)` (`rec = store.recorder()`), then `close()`",
        "the same loop keeping each state in a list",
        True,
    ),
    "recorder.wrap": (
        loop_wrapped,
        lambda steps, start, step: _loop_list(steps, start, step),
        "`state = recorded(state)` (`recorded = store.recorder().wrap(step)`), then `close()`",
        "the same loop of `step` keeping each state in a list",
        True,
    ),
    "store.append": (
        loop_append,
        lambda steps, start, step: _loop_list(steps, start, step),
        "`state = step(state); store.append(state)`, then `close()`",
        "the same loop keeping each state in a list",
        True,
    ),
    "record_scan vs scan": (
        scan_recorded,
        scan_only,
        f"`record_scan(store, step, start, steps)` ({BLOCK}-step scan blocks), then `close()`",
        "the same scan blocks recording nothing",
        True,
    ),
    "record_scan vs the Python loop": (
        scan_recorded,
        lambda steps, start, step: _loop_list(steps, start, step),
        f"`record_scan(store, step, start, steps)` ({BLOCK}-step scan blocks), then `close()`",
        "a Python loop of the jitted step keeping each state in a list",
        False,
    ),
}


def run_row(kind: str, step_name: str, steps: int, repeats: int) -> Result:
    """One row: ``kind`` of :data:`ROWS` with the step ``step_name`` of :data:`STEPS_OF`."""
    ours_fn, anchor_fn, ours_label, anchor_label, goal_of_step = ROWS[kind]
    start, step, goal = STEPS_OF[step_name]
    ours, anchor, cpu_ours, cpu_anchor = _measure(
        step_name,
        start,
        steps,
        lambda store: ours_fn(store, steps, start, step),
        lambda: anchor_fn(steps, start, step),
        repeats,
    )
    platform = jax.devices()[0].platform
    return Result(
        case=f"{kind}, {step_name}",
        n=steps,
        ours=ours,
        baseline=anchor,
        goal=at_most(goal if goal_of_step else 1.0),
        higher_is_better=False,
        ours_label=ours_label,
        baseline_label=anchor_label,
        notes=(
            f"Platform {platform}{', stores made with pack=True' if PACK[0] else ''}. Per step: ours {format_seconds(ours.median / steps)}, the "
            f"anchor {format_seconds(anchor.median / steps)}; CPU time ours "
            f"{format_seconds(float(np.median(cpu_ours)))}, the anchor "
            f"{format_seconds(float(np.median(cpu_anchor)))} (CPU ratio "
            f"{float(np.median(cpu_ours)) / max(float(np.median(cpu_anchor)), 1e-9):.2f}); "
            f"of which the loop's own thread: ours "
            f"{format_seconds(float(np.median(_LOOP_CPU[step_name][0])))}, the anchor "
            f"{format_seconds(float(np.median(_LOOP_CPU[step_name][1])))}.",
        ),
    )


def cases(quick: bool) -> list[Case]:
    steps, repeats = (QUICK_STEPS, 2) if quick else (STEPS, 5)
    out = []
    for kind in ROWS:
        for step_name in STEPS_OF:
            name = f"{kind} {step_name}".replace(" ", "_").replace(".", "_")

            def run(kind: str = kind, step_name: str = step_name) -> list[Result]:
                return [run_row(kind, step_name, steps, repeats)]

            out.append(Case(name, run))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps: a smoke run")
    parser.add_argument("--only", action="append", help="run only cases containing this")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--pack", action="store_true", help="stores made with pack=True")
    args = parser.parse_args()
    PACK[0] = args.pack
    chosen = [c for c in cases(args.quick) if not args.only or any(o in c.name for o in args.only)]
    rows = []
    for case in chosen:
        for r in case.run():
            rows.append(r)
            print(
                f"{r.case}: ours {r.ours} (median {format_seconds(r.ours_s)}), anchor "
                f"{r.baseline} (median {format_seconds(r.baseline_s)}), ratio {r.ratio:.2f} "
                f"(goal {r.goal}: {'met' if r.goal.met(r.ratio) else 'NOT met'}). "
                f"{' '.join(r.notes)}",
                flush=True,
            )
    if args.json is not None:
        out = [
            {
                "case": r.case,
                "n": r.n,
                "platform": jax.devices()[0].platform,
                "device": str(jax.devices()[0]),
                "ours_s": list(r.ours.times),
                "anchor_s": list(r.baseline.times),
                "ratio": r.ratio,
                "goal": str(r.goal),
                "met": r.goal.met(r.ratio),
                "notes": list(r.notes),
            }
            for r in rows
        ]
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
