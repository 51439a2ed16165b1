"""What the multi-host route costs a batch (issue #17): ``extend_batch`` with ``multihost=True``.

* **multi-host extend_batch, one process**: ``store.extend_batch(batch)`` on a store created
  with ``multihost=True`` (the row plan, the batch written as a fragment, the two exchanges,
  ``commit_fragments``) against ``extend_batch`` of the same batch on a plain store, each on
  a store of its own, side by side. The batch is a ``jax.Array`` tree sharded over this
  process's devices and holds a multiple of ``chunk_records`` records, so the fragment's
  chunks are placed without copying. With one process the exchanges are local: the figure
  is the cost of the fragment route itself, what each process pays in a real multi-host
  job besides the collectives. Ratio: slowdown, ours over the plain write. Goal: at most
  2x, since the route writes the same chunks and then places them (a hard link per chunk
  and the folders synced, on local disk): the commit's placing, not the row plan or the
  exchange, is the difference (profiled: about 60 ms of placing per 8,192-record batch).

Both backends, local stores, 20 leaves of float32[64] per record.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
from _common import Case, Result, Timed, at_most, measure_side_by_side
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import pytreestore

TITLE = "Multi-host: the fragment route of extend_batch"
LEAVES = 20
CHUNK = 1024


def _batch(count: int) -> Any:
    host = {f"f{k:02d}": np.full((count, 64), k, np.float32) for k in range(LEAVES)}
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    return jax.device_put(host, NamedSharding(mesh, P("data")))


def _rows(backend: str, count: int, repeats: int) -> list[Result]:
    tmp = Path(tempfile.mkdtemp(prefix="pytreestore-bench-multihost-"))
    like = {f"f{k:02d}": np.zeros(64, np.float32) for k in range(LEAVES)}
    batch = _batch(count)
    stores = {
        name: pytreestore.create(
            tmp / name, like, backend=backend, chunk_records=CHUNK, multihost=name == "ours"
        )
        for name in ("ours", "plain")
    }
    try:
        ours, base = measure_side_by_side(
            Timed(lambda _: stores["ours"].extend_batch(batch), repeats, warmup=2),
            Timed(lambda _: stores["plain"].extend_batch(batch), repeats, warmup=2),
        )
        lengths = {name: len(s) for name, s in stores.items()}
        assert lengths["ours"] == lengths["plain"] == count * (repeats + 2)
        got = stores["ours"].load(slice(0, count), as_numpy=True)
        np.testing.assert_array_equal(got["f03"], np.asarray(batch["f03"]))
    finally:
        for store in stores.values():
            store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    mib = count * LEAVES * 64 * 4 / 2**20
    return [
        Result(
            f"extend_batch of {count} records, {mib:.0f} MiB ({backend})",
            count,
            ours,
            base,
            at_most(2.0),
            False,
            "multihost=True: fragment + commit_fragments",
            "extend_batch on a plain store",
            notes=(f"chunk_records={CHUNK}; {jax.device_count()} device(s), one process",),
        )
    ]


def cases(quick: bool) -> list[Case]:
    count, repeats = (CHUNK, 5) if quick else (8 * CHUNK, 15)
    return [
        Case(f"extend_batch-{backend}", lambda b=backend: _rows(b, count, repeats))
        for backend in ("tensorstore", "zarr")
    ]
