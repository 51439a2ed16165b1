"""Train on a store without loading it: sharded batches, a resumable shuffle, an out-of-core map.

    python examples/train_batches.py [DIRECTORY]

Writes a store of 4,096 noisy samples of y = x . w_true, fits w with SGD on batches split over
8 simulated CPU devices (a data-parallel mesh), stops mid-epoch, resumes from the iterator's
state as a restarted job would, then writes the residual of every sample to a second store
with ``store.map``. DIRECTORY defaults to a temporary one.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before JAX starts: 8 devices on a CPU machine

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import pytreestore  # noqa: E402

FEATURES, RECORDS, BATCH = 16, 4096, 256


def write_samples(path: Path) -> np.ndarray:
    rng = np.random.default_rng(0)
    w_true = rng.standard_normal(FEATURES).astype(np.float32)
    like = {"x": np.zeros(FEATURES, np.float32), "y": np.float32(0)}
    with pytreestore.create(path, like, chunk_records=1024) as store:
        x = rng.standard_normal((RECORDS, FEATURES)).astype(np.float32)
        noise = 0.01 * rng.standard_normal(RECORDS).astype(np.float32)
        store.extend_batch({"x": x, "y": x @ w_true + noise})
    return w_true


@jax.jit
def sgd_step(w: jax.Array, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    def loss(w: jax.Array) -> jax.Array:
        return jnp.mean((batch["x"] @ w - batch["y"]) ** 2)

    value, grad = jax.value_and_grad(loss)(w)
    return w - 0.1 * grad, value


def train(store: pytreestore.TreeStore, sharding: NamedSharding, epochs: int) -> jax.Array:
    w = jnp.zeros(FEATURES)
    batches = store.batches(BATCH, shuffle=True, seed=42, epochs=epochs, sharding=sharding)
    for step, batch in enumerate(batches):
        w, _ = sgd_step(w, batch)
        if step == 20:  # the job is "killed" here; it saved the iterator's state
            saved = batches.state()
            batches.close()
            break
    print(f"stopped at epoch {saved['epoch']}, batch {saved['batch']} of {len(batches)}")
    resumed = store.batches(
        BATCH, shuffle=True, seed=42, epochs=epochs, sharding=sharding, state=saved
    )
    loss = jnp.nan
    for batch in resumed:
        w, loss = sgd_step(w, batch)
    print(f"resumed and finished {epochs} epochs, last batch loss {float(loss):.5f}")
    return w


def main(root: Path) -> None:
    w_true = write_samples(root / "samples")
    store = pytreestore.open(root / "samples")
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    data_parallel = NamedSharding(mesh, P("data"))
    print(f"{len(store):,} records over {jax.device_count()} devices")
    first = next(iter(store.batches(BATCH, sharding=data_parallel)))
    print(f"one batch: x {first['x'].shape}, {len(first['x'].addressable_shards)} shards")

    w = train(store, data_parallel, epochs=3)
    error = float(jnp.max(jnp.abs(w - w_true)))
    assert error < 0.05, error
    print(f"recovered w_true to within {error:.3f}")

    residuals = store.map(
        lambda r: {"residual": r["x"] @ w - r["y"]}, batch_size=1024, out=root / "residuals"
    )
    worst = float(np.abs(residuals[:]["residual"]).max())
    print(f"wrote {len(residuals):,} residuals with store.map, largest {worst:.3f}")
    residuals.close()
    print("train_batches example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
