"""Replay buffers (issue 46): ``store.replay(capacity)`` against a numpy ring and flashbax.

A step adds 32 transitions and samples 256 (uniformly, with replacement, from the last
``capacity``), the RL loop's use of a replay buffer. A transition is ``obs`` float32[8],
``action`` int32, ``reward`` float32, ``done`` bool (fixed), or the same with ``obs``
float32[n, 8], ``n`` from 1 to 8 (ragged, ``ragged=["['obs']"]``: each sample padded to its
longest ``obs`` with a mask). Each run times a block of steps on a buffer already holding
``capacity`` transitions; ours and the anchor's runs are interleaved.

* **replay step vs numpy ring**: ``buffer.add_batch(batch); buffer.sample(256,
  as_numpy=True)`` (every transition also appended to a store on disk, TensorStore backend)
  against a numpy ring per leaf written in place, sampled by fancy indexing (ragged: ``obs``
  kept padded to 8 with its lengths, the mask made from them). Goal: at most 10x.
* **replay step vs flashbax add+sample**: the same with ``sample(256)`` (jax arrays,
  waited for) against flashbax 0.1.3's item buffer, ``add`` (donating its state) and
  ``sample`` both jitted, the batch already on the device (ragged: ``obs`` padded to 8 with
  its length, since flashbax keeps fixed shapes). Goal: at most 1x.
* **sample only vs flashbax**: ``buffer.sample(256)`` against flashbax's jitted ``sample``,
  both waited for. Goal: at most 1x.

Every sample is checked once against the store outside the timed region (the records drawn,
read back with ``store.load``).

    python benchmarks/bench_replay.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # `_common`; this checkout's pytreestore

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _common import Case, Result, Timed, at_most, format_seconds, measure_side_by_side  # noqa: E402

import pytreestore  # noqa: E402

TITLE = "Replay buffers: add 32 transitions + sample 256"

ADD, SAMPLE, LONGEST = 32, 256, 8
CAPACITY, QUICK_CAPACITY = 100_000, 4_096
STEPS, QUICK_STEPS = 300, 30
REPEATS, QUICK_REPEATS = 7, 3
RAGGED = ["['obs']"]


def batch(seed: int, ragged: bool) -> dict[str, Any]:
    """``ADD`` transitions as one batch; ragged: ``obs`` padded to ``LONGEST`` with a mask
    (the pair ``add_batch`` takes) and the lengths."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {
        "obs": rng.standard_normal((ADD, 8)).astype(np.float32),
        "action": rng.integers(0, 4, ADD).astype(np.int32),
        "reward": rng.standard_normal(ADD).astype(np.float32),
        "done": rng.random(ADD) < 0.05,
    }
    if ragged:
        lengths = rng.integers(1, LONGEST + 1, ADD)
        obs = rng.standard_normal((ADD, LONGEST, 8)).astype(np.float32)
        mask = np.arange(LONGEST)[None, :] < lengths[:, None]
        out["obs"] = obs * mask[:, :, None]
        out["lengths"] = lengths.astype(np.int32)
    return out


def record_batch(b: dict[str, Any], ragged: bool) -> tuple[Any, Any]:
    """The store's ``(batch, mask)`` of a batch (mask None for a fixed store)."""
    values = {k: b[k] for k in ("obs", "action", "reward", "done")}
    if not ragged:
        return values, None
    rows = np.ones(ADD, bool)
    mask = {"obs": np.arange(LONGEST)[None, :] < b["lengths"][:, None], "action": rows}
    mask |= {"reward": rows, "done": rows}
    return values, mask


class NumpyRing:
    """The anchor: one numpy ring per leaf, written in place, sampled by fancy indexing."""

    def __init__(self, like: dict[str, Any], capacity: int, seed: int) -> None:
        self.cols = {k: np.zeros((capacity, *v.shape[1:]), v.dtype) for k, v in like.items()}
        self.capacity, self.pos, self.size = capacity, 0, 0
        self.rng = np.random.default_rng(seed)

    def add(self, b: dict[str, Any]) -> None:
        at = (self.pos + np.arange(ADD)) % self.capacity
        for k, col in self.cols.items():
            col[at] = b[k]
        self.pos = (self.pos + ADD) % self.capacity
        self.size = min(self.size + ADD, self.capacity)

    def sample(self, k: int) -> dict[str, Any]:
        idx = self.rng.integers(0, self.size, k)
        out = {name: col[idx] for name, col in self.cols.items()}
        if "lengths" in out:
            out["mask"] = np.arange(LONGEST)[None, :] < out["lengths"][:, None]
        return out


