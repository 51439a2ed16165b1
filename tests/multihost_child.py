"""One process of tests/test_multihost_write.py: ``python -m tests.multihost_child ID PORT ROOT``.

Two of these run under ``jax.distributed`` (:mod:`tests.launch`), 4 CPU devices each. For each
backend they create a store with ``multihost=True`` and write the global batches of
:data:`BATCHES`, each with its own shardings over a mesh spanning both processes; then a
second store sees the failures. The last line printed is a JSON report.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import numpy as np

from tests import launch
from tests.trees import Params

LIKE = Params(x=np.zeros(4, np.float32), y=np.int32(0))

# (records, sharding of x, sharding of y): names of the shardings built in main()
BATCHES = [
    (16, "data", "data"),  # both leaves split over the 8 devices of both processes
    (12, "data_partial", "data_partial"),  # split over 4, replicated over the other axis
    (5, "replicated", "replicated"),  # every device holds everything
    (8, "data_model", "replicated"),  # x split on its leaf axis too; y replicated
    (8, "data", "data_partial"),  # the leaves split differently, rows still meet
]


def batch_values(first: int, count: int) -> Params:
    """Records ``first`` .. ``first + count - 1``, as host arrays."""
    index = np.arange(first, first + count)
    x = (index[:, None] * 10 + np.arange(4)).astype(np.float32) / 4
    return Params(x=x, y=(index * 3 - 7).astype(np.int32))


def _report(err: BaseException) -> dict[str, Any]:
    return {"type": type(err).__name__, "message": str(err), "notes": getattr(err, "__notes__", [])}


def main() -> None:
    process_id, (root,) = launch.join()
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import pytreestore
    from pytreestore.backends import TensorStoreBackend, ZarrBackend
    from pytreestore.errors import StorageError

    devices = np.array(jax.devices())
    line, grid = Mesh(devices, ("data",)), Mesh(devices.reshape(4, 2), ("data", "model"))
    across = Mesh(devices.reshape(2, 4).T, ("data", "model"))  # "model" spans the processes
    shardings = {
        "data": NamedSharding(line, P("data")),
        "data_partial": NamedSharding(grid, P("data")),
        "replicated": NamedSharding(line, P()),
        "data_model": NamedSharding(grid, P("data", "model")),
        "across": NamedSharding(across, P("data", "model")),
    }

    def global_batch(first: int, count: int, sx: str, sy: str) -> Params:
        host = batch_values(first, count)
        return Params(
            x=jax.make_array_from_callback(host.x.shape, shardings[sx], lambda i: host.x[i]),
            y=jax.make_array_from_callback(host.y.shape, shardings[sy], lambda i: host.y[i]),
        )

    out: dict[str, Any] = {"process": process_id, "lengths": {}, "modes": {}}
    for backend in ("tensorstore", "zarr"):
        store = pytreestore.create(f"{root}/{backend}", LIKE, backend=backend, multihost=True)
        first, lengths = 0, []
        for count, sx, sy in BATCHES:
            store.extend_batch(global_batch(first, count, sx, sy))
            first += count
            lengths.append(len(store))
        out["lengths"][backend] = lengths
        out["modes"][backend] = store.mode
        store.close()

    # a create or open that fails on process 0 raises on both, and leaves nothing open
    opening: dict[str, Any] = {}
    for name, call in (
        ("exists", lambda: pytreestore.create(f"{root}/zarr", LIKE, multihost=True)),
        ("missing", lambda: pytreestore.open(f"{root}/none", "a", multihost=True)),
    ):
        try:
            call()
            opening[name] = None
        except Exception as err:
            opening[name] = _report(err)
    out["opening"] = opening
    with pytreestore.open(f"{root}/zarr", "a", backend="zarr", multihost=True) as again:
        out["reopened"] = len(again)  # the lock was free: the failed create took nothing

    # typed PRNG keys, split over both processes
    keyed = pytreestore.create(f"{root}/keys", {"k": jax.random.key(0)}, multihost=True)
    split = jax.jit(lambda: jax.random.split(jax.random.key(7), 8), out_shardings=shardings["data"])
    keyed.extend_batch({"k": split()})
    out["keys"] = len(keyed)
    keyed.close()

    # failures, on a store of their own: each must raise on both processes, commit nothing
    store = pytreestore.create(f"{root}/failures", LIKE, multihost=True)
    failures: dict[str, Any] = {}

    def attempt(name: str, call: Any) -> None:
        try:
            call()
            failures[name] = {"type": None, "length": len(store)}
        except Exception as err:
            failures[name] = {**_report(err), "length": len(store)}

    good = global_batch(0, 8, "data", "data")
    wrong = {"x": np.zeros((8, 4), np.float32), "y": np.zeros(8, np.int32)}  # a dict
    attempt("structure", lambda: store.extend_batch(wrong if process_id == 1 else good))
    attempt("split", lambda: store.extend_batch(global_batch(0, 8, "across", "data")))
    other = batch_values(0, 6 if process_id == 1 else 8)  # host arrays that differ
    attempt("different", lambda: store.extend_batch(other))
    attempt("append", lambda: store.append(batch_values(0, 1)))

    def failing_write(self: Any, *args: Any, **kwargs: Any) -> None:
        raise StorageError("injected: the disk of process 1 is full")

    if process_id == 1:  # process 1's fragment writes fail on storage
        saved = TensorStoreBackend.write, ZarrBackend.write
        TensorStoreBackend.write = ZarrBackend.write = failing_write  # type: ignore[method-assign]
    attempt("storage", lambda: store.extend_batch(good))
    if process_id == 1:
        TensorStoreBackend.write, ZarrBackend.write = saved  # type: ignore[method-assign]
    attempt("after", lambda: store.extend_batch(global_batch(0, 8, "data", "data")))
    store.close()
    out["failures"] = failures
    print(json.dumps(out))
    jax.distributed.shutdown()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        raise
