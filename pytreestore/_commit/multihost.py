"""Multi-host ``extend_batch``: every process writes its rows as fragments, process 0 commits.

A store opened with ``multihost=True`` under ``jax.distributed`` is one object per process:
process 0 holds the writer lock (an ordinary writer), the others attach without it. A call
of :meth:`~pytreestore.TreeStore.extend_batch` with a global batch, on every process, runs:

1. **Local step**, on each process: check the batch against the schema (structure, per-record
   shapes, dtypes), compute the row plan from the leaves' shardings
   (:func:`pytreestore._tree.global_rows.row_plan`, the same on every process), and write
   this process's runs as fragments (``write_fragment``; no lock, nothing committed). A
   failure here is caught, not raised yet.
2. **Exchange** (the first barrier): every process's status, fragments as JSON or its error,
   and a description of its batch (record count, treedef, leaf shapes and dtypes), gathered
   on every process with ``jax.experimental.multihost_utils.process_allgather``. It returns
   once every process has written its fragments.
3. **Commit**, on process 0: if every process succeeded and all describe the same batch,
   ``commit_fragments`` of every fragment in record order, one atomic commit.
4. **Outcome** (the second barrier): process 0's outcome, gathered the same way. Every
   process returns only after the commit, and sees the same store length; or every process
   raises: the one that failed its own error, the others the same error class saying which
   process failed. Nothing is committed then (fragments written are abandoned; ``vacuum()``
   removes them).

Every process must make the same calls in the same order, as with any JAX collective; a
process that never calls leaves the others waiting in the exchange.

Example:
    >>> import json
    >>> unpack(pack({"ok": True}) + b"\\0\\0")
    {'ok': True}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten

from pytreestore import errors
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.global_rows import host_rows, row_plan
from pytreestore._tree.stack import batch_length
from pytreestore.errors import MultiHostError, PyTreeStoreError, SchemaMismatchError

Fragment = Any  # pytreestore.Fragment: to_json() / from_json()


def pack(message: dict[str, Any]) -> bytes:
    """A status message as bytes (JSON)."""
    return json.dumps(message, separators=(",", ":")).encode()


def unpack(raw: bytes) -> dict[str, Any]:
    """The message of :func:`pack`, zero padding stripped."""
    return json.loads(raw.rstrip(b"\0").decode())


def allgather(payload: bytes) -> list[bytes]:
    """Every process's ``payload``, in process order; returns once every process has sent.

    Two collectives: the lengths, then the payloads padded to a power of two (so that a
    run of calls compiles a few programs, not one per length).
    """
    if jax.process_count() == 1:
        return [payload]
    from jax.experimental import multihost_utils

    lengths = multihost_utils.process_allgather(np.array([len(payload)], np.int32))
    size = 1 << max(10, int(np.max(lengths) - 1).bit_length())
    padded = np.zeros(size, np.uint8)
    padded[: len(payload)] = np.frombuffer(payload, np.uint8)
    gathered = multihost_utils.process_allgather(padded)
    return [bytes(gathered[i][: int(n)]) for i, n in enumerate(np.asarray(lengths).ravel())]


def describe(batch_leaves: Sequence[Any], treedef: Any) -> dict[str, Any]:
    """What every process must agree on: the treedef, each leaf's global shape and dtype."""
    leaves = [[list(np.shape(x)), str(getattr(x, "dtype", type(x).__name__))] for x in batch_leaves]
    return {"treedef": str(treedef), "leaves": leaves}


