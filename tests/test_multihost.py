"""Multi-host loads: two processes under ``jax.distributed`` on 127.0.0.1, 4 CPU devices each.

Each process loads the same store with one global sharding; a jitted reduction over the global
arrays must equal the single-process result, and every process must have read exactly the rows
of its own devices: half of the records each, no row read by both.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from tests import launch

N = 64

CHILD = textwrap.dedent(
    """
    import json
    from tests import launch
    process_id, (path,) = launch.join()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import pytreestore
    from pytreestore.backends import TensorStoreBackend

    rows = {}
    original = TensorStoreBackend.read_many

    def counting(self, requests, records):
        for key, index in requests:
            picked = np.arange(records)[index] if isinstance(index, slice) else index
            rows.setdefault(key, []).extend(int(i) for i in picked)
        return original(self, requests, records)

    TensorStoreBackend.read_many = counting
    store = pytreestore.open(path)
    mesh = jax.make_mesh((8,), ("data",))
    tree = store.load(sharding=NamedSharding(mesh, P("data")))
    total = jax.jit(lambda t: jnp.sum(t["x"]) + jnp.sum(t["y"].astype(jnp.float32)))(tree)
    strided = store.load(slice(1, None, 2), sharding=NamedSharding(mesh, P("data")))
    odd = jax.jit(lambda t: jnp.sum(t["y"]))(strided)
    loads = {key: list(picked) for key, picked in rows.items()}  # the batches' reads apart
    shuffled = {}
    blocks = pytreestore.open(path + "-blocks")
    for mode, window in (("block", 16), ("uniform", None)):
        it = blocks.batches(8, shuffle=mode, seed=5, shuffle_window=window, epochs=2,
                            sharding=NamedSharding(mesh, P("data")))
        shuffled[mode] = [
            sorted(int(v) for s in b["y"].addressable_shards for v in np.asarray(s.data))
            for b in it
        ]
    print(json.dumps({
        "shuffled": shuffled,
        "process": jax.process_index(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "total": float(total.addressable_data(0)),
        "odd": int(odd.addressable_data(0)),
        "rows": loads,
        "shape": list(tree["x"].shape),
    }))
    jax.distributed.shutdown()
    """
)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory) -> Path:
    tmp_path = tmp_path_factory.mktemp("multihost")
    path = tmp_path / "global"
    with pytreestore.create(path, {"x": np.zeros(3, np.float32), "y": np.int32(0)}) as store:
        store.extend_batch(
            {
                "x": np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 4,
                "y": np.arange(N, dtype=np.int32),
            }
        )
    blocks = tmp_path / "global-blocks"  # the child opens it by this name
    with pytreestore.create(blocks, {"y": np.int32(0)}, chunk_records=4) as store:
        store.extend_batch({"y": np.arange(N, dtype=np.int32)})
    return path


@pytest.fixture(scope="module")
def multihost_results(store_path) -> list[dict]:
    """What each of the two processes reported (run once for the module's tests)."""
    script = store_path.parent / "child.py"
    script.write_text(CHILD)
    return launch.run_two(script, store_path, timeout=180)


def test_each_process_reads_only_its_rows(multihost_results, store_path):
    results = multihost_results
    plain = pytreestore.open(store_path).load(as_numpy=True)
    expected = float(plain["x"].sum() + plain["y"].sum())
    for r in results:
        assert (r["devices"], r["local_devices"], r["shape"]) == (8, 4, [N, 3])
        assert r["total"] == pytest.approx(expected, rel=1e-6)
        assert r["odd"] == int(plain["y"][1::2].sum())
    for key in ("x", "y"):
        first, second = (set(r["rows"][key]) for r in results)
        # the full load gives each process 32 rows, the strided one 16 more of its own half
        assert len(results[0]["rows"][key]) == len(results[1]["rows"][key]) == 48
        assert not first & second
        assert first | second == set(range(N))


def test_shuffled_batches_split_over_processes(multihost_results, store_path):
    """Both shuffles over two processes: each process holds half of each batch, and the two
    halves are the batch one process would read (the order depends on the seed alone)."""
    blocks = pytreestore.open(store_path.parent / "global-blocks")
    for mode, window in (("block", 16), ("uniform", None)):
        plain = blocks.batches(8, shuffle=mode, seed=5, shuffle_window=window, epochs=2)
        expected = [np.asarray(b["y"]).tolist() for b in plain]
        first, second = (r["shuffled"][mode] for r in multihost_results)
        assert len(first) == len(second) == len(expected) == 16
        for a, b, whole in zip(first, second, expected):
            assert len(a) == len(b) == 4 and sorted(a + b) == sorted(whole)
