"""Waiting for TensorStore's futures, and its failures as pytreestore errors.

TensorStore reports every failure as a ``ValueError`` whose text starts with a status code:
a chunk it could not decode is damage (:class:`CorruptChunkError`), a missing metadata
document or chunk is named as such, an OCDBT database replaced by another since it was opened
is :class:`StoreReplacedError`, and anything else is storage that could not be reached
(:class:`StorageError`, retryable).

Example:
    >>> is_damage(ValueError("DATA_LOSS: checksum mismatch"))
    True
    >>> type(storage_error("reading x", ValueError("UNAVAILABLE: down"))).__name__
    'StorageError'

TensorStore in a forked child: a clear error before any call that would abort the process.

TensorStore does its I/O on thread pools that ``os.fork`` does not copy. A child process that
issues a TensorStore read or write after its parent used TensorStore is aborted by TensorStore
itself (``fork() use detected``, signal 6), with no exception to catch. Every call of this
backend that issues I/O first asks :func:`check`, which raises :class:`ForkedBackendError`
in such a child instead. What needs no TensorStore thread still works there: rows held in the
decoded-chunk cache, and uncompressed local chunks, which this backend reads as plain files.

Example:
    >>> check("memory://doc-fork")  # in the process that used TensorStore: nothing to say
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pytreestore._format.validate import COLUMN_GONE
from pytreestore.backends._base import damaged_chunk, missing_chunk, symlink_loop
from pytreestore.backends._errors import ForkGuard
from pytreestore.errors import (
    CommitConflictError,
    CorruptChunkError,
    CorruptStoreError,
    PyTreeStoreError,
    StorageError,
    StoreReplacedError,
)

#: status codes of a read that found bytes it could not decode (as opposed to not reaching them)
_DAMAGED = ("DATA_LOSS", "FAILED_PRECONDITION", "INVALID_ARGUMENT", "OUT_OF_RANGE")


#: what TensorStore says (FAILED_PRECONDITION) when an OCDBT database's manifest now belongs to
#: another database than the one a handle opened (``create(overwrite=True)`` put a new one there)
_OTHER_DATABASE = "Configuration mismatch on uuid"


#: what TensorStore says when a web server answered a byte-range request with the whole file
_NO_RANGES = "was ignored by server"


def wait(
    futures: Sequence[Any],
    keys: Sequence[str],
    doing: str,
    *,
    read: bool = False,
    meta: bool = False,
    timeout: float | None = None,
) -> list[Any]:
    """Waits for every future (each up to ``timeout`` seconds), then raises the first failure
    as a pytreestore error."""
    results: list[Any] = []
    failure: tuple[str, ValueError] | None = None
    for key, fut in zip(keys, futures):
        try:
            results.append(result(fut, timeout))
        except ValueError as err:
            failure = failure or (key, err)
            results.append(None)
    if failure is None:
        return results
    key, err = failure
    status = str(err).split(":", 1)[0]
    if _OTHER_DATABASE in str(err):
        raise storage_error(f"{doing} {key}", err) from err
    if "`expand_only` was specified" in str(err):
        raise CommitConflictError(
            f"column {key} has grown since this writer last resized it: another writer is "
            "appending to this store. Nothing more was written; reopen the store."
        ) from err
    if meta and status == "NOT_FOUND":
        raise CorruptStoreError(
            f"{doing} {key}: {key}/zarr.json is missing: {COLUMN_GONE}"
        ) from err
    if meta and status in _DAMAGED:
        raise CorruptStoreError(f"{doing} {key}: {key}/zarr.json cannot be used: {err}") from err
    if read and is_damage(err):
        raise chunk_error(key, err) from err
    raise storage_error(f"{doing} {key}", err) from err


def is_damage(err: ValueError) -> bool:
    """Whether a read failed on bytes it could not decode, or on a chunk that is missing."""
    status = str(err).split(":", 1)[0]
    if _OTHER_DATABASE in str(err) or _NO_RANGES in str(err):
        return False  # not damage: another store, a web server's limits (storage_error)
    return status in _DAMAGED or (status == "NOT_FOUND" and "is missing" in str(err))


def result(future: Any, timeout: float | None) -> Any:
    """``future``'s result; after ``timeout`` seconds (the location's ``total_timeout``) it is
    cancelled and a ``DEADLINE_EXCEEDED`` ValueError raised, as TensorStore reports failures."""
    try:
        return future.result(timeout=timeout)
    except TimeoutError as err:
        future.cancel()
        raise ValueError(
            f"DEADLINE_EXCEEDED: no answer from storage within {timeout:g} s (the "
            "storage option total_timeout; retries included)"
        ) from err


def chunk_error(key: str, err: ValueError) -> CorruptChunkError:
    """The error of a chunk of ``key`` that a read found damaged or missing, naming the chunk."""
    found = re.search(re.escape(key) + r"/c((?:/\d+)+)", str(err))
    grid = re.search(r"chunk \{([\d, ]+)\}", str(err))
    if found:
        chunk: tuple[int, ...] | None = tuple(int(i) for i in found.group(1).split("/")[1:])
    else:
        chunk = tuple(int(i) for i in grid.group(1).split(",")) if grid else None
    if str(err).startswith("NOT_FOUND"):
        return missing_chunk(key, chunk, err)
    return damaged_chunk(key, chunk, err)


def storage_error(doing: str, err: Exception) -> PyTreeStoreError:
    """The error of storage that failed ``doing`` something: retryable; or, if the OCDBT
    database there was replaced by another since it was opened, :class:`StoreReplacedError`;
    or, for a symbolic link loop inside the store, :class:`CorruptStoreError`."""
    loop = symlink_loop(doing, err)
    if loop is not None:
        return loop
    if _NO_RANGES in str(err):
        return StorageError(
            f"{doing} failed: the web server ignored a byte-range request ({err}). Sharded "
            "columns (create(inner_chunk_bytes=...)) and OCDBT stores are read in parts: serve "
            "them from a server that answers Range requests (nginx, Apache, object stores), or "
            "copy the store to local disk first."
        )
    if _OTHER_DATABASE in str(err):
        return StoreReplacedError(
            f"{doing} failed: the OCDBT database there was replaced by another since this store "
            "was opened (create(overwrite=True), or a copy, put a new database in its place), "
            "so what it would read or write belongs to another store. Open the store again "
            "with pytreestore.open()"
        )
    return StorageError(
        f"{doing} failed: {err}. Records committed before stay committed; once storage is "
        "reachable (or has space) again, retry the call (a failed flush() can be repeated)."
    )


#: raises ForkedBackendError in a child forked from a process that had used TensorStore
check = ForkGuard(
    "TensorStore",
    "",
    "it would abort the process",
    ", or open the store in the child with backend='zarr' (file and S3 stores)",
).check


__all__ = ["check", "chunk_error", "is_damage", "result", "storage_error", "wait"]
