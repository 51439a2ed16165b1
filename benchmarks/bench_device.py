"""Device-ready loading on CPU with simulated devices, each case in fresh subprocesses.

* **sharded load**: every record of a 4-column, 256 MiB store (uncompressed) as global arrays
  split over 8 simulated CPU devices (``--xla_force_host_platform_device_count=8``), against
  the floor a user would write: raw TensorStore reads of every column issued together on
  handles opened beforehand, then one ``jax.device_put(arrays, sharding)``. Both sides run
  side by side in one 8-device subprocess.
* **batches**: one epoch of a jitted least-squares gradient step per batch, streaming with
  ``store.batches(batch_size, prefetch=2)``, against loading everything with ``store.load()``
  first and running the same steps on slices of it (``lax.dynamic_slice`` inside the jitted
  step). Both loops wait for each step's result, as a loop that logs its loss does: without
  that, JAX's asynchronous dispatch lets a loop run ahead of the computation and every batch
  queued behind it stays in memory. Each side runs in its own subprocess so that its peak RSS
  (``ru_maxrss``) is its own; times are not interleaved, so a slow spell of the machine falls
  on one side only.

No GPU was available to this benchmark; the GPU case of issue 4 (bytes per second of a load
to the GPU against ``jax.device_put``) is not measured here.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import Case, Result, Timing, at_least, at_most, measure_side_by_side

TITLE = "Device: sharded loads and streaming batches"
HERE = Path(__file__).resolve()


@dataclass(frozen=True)
class Sizes:
    load_records: int  # 4 columns of float32[1024]: 16 KiB per record
    load_repeats: int
    batch_records: int  # float32[512] + float32[]: about 2 KiB per record
    batch_size: int
    batch_repeats: int


FULL = Sizes(
    load_records=16_384, load_repeats=5, batch_records=131_072, batch_size=4096, batch_repeats=3
)
QUICK = Sizes(
    load_records=1_024, load_repeats=3, batch_records=8_192, batch_size=1024, batch_repeats=2
)


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    return [
        Case("sharded load", lambda: [_sharded_load(sizes)]),
        Case("batches", lambda: [_batches(sizes)]),
    ]


# --- parent side: run workers, build rows ---------------------------------------------------------


def _worker(name: str, *args: Any, devices: int = 1) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    if devices > 1:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    cmd = [sys.executable, str(HERE), name, *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name} worker failed:\n{done.stdout}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sharded_load(sizes: Sizes) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-device-") as tmp:
        got = _worker("sharded", tmp, sizes.load_records, sizes.load_repeats, devices=8)
    mib = got["nbytes"] / 2**20
    return Result(
        case="sharded load (8 devices)",
        n=sizes.load_records,
        ours=Timing(tuple(got["ours"])),
        baseline=Timing(tuple(got["baseline"])),
        goal=at_most(1.2),
        higher_is_better=False,
        ours_label="`store.load(sharding=NamedSharding(mesh, P('data')))` + `block_until_ready`",
        baseline_label="raw TensorStore reads of the 4 columns issued together, then "
        "`jax.device_put(arrays, sharding)` + `block_until_ready`",
        notes=(f"{mib:.0f} MiB in 4 columns over {got['devices']} devices.",),
    )


def _batches(sizes: Sizes) -> Result:
    with tempfile.TemporaryDirectory(prefix="bench-batches-") as tmp:
        _worker("make-batches-store", tmp, sizes.batch_records)
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
            f"{mib:.0f} MiB store, {batch_mib:.1f} MiB per batch. Peak RSS: batches() "
            f"{ours['rss_mib']:.0f} MiB, load-all {base['rss_mib']:.0f} MiB (after imports "
            f"and opening the store: {ours['rss_start_mib']:.0f} and "
            f"{base['rss_start_mib']:.0f} MiB).",
        ),
    )


# --- worker side ----------------------------------------------------------------------------------


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def work_sharded(root: str, records: str, repeats: str) -> dict[str, Any]:
    import jax
    import numpy as np
    import tensorstore as ts
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import pytreestore

    n, path = int(records), Path(root) / "load"
    like = {f"c{k}": np.zeros(1024, np.float32) for k in range(4)}
    with pytreestore.create(path, like, codec=None) as store:
        block = np.random.default_rng(0).random((n, 1024), np.float32)
        store.extend_batch({k: block + i for i, k in enumerate(like)})
    store = pytreestore.open(path)
    sharding = NamedSharding(jax.make_mesh((8,), ("data",)), P("data"))
    handles = [
        ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{path}/{k}/"}}).result()
        for k in like
    ]

    def ours(_: Any) -> Any:
        return jax.block_until_ready(store.load(sharding=sharding))

    def baseline(_: Any) -> Any:
        futures = [h[0:n].read() for h in handles]
        return jax.block_until_ready(jax.device_put([f.result() for f in futures], sharding))

    check = ours(None)
    np.testing.assert_array_equal(np.asarray(check["c2"]), block + 2)
    from _common import Timed

    t_ours, t_base = measure_side_by_side(
        Timed(ours, int(repeats), warmup=1), Timed(baseline, int(repeats), warmup=1)
    )
    return {
        "ours": list(t_ours.times),
        "baseline": list(t_base.times),
        "nbytes": 4 * n * 1024 * 4,
        "devices": jax.device_count(),
    }


def work_make_batches_store(root: str, records: str) -> dict[str, Any]:
    import numpy as np

    import pytreestore

    n, rng = int(records), np.random.default_rng(1)
    like = {"x": np.zeros(512, np.float32), "y": np.float32(0)}
    with pytreestore.create(Path(root) / "batches", like, codec=None) as store:
        for lo in range(0, n, 16_384):
            k = min(16_384, n - lo)
            x = rng.standard_normal((k, 512), np.float32)
            store.extend_batch({"x": x, "y": x[:, :8].sum(axis=1)})
    return {}


def _step_fns() -> tuple[Any, Any]:
    import jax
    import jax.numpy as jnp

    def loss(w: Any, x: Any, y: Any) -> Any:
        hidden = jnp.tanh(x @ w)
        return jnp.mean((hidden.sum(axis=1) - y) ** 2)

    @jax.jit
    def step(w: Any, batch: Any) -> Any:
        return w - 1e-4 * jax.grad(loss)(w, batch["x"], batch["y"])

    @jax.jit
    def step_at(w: Any, data: Any, start: Any, size: int = 0) -> Any:
        cut = {k: jax.lax.dynamic_slice_in_dim(v, start, size) for k, v in data.items()}
        return step(w, cut)

    return step, step_at


def work_stream(root: str, batch_size: str, repeats: str) -> dict[str, Any]:
    return _epochs(root, int(batch_size), int(repeats), stream=True)


def work_preload(root: str, batch_size: str, repeats: str) -> dict[str, Any]:
    return _epochs(root, int(batch_size), int(repeats), stream=False)


def _epochs(root: str, size: int, repeats: int, *, stream: bool) -> dict[str, Any]:
    import functools

    import jax
    import jax.numpy as jnp

    import pytreestore

    store = pytreestore.open(Path(root) / "batches")
    step, step_at = _step_fns()
    step_at = jax.jit(functools.partial(step_at.__wrapped__, size=size))
    rss_start = _rss_mib()
    times = []
    for _ in range(repeats + 1):  # the first run compiles; it is not timed
        w = jnp.full((512, 64), 0.01, jnp.float32)
        start = time.perf_counter()
        if stream:
            for batch in store.batches(size, drop_last=True, prefetch=2):
                w = step(w, batch).block_until_ready()
        else:
            data = store.load()
            for k in range(len(store) // size):
                w = step_at(w, data, k * size).block_until_ready()
            del data
        jax.block_until_ready(w)
        times.append(time.perf_counter() - start)
    nbytes = len(store) * (512 + 1) * 4
    return {"times": times[1:], "rss_mib": _rss_mib(), "rss_start_mib": rss_start, "nbytes": nbytes}


WORKERS = {
    "sharded": work_sharded,
    "make-batches-store": work_make_batches_store,
    "stream": work_stream,
    "preload": work_preload,
}

if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    print(json.dumps(WORKERS[sys.argv[1]](*sys.argv[2:])))
