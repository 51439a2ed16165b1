"""A first check on a new machine: list JAX's devices and load one small store onto them.

    python benchmarks/device_check.py

Prints ``jax.devices()``, the default platform and device kind, then writes a 2,048-record
store to a temporary directory, loads it with ``store.load()``, checks the values on the
device against what was written, and prints where the leaves landed and how long the load
took. Run it on its own (on an accelerator only one process may hold the chip), before
``python benchmarks/run.py --only device``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's pytreestore

import pytreestore


def main() -> None:
    devices = jax.devices()
    print(f"jax {jax.__version__}, default backend {jax.default_backend()}")
    print(f"jax.devices(): {devices}")
    print(f"device kind: {devices[0].device_kind}")
    rng = np.random.default_rng(0)
    columns = {"x": rng.standard_normal((2048, 256), np.float32), "i": np.arange(2048)}
    columns["i"] = columns["i"].astype(np.int32)
    with tempfile.TemporaryDirectory(prefix="device-check-") as tmp:
        like = {k: np.zeros(v.shape[1:], v.dtype) for k, v in columns.items()}
        with pytreestore.create(Path(tmp) / "check", like) as store:
            store.extend_batch(columns)
        store = pytreestore.open(Path(tmp) / "check")
        start = time.perf_counter()
        loaded = jax.block_until_ready(store.load())
        seconds = time.perf_counter() - start
        for key, want in columns.items():
            np.testing.assert_array_equal(np.asarray(loaded[key]), want)
        one = jax.block_until_ready(store[7])
        np.testing.assert_array_equal(np.asarray(one["x"]), columns["x"][7])
    nbytes = sum(v.nbytes for v in columns.values())
    print(f"store.load(): {nbytes / 2**20:.1f} MiB in {seconds * 1e3:.1f} ms, values checked")
    print(f"leaves on: {loaded['x'].devices()}; store[7] on: {one['x'].devices()}")


if __name__ == "__main__":
    main()
