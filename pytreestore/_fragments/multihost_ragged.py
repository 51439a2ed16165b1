"""A ragged or optional store's part of a multi-host ``extend_batch(batch, mask=mask)``: this
process's rows of the global padded batch and its mask, written as ragged fragments
(:mod:`pytreestore._fragments.multihost` runs the protocol: exchange, process 0's commit).

The record axis of the batch and of the mask is cut by the row plan of a fixed store's batch
(:func:`pytreestore._tree.global_rows.row_plan`, over the leaves of both, so that each run's
values and mask are held whole by the process that writes it); each process takes its runs
from its own shards (:func:`~pytreestore._tree.global_rows.host_rows`) and writes each run
as one fragment of the records ``extend_batch`` would append
(:func:`pytreestore._fragments.write.write` with the mask), which process 0 commits in
record order: the store ends as a single process's ``extend_batch`` leaves it.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ragged-multihost", {"p": [np.int8(0)]},
    ...                        ragged=["['p']"])
    >>> batch = {"p": np.array([[1, 2], [3, 0]], np.int8)}
    >>> mask = {"p": np.array([[True, True], [True, False]])}
    >>> status = write_rows(s._backend, s.schema, s.commit_now(), batch, mask, 0, s.path)
    >>> status["count"], [run[:2] for run in status["runs"]]
    (2, [[0, 2]])
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

from pytreestore._commit.fragment import Fragment
from pytreestore._commit.record import Commit
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import remove as _fixed
from pytreestore._fragments import write as _fragments
from pytreestore._fragments.multihost import describe
from pytreestore._tree.global_rows import host_rows, row_plan
from pytreestore.backends import Backend
from pytreestore.errors import PyTreeStoreError, SchemaMismatchError


def write_rows(
    engine: Backend,
    schema: TreeSchema,
    head: Commit,
    batch: Any,
    mask: Any,
    process: int,
    where: str,
) -> dict[str, Any]:
    """Writes ``process``'s runs of the global ``batch`` and ``mask`` as fragments of the
    ragged store behind ``engine`` (latest commit ``head``); the process's status members:
    ``count`` (records in the batch), ``describe`` (what every process must agree on) and
    ``runs`` (``[start, stop, fragment JSON]``).

    Raises:
        SchemaMismatchError: no mask, leaves that disagree on the record count, or records
            the store refuses (nothing of this process is left written).
        ShardingError: rows no process holds whole in every leaf of the batch and mask.
    """
    if mask is None:
        raise SchemaMismatchError(
            f"store {where} holds ragged or optional records: its extend_batch takes the padded "
            "batch with its mask, extend_batch(batch, mask=mask) (the pair load() returns), "
            "on every process"
        )
    found_b, tree_b = tree_flatten_with_path(batch)
    found_m, tree_m = tree_flatten_with_path(mask)
    paths = [f"batch{keystr(p)}" for p, _ in found_b] + [f"mask{keystr(p)}" for p, _ in found_m]
    leaves = [x for _, x in found_b] + [x for _, x in found_m]
    rowed = [i for i, x in enumerate(leaves) if np.ndim(x) > 0]  # arrays with a record axis
    count = _count(leaves, paths, rowed, where)
    plan = row_plan([leaves[i] for i in rowed], [paths[i] for i in rowed], count)
    runs: list[list[Any]] = []
    try:
        for start, stop in plan.of(process):
            part = list(leaves)
            for i in rowed:
                part[i] = host_rows(leaves[i], start, stop)
            rows = tree_b.unflatten(part[: len(found_b)])
            rows_mask = tree_m.unflatten(part[len(found_b) :])
            fragment = _fragments.write(engine, schema, head, rows, rows_mask, where)
            runs.append([start, stop, fragment.to_json()])
    except BaseException:
        with contextlib.suppress(PyTreeStoreError):  # those left are vacuum's
            _fixed.remove(engine, [Fragment.from_json(text).id for _, _, text in runs])
        raise
    description = describe(leaves, f"{tree_b} {tree_m}")
    return {"count": count, "describe": description, "runs": runs}


def _count(leaves: list[Any], paths: list[str], rowed: list[int], where: str) -> int:
    """The records of the batch: every array leaf's leading length, which must agree."""
    if not rowed:
        raise SchemaMismatchError(
            f"extend_batch(batch, mask=) of store {where} found no array leaf in the batch"
        )
    lengths = {paths[i]: int(np.shape(leaves[i])[0]) for i in rowed}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{p}: {n}" for p, n in lengths.items())
        raise SchemaMismatchError(
            f"extend_batch(batch, mask=) of store {where}: the leaves of the batch and its mask "
            f"disagree on the number of records ({detail}); each leaf's leading axis is the "
            "record axis. Nothing was appended."
        )
    return next(iter(lengths.values()))


__all__ = ["write_rows"]
