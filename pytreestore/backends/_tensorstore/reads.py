"""The TensorStore backend's column reads: uncompressed chunks of a local store are read
straight from their files (:mod:`.direct`) while TensorStore decodes the others, all at once.

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
from pytreestore.backends._tensorstore import futures as _fork
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.errors import PyTreeStoreError

if TYPE_CHECKING:
    from pytreestore._location import Location


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
                got = _direct.read(
                    [(plans[requests[i][0]], *requests[i][1:]) for i in mine],  # type: ignore[misc]
                    None if outs is None else [outs[i] for i in mine],
                )
                for i, array in zip(mine, got):
                    out[i] = array
            except _direct.MissingChunk:  # TensorStore knows the fill value
                engine += _start(location, handles, requests, outs, mine)
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


__all__ = ["read_parts"]
