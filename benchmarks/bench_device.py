"""Loading onto the default JAX device (a TPU or GPU when there is one, else the CPU), each
case in fresh subprocesses that run one after another.

The parent process never initialises a JAX backend: on an accelerator only one process at a
time may hold the chip. ``JAX_PLATFORMS`` is left as the user set it (unset: JAX's default,
the accelerator when present). Each row's notes name the platform and device kind it ran on.
Every worker checks what it loaded against the arrays it wrote, outside the timed regions.
The baselines are ``jax.device_put`` of the same bytes from host memory, the host-to-device
limit; throughput ratios are ``baseline time / our time`` (1.0: as fast as the floor).

* **bulk load**: ``store.load()`` (every leaf a ``jax.Array``, ``block_until_ready``) of a
  4-leaf zstd store of about 512 MiB (quick: 9 MiB), against raw TensorStore reads of every
  column issued together into numpy, then ``jax.device_put`` of them. The notes give
  ``device_put`` of the same numpy arrays alone (already in host memory) as a second floor.
* **record**: a cold ``store[i]`` (the store opened with ``cache_bytes=0``) of random ``i``
  on a 128 MiB zstd store, against ``jax.device_put`` of that record's numpy leaves. A cold
  record decodes a whole chunk of every column, so this row is not expected to meet the goal.
* **shuffled batches**: one epoch of ``store.batches(1024, shuffle=True)`` (the default block
  shuffle) feeding a jitted MLP step (matmul, tanh, matmul, mean-squared loss, gradient
  update), blocking on each step's loss, against the same step over the same number of
  shuffled batches already in host memory, each ``jax.device_put`` and then run.
* **ragged load**: ``store.load(pad_to=32)`` of a ragged store (``{"id", "hits": list of
  float32[16]}``, 0-32 hits per record): the padded batch and mask on the device, against
  ``jax.device_put`` of the same padded numpy arrays and mask.
* **sharded load**: every record of a 4-column, 256 MiB store (uncompressed) as global arrays
  split over every device of the default platform: 8 simulated CPU devices on a CPU-only
  machine (``--xla_force_host_platform_device_count=8``, which affects only the host
  platform), the chips on an accelerator. Against the floor a user would write: raw
  TensorStore reads of every column issued together, then one ``jax.device_put(arrays,
  sharding)``.
* **batches**: one epoch of a jitted least-squares gradient step per batch, streaming with
  ``store.batches(batch_size, prefetch=2)``, against loading everything with ``store.load()``
  first and running the same steps on slices of it (``lax.dynamic_slice`` inside the jitted
  step). Both loops wait for each step's result, as a loop that logs its loss does: without
  that, JAX's asynchronous dispatch lets a loop run ahead of the computation and every batch
  queued behind it stays in memory. Each side runs in its own subprocess so that its peak RSS
  (``ru_maxrss``) is its own; times are not interleaved, so a slow spell of the machine falls
  on one side only.

``python benchmarks/device_check.py`` lists the devices and runs one small load: try it first
on a new machine. On an accelerator, run this module on its own (``python benchmarks/run.py
--only device``): the other modules run JAX in the parent process, which then holds the chip,
and the workers refuse to start with an error that says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import Case, Result, Timing, at_least, at_most

TITLE = "Device: bulk, record, shuffled, ragged and sharded loads, streaming batches"
HERE = Path(__file__).resolve()
HOST_DEVICES = "--xla_force_host_platform_device_count"


@dataclass(frozen=True)
class Sizes:
    load_records: int  # 4 columns of float32[1024]: 16 KiB per record
    load_repeats: int
    batch_records: int  # float32[512] + float32[]: about 2 KiB per record
    batch_size: int
    batch_repeats: int
    bulk_records: int  # obs float32[512], act float32[64], rew, step: 2,312 bytes per record
    record_records: int
    record_repeats: int
    shuffled_records: int  # x float32[512], y, id: 2,056 bytes per record
    ragged_records: int  # id, 0-32 hits of float32[16]: about 1 KiB per record stored


FULL = Sizes(
    load_records=16_384,
    load_repeats=5,
    batch_records=131_072,
    batch_size=4096,
    batch_repeats=3,
    bulk_records=229_376,
    record_records=57_344,
    record_repeats=40,
    shuffled_records=131_072,
    ragged_records=65_536,
)
QUICK = Sizes(
    load_records=1_024,
    load_repeats=3,
    batch_records=8_192,
    batch_size=1024,
    batch_repeats=2,
    bulk_records=4_096,
    record_records=4_096,
    record_repeats=5,
    shuffled_records=8_192,
    ragged_records=2_048,
)
SHUFFLED_BATCH = 1024
RAGGED_PAD_TO = 32


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    repeats = 2 if quick else 3
    return [
        Case("bulk load", lambda: [_bulk(sizes.bulk_records, repeats)]),
        Case("record", lambda: [_record(sizes.record_records, sizes.record_repeats)]),
        Case("shuffled batches", lambda: [_shuffled(sizes.shuffled_records, repeats)]),
        Case("ragged load", lambda: [_ragged(sizes.ragged_records, repeats)]),
        Case("sharded load", lambda: [_sharded_load(sizes)]),
        Case("batches", lambda: [_batches(sizes)]),
    ]


# --- parent side: run workers, build rows ---------------------------------------------------------


def _worker(name: str, *args: Any, devices: int = 1, cpu: bool = False) -> dict[str, Any]:
    """Runs ``WORKERS[name](*args)`` in a fresh process, on JAX's default platform.

    ``devices`` > 1 simulates that many host devices (it changes nothing on an accelerator);
    ``cpu`` keeps a worker that only writes a store off the accelerator, so that it does not
    pay for opening the chip.
    """
    _check_no_device_held()
    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(HOST_DEVICES)]
    if devices > 1:
        flags.append(f"{HOST_DEVICES}={devices}")
    env.pop("XLA_FLAGS", None)
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    if cpu:
        env["JAX_PLATFORMS"] = "cpu"
    cmd = [sys.executable, str(HERE), name, *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} worker failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_no_device_held() -> None:
    """Refuses to start a worker while this process holds an accelerator (only one process
    may): an earlier benchmark of the same run initialised JAX here."""
    if "jax" not in sys.modules:
        return
    from jax._src import xla_bridge  # only asks whether a backend exists; creates none

    if xla_bridge.backends_are_initialized():
        platform = sys.modules["jax"].default_backend()
        if platform != "cpu":
            raise RuntimeError(
                f"this process already holds the {platform} (an earlier benchmark ran JAX in "
                "it), so the device workers cannot open it: run "
                "`python benchmarks/run.py --only device` on its own"
            )


def _on(got: dict[str, Any]) -> str:
    n = got["devices"]
    return f"Ran on {got['platform']} ({got['device_kind']}; {n} device{'s' * (n != 1)})."


def _gib_s(nbytes: float, seconds: Sequence[float]) -> str:
    return f"{nbytes / 2**30 / Timing(tuple(seconds)).median:.2f} GiB/s"


def _bulk(records: int, repeats: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-device-bulk-") as tmp:
        got = _worker("bulk", tmp, records, repeats)
    nbytes = got["nbytes"]
    put = Timing(tuple(got["put"]))
    ours = Timing(tuple(got["ours"]))
    return Result(
        case="bulk load",
        n=records,
        ours=ours,
        baseline=Timing(tuple(got["baseline"])),
        goal=at_least(0.5),
        higher_is_better=True,
        ours_label="`store.load()` of a zstd store + `block_until_ready`",
        baseline_label="raw TensorStore reads of the 4 columns issued together into numpy, "
        "then `jax.device_put` + `block_until_ready`",
        notes=(
            _on(got),
            f"{nbytes / 2**20:.0f} MiB in 4 columns. Throughput: ours "
            f"{_gib_s(nbytes, ours.times)}, read + device_put {_gib_s(nbytes, got['baseline'])}"
            f", `jax.device_put` alone from host memory {_gib_s(nbytes, put.times)} (median "
            f"{put.median:.3g} s, runs {put}); ours against device_put alone: "
            f"{put.median / ours.median:.2f}x.",
        ),
    )


def _record(records: int, repeats: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-device-record-") as tmp:
        got = _worker("record", tmp, records, repeats)
    return Result(
        case="record (cold store[i])",
        n=repeats,
        ours=Timing(tuple(got["ours"])),
        baseline=Timing(tuple(got["baseline"])),
        goal=at_least(0.5),
        higher_is_better=True,
        ours_label="`store[i]` of a random `i`, store opened with `cache_bytes=0`, "
        "+ `block_until_ready`",
        baseline_label="`jax.device_put` of the same record's numpy leaves + `block_until_ready`",
        notes=(
            _on(got),
            f"{records:,} records of {got['nbytes']:,} bytes in a zstd store; N is the number "
            "of random records timed (each a run).",
        ),
    )


def _shuffled(records: int, repeats: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-device-shuffled-") as tmp:
        got = _worker("shuffled", tmp, records, SHUFFLED_BATCH, repeats)
    ours, base = Timing(tuple(got["ours"])), Timing(tuple(got["baseline"]))
    steps = got["steps"]
    return Result(
        case="shuffled batches",
        n=records,
        ours=ours,
        baseline=base,
        goal=at_least(0.5),
        higher_is_better=True,
        ours_label=f"one epoch of `store.batches({SHUFFLED_BATCH}, shuffle=True)`, each batch "
        "into a jitted MLP step, blocking on its loss",
        baseline_label=f"the same step over {steps} shuffled batches already in host memory, "
        "each `jax.device_put` then run",
        notes=(
            _on(got),
            f"{got['nbytes'] / 2**20:.0f} MiB zstd store, {steps} steps per epoch: ours "
            f"{steps / ours.median:.1f} steps/s, from memory {steps / base.median:.1f} steps/s.",
        ),
    )


def _ragged(records: int, repeats: int) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-device-ragged-") as tmp:
        got = _worker("ragged", tmp, records, RAGGED_PAD_TO, repeats)
    ours = Timing(tuple(got["ours"]))
    return Result(
        case="ragged load",
        n=records,
        ours=ours,
        baseline=Timing(tuple(got["baseline"])),
        goal=at_least(0.5),
        higher_is_better=True,
        ours_label=f"`store.load(pad_to={RAGGED_PAD_TO})` of a ragged store (padded batch and "
        "mask) + `block_until_ready`",
        baseline_label="`jax.device_put` of the same padded numpy batch and mask "
        "+ `block_until_ready`",
        notes=(
            _on(got),
            f"Records `{{'id': int32, 'hits': [float32[16]] * L}}`, L uniform in 0-"
            f"{RAGGED_PAD_TO}, zstd: {got['stored_bytes'] / 2**20:.0f} MiB of values, "
            f"{got['padded_bytes'] / 2**20:.0f} MiB padded with masks; ours "
            f"{_gib_s(got['padded_bytes'], ours.times)} of padded output.",
        ),
    )


def _sharded_load(sizes: Sizes) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-device-") as tmp:
        got = _worker("sharded", tmp, sizes.load_records, sizes.load_repeats, devices=8)
    mib = got["nbytes"] / 2**20
    return Result(
        case=f"sharded load ({got['devices']} {got['platform']} devices)",
        n=sizes.load_records,
        ours=Timing(tuple(got["ours"])),
        baseline=Timing(tuple(got["baseline"])),
        goal=at_most(1.2),
        higher_is_better=False,
        ours_label="`store.load(sharding=NamedSharding(mesh, P('data')))` + `block_until_ready`",
        baseline_label="raw TensorStore reads of the 4 columns issued together, then "
        "`jax.device_put(arrays, sharding)` + `block_until_ready`",
        notes=(_on(got), f"{mib:.0f} MiB in 4 columns over {got['devices']} devices."),
    )


def _batches(sizes: Sizes) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-batches-") as tmp:
        _worker("make-batches-store", tmp, sizes.batch_records, cpu=True)
        args = (tmp, sizes.batch_size, sizes.batch_repeats)
        ours = _worker("stream", *args)
        base = _worker("preload", *args)
    mib = ours["nbytes"] / 2**20
    batch_mib = mib * sizes.batch_size / sizes.batch_records
    return Result(
        case="batches vs load-all",
        n=sizes.batch_records,
        ours=Timing(tuple(ours["times"])),
        baseline=Timing(tuple(base["times"])),
        goal=at_least(0.8),
        higher_is_better=True,
        ours_label=f"one epoch of `store.batches({sizes.batch_size}, prefetch=2)` with a "
        "jitted gradient step per batch",
        baseline_label="`store.load()` of everything, then the same jitted step on "
        "`lax.dynamic_slice`s of it",
        notes=(
            _on(ours),
            f"{mib:.0f} MiB store, {batch_mib:.1f} MiB per batch. Peak RSS: batches() "
            f"{ours['rss_mib']:.0f} MiB, load-all {base['rss_mib']:.0f} MiB (after imports "
            f"and opening the store: {ours['rss_start_mib']:.0f} and "
            f"{base['rss_start_mib']:.0f} MiB).",
        ),
    )


def _main(argv: list[str]) -> None:
    sys.path.insert(0, str(HERE.parent))
    from _device_workers import WORKERS  # JAX's backends start here, in the worker only

    worker: Callable[..., dict[str, Any]] = WORKERS[argv[0]]
    print(json.dumps(worker(*argv[1:])))


if __name__ == "__main__":
    _main(sys.argv[1:])
