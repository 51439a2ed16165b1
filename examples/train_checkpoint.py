"""Checkpoints of a training run in one store: killed with SIGKILL, resumed, bit for bit.

    python examples/train_checkpoint.py [DIRECTORY]
    python examples/train_checkpoint.py DIRECTORY --train RUN [--backend B] [--jax-cache DIR]

A small MLP (plain JAX and optax, with dropout) learns to classify samples streamed from a
data store with ``batches(shuffle=True)``. Every ``EVERY`` steps, and at the last one, the
training loop appends one record to a checkpoint store: the parameters, the optimizer state,
the data iterator's ``state()`` and the RNG key, and commits it (``flush``). A run started
with ``--train RUN`` resumes from the latest record of the checkpoint store ``RUN`` if it
has one, so killing it at any moment and starting it again loses at most ``EVERY`` steps.

With only a directory (a temporary one by default), the script writes the data store, starts
a training run in another process and SIGKILLs it at a random step after its first
checkpoint, resumes that run here, trains the same run without interruption into a second
checkpoint store, and checks that the two runs end with the same bytes in every leaf.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pytreestore
from pytreestore.errors import StoreNotFoundError

FEATURES, HIDDEN, CLASSES = 8, 32, 4
RECORDS, BATCH, EPOCHS = 1024, 32, 8  # 32 batches an epoch, 256 steps
STEPS = EPOCHS * RECORDS // BATCH
EVERY = 40  # steps between checkpoints
KEEP = 3  # checkpoints kept (see the retention below)
DROPOUT = 0.1
OPTIMIZER = optax.adam(1e-2)


def write_data(path: Path, backend: str) -> None:
    """A data store of noisy samples of 4 classes (fixed by a seed)."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((CLASSES, FEATURES)).astype(np.float32)
    y = rng.integers(0, CLASSES, RECORDS).astype(np.int32)
    x = centers[y] + 0.8 * rng.standard_normal((RECORDS, FEATURES)).astype(np.float32)
    like = {"x": np.zeros(FEATURES, np.float32), "y": np.int32(0)}
    with pytreestore.create(path, like, chunk_records=512, backend=backend) as store:
        store.extend_batch({"x": x, "y": y})