class MultiHost:
    """One store's multi-host writes, on one process.

    Attributes:
        path: the store's location, for messages.
        process: this process's index (``jax.process_index()``).
        processes: the number of processes (``jax.process_count()``).
    """

    def __init__(
        self,
        path: str,
        write: Callable[[Any], Fragment],
        fragment: Callable[[str], Fragment],
    ) -> None:
        """``write(batch)`` writes one batch of the store's classes as a fragment;
        ``fragment(text)`` rebuilds one from its JSON (``Fragment.from_json``)."""
        self.path = path
        self.process = jax.process_index()
        self.processes = jax.process_count()
        self._write = write
        self._fragment = fragment

    def refused(self, method: str) -> MultiHostError:
        """The error for ``append``/``extend`` on a store open with ``multihost=True``."""
        return MultiHostError(
            f"store {self.path} is open with multihost=True (this is process {self.process} of "
            f"{self.processes}): it takes global batches through extend_batch(batch), called "
            f"on every process; {method}() would write on one process only. Stack the "
            "records into a batch (pytreestore.stack) and call extend_batch on every "
            "process, or open the store without multihost=True on one process"
        )

    def extend_batch(
        self, schema: TreeSchema, batch: Any, commit: Callable[[list[Fragment]], int]
    ) -> int:
        """Steps 1 to 4 of the module's protocol; ``commit`` (process 0 only) commits the
        fragments in order and returns the store's records.

        Returns:
            The store's committed records after the call (the same on every process).
        """
        local: BaseException | None = None
        try:
            status = {"ok": True, **self._write_rows(schema, batch)}
        except Exception as err:  # reported to every process, raised below
            local = err
            status = {"ok": False, "error": _error_json(err)}
        statuses = [unpack(raw) for raw in allgather(pack(status))]
        outcome: dict[str, Any] = {}
        if self.process == 0:
            outcome = self._commit(statuses, commit)
        outcome = unpack(allgather(pack(outcome))[0])
        if outcome["ok"]:
            return int(outcome["records"])
        if local is not None:
            local.add_note(
                f"nothing was committed to {self.path}: every process of the multi-host "
                "extend_batch raises"
            )
            raise local
        raise _rebuild(outcome["error"])

    def _write_rows(self, schema: TreeSchema, batch: Any) -> dict[str, Any]:
        leaves, treedef = tree_flatten(batch)
        if treedef != schema.treedef:
            raise SchemaMismatchError(schema.mismatch_message(batch, what="batch"))
        description = describe(leaves, treedef)
        columns = schema.column_leaves(leaves)
        count = batch_length(columns, schema.paths)
        plan = row_plan(columns, schema.paths, count)
        runs = []
        for start, stop in plan.of(self.process):
            rows = schema.unflatten([host_rows(leaf, start, stop) for leaf in columns])
            runs.append([start, stop, self._write(rows).to_json()])
        return {"count": count, "describe": description, "runs": runs}

    def _commit(self, statuses: list[dict[str, Any]], commit: Callable[[list[Any]], int]) -> dict:
        try:
            failed = [(i, s) for i, s in enumerate(statuses) if not s["ok"]]
            if failed:
                i, status = failed[0]
                error = dict(status["error"])
                error["message"] = (
                    f"process {i} of {self.processes} could not write its rows of the global "
                    f"batch, so nothing was committed to {self.path} (every process raises): "
                    f"{error['message']}"
                )
                return {"ok": False, "error": error}
            _check_same_batch(statuses)
            runs = sorted(run for s in statuses for run in s["runs"])
            _check_tiling(runs, statuses[0]["count"])
            records = commit([self._fragment(text) for _, _, text in runs])
            return {"ok": True, "records": records}
        except Exception as err:
            return {"ok": False, "error": _error_json(err)}


def _check_same_batch(statuses: list[dict[str, Any]]) -> None:
    first = statuses[0]["describe"]
    for i, status in enumerate(statuses[1:], start=1):
        if status["describe"] != first or status["count"] != statuses[0]["count"]:
            raise MultiHostError(
                f"the processes passed different batches to extend_batch: process 0 has "
                f"{statuses[0]['count']} records {first}, process {i} has {status['count']} "
                f"records {status['describe']}. Every process must pass the same global batch "
                "(the same jax.Arrays, or host arrays equal on every process). Nothing was "
                "committed."
            )


def _check_tiling(runs: list[list[Any]], count: int) -> None:
    at = 0
    for start, stop, _ in runs:
        if start != at:
            raise MultiHostError(
                f"the fragments of the global batch do not cover its records in order: records "
                f"[{at}, {start}) have no fragment (runs {[r[:2] for r in runs]}). Nothing was "
                "committed; this is a bug in pytreestore's row plan, please report it."
            )
        at = stop
    if at != count:
        raise MultiHostError(
            f"the fragments of the global batch cover {at} of its {count} records; nothing "
            "was committed; this is a bug in pytreestore's row plan, please report it."
        )


def _error_json(err: BaseException) -> dict[str, str]:
    return {"type": type(err).__name__, "message": str(err)}


def _rebuild(error: dict[str, str]) -> PyTreeStoreError:
    """The error another process reported: the same pytreestore error class where there is
    one (so ``except SchemaMismatchError`` works on every process), else MultiHostError."""
    cls = getattr(errors, error["type"], None)
    if isinstance(cls, type) and issubclass(cls, PyTreeStoreError):
        try:
            return cls(error["message"])
        except TypeError:
            pass
    return MultiHostError(f"{error['type']}: {error['message']}")


__all__ = ["MultiHost", "allgather", "describe", "pack", "unpack"]
