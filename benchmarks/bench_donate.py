"""A training loop whose jitted step donates its state, appending each state (issue 44, item 4).

* **donated training loop**: `store.append(state); state = step(state)` with
  `step = jax.jit(train_step, donate_argnums=0)`, an Adam step of a 2-layer MLP (32-32-4, a
  batch of 64) whose state (parameters, both moments, the count, three metrics: 16 leaves) it
  donates, the store created untimed and closed inside the timed region; against the same loop
  keeping `jax.tree.map(jnp.copy, state)` in a list (what a user writes to keep states a
  donating step would delete), synchronised at the end. Goal: at most 1.5x. Every record is
  checked against the list's states outside the timed region.

The store makes each appended state its own before `append` returns: on the CPU each leaf is
copied into its row (about 1 us a leaf), on an accelerator one jitted copy of the record's
leaves is dispatched (one call where `jax.tree.map(jnp.copy, ...)` makes one per leaf) and
fetched when its chunk is written.

Run it alone on an accelerator's host (one process at a time may hold the chip)::

    python benchmarks/bench_donate.py [--quick] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # `_common`; this checkout's pytreestore

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _common import (  # noqa: E402
    Case,
    Result,
    at_most,
    format_seconds,
)
from bench_write import Train, measure_loops, train_step  # noqa: E402  (its jitted loop)

TITLE = "A training loop donating its state, appending each state"

STEPS, QUICK_STEPS = 3_000, 200


def start() -> Train:
    """The first state (fresh arrays: a donating step deletes the ones it is given)."""
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {
        "w1": jax.random.normal(k1, (32, 32)) * 0.1,
        "b1": jnp.zeros(32),
        "w2": jax.random.normal(k2, (32, 4)) * 0.1,
        "b2": jnp.zeros(4),
    }
    metrics = {"loss": jnp.float32(0), "grad_norm": jnp.float32(0), "ok": jnp.bool_(True)}
    return Train(
        params,
        jax.tree.map(jnp.zeros_like, params),
        jax.tree.map(jnp.zeros_like, params),
        jnp.int32(0),
        metrics,
    )


step = jax.jit(train_step, donate_argnums=0)


def loop_copies(steps: int) -> list[Train]:
    """The anchor: each state's copy kept in a list, the step donating the state."""
    state, kept = start(), []
    for _ in range(steps):
        kept.append(jax.tree.map(jnp.copy, state))
        state = step(state)
    kept.append(state)
    jax.block_until_ready(kept)
    return kept


def loop_store(store: Any, steps: int) -> None:
    """Ours: each state appended to ``store``, the step donating it; then ``close()``."""
    state, append = start(), store.append
    for _ in range(steps):
        append(state)
        state = step(state)
    append(state)
    store.close()


def run_case(steps: int, repeats: int) -> list[Result]:
    """The donated loop against the anchor, side by side; every record checked."""
    expected = loop_copies(steps)  # also compiles the step
    ours, base = measure_loops(
        "donated training loop",
        start,
        expected,
        lambda store: loop_store(store, steps),
        lambda: loop_copies(steps),
        repeats,
    )
    per = (ours.median - base.median) / (steps + 1)
    return [
        Result(
            case="donated training loop",
            n=steps + 1,
            ours=ours,
            baseline=base,
            goal=at_most(1.5),
            higher_is_better=False,
            ours_label=(
                "`store.append(state); state = step(state)`, the step donating its 16-leaf "
                "state (`donate_argnums=0`), then `close()`"
            ),
            baseline_label="the same loop keeping `jax.tree.map(jnp.copy, state)` in a list",
            notes=(
                f"Platform {jax.devices()[0].platform}. Per step: the anchor "
                f"{format_seconds(base.median / (steps + 1))}, the store "
                f"{'adds' if per >= 0 else 'saves'} {format_seconds(abs(per))}.",
            ),
        )
    ]


def cases(quick: bool) -> list[Case]:
    steps, repeats = (QUICK_STEPS, 2) if quick else (STEPS, 5)
    return [Case("donated_loop", lambda: run_case(steps, repeats))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps: a smoke run")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = [r for case in cases(args.quick) for r in case.run()]
    for r in rows:
        print(
            f"{r.case}: ours {r.ours} (median {format_seconds(r.ours_s)}), anchor "
            f"{r.baseline} (median {format_seconds(r.baseline_s)}), ratio {r.ratio:.2f} "
            f"(goal {r.goal}: {'met' if r.goal.met(r.ratio) else 'NOT met'}). {' '.join(r.notes)}"
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
            }
            for r in rows
        ]
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
