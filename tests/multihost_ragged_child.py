"""One process of tests/test_multihost_ragged.py: ``python -m tests.multihost_ragged_child ID
PORT ROOT``.

Two of these run under ``jax.distributed`` (:mod:`tests.launch`), 4 CPU devices each (x64 on, so
that int64 and float64 leaves stay exact in global arrays). For each backend they create a
ragged and optional store (the records of :func:`tests.trial_harness.ragged_record`) with
``multihost=True`` and append the padded global batches of :data:`BATCHES`, values and mask
sharded over a mesh spanning both processes; then a second store sees the failures. The last
line printed is a JSON report.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import numpy as np

from tests import launch
from tests.parity import kinds
from tests.trial_harness import RAGGED_DECL, ragged_like, ragged_record

# (first record, records, sharding of the batch, sharding of the mask)
BATCHES = [
    (0, 16, "data", "data"),  # split over the 8 devices of both processes
    (16, 8, "data_partial", "data"),  # values split over 4 and replicated; mask split over 8
    (24, 5, "replicated", "replicated"),  # every device holds every record
]


def padded(first: int, count: int) -> tuple[Any, Any]:
    """Records ``first`` .. ``first + count - 1`` as the padded batch and mask, numpy."""
    return pytreestore_stack([ragged_record(i) for i in range(first, first + count)])


def pytreestore_stack(records: list[Any]) -> tuple[Any, Any]:
    import pytreestore

    return pytreestore.stack(records, like=ragged_like(False), as_numpy=True, **RAGGED_DECL)


# (first record, records, sharding of values and mask) of each store of every_kind
KIND_BATCHES = [(0, 16, "data"), (16, 3, "replicated")]


def every_kind(root: str, name: str, backend: str, global_tree: Any) -> dict[str, Any]:
    """A store of kind ``name`` (tests/parity/kinds.py) on ``backend`` with ``multihost=True``,
    appended :data:`KIND_BATCHES` as global padded batches and masks (a fixed store: the
    batch alone); its length after each, or the error."""
    import pytreestore

    lengths = []
    try:
        store = kinds.create(f"{root}/{name}-{backend}", name, backend, multihost=True)
        for first, count, sharding in KIND_BATCHES:
            pair = kind_batch(name, first, count)
            store.extend_batch(*(global_tree(part, sharding) for part in pair))
            lengths.append(len(store))
        store.close()
    except pytreestore.errors.PyTreeStoreError as err:
        return {**_report(err), "lengths": lengths}
    return {"type": None, "lengths": lengths}


def kind_batch(name: str, first: int, count: int) -> tuple[Any, ...]:
    """Records ``first`` .. of kind ``name``, stacked as ``extend_batch`` takes them:
    ``(batch,)`` for a fixed store, ``(batch, mask)`` padded for the others."""
    import pytreestore

    records = kinds.records(name, count, start=first)
    kind = kinds.kind(name)
    if kind.is_fixed:
        return (pytreestore.stack(records, as_numpy=True),)
    like = kinds.like(name)
    return pytreestore.stack(records, like=like, as_numpy=True, **kind.declarations)


def _report(err: BaseException) -> dict[str, Any]:
    return {"type": type(err).__name__, "message": str(err), "notes": getattr(err, "__notes__", [])}


def main() -> None:
    process_id, (root,) = launch.join(x64=True)
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import pytreestore

    devices = np.array(jax.devices())
    line, grid = Mesh(devices, ("data",)), Mesh(devices.reshape(4, 2), ("data", "model"))
    shardings = {
        "data": NamedSharding(line, P("data")),
        "data_partial": NamedSharding(grid, P("data")),
        "replicated": NamedSharding(line, P()),
    }

    def global_tree(tree: Any, name: str) -> Any:
        def one(x: np.ndarray) -> jax.Array:
            return jax.make_array_from_callback(x.shape, shardings[name], lambda i: x[i])

        return jax.tree.map(one, tree)

    out: dict[str, Any] = {"process": process_id, "lengths": {}}
    for backend in ("tensorstore", "zarr"):
        store = pytreestore.create(
            f"{root}/{backend}",
            ragged_like(False),
            backend=backend,
            multihost=True,
            chunk_records=4,
            **RAGGED_DECL,
        )
        lengths = []
        for first, count, sb, sm in BATCHES:
            batch, mask = padded(first, count)
            store.extend_batch(global_tree(batch, sb), mask=global_tree(mask, sm))
            lengths.append(len(store))
        out["lengths"][backend] = lengths
        store.close()

    failures: dict[str, Any] = {}
    store = pytreestore.create(
        f"{root}/failures", ragged_like(False), multihost=True, **RAGGED_DECL
    )

    def attempt(name: str, call: Any) -> None:
        try:
            call()
            failures[name] = {"type": None, "length": len(store)}
        except Exception as err:
            failures[name] = {**_report(err), "length": len(store)}

    batch, mask = padded(0, 8)
    attempt("nomask", lambda: store.extend_batch(global_tree(batch, "data")))
    broken = jax.tree.map(np.copy, mask)
    broken["elems"].x[5, 0] = not broken["elems"].x[5, 0]  # row 5: process 1's rows
    broken["elems"].x[5, -1] = True  # a hole: not a run of True then False
    attempt(
        "run",
        lambda: store.extend_batch(global_tree(batch, "data"), mask=global_tree(broken, "data")),
    )
    good = (global_tree(batch, "data"), global_tree(mask, "data"))
    attempt("after", lambda: store.extend_batch(good[0], mask=good[1]))
    store.close()
    pending = pytreestore.create(
        f"{root}/pending", ragged_like(True), multihost=True, **RAGGED_DECL
    )
    store = pending
    attempt("pending", lambda: pending.extend_batch(good[0], mask=good[1]))
    pending.close()
    out["failures"] = failures
    out["kinds"] = {
        f"{name}-{backend}": every_kind(f"{root}/kinds", name, backend, global_tree)
        for name in kinds.KINDS
        for backend in kinds.BACKENDS
    }
    print(json.dumps(out))
    jax.distributed.shutdown()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        raise
