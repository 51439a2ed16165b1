"""Feeding an accelerator: every row of issue 34 side by side in one process on the chip.

Run it on the accelerator's host, alone (one process at a time may hold the chip)::

    python benchmarks/tpu_feed.py [--quick] [--json OUT.json] [--only CASE ...]

It is not a ``bench_*`` module: ``benchmarks/run.py`` imports those into its own process,
and this one must hold the chip itself.

It runs on any JAX platform (CI runs ``--quick`` on the CPU to keep it working); the figures
that matter are the TPU's, recorded in docs/benchmarks.md. Each case builds its store in a
temporary folder, checks what it loaded against what it wrote (outside the timed regions),
then times ours and its floor alternately, several runs each, and reports medians and the
ratio ``ours / floor`` (lower is better; a goal ``<= 2`` means at most twice the floor's
time) or, for throughput rows, ``ours / floor`` in steps per second (higher is better).

Cases (the floors are what a user would write by hand with the data already in memory):

* ``bulk``: ``store.load()`` of a ~1 GB store of 20-leaf records, zstd and ``codec=None``,
  against ``jax.device_put`` of the same numpy tree from host memory.
* ``wide``: the same for ~200 MB of 151-leaf records (many small leaves).
* ``batches``: ``store.batches(B, prefetch=2)`` feeding a jitted MLP step, against numpy
  batch slices ``device_put`` each step; and, with a step made as long as a batch's load,
  ``prefetch=2`` against ``prefetch=0`` (the overlap).
* ``record``: ``store[i]`` with its chunk cached, and cold (``cache_bytes=0``), against
  ``jax.device_put`` of the record's numpy leaves.
* ``sharded``: ``load(sharding=NamedSharding(mesh, P("data")))`` of ~200 MB against
  ``jax.device_put(tree, sharding)``.
* ``map``: ``store.map(f)`` over the 1 GB store against the loop numpy batch ->
  ``device_put`` -> ``jit(vmap(f))``, results gathered the same way.
* ``ragged``: ``load(ragged="pad", pad_to=64)`` against columnar numpy padding of the same
  lists + ``device_put``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _device_workers import _assert_tree_equal as _check  # the same check as bench_device
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore
from pytreestore._runtime import RUNTIME

GIB = 2**30


def _ready(tree: Any) -> Any:
    return jax.block_until_ready(tree)


def _side_by_side(
    ours: Callable[[], Any], floor: Callable[[], Any], repeats: int
) -> tuple[list[float], list[float]]:
    """Times ``ours`` and ``floor`` alternately after one warm-up call of each."""
    _ready(ours())
    _ready(floor())
    a, b = [], []
    for _ in range(repeats):
        for fn, times in ((ours, a), (floor, b)):
            t = time.perf_counter()
            out = fn()
            _ready(out)
            times.append(time.perf_counter() - t)
            del out
    return a, b


def _row(case: str, ours: list[float], floor: list[float], goal: str, **notes: Any) -> dict:
    mo, mf = statistics.median(ours), statistics.median(floor)
    return {
        "case": case,
        "ours_s": mo,
        "floor_s": mf,
        "ratio": mo / mf,
        "goal": goal,
        "ours_runs": ours,
        "floor_runs": floor,
        **notes,
    }


# ---- data ----------------------------------------------------------------------------------------


def _leaves(n: int, count: int, width: int, seed: int) -> dict[str, Any]:
    """``count`` leaves in a nested tree, mostly float32[width], some int32 and scalars;
    values rounded so zstd has something to compress, as simulation states do."""
    rng = np.random.default_rng(seed)
    tree: dict[str, Any] = {}
    for k in range(count):
        group = tree.setdefault(f"g{k % 5}", {})
        if k % 7 == 3:
            leaf = rng.integers(0, 1000, (n,), dtype=np.int32)
        elif k % 7 == 5:
            leaf = np.round(rng.standard_normal((n, 3)), 3).astype(np.float32)
        else:
            leaf = np.round(rng.standard_normal((n, width)), 2).astype(np.float32)
        group[f"x{k}"] = leaf
    return tree


def _nbytes(tree: Any) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def _write(path: Path, tree: Any, **create: Any) -> Any:
    like = jax.tree.map(lambda v: np.zeros(v.shape[1:], v.dtype), tree)
    n = len(jax.tree.leaves(tree)[0])
    step = 32_768
    with pytreestore.create(path, like, **create) as store:
        for lo in range(0, n, step):
            store.extend_batch(jax.tree.map(lambda v, lo=lo: v[lo : lo + step], tree))
    return pytreestore.open(path)


# ---- cases ---------------------------------------------------------------------------------------


def case_bulk(tmp: Path, q: bool, repeats: int) -> list[dict]:
    rows = []
    n = 4_096 if q else 200_000  # 20 leaves, 5,120 bytes a record: 1.02 GB
    data = _leaves(n, 20, 64, 0)
    for codec in ("zstd", None):
        store = _write(tmp / f"bulk-{codec}", data, codec=codec)
        _check(store.load(), data)
        ours, floor = _side_by_side(store.load, lambda: jax.device_put(data), repeats)
        host, _ = _side_by_side(lambda s=store: s.load(as_numpy=True), lambda: 0, repeats)
        nb = _nbytes(data)
        rows.append(
            _row(
                f"bulk load, {nb / 1e9:.2f} GB, codec={codec}",
                ours,
                floor,
                "<= 2",
                gb_s=nb / 1e9 / statistics.median(ours),
                host_load_s=statistics.median(host),
            )
        )
        store.close()
    n = 1_024 if q else 40_000  # 151 leaves, about 5 kB a record: 200 MB
    data = _leaves(n, 151, 8, 1)
    store = _write(tmp / "wide", data)
    _check(store.load(), data)
    ours, floor = _side_by_side(store.load, lambda: jax.device_put(data), repeats)
    rows.append(_row(f"bulk load, 151 leaves, {_nbytes(data) / 1e6:.0f} MB", ours, floor, "<= 2"))
    return rows


def _mlp(width: int, depth: int) -> Callable:
    """A jitted MLP training step whose hidden layer is applied ``depth`` times; ``depth``
    0 gives one layer and grads, any other a forward pass looping ``depth`` times (one
    compile serves every depth: it is an argument, not a constant)."""

    def loss(params, x, y):
        h = jnp.tanh(x @ params["w1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    @jax.jit
    def train(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value

    @jax.jit
    def busy(params, x, y, k):
        h = jax.lax.fori_loop(0, k, lambda _, h: jnp.tanh(h @ params["w1"]), x)
        return params, jnp.mean((h @ params["w2"] - y) ** 2)

    if depth == 0:
        return train
    return lambda params, x, y: busy(params, x, y, jnp.int32(depth))


def case_batches(tmp: Path, q: bool, repeats: int) -> list[dict]:
    n, b = (16_384, 1_024) if q else (262_144, 4_096)
    rng = np.random.default_rng(2)
    data = {
        "x": np.round(rng.standard_normal((n, 256)), 2).astype(np.float32),
        "y": rng.standard_normal((n, 1)).astype(np.float32),
        "meta": {"id": np.arange(n, dtype=np.int32), "w": rng.random(n).astype(np.float32)},
    }
    store = plain = _write(tmp / "batches", data)
    params = {"w1": jnp.eye(256) * 0.5, "w2": jnp.ones((256, 1)) * 0.01}

    def epoch_ours(step, prefetch):
        p = params
        for batch in store.batches(b, prefetch=prefetch, drop_last=True):
            p, value = step(p, batch["x"], batch["y"])
            value.block_until_ready()
        return p

    def epoch_naive(step):
        p = params
        for lo in range(0, n - b + 1, b):
            x, y = jax.device_put((data["x"][lo : lo + b], data["y"][lo : lo + b]))
            p, value = step(p, x, y)
            value.block_until_ready()
        return p

    steps = n // b
    rows = []
    light = _mlp(256, 0)
    inner = _write(tmp / "batches-inner", data, inner_chunk_bytes="auto")
    for prefetch, layout in ((None, ""), (2, ""), (None, ", inner chunks")):
        store = inner if layout else plain
        ours, floor = _side_by_side(
            lambda p=prefetch: epoch_ours(light, p), lambda: epoch_naive(light), repeats
        )
        rows.append(
            _row(
                f"batches({b}, prefetch={prefetch}){layout} feeding a jitted step, {steps} steps",
                ours,
                floor,
                "steps/s >= 1.0x the naive feed (ratio <= 1)",
                ours_steps_s=steps / statistics.median(ours),
                floor_steps_s=steps / statistics.median(floor),
            )
        )
    store = plain
    # a step as long as one batch's load: find the depth, then prefetch 2 against 0
    load_one = statistics.median(_timed(lambda: store.load(slice(0, b)), 5 if q else 9))
    depth = 1
    while depth < 4096:
        heavy = _mlp(256, depth)
        x, y = jax.device_put((data["x"][:b], data["y"][:b]))
        _ready(heavy(params, x, y))
        if (
            statistics.median(_timed(lambda heavy=heavy, x=x, y=y: heavy(params, x, y), 5))
            >= load_one
        ):
            break
        depth *= 2
    two, zero = _side_by_side(lambda: epoch_ours(heavy, 2), lambda: epoch_ours(heavy, 0), repeats)
    rows.append(
        _row(
            f"batches, step ~ one load ({load_one * 1e3:.1f} ms, depth {depth}): "
            "prefetch=2 against prefetch=0",
            two,
            zero,
            "prefetch=0 time / prefetch=2 time >= 1.5 (ratio <= 0.67)",
            gain=statistics.median(zero) / statistics.median(two),
        )
    )
    return rows


def _timed(fn: Callable[[], Any], k: int) -> list[float]:
    out = []
    for _ in range(k):
        t = time.perf_counter()
        _ready(fn())
        out.append(time.perf_counter() - t)
    return out


def case_record(tmp: Path, q: bool, repeats: int) -> list[dict]:
    n = 4_096 if q else 200_000
    data = _leaves(n, 20, 64, 0)
    _write(tmp / "record", data)
    _write(tmp / "record-inner", data, inner_chunk_bytes="auto")
    rng = np.random.default_rng(3)
    picks = rng.integers(0, n, 20 if q else 60)
    rows = []
    for label, opts, goal in (
        ("cached chunk", {}, "<= 1.2"),
        ("cold", {"cache_bytes": 0}, "<= 3"),
        ("cold, inner chunks", {"cache_bytes": 0}, "<= 3"),
    ):
        path = tmp / ("record-inner" if "inner" in label else "record")
        store = pytreestore.open(path, **opts)
        ours, floor = [], []
        for i in picks:
            i = int(i)
            want = jax.tree.map(lambda v, i=i: v[i], data)
            if label == "cached chunk":
                _ready(store[i])  # the chunk is now cached
            _check(store[i], want)
            if label.startswith("cold"):
                store.close()
                store = pytreestore.open(path, **opts)
            t = time.perf_counter()
            _ready(store[i])
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            _ready(jax.device_put(want))
            floor.append(time.perf_counter() - t)
            if label.startswith("cold"):
                store.close()
                store = pytreestore.open(path, **opts)
        rows.append(_row(f"store[i], {label}", ours, floor, goal))
        store.close()
    return rows


def case_sharded(tmp: Path, q: bool, repeats: int) -> list[dict]:
    n = 2_048 if q else 40_000
    data = _leaves(n, 20, 64, 4)
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    rows = []
    for codec in ("zstd", None):
        store = _write(tmp / f"sharded-{codec}", data, codec=codec)
        _check(store.load(sharding=sharding), data)
        ours, floor = _side_by_side(
            lambda s=store: s.load(sharding=sharding),
            lambda: jax.device_put(data, sharding),
            repeats,
        )
        label = f"sharded load, {_nbytes(data) / 1e6:.0f} MB, codec={codec}"
        rows.append(_row(label, ours, floor, "<= 1.5"))
    return rows


def case_map(tmp: Path, q: bool, repeats: int) -> list[dict]:
    n = 4_096 if q else 200_000
    data = _leaves(n, 20, 64, 0)

    def f(r):
        return sum(jnp.sum(x) for x in jax.tree.leaves(r))

    rows = []
    for codec, fn, label in (
        ("zstd", f, "f"),
        ("zstd", jax.jit(f), "jax.jit(f)"),
        (None, jax.jit(f), "jax.jit(f)"),
    ):
        where = tmp / f"map-{codec}"
        store = pytreestore.open(where) if where.exists() else _write(where, data, codec=codec)
        b = store.schema.chunk_records if hasattr(store.schema, "chunk_records") else 4096
        fv = jax.jit(jax.vmap(f))

        def floor(b=b, fv=fv):
            outs = []
            for lo in range(0, n, b):
                batch = jax.device_put(jax.tree.map(lambda v, lo=lo: v[lo : lo + b], data))
                outs.append(fv(batch))
            return jnp.concatenate(outs)

        got = store.map(fn, batch_size=b)
        np.testing.assert_allclose(np.asarray(got), np.asarray(floor()), rtol=1e-5)
        ours, fl = _side_by_side(
            lambda s=store, fn=fn, b=b: s.map(fn, batch_size=b), floor, repeats
        )
        name = f"map({label}) over {_nbytes(data) / 1e9:.2f} GB, batch {b}, codec={codec}"
        rows.append(_row(name, ours, fl, "<= 1.5"))
    return rows


def case_ragged(tmp: Path, q: bool, repeats: int) -> list[dict]:
    n, pad_to = (2_048 if q else 65_536), 64
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, pad_to + 1, n)
    hits = [np.round(rng.standard_normal((k, 16)), 2).astype(np.float32) for k in lengths]
    path = tmp / "ragged"
    like = {"id": np.int32(0), "hits": [np.zeros(16, np.float32)]}
    with pytreestore.create(path, like, ragged=["['hits']"]) as store:
        store.extend({"id": np.int32(i), "hits": list(h)} for i, h in enumerate(hits))
    store = pytreestore.open(path)
    flat = np.concatenate(hits)
    ids = np.arange(n, dtype=np.int32)

    def floor():
        padded = np.zeros((n, pad_to, 16), np.float32)
        mask = np.arange(pad_to)[None, :] < lengths[:, None]
        padded[mask] = flat
        return jax.device_put(({"id": ids, "hits": padded}, mask))

    batch, mask = store.load(ragged="pad", pad_to=pad_to)
    want_batch, want_mask = floor()
    np.testing.assert_array_equal(np.asarray(jax.tree.leaves(mask["hits"])[0]), want_mask)
    np.testing.assert_array_equal(np.asarray(batch["id"]), ids)
    leaf = jax.tree.leaves(batch["hits"])[0]
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(want_batch["hits"]))
    ours, fl = _side_by_side(lambda: store.load(ragged="pad", pad_to=pad_to), floor, repeats)
    return [
        _row(
            f"ragged load(pad_to={pad_to}), {flat.nbytes / 1e6:.0f} MB of values",
            ours,
            fl,
            "<= 1.2",
        )
    ]


CASES = {
    "bulk": case_bulk,
    "batches": case_batches,
    "record": case_record,
    "sharded": case_sharded,
    "map": case_map,
    "ragged": case_ragged,
}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json")
    parser.add_argument("--only", nargs="*", default=list(CASES))
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--readers", type=int, help="slab readers side by side (a variant)")
    parser.add_argument("--slab-mib", type=int, help="bytes of one slab, in MiB (a variant)")
    parser.add_argument("--no-reuse", action="store_true", help="fresh host buffers (a variant)")
    parser.add_argument("--min-mib", type=int, help="the smallest load read in pieces, in MiB")
    parser.add_argument("--direct-workers", type=int, help="threads reading plain chunk files")
    args = parser.parse_args(argv)
    from pytreestore._read import slabs as hostpool

    if args.min_mib is not None:
        RUNTIME.reads.slab_min_bytes = args.min_mib << 20
    if args.direct_workers:
        RUNTIME.threads.direct = args.direct_workers

    if args.no_reuse:
        hostpool.ALIASING.add(jax.devices()[0].platform)

    if args.readers:
        RUNTIME.threads.slab_readers = args.readers
    if args.slab_mib:
        RUNTIME.reads.slab_bytes = args.slab_mib << 20
    repeats = args.repeats or (2 if args.quick else 5)
    device = jax.devices()[0]
    print(f"# on {device.platform} ({device.device_kind}), jax {jax.__version__}", flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-tpu-") as tmp:
        for name in args.only:
            t = time.perf_counter()
            got = CASES[name](Path(tmp), args.quick, repeats)
            for r in got:
                print(
                    f"{r['case']}: ours {r['ours_s'] * 1e3:.2f} ms, floor "
                    f"{r['floor_s'] * 1e3:.2f} ms, ratio {r['ratio']:.2f} (goal {r['goal']})"
                    + "".join(
                        f", {k} {v:.3g}"
                        for k, v in r.items()
                        if k.endswith(("gb_s", "steps_s", "gain", "host_load_s"))
                    ),
                    flush=True,
                )
            rows.extend(got)
            print(f"  ({name}: {time.perf_counter() - t:.1f} s)", flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"platform": device.platform, "kind": device.device_kind, "rows": rows}, indent=1
            )
        )
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
