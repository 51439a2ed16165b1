"""The rows of a global batch each process writes: from the leaves' shardings to row runs.

Under ``jax.distributed`` a batch's leaves may be ``jax.Array`` s spanning several processes,
each process holding some shards. Every process computes the same plan from the shardings
alone (``sharding.devices_indices_map`` covers every device of every process): the record
axis is cut at every shard boundary of every leaf, and each piece of rows goes to one
process that holds those rows whole, every leaf's every element of them, in its own devices.
That process is the one holding replica 0 of the piece's rows in the first sharded leaf
(the shard JAX numbers ``replica_id == 0``) when it holds every leaf's rows; otherwise the
lowest-numbered process that does. A leaf that is not a global array (numpy, a Python
scalar, an array of this process alone) is taken to hold the same values on every process,
as JAX takes such inputs to ``jit``. Pieces no process holds whole (the leaves sharded across
processes in ways that never meet) are refused, naming the leaves.

Adjacent pieces of one process merge into runs: a process writes one fragment per run.

Example:
    >>> import jax, numpy as np
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((1,), ("data",))
    >>> x = jax.device_put(np.arange(6.0), NamedSharding(mesh, P("data")))
    >>> plan = row_plan([x, np.arange(6)], ["['x']", "['y']"], 6)
    >>> plan.runs, plan.of(0)
    (((0, 6, 0),), [(0, 6)])
    >>> np.asarray(host_rows(x, 2, 4))
    array([2., 3.], dtype=float32)
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any, cast

import jax
import numpy as np

from pytreestore._format.dtypes import is_key
from pytreestore.errors import ShardingError

Box = tuple[tuple[int, int], ...]  # (start, stop) per axis


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """Which process writes which rows of a batch of ``count`` records.

    Attributes:
        count: the records in the batch.
        runs: ``(start, stop, process)``, in record order, tiling ``[0, count)``.
    """

    count: int
    runs: tuple[tuple[int, int, int], ...]

    def of(self, process: int) -> list[tuple[int, int]]:
        """The ``(start, stop)`` runs ``process`` writes, in record order."""
        return [(a, b) for a, b, p in self.runs if p == process]


@dataclasses.dataclass(frozen=True)
class _Pieces:
    """One global leaf's shards: ``(process, row range, trailing box)`` per device, in the
    order of ``devices_indices_map`` (replica 0 of a box is the first device holding it)."""

    entries: tuple[tuple[int, tuple[int, int], Box], ...]

    def holders(self, a: int, b: int) -> tuple[set[int], int]:
        """The processes holding rows ``[a, b)`` whole, and the one holding replica 0."""
        covering = [(p, box) for p, (r0, r1), box in self.entries if r0 <= a and b <= r1]
        every = {box for _, box in covering}
        by_process: dict[int, set[Box]] = {}
        for p, box in covering:
            by_process.setdefault(p, set()).add(box)
        whole = {p for p, boxes in by_process.items() if boxes == every}
        first = min(every) if every else ()
        replica0 = next((p for p, box in covering if box == first), -1)
        return whole, replica0

    def cuts(self) -> set[int]:
        return {r for _, rows, _ in self.entries for r in rows}


def is_global(leaf: Any) -> bool:
    """Whether ``leaf`` is a ``jax.Array`` some of whose shards are on other processes."""
    return isinstance(leaf, jax.Array) and not leaf.is_fully_addressable


def _pieces(leaf: jax.Array) -> _Pieces:
    shape = leaf.shape
    entries = []
    for device, index in leaf.sharding.devices_indices_map(shape).items():
        box = tuple(s.indices(n)[:2] for s, n in zip(index, shape))
        entries.append((device.process_index, box[0], box[1:]))
    return _Pieces(tuple(entries))


def row_plan(leaves: Sequence[Any], paths: Sequence[str], count: int) -> RowPlan:
    """The plan of a batch of ``count`` records whose leaves (at ``paths``) are ``leaves``.

    Every process computes the same plan, from the shardings alone.

    Raises:
        ShardingError: some rows are held whole by no process; the message names the
            leaves and how to reshard them.
    """
    sharded = [(path, _pieces(leaf)) for leaf, path in zip(leaves, paths) if is_global(leaf)]
    everyone = set(range(jax.process_count()))
    cuts = sorted({c for c in {0, count}.union(*(p.cuts() for _, p in sharded)) if 0 <= c <= count})
    runs: list[tuple[int, int, int]] = []
    for a, b in itertools.pairwise(cuts):
        common, preferred = set(everyone), 0
        for i, (path, pieces) in enumerate(sharded):
            whole, replica0 = pieces.holders(a, b)
            if i == 0:
                preferred = replica0
            common &= whole
            if not common:
                raise _split_error(sharded, a, b, path)
        owner = preferred if preferred in common else min(common)
        if runs and runs[-1][2] == owner and runs[-1][1] == a:
            runs[-1] = (runs[-1][0], b, owner)
        else:
            runs.append((a, b, owner))
    return RowPlan(count, tuple(runs))


def _split_error(
    sharded: Sequence[tuple[str, _Pieces]], a: int, b: int, path: str
) -> ShardingError:
    held = "; ".join(
        f"{p}: process(es) {sorted(pieces.holders(a, b)[0]) or 'none'}" for p, pieces in sharded
    )
    return ShardingError(
        f"no process holds records [{a}, {b}) of the global batch whole in every leaf (the "
        f"leaves holding them whole, by process: {held}; the first leaf left without a common "
        f"process is {path}). Each record is written by one process, which needs all of its "
        "leaves. Shard every leaf's record axis the same way, e.g. "
        "jax.device_put(batch, NamedSharding(mesh, P('data'))), and keep a leaf's other axes "
        "within one process's devices. Nothing was written."
    )


def host_rows(leaf: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of ``leaf`` on this host, from this process's shards alone.

    A PRNG key leaf comes back as a key array of this process (``jax.random.wrap_key_data``);
    every other leaf as numpy (a leaf that is no global array: sliced as it is).
    """
    if not is_global(leaf):
        if start == 0 and stop == len(leaf):
            return leaf  # all of it: no copy (and no slicing op on a device)
        return leaf[start:stop] if is_key(leaf) else np.asarray(leaf)[start:stop]
    keys = is_key(leaf)
    out: np.ndarray | None = None
    done: set[Box] = set()
    for shard in leaf.addressable_shards:
        box = tuple(s.indices(n)[:2] for s, n in zip(shard.index, leaf.shape))
        (r0, r1), trailing = box[0], box[1:]
        a, b = max(r0, start), min(r1, stop)
        if a >= b or box in done:
            continue
        done.add(box)
        data = np.asarray(jax.random.key_data(shard.data) if keys else shard.data)
        if out is None:
            out = np.empty((stop - start, *leaf.shape[1:], *data.shape[leaf.ndim :]), data.dtype)
        inner = tuple(slice(lo, hi) for lo, hi in trailing)
        out[(slice(a - start, b - start), *inner)] = data[a - r0 : b - r0]
    if out is None:  # the plan gave this process rows it has no shard of: a bug
        raise AssertionError(f"this process holds no shard of rows [{start}, {stop})")
    if not keys:
        return out
    return jax.random.wrap_key_data(cast(Any, out), impl=jax.random.key_impl(leaf))


__all__ = ["RowPlan", "host_rows", "is_global", "row_plan"]
