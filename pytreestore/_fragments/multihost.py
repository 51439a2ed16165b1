"""Multi-host ``extend_batch``: every process writes its rows as fragments, process 0 commits.

A store opened with ``multihost=True`` under ``jax.distributed`` is one object per process:
process 0 holds the writer lock (an ordinary writer), the others attach without it. A call
of :meth:`~pytreestore.TreeStore.extend_batch` with a global batch, on every process, runs:

1. **Local step**, on each process: check the batch against the schema (structure, per-record
   shapes, dtypes), compute the row plan from the leaves' shardings
   (:func:`pytreestore._tree.global_rows.row_plan`, the same on every process), and write
   this process's runs as fragments (``write_fragment``; no lock, nothing committed). A
   ragged or optional store's padded batch and its mask are cut the same way: every store's
   step is the ``local_rows`` the opener hands over
   (:func:`pytreestore._fragments.multihost.write_rows`). A failure here is caught, not
   raised yet.
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

Every store's part of a multi-host ``extend_batch(batch)`` (a ragged or optional store's:
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
import json
from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

from pytreestore import errors
from pytreestore._format.dtypes import is_key
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import fragment as _fixed
from pytreestore._fragments import fragment as _remove
from pytreestore._fragments import write as _fragments
from pytreestore._fragments.fragment import Fragment
from pytreestore._location import Location
from pytreestore._log.commit_record import Commit
from pytreestore._tree.global_rows import host_rows, is_global, row_plan
from pytreestore._write.commits import MemoryCommits
from pytreestore._write.records import RecordWriter
from pytreestore.backends import Backend
from pytreestore.errors import (
    BadLocationError,
    MultiHostError,
    PyTreeStoreError,
    SchemaMismatchError,
)


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


#: the local step: (engine, schema, head, batch, mask, process, where) -> the process's
#: status members ``count``, ``describe``, ``runs`` (pytreestore._fragments.multihost)
LocalRows = Callable[[Backend, TreeSchema, Commit, Any, Any, int, str], dict[str, Any]]


def describe(batch_leaves: Sequence[Any], treedef: Any) -> dict[str, Any]:
    """What every process must agree on: the treedef, each leaf's global shape and dtype."""
    leaves = [[list(np.shape(x)), str(getattr(x, "dtype", type(x).__name__))] for x in batch_leaves]
    return {"treedef": str(treedef), "leaves": leaves}


