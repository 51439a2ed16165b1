"""A Ray Data write into a new store, and a read back.

    python examples/ray_write_read.py [DIRECTORY]

Starts Ray on this machine (2 CPUs), makes a dataset of 1,000 simulated measurements with
Ray's default block count, computes a derived column in Ray, and writes it with
``TreeStoreDatasink`` to a path where no store exists yet: the write creates the store from
its first block (nested dicts by the dots of the column names) and commits every row at
once. Then reads the store back into Ray (``read_store``), aggregates there, and checks the
result against the same numbers computed with numpy from the store. DIRECTORY defaults to a
temporary one.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import ray

import pytreestore
from pytreestore.ray import TreeStoreDatasink, read_store

ROWS = 1_000


def measure(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs in Ray's workers: each id's reading, and its square."""
    i = batch["id"]
    value = np.sin(i / 50).astype(np.float32)
    return {"sensor.id": i.astype(np.int32), "sensor.value": value, "energy": value**2}


def above_half(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Runs in Ray's workers, over the store's rows: how many readings exceed 0.5."""
    return {"above": np.array([int((batch["sensor.value"] > 0.5).sum())])}


def main(directory: Path) -> None:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # one machine: 127.0.0.1
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.execution_options.preserve_order = True  # records land in the dataset's order

    path = directory / "measurements.store"  # nothing there yet
    ray.data.range(ROWS).map_batches(measure).write_datasink(TreeStoreDatasink(path))

    store = pytreestore.open(path)
    print(f"{len(store)} records; columns {[c.path for c in store.schema.columns]}")
    local = store.load(as_numpy=True)
    assert local["sensor"]["id"].tolist() == list(range(ROWS))

    read = read_store(path)  # one column per leaf: energy, sensor.id, sensor.value
    total = read.sum("energy")
    high = read.map_batches(above_half).sum("above")
    np.testing.assert_allclose(total, local["energy"].sum(dtype=np.float64), rtol=1e-5)
    assert high == int((local["sensor"]["value"] > 0.5).sum())
    print(f"sum of energy {total:.3f}, {high} readings above 0.5, as numpy computes them")
    print("ray_write_read example OK")
    ray.shutdown()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