def flashbax_buffer(like: dict[str, Any], capacity: int) -> tuple[Any, Callable, Callable]:
    """flashbax's item buffer holding ``capacity`` items: (state, add, sample), jitted."""
    import flashbax as fbx

    item = jax.tree.map(lambda x: x[0], like)
    buf = fbx.make_item_buffer(
        max_length=capacity, min_length=1, sample_batch_size=SAMPLE, add_batches=True
    )
    add, sample = jax.jit(buf.add, donate_argnums=0), jax.jit(buf.sample)
    state = buf.init(item)
    return state, add, sample


def filled(ragged: bool, capacity: int) -> tuple[Any, NumpyRing, list[dict[str, Any]]]:
    """A replay buffer over a new store, a numpy ring and 8 batches to add, each buffer
    holding ``capacity`` transitions."""
    batches = [batch(i, ragged) for i in range(8)]
    first, _ = record_batch(batches[0], ragged)
    like = jax.tree.map(lambda x: x[0], first)
    if ragged:
        like = {**like, "obs": first["obs"][0, :1]}
    path = Path(tempfile.mkdtemp(prefix="bench-replay-")) / "store"
    store = pytreestore.create(path, like, ragged=RAGGED if ragged else None)
    buffer = store.replay(capacity, seed=0)
    ring = NumpyRing(batches[0], capacity, seed=0)
    for i in range(capacity // ADD + 1):
        b = batches[i % len(batches)]
        buffer.add_batch(*record_batch(b, ragged))
        ring.add(b)
    return buffer, ring, batches


def check(buffer: Any, ragged: bool) -> None:
    """A sample is exactly the records drawn, as the store loads them."""
    got = buffer.sample(64, as_numpy=True)
    drawn = got[0] if ragged else got
    # the drawn records' numbers are not returned: find them by value among the window
    store = buffer.store
    window = store.load(slice(len(store) - len(buffer), None), as_numpy=True)
    values = window[0] if ragged else window
    keys = {
        (float(r), int(a)): i for i, (r, a) in enumerate(zip(values["reward"], values["action"]))
    }
    index = [
        keys[(float(r), int(a))] + len(store) - len(buffer)
        for r, a in zip(drawn["reward"], drawn["action"])
    ]
    want = store.load(index, as_numpy=True)
    jax.tree.map(np.testing.assert_array_equal, got, want)


def run_case(ragged: bool, capacity: int, steps: int, repeats: int) -> list[Result]:
    """The three rows of one kind of transition."""
    buffer, ring, batches = filled(ragged, capacity)
    check(buffer, ragged)
    pairs = [record_batch(b, ragged) for b in batches]
    fb_batches = [jax.device_put(_fb_item(b, ragged)) for b in batches]
    fb = flashbax_buffer(fb_batches[0], capacity)
    fb_state = [fb[0]]
    for i in range(capacity // ADD + 1):
        fb_state[0] = fb[1](fb_state[0], fb_batches[i % len(batches)])
    keys = iter(jax.random.split(jax.random.key(0), (steps + 1) * (3 * repeats + 6)))

    def ours_numpy(_: Any) -> None:
        for i in range(steps):
            buffer.add_batch(*pairs[i % len(pairs)])
            buffer.sample(SAMPLE, as_numpy=True)

    def ours_jax(_: Any) -> None:
        out = None
        for i in range(steps):
            buffer.add_batch(*pairs[i % len(pairs)])
            out = buffer.sample(SAMPLE)
        jax.block_until_ready(out)

    def ours_sample(_: Any) -> None:
        for _i in range(steps):
            jax.block_until_ready(buffer.sample(SAMPLE))

    def numpy_ring(_: Any) -> None:
        for i in range(steps):
            ring.add(batches[i % len(batches)])
            ring.sample(SAMPLE)

    def flashbax_step(_: Any) -> None:
        out = None
        add, sample = fb[1], fb[2]
        for i in range(steps):
            fb_state[0] = add(fb_state[0], fb_batches[i % len(fb_batches)])
            out = sample(fb_state[0], next(keys))
        jax.block_until_ready(out)

    def flashbax_sample(_: Any) -> None:
        for _i in range(steps):
            jax.block_until_ready(fb[2](fb_state[0], next(keys)))

    kind = "ragged" if ragged else "fixed"
    step_np, ring_t, step_jax, fb_t, sample_t, fb_sample_t = measure_side_by_side(
        Timed(ours_numpy, repeats, 1),
        Timed(numpy_ring, repeats, 1),
        Timed(ours_jax, repeats, 1),
        Timed(flashbax_step, repeats, 1),
        Timed(ours_sample, repeats, 1),
        Timed(flashbax_sample, repeats, 1),
    )
    per = lambda t: format_seconds(t.median / steps)  # noqa: E731
    note = (
        f"{kind}; capacity {capacity:,}; {steps} steps a run; platform "
        f"{jax.devices()[0].platform}. Per step: ours {{}}, anchor {{}}."
    )
    transition = (
        "obs float32[n, 8] (n 1-8), action, reward, done"
        if ragged
        else ("obs float32[8], action, reward, done")
    )
    return [
        Result(
            case=f"replay step ({kind}): pytreestore vs numpy ring",
            n=steps,
            ours=step_np,
            baseline=ring_t,
            goal=at_most(10),
            higher_is_better=False,
            ours_label=f"`buffer.add_batch` of 32 + `buffer.sample(256, as_numpy=True)` ({transition})",
            baseline_label="a numpy ring per leaf, written in place, sampled by fancy indexing",
            notes=(note.format(per(step_np), per(ring_t)),),
        ),
        Result(
            case=f"replay step ({kind}): pytreestore vs flashbax add+sample",
            n=steps,
            ours=step_jax,
            baseline=fb_t,
            goal=at_most(1),
            higher_is_better=False,
            ours_label="`buffer.add_batch` of 32 + `buffer.sample(256)` (jax arrays, waited for)",
            baseline_label="flashbax 0.1.3 item buffer: jitted `add` (donated) + `sample`",
            notes=(note.format(per(step_jax), per(fb_t)),),
        ),
        Result(
            case=f"sample only ({kind}): pytreestore vs flashbax",
            n=steps,
            ours=sample_t,
            baseline=fb_sample_t,
            goal=at_most(1),
            higher_is_better=False,
            ours_label="`buffer.sample(256)` (jax arrays, waited for)",
            baseline_label="flashbax 0.1.3 jitted `sample`, waited for",
            notes=(note.format(per(sample_t), per(fb_sample_t)),),
        ),
    ]


def _fb_item(b: dict[str, Any], ragged: bool) -> dict[str, Any]:
    """flashbax's batch: fixed shapes (ragged ``obs`` padded to 8, with its lengths)."""
    keys = (
        ("obs", "action", "reward", "done", "lengths")
        if ragged
        else ("obs", "action", "reward", "done")
    )
    return {k: b[k] for k in keys}


def cases(quick: bool) -> list[Case]:
    capacity, steps, repeats = (
        (QUICK_CAPACITY, QUICK_STEPS, QUICK_REPEATS) if quick else (CAPACITY, STEPS, REPEATS)
    )
    return [
        Case("fixed", lambda: run_case(False, capacity, steps, repeats)),
        Case("ragged", lambda: run_case(True, capacity, steps, repeats)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", choices=["fixed", "ragged"], help="one kind of transition")
    args = parser.parse_args()
    for case in cases(args.quick):
        if args.only not in (None, case.name):
            continue
        for r in case.run():
            print(
                f"{r.case}: ratio {r.ratio:.2f} (paired {r.paired_ratio or float('nan'):.2f}; "
                f"goal {r.goal}: {'met' if r.met else 'NOT met'}). {' '.join(r.notes)}"
            )


if __name__ == "__main__":
    main()