class MultiHost:
    """One store's multi-host writes, on one process (attached by :func:`open_everywhere`).

    Attributes:
        path: the store's location, for messages.
        process: this process's index (``jax.process_index()``).
        processes: the number of processes (``jax.process_count()``).
        local_rows: the local step, step 1 (every kind of store's).
    """

    def __init__(self, path: str, location: Location, local_rows: LocalRows) -> None:
        self.path = path
        self.process = jax.process_index()
        self.processes = jax.process_count()
        self._location = location
        self.local_rows = local_rows

    def refused(self, *, append: bool = False) -> MultiHostError:
        """The error for a method a multi-host store does not take on this process:
        ``append``/``extend`` (``append=True``) on any process, writes other than
        ``extend_batch`` on processes other than 0."""
        what = (
            "append() and extend() would write on one process only"
            if append
            else "only process 0 holds the writer lock, so this method is process 0's"
        )
        return MultiHostError(
            f"store {self.path} is open with multihost=True and this is process "
            f"{self.process} of {self.processes}: {what}. Append global batches with "
            "store.extend_batch(batch), called on every process (pytreestore.stack makes a "
            "batch of records); for anything else open the store without multihost=True "
            "on one process"
        )

    def extend_batch(self, store: Any, backend: Backend, batch: Any, mask: Any) -> None:
        """Steps 1 to 4 of the module's protocol, for ``store`` (this process's TreeStore,
        ``backend`` its backend); returns once the batch is committed, on every process.

        Raises:
            PyTreeStoreError: on every process, if any process failed; the one that failed
                raises its own error, the others the same class naming that process.
        """
        local: BaseException | None = None
        try:
            len(store)  # a closed store raises here, on its own process
            head, schema = store.commit_now(), store.schema
            rows = self.local_rows(backend, schema, head, batch, mask, self.process, self.path)
            status = {"ok": True, **rows}
        except Exception as err:  # reported to every process, raised below
            local = err
            status = {"ok": False, "error": _error_json(err)}
        statuses = [unpack(raw) for raw in allgather(pack(status))]
        outcome: dict[str, Any] = {}
        if self.process == 0:
            outcome = self._commit(store, backend, statuses)
        outcome = unpack(allgather(pack(outcome))[0])
        if outcome["ok"]:
            if self.process != 0:
                store.refresh()
            return
        if local is not None:
            local.add_note(
                f"nothing was committed to {self.path}: every process of the multi-host "
                "extend_batch raises"
            )
            raise local
        raise _rebuild(outcome["error"])

    def _commit(self, store: Any, backend: Backend, statuses: list[dict[str, Any]]) -> dict:
        written = [text for s in statuses if s["ok"] for _, _, text in s["runs"]]
        try:
            failed = [(i, s) for i, s in enumerate(statuses) if not s["ok"]]
            if failed:
                self._remove(backend, written)
                return {"ok": False, "error": self._failed(*failed[0], "write its rows of")}
            _check_same_batch(statuses)
            runs = sorted(run for s in statuses for run in s["runs"])
            _check_tiling(runs, statuses[0]["count"])
            store.commit_fragments([Fragment.from_json(text) for _, _, text in runs])
            return {"ok": True}
        except Exception as err:
            self._remove(backend, written)
            return {"ok": False, "error": _error_json(err)}

    def _failed(self, process: int, status: dict[str, Any], doing: str) -> dict[str, str]:
        error = dict(status["error"])
        error["message"] = (
            f"process {process} of {self.processes} could not {doing} the global batch, so "
            f"nothing was committed to {self.path} (every process raises): {error['message']}"
        )
        return error

    def _remove(self, backend: Backend, texts: Sequence[str]) -> None:
        """Deletes fragments no commit will take (those left are vacuum's)."""
        if texts:
            with contextlib.suppress(PyTreeStoreError):
                ids = [Fragment.from_json(text).id for text in texts]
                _remove.remove(backend, ids)


def open_everywhere(
    first: Callable[[], Any],
    other: Callable[[], Any],
    path: str,
    location: Location,
    local_rows: LocalRows,
) -> Any:
    """A multi-host store on every process: process 0 runs ``first()`` (create, or open for
    appending: it takes the writer lock), then, after a barrier, every other process runs
    ``other()`` (open read-only: no lock); each attaches a :class:`MultiHost` (with
    ``local_rows``, the local step of its ``extend_batch``).

    Raises:
        BadLocationError: a ``memory://`` store with several processes.
        PyTreeStoreError: on every process, if any process failed to create or open it
            (process 0 closes its store then).
    """
    if jax.process_count() > 1 and location.kind == "memory":
        raise BadLocationError(
            f"{path} is an in-memory store, which the other processes of the multi-host job "
            "cannot reach; put the store on storage every process reaches (a shared "
            "filesystem, s3://, gs://)"
        )
    host = MultiHost(path, location, local_rows)
    store, local = None, None
    for turn in ("first", "other"):
        status: dict[str, Any] = {"ok": True}
        if (turn == "first") == (host.process == 0):
            try:
                store = first() if turn == "first" else other()
            except Exception as err:
                local, status = err, {"ok": False, "error": _error_json(err)}
        statuses = [unpack(raw) for raw in allgather(pack(status))]
        failed = [(i, s) for i, s in enumerate(statuses) if not s["ok"]]
        if failed:
            if store is not None:
                store.close()
            if local is not None:
                raise local
            error = dict(failed[0][1]["error"])
            error["message"] = (
                f"process {failed[0][0]} of {host.processes} could not "
                f"{'create or open' if turn == 'first' else 'open'} store {path}, so it is "
                f"open on no process: {error['message']}"
            )
            raise _rebuild(error)
    assert store is not None  # every process made one, or all raised above
    store._use_multihost(host)
    return store


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


__all__ = [
    "LocalRows",
    "MultiHost",
    "allgather",
    "check_batch",
    "describe",
    "open_everywhere",
    "pack",
    "unpack",
    "write_rows",
]
