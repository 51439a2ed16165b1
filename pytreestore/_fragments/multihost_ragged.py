"""Every store's part of a multi-host ``extend_batch(batch)`` (a ragged or optional store's:
``extend_batch(batch, mask=mask)``): this process's rows of the global batch (and its mask),
written as fragments (:mod:`pytreestore._fragments.multihost` runs the protocol: exchange,
process 0's commit).

The batch is first checked as the store's own ``extend_batch`` checks it, on none of its
records (:func:`check_batch`: a mask where the store needs one and only there; a fixed
store's structure, dtypes and trailing shapes). The record axis of the batch and of the mask is then cut by
the row plan (:func:`pytreestore._tree.global_rows.row_plan`, over the leaves of both, so
that each run's values and mask are held whole by the process that writes it); each process
takes its runs from its own shards (:func:`~pytreestore._tree.global_rows.host_rows`) and
writes each run as one fragment of the records ``extend_batch`` would append
(:func:`pytreestore._fragments.write.write`, with the mask if any), which process 0 commits
in record order: the store ends as a single process's ``extend_batch`` leaves it.

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
from typing import Any, cast

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

from pytreestore._commit.fragment import Fragment
from pytreestore._commit.memory import MemoryCommits
from pytreestore._commit.record import Commit
from pytreestore._commit.records import RecordWriter
from pytreestore._format.prng import is_key
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import remove as _fixed
from pytreestore._fragments import write as _fragments
from pytreestore._fragments.multihost import describe
from pytreestore._tree.global_rows import host_rows, is_global, row_plan
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
    """Writes ``process``'s runs of the global ``batch`` (and ``mask``, a ragged or optional
    store's) as fragments of the store behind ``engine`` (latest commit ``head``); the
    process's status members: ``count`` (records in the batch), ``describe`` (what every
    process must agree on) and ``runs`` (``[start, stop, fragment JSON]``).

    Raises:
        SchemaMismatchError: the batch or mask is refused as ``extend_batch`` refuses it,
            leaves that disagree on the record count, or records the store refuses (nothing
            of this process is left written).
        ShardingError: rows no process holds whole in every leaf of the batch and mask.
    """
    check_batch(engine, schema, head, batch, mask, where)
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


def check_batch(
    engine: Backend, schema: TreeSchema, head: Commit, batch: Any, mask: Any, where: str
) -> None:
    """Refuses ``batch`` and ``mask`` as the store's ``extend_batch`` would, on none of their
    records (the store's own record writer, tables in memory): before any row is read.

    Raises:
        SchemaMismatchError: a mask is missing (a ragged or optional store) or given (a
            fixed one); a fixed store's batch of another structure, or a column's dtype or
            trailing shape (a ragged store's values are checked as its records are walked,
            run by run).
    """
    empty = jax.tree.map(_no_rows, (batch, mask))
    writer = RecordWriter(engine, schema, Commit(0, 0), MemoryCommits(head, where))
    writer.extend_batch(*empty, where=where)


def _no_rows(leaf: Any) -> Any:
    """None of ``leaf``'s rows, with its dtype (a global array's, without reading a shard)."""
    if np.ndim(leaf) == 0:
        return leaf
    if not is_global(leaf):
        return host_rows(leaf, 0, 0)
    if is_key(leaf):
        data = jax.eval_shape(jax.random.key_data, leaf)
        none = np.empty((0, *data.shape[1:]), data.dtype)
        return jax.random.wrap_key_data(cast(Any, none), impl=jax.random.key_impl(leaf))
    return np.empty((0, *leaf.shape[1:]), leaf.dtype)


def _count(leaves: list[Any], paths: list[str], rowed: list[int], where: str) -> int:
    """The records of the batch: every array leaf's leading length, which must agree."""
    if not rowed:
        raise SchemaMismatchError(
            f"extend_batch() of store {where} found no array leaf in the batch"
        )
    lengths = {paths[i]: int(np.shape(leaves[i])[0]) for i in rowed}
    if len(set(lengths.values())) > 1:
        detail = ", ".join(f"{p}: {n}" for p, n in lengths.items())
        raise SchemaMismatchError(
            f"extend_batch() of store {where}: the leaves of the batch (and its mask) "
            f"disagree on the number of records ({detail}); each leaf's leading axis is the "
            "record axis. Nothing was appended."
        )
    return next(iter(lengths.values()))


__all__ = ["check_batch", "write_rows"]