def initial_state(data: pytreestore.TreeStore) -> dict[str, Any]:
    """Step 0 of a run: fresh parameters and optimizer state, the data iterator at its start,
    the RNG key that drives dropout."""
    rng = np.random.default_rng(42)
    params = {
        "w1": (rng.standard_normal((FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.standard_normal((HIDDEN, CLASSES)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros(CLASSES, np.float32),
    }
    with batches(data) as it:
        position = it.state()
    return {
        "step": np.int32(0),
        "params": params,
        "opt_state": OPTIMIZER.init(params),
        "data": position,
        "rng": jax.random.key(42),
    }


def batches(data: pytreestore.TreeStore, state: Any = None) -> pytreestore.BatchIterator:
    """The run's data iterator: the same arguments every time, resumed from ``state``."""
    return data.batches(BATCH, shuffle=True, seed=7, epochs=EPOCHS, drop_last=True, state=state)


def loss_fn(params: Any, batch: Any, key: jax.Array) -> jax.Array:
    hidden = jax.nn.relu(batch["x"] @ params["w1"] + params["b1"])
    keep = jax.random.bernoulli(key, 1 - DROPOUT, hidden.shape)
    hidden = jnp.where(keep, hidden / (1 - DROPOUT), 0)
    logits = hidden @ params["w2"] + params["b2"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


@jax.jit
def train_step(params: Any, opt_state: Any, key: jax.Array, batch: Any) -> tuple[Any, ...]:
    key, dropout = jax.random.split(key)
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, dropout)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, key, loss


def open_checkpoints(path: Path, like: Any, backend: str) -> pytreestore.TreeStore:
    """The run's checkpoint store, open for appending; created on the first start."""
    try:
        return pytreestore.open(path, "a", backend=backend)
    except StoreNotFoundError:
        return pytreestore.create(path, like, backend=backend, keep_versions=2 * KEEP)


def train(data_path: Path, run: Path, backend: str, report: bool = False) -> int:
    """Trains run ``run`` to the end, from its latest checkpoint if it has one; returns the
    step it started from. ``report``: print ``step N`` after each step (for the demo)."""
    data = pytreestore.open(data_path, backend=backend)
    fresh = initial_state(data)
    with open_checkpoints(run, fresh, backend) as checkpoints:
        state = checkpoints[-1] if len(checkpoints) else fresh  # the latest checkpoint
        start = step = int(state["step"])
        params, opt_state, key = state["params"], state["opt_state"], state["rng"]
        with batches(data, state["data"]) as it:
            for batch in it:
                params, opt_state, key, _ = train_step(params, opt_state, key, batch)
                step += 1
                if step % EVERY == 0 or step == STEPS:
                    record = {"step": np.int32(step), "params": params, "opt_state": opt_state}
                    checkpoints.append({**record, "data": it.state(), "rng": key})
                    checkpoints.flush()  # committed: a kill from here on resumes here
                    checkpoints.keep_last(KEEP)  # the last KEEP checkpoints stay readable
                    checkpoints.vacuum()  # the chunks only older checkpoints held are freed
                if report:
                    print(f"step {step}", flush=True)
    return start


def leaf_bytes(run: Path, backend: str) -> tuple[Any, list[bytes]]:
    """The structure and the bytes of every leaf of run ``run``'s latest checkpoint."""
    latest = pytreestore.open(run, backend=backend).load(-1, as_numpy=True)
    leaves, treedef = jax.tree.flatten(latest)
    return treedef, [np.asarray(leaf).tobytes() for leaf in leaves]


def use_compilation_cache(directory: Path) -> None:
    """Keeps JAX's compiled programs in ``directory``, so that a restarted run skips compiling
    its step (and runs the very program the run before it ran)."""
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def command(root: Path, backend: str, cache: Path | None = None) -> list[str]:
    """The command line of this script on ``root``; ``--train RUN`` follows."""
    cached = ["--jax-cache", str(cache)] if cache else []
    return [sys.executable, __file__, str(root), "--backend", backend, *cached]


def kill_at_random_step(
    root: Path,
    backend: str,
    *,
    seed: int | None = None,
    cache: Path | None = None,
    popen: Callable[..., Any] = subprocess.Popen,
) -> int:
    """Starts ``--train killed`` in another process (made by ``popen``) and SIGKILLs it once
    it has reported a random step after its first checkpoint; returns that step."""
    at = random.Random(seed).randrange(EVERY + 1, STEPS // 2)
    argv = [*command(root, backend, cache), "--train", "killed"]
    with popen(argv, stdout=subprocess.PIPE) as child:
        for line in child.stdout:
            if line == f"step {at}\n".encode():
                child.send_signal(signal.SIGKILL)
                break
        code = child.wait()
    assert code == -signal.SIGKILL, f"the run ended with status {code} before step {at}"
    return at


def main(root: Path, backend: str = "tensorstore") -> None:
    use_compilation_cache(root / "jax-cache")
    write_data(root / "data", backend)
    at = kill_at_random_step(root, backend, cache=root / "jax-cache")
    print(f"killed the run with SIGKILL after step {at}")
    resumed_from = train(root / "data", root / "killed", backend)
    # the checkpoint before the kill (the run may have gone on a few steps after step `at`)
    assert resumed_from % EVERY == 0 and EVERY <= resumed_from < STEPS, (resumed_from, at)
    print(f"resumed it from the checkpoint of step {resumed_from} and trained to the end")
    train(root / "data", root / "uninterrupted", backend)
    assert leaf_bytes(root / "killed", backend) == leaf_bytes(root / "uninterrupted", backend)
    print("the resumed run ends with the same bytes in every leaf as an uninterrupted one")
    print("train checkpoint: all checks passed")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Checkpoints of a training run in one store.")
    parser.add_argument("directory", nargs="?", type=Path)
    parser.add_argument("--train", metavar="RUN", help="train run RUN of DIRECTORY")
    parser.add_argument("--backend", default="tensorstore")
    parser.add_argument("--jax-cache", type=Path, help="JAX's compilation cache directory")
    args = parser.parse_args()
    if args.train:
        use_compilation_cache(args.jax_cache or args.directory / "jax-cache")
        train(args.directory / "data", args.directory / args.train, args.backend, report=True)
    elif args.directory:
        main(args.directory, args.backend)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp), args.backend)
