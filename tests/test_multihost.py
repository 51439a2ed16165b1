"""Multi-host loads: two processes under ``jax.distributed`` on 127.0.0.1, 4 CPU devices each.

Each process loads the same store with one global sharding; a jitted reduction over the global
arrays must equal the single-process result, and every process must have read exactly the rows
of its own devices: half of the records each, no row read by both.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pytreestore

ROOT = Path(__file__).resolve().parent.parent
N = 64

CHILD = textwrap.dedent(
    """
    import json, os, sys
    process_id, port, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    import jax
    jax.config.update("jax_num_cpu_devices", 4)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
        initialization_timeout=60,
    )
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
    print(json.dumps({
        "process": jax.process_index(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "total": float(total.addressable_data(0)),
        "odd": int(odd.addressable_data(0)),
        "rows": rows,
        "shape": list(tree["x"].shape),
    }))
    jax.distributed.shutdown()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def store_path(tmp_path) -> Path:
    path = tmp_path / "global"
    with pytreestore.create(path, {"x": np.zeros(3, np.float32), "y": np.int32(0)}) as store:
        store.extend_batch(
            {
                "x": np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 4,
                "y": np.arange(N, dtype=np.int32),
            }
        )
    return path


def run_two_processes(script: Path, store_path: Path) -> list[dict]:
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), port, str(store_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{out}\n{err[-4000:]}"
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return sorted(outputs, key=lambda o: o["process"])


def test_each_process_reads_only_its_rows(tmp_path, store_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    results = run_two_processes(script, store_path)
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
