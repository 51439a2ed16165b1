"""Grain with worker processes over a store: shuffled, transformed and batched in 2 workers.

    python examples/grain_workers.py [DIRECTORY]

Writes 240 labelled 8x8 "images" to a store, then feeds them through a
``grain.DataLoader(worker_count=2)``: each worker process opens the store read-only (the
source pickles as the store's location), reads its records, scales the images in a Grain
``MapTransform`` and batches them; the batches come back through shared memory. Checks
that every record comes exactly once per epoch, each equal to the store's, scaled. The
program parses no absl flags (``store.grain_source()`` readies Grain's workers for that) and
leaves no shared memory behind. The ``__main__`` guard is needed: Grain starts its workers
with ``spawn``, which imports this script again in each. DIRECTORY defaults to a temporary
one.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import grain
import jax  # noqa: F401  (imported first, as in a JAX program)
import numpy as np

import pytreestore

RECORDS, BATCH = 240, 16


class Scale(grain.transforms.Map):
    """Runs in the workers: images to [0, 1]."""

    def map(self, record: dict) -> dict:
        return {**record, "image": record["image"] / np.float32(255)}


def write_images(path: Path) -> None:
    rng = np.random.default_rng(0)
    like = {"image": np.zeros((8, 8), np.float32), "label": np.int32(0), "id": np.int32(0)}
    with pytreestore.create(path, like, overwrite=True) as store:
        store.extend_batch(
            {
                "image": rng.integers(0, 256, (RECORDS, 8, 8)).astype(np.float32),
                "label": rng.integers(0, 10, RECORDS).astype(np.int32),
                "id": np.arange(RECORDS, dtype=np.int32),
            }
        )


def main(directory: Path) -> None:
    path = directory / "images.store"
    write_images(path)
    store = pytreestore.open(path)
    source = store.grain_source()
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shuffle=True,
        seed=7,
        num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    loader = grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[Scale(), grain.transforms.Batch(batch_size=BATCH)],
        worker_count=2,
    )
    want = store.load(as_numpy=True)
    seen = []
    for batch in loader:
        ids = batch["id"]
        np.testing.assert_array_equal(batch["image"], want["image"][ids] / np.float32(255))
        np.testing.assert_array_equal(batch["label"], want["label"][ids])
        seen.extend(ids.tolist())
    assert sorted(seen) == list(range(RECORDS)), "a record was lost or repeated"
    print(f"{len(seen)} records in {len(seen) // BATCH} batches from 2 worker processes")
    print("every record once, equal to the store's")
    print("grain_workers example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
