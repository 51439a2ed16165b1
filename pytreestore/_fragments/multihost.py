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
   (:func:`pytreestore._fragments.multihost_ragged.write_rows`). A failure here is caught, not
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
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from pytreestore import errors
from pytreestore._commit.fragment import Fragment
from pytreestore._commit.record import Commit
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import remove as _remove
from pytreestore._location import Location
from pytreestore.backends import Backend
from pytreestore.errors import (
    BadLocationError,
    MultiHostError,
    PyTreeStoreError,
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
#: status members ``count``, ``describe``, ``runs`` (pytreestore._fragments.multihost_ragged)
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


__all__ = [
    "LocalRows",
    "MultiHost",
    "allgather",
    "describe",
    "open_everywhere",
    "pack",
    "unpack",
]
