"""The worker side of ``bench_device.py``: each function runs in a process of its own.

``bench_device.py`` starts ``python benchmarks/bench_device.py NAME ARGS...``, which calls
``WORKERS[NAME](*ARGS)`` and prints its JSON result on the last line of stdout. Only these
processes import JAX's backends: on an accelerator one process at a time may hold the chip,
so the parent never does, and the workers run one after another. Each worker builds what it
reads, checks what it loaded against the arrays it wrote (outside the timed regions), then
times ours and the baseline side by side (:func:`_common.measure_side_by_side`).
"""

from __future__ import annotations

import functools
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
from _common import Timed, measure_side_by_side
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore


def device_info() -> dict[str, Any]:
    """The platform and kind of the default devices, for every row's notes."""
    first = jax.devices()[0]
    return {
        "platform": first.platform,
        "device_kind": first.device_kind,
        "devices": len(jax.devices()),
    }


def _columns(n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` records of a 2,312-byte, 4-leaf record (an observation, an action, a reward, a step)."""
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, 512), np.float32),
        "act": rng.standard_normal((n, 64), np.float32),
        "rew": rng.standard_normal(n, np.float32),
        "step": np.arange(n, dtype=np.int32),
    }


def _write(path: Path, columns: dict[str, np.ndarray], **create: Any) -> None:
    like = {k: np.zeros(v.shape[1:], v.dtype) for k, v in columns.items()}
    n = len(next(iter(columns.values())))
    with pytreestore.create(path, like, **create) as store:
        for lo in range(0, n, 16_384):
            store.extend_batch({k: v[lo : lo + 16_384] for k, v in columns.items()})


def _raw_handles(path: Path, keys: Any) -> list[Any]:
    return [
        ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{path}/{k}/"}}).result()
        for k in keys
    ]


def _assert_tree_equal(got: Any, want: Any) -> None:
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves), (len(got_leaves), len(want_leaves))
    for g, w in zip(got_leaves, want_leaves, strict=True):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_array_equal(g, w)


# --- sharded load -------------------------------------------------------------------------------


def work_sharded(root: str, records: str, repeats: str) -> dict[str, Any]:
    """A 4-column store as global arrays split over every device of the default platform."""
    n, path = int(records), Path(root) / "load"
    block = np.random.default_rng(0).random((n, 1024), np.float32)
    columns = {f"c{k}": block + k for k in range(4)}
    _write(path, columns, codec=None)
    store = pytreestore.open(path)
    sharding = NamedSharding(jax.make_mesh((len(jax.devices()),), ("data",)), P("data"))
    handles = _raw_handles(path, columns)

    def ours(_: Any) -> Any:
        return jax.block_until_ready(store.load(sharding=sharding))

    def baseline(_: Any) -> Any:
        futures = [h[0:n].read() for h in handles]
        return jax.block_until_ready(jax.device_put([f.result() for f in futures], sharding))

    _assert_tree_equal(ours(None), columns)
    t_ours, t_base = measure_side_by_side(
        Timed(ours, int(repeats), warmup=1), Timed(baseline, int(repeats), warmup=1)
    )
    nbytes = 4 * n * 1024 * 4
    return {**device_info(), "ours": t_ours.times, "baseline": t_base.times, "nbytes": nbytes}


# --- bulk load and cold records -----------------------------------------------------------------


def work_bulk(root: str, records: str, repeats: str) -> dict[str, Any]:
    """``store.load()`` of a zstd store against raw reads + ``device_put``, and ``device_put``."""
    n, path = int(records), Path(root) / "bulk"
    columns = _columns(n, seed=2)
    _write(path, columns)
    store = pytreestore.open(path)
    handles = _raw_handles(path, columns)
    host = dict(zip(columns, [h[0:n].read().result() for h in handles], strict=True))
    _assert_tree_equal(host, columns)

    def ours(_: Any) -> Any:
        return jax.block_until_ready(store.load())

    def read_then_put(_: Any) -> Any:
        futures = [h[0:n].read() for h in handles]
        return jax.block_until_ready(jax.device_put([f.result() for f in futures]))

    def put_only(_: Any) -> Any:
        return jax.block_until_ready(jax.device_put(host))

    _assert_tree_equal(ours(None), columns)
    _assert_tree_equal(put_only(None), columns)
    timings = measure_side_by_side(
        *(Timed(fn, int(repeats), warmup=1) for fn in (ours, read_then_put, put_only))
    )
    nbytes = sum(v.nbytes for v in columns.values())
    t_ours, t_base, t_put = (t.times for t in timings)
    return {**device_info(), "ours": t_ours, "baseline": t_base, "put": t_put, "nbytes": nbytes}


def work_record(root: str, records: str, repeats: str) -> dict[str, Any]:
    """Cold ``store[i]`` (``cache_bytes=0``) of random ``i`` against ``device_put`` of it."""
    n, path = int(records), Path(root) / "record"
    columns = _columns(n, seed=3)
    _write(path, columns)
    cold = pytreestore.open(path, cache_bytes=0)
    picks = np.random.default_rng(4).integers(0, n, size=int(repeats) + 2)
    ours_at, base_at = iter(picks.tolist()), iter(picks.tolist())

    def want(i: int) -> dict[str, np.ndarray]:
        return {k: v[i] for k, v in columns.items()}

    def ours(i: int) -> Any:
        return jax.block_until_ready(cold[i])

    def baseline(record: dict[str, np.ndarray]) -> Any:
        return jax.block_until_ready(jax.device_put(record))

    checked: list[int] = []

    def check(i: Any, out: Any) -> None:
        _assert_tree_equal(out, want(i if isinstance(i, int) else int(i["step"])))
        checked.append(1)

    t_ours, t_base = measure_side_by_side(
        Timed(ours, int(repeats), warmup=2, setup=lambda: next(ours_at), teardown=check),
        Timed(baseline, int(repeats), warmup=2, setup=lambda: want(next(base_at)), teardown=check),
    )
    assert len(checked) == 2 * len(picks)
    nbytes = sum(v[0].nbytes for v in columns.values())
    return {**device_info(), "ours": t_ours.times, "baseline": t_base.times, "nbytes": nbytes}


# --- shuffled batches feeding a jitted step -----------------------------------------------------


def _mlp_step() -> Any:
    def loss(params: Any, x: Any, y: Any) -> Any:
        hidden = jnp.tanh(x @ params["w1"])
        return jnp.mean((hidden @ params["w2"] - y) ** 2)

    @jax.jit
    def step(params: Any, batch: Any) -> tuple[Any, Any]:
        value, grads = jax.value_and_grad(loss)(params, batch["x"], batch["y"])
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value

    return step


def _params() -> dict[str, Any]:
    w1 = jax.random.normal(jax.random.key(0), (512, 256), jnp.float32) * 0.05
    return {"w1": w1, "w2": jnp.full((256,), 0.01, jnp.float32)}


def _run_epoch(step: Any, batches: Iterator[Any]) -> int:
    params, steps = _params(), 0
    for batch in batches:
        params, loss = step(params, batch)
        loss.block_until_ready()  # as a loop that logs its loss does
        steps += 1
    return steps


def work_shuffled(root: str, records: str, batch_size: str, repeats: str) -> dict[str, Any]:
    """An epoch of ``batches(size, shuffle=True)`` into a jitted MLP step, against the same
    step over batches already in host memory, each ``device_put`` first."""
    n, size, path = int(records), int(batch_size), Path(root) / "shuffled"
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, 512), np.float32)
    columns = {"x": x, "y": x[:, :8].sum(axis=1), "id": np.arange(n, dtype=np.int32)}
    _write(path, columns)
    store = pytreestore.open(path)
    order = rng.permutation(n)[: n // size * size].reshape(-1, size)
    host = [{"x": x[idx], "y": columns["y"][idx]} for idx in order]
    step = _mlp_step()
    _check_shuffled_epoch(store, columns, size)

    def ours(_: Any) -> int:
        return _run_epoch(step, iter(store.batches(size, shuffle=True, drop_last=True)))

    def baseline(_: Any) -> int:
        return _run_epoch(step, (jax.device_put(b) for b in host))

    steps = [ours(None), baseline(None)]  # compiles the step for both
    assert steps == [len(order)] * 2, steps
    t_ours, t_base = measure_side_by_side(Timed(ours, int(repeats)), Timed(baseline, int(repeats)))
    nbytes = sum(v.nbytes for v in columns.values())
    return {
        **device_info(),
        "ours": t_ours.times,
        "baseline": t_base.times,
        "nbytes": nbytes,
        "steps": len(order),
    }


def _check_shuffled_epoch(store: Any, columns: dict[str, np.ndarray], size: int) -> None:
    """One epoch's batches hold the stored records, each once, not in stored order."""
    seen = []
    for batch in store.batches(size, shuffle=True, drop_last=True):
        ids = np.asarray(batch["id"])
        _assert_tree_equal(batch, {k: v[ids] for k, v in columns.items()})
        seen.append(ids)
    ids = np.concatenate(seen)
    assert len(np.unique(ids)) == len(ids) == len(columns["id"]) // size * size
    assert not np.array_equal(ids, np.sort(ids)), "batches(shuffle=True) came back in order"


# --- ragged load --------------------------------------------------------------------------------


def _ragged_columns(n: int, pad_to: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A padded batch and mask of ``n`` records ``{"id", "hits": [float32[16]] * L}``,
    ``L`` uniform in ``[0, pad_to]``."""
    rng = np.random.default_rng(6)
    lengths = rng.integers(0, pad_to + 1, size=n)
    mask = np.arange(pad_to)[None, :] < lengths[:, None]
    hits = rng.standard_normal((n, pad_to, 16), np.float32) * mask[:, :, None]
    batch = {"id": np.arange(n, dtype=np.int32), "hits": hits}
    return batch, {"id": np.ones(n, bool), "hits": mask}


def write_ragged(path: Path, batch: dict[str, np.ndarray], mask: dict[str, np.ndarray]) -> None:
    """A ragged store of the records of :func:`_ragged_columns`' padded ``batch`` and ``mask``
    at ``path``, appended 8,192 at a time."""
    like = {"id": np.int32(0), "hits": [np.zeros(16, np.float32)]}
    with pytreestore.create(path, like, ragged=["['hits']"]) as store:
        for lo in range(0, len(batch["id"]), 8_192):
            cut = slice(lo, lo + 8_192)
            store.extend_batch(
                {k: v[cut] for k, v in batch.items()}, {k: v[cut] for k, v in mask.items()}
            )


def work_ragged(root: str, records: str, pad_to: str, repeats: str) -> dict[str, Any]:
    """``store.load(pad_to=...)`` of a ragged store against ``device_put`` of the pair."""
    n, pad, path = int(records), int(pad_to), Path(root) / "ragged"
    batch, mask = _ragged_columns(n, pad)
    write_ragged(path, batch, mask)
    store = pytreestore.open(path)

    def ours(_: Any) -> Any:
        return jax.block_until_ready(store.load(pad_to=pad))

    def baseline(_: Any) -> Any:
        return jax.block_until_ready(jax.device_put((batch, mask)))

    _assert_tree_equal(ours(None), (batch, mask))
    _assert_tree_equal(baseline(None), (batch, mask))
    t_ours, t_base = measure_side_by_side(
        Timed(ours, int(repeats), warmup=1), Timed(baseline, int(repeats), warmup=1)
    )
    stored = int(mask["hits"].sum()) * 16 * 4 + n * 4
    padded = batch["hits"].nbytes + mask["hits"].nbytes + n * 5
    return {
        **device_info(),
        "ours": t_ours.times,
        "baseline": t_base.times,
        "stored_bytes": stored,
        "padded_bytes": padded,
    }


# --- streaming batches against load-all (the resident-memory case) ------------------------------


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def work_make_batches_store(root: str, records: str) -> dict[str, Any]:
    n, rng = int(records), np.random.default_rng(1)
    like = {"x": np.zeros(512, np.float32), "y": np.float32(0)}
    with pytreestore.create(Path(root) / "batches", like, codec=None) as store:
        for lo in range(0, n, 16_384):
            k = min(16_384, n - lo)
            x = rng.standard_normal((k, 512), np.float32)
            store.extend_batch({"x": x, "y": x[:, :8].sum(axis=1)})
    return {}


def _step_fns() -> tuple[Any, Any]:
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
    return {
        **device_info(),
        "times": times[1:],
        "rss_mib": _rss_mib(),
        "rss_start_mib": rss_start,
        "nbytes": nbytes,
    }


WORKERS = {
    "sharded": work_sharded,
    "bulk": work_bulk,
    "record": work_record,
    "shuffled": work_shuffled,
    "ragged": work_ragged,
    "make-batches-store": work_make_batches_store,
    "stream": work_stream,
    "preload": work_preload,
}
