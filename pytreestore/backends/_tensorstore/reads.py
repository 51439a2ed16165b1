"""The TensorStore backend's column reads: the chunks of a local store that the direct
reader covers are read by it (:mod:`.direct_reads`) while TensorStore decodes the others, all
at once; and :func:`read_checked`, the reads of ``verify``
(:class:`~pytreestore.backends.CheckedReads`), which report damage instead of raising.

:func:`read_parts` reads into new arrays, or into the caller's
(:class:`~pytreestore.backends.ReadsInto`): TensorStore then decodes each column's rows into
an array TensorStore that refers to the caller's memory (``ts.array(out, copy=False)``), so
no array of its own is allocated and faulted in.

Example:
    >>> import numpy as np
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import ColumnLayout, TensorStoreBackend
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-reads"))
    >>> backend.create_columns([ColumnLayout("x", np.dtype("int32"), (), (4,), "zstd", ("record",), 0)])
    >>> backend.resize(["x"], 6)
    >>> backend.write(["x"], 0, [np.arange(6, dtype=np.int32)])
    >>> out = np.zeros(3, np.int32)
    >>> got = backend.read_into(["x"], slice(2, 5, 1), 6, [out])
    >>> got[0] is out, out.tolist()
    (True, [2, 3, 4])
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorstore as ts

from pytreestore.backends._tensorstore import direct as _direct
from pytreestore.backends._tensorstore import direct_reads as _direct_reads
from pytreestore.backends._tensorstore import futures as _fork
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.errors import CorruptChunkError, CorruptStoreError, PyTreeStoreError

if TYPE_CHECKING:
    from pytreestore._location import Location
    from pytreestore.backends._tensorstore.backend import TensorStoreBackend


_Part = tuple[str, Any, "slice | None"]  # (key, index, part of the second axis or None: all)


def read_parts(
    location: Location,
    handles: Mapping[str, ts.TensorStore],
    plans: Mapping[str, _direct.DirectColumn | None],
    requests: Sequence[_Part],
    timeout: float | None,
    outs: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Each ``(key, index, part)`` request's rows of column ``key`` (open as ``handles[key]``;
    ``plans[key]`` how to read its files directly, or None): in new arrays, or written into
    ``outs[i]`` where given (every request then a slice of step 1 and no part), which it
    returns. Once it raises, nothing writes into ``outs``."""
    out: list[Any] = list(outs) if outs is not None else [None] * len(requests)
    mine = [i for i, (k, _, _) in enumerate(requests) if plans[k] is not None]
    theirs = [i for i, (k, _, _) in enumerate(requests) if plans[k] is None]
    engine = _start(location, handles, requests, outs, theirs)
    try:
        if mine:
            try:
                got = _direct_reads.read(
                    [(plans[requests[i][0]], *requests[i][1:]) for i in mine],  # type: ignore[misc]
                    None if outs is None else [outs[i] for i in mine],
                )
                for i, array in zip(mine, got):
                    out[i] = array
            except PyTreeStoreError:
                raise
            except OSError as err:
                raise _futures.storage_error(f"reading columns of {location}", err) from err
        keys_read = [requests[i][0] for i, _ in engine]
        done = _futures.wait(
            [f for _, f in engine], keys_read, "reading column", read=True, timeout=timeout
        )
    except BaseException:  # a damaged chunk, a timeout, Ctrl-C
        _stop([f for _, f in engine])  # nothing writes into outs once this raises
        raise
    if outs is None:
        for (i, _), array in zip(engine, done):
            out[i] = array
    return out


def _start(
    location: Location,
    handles: Mapping[str, ts.TensorStore],
    requests: Sequence[_Part],
    outs: Sequence[np.ndarray] | None,
    which: list[int],
) -> list[tuple[int, Any]]:
    """Starts the reads of ``requests[i]`` for every ``i`` in ``which``: into new arrays, in
    one batch, or copied into ``outs[i]`` through an array TensorStore over it."""
    if which:
        _fork.check(location)
    if outs is not None:
        return [
            (i, ts.array(outs[i], copy=False, write=True).write(_source(handles, requests[i])))
            for i in which
        ]
    with ts.Batch() as batch:
        return [(i, _source(handles, requests[i]).read(batch=batch)) for i in which]


def _source(handles: Mapping[str, ts.TensorStore], request: _Part) -> ts.TensorStore:
    """``handles[key][index]``, restricted to ``part`` of its second axis when one is given."""
    key, index, part = request
    return handles[key][index] if part is None else handles[key][index, part]


def _stop(futures: Sequence[Any]) -> None:
    """Cancels TensorStore's ``futures`` and waits for each to end. A cancelled future's
    ``result()`` raises ``asyncio.CancelledError``, a ``BaseException``: it is the end
    waited for, not an error (the caller raises its own: a timeout's ``StorageError``)."""
    for future in futures:
        with contextlib.suppress(Exception):
            future.cancel()
    for future in futures:
        with contextlib.suppress(Exception, asyncio.CancelledError):
            future.result()


def read_checked(
    backend: TensorStoreBackend, reads: Sequence[tuple[str, Any]], records: int
) -> list[PyTreeStoreError | None]:
    """Reads every ``(key, index)`` at once; each read's error, or None where it worked.

    Damaged chunks and metadata give errors in the list; storage failures raise.
    """
    opened: dict[str, ts.TensorStore | PyTreeStoreError] = {}
    for key in dict.fromkeys(k for k, _ in reads):
        try:
            opened[key] = backend.column_handles([key], records)[0]
        except CorruptStoreError as err:
            opened[key] = err
    direct = {  # local files are checked as load reads them: sizes and shard indexes too
        i: _read_direct(plan, key, index)
        for i, (key, index) in enumerate(reads)
        if isinstance(h := opened[key], ts.TensorStore) and (plan := backend.reads_plan(key, h))
    }
    backend.check_usable()
    with ts.Batch() as batch:  # the engine reads only what the direct reader did not
        futures = [
            None
            if i in direct
            else h[index].read(batch=batch)
            if isinstance(h := opened[key], ts.TensorStore)
            else h
            for i, (key, index) in enumerate(reads)
        ]
    out: list[PyTreeStoreError | None] = []
    for i, ((key, _), fut) in enumerate(zip(reads, futures)):
        if i in direct:
            out.append(direct[i])
            continue
        if isinstance(fut, PyTreeStoreError):
            out.append(fut)
            continue
        try:
            _futures.result(fut, backend.timeout)
            out.append(None)
        except ValueError as err:
            if not _futures.is_damage(err):
                raise _futures.storage_error(f"reading column {key}", err) from err
            damaged = _futures.chunk_error(key, err)
            damaged.__cause__ = err
            out.append(damaged)
    return out


def _read_direct(plan: _direct.DirectColumn, key: str, index: Any) -> CorruptChunkError | None:
    """The error of reading ``index`` of ``key`` through the direct reader (None: it read
    back)."""
    try:
        _direct_reads.read([(plan, index, None)])
    except CorruptChunkError as err:
        return err
    except OSError as err:
        raise _futures.storage_error(f"reading column {key}", err) from err
    return None


__all__ = ["read_checked", "read_parts"]
