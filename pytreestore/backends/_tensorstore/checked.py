"""Reads that report damage instead of raising: the TensorStore backend's
:class:`~pytreestore.backends.CheckedReads` (``verify``).

Example:
    >>> import pytreestore
    >>> s = pytreestore.create("memory://doc-checked", {"x": 0}, chunk_records=2)
    >>> s.extend([{"x": 1}, {"x": 2}]); s.flush()
    >>> read_checked(s._backend, [("x", slice(0, 2))], 2)
    [None]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import tensorstore as ts

from pytreestore.backends._tensorstore import direct as _direct
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.errors import CorruptChunkError, CorruptStoreError, PyTreeStoreError

if TYPE_CHECKING:
    from pytreestore.backends._tensorstore.backend import TensorStoreBackend


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
    direct = {  # plain files are checked as load reads them: sizes too
        i: _read_direct(plan, key, index)
        for i, (key, index) in enumerate(reads)
        if isinstance(h := opened[key], ts.TensorStore) and (plan := backend.direct_plan(key, h))
    }
    backend.check_usable()
    with ts.Batch() as batch:
        futures = [
            h[index].read(batch=batch) if isinstance(h := opened[key], ts.TensorStore) else h
            for key, index in reads
        ]
    out: list[PyTreeStoreError | None] = []
    for i, ((key, _), fut) in enumerate(zip(reads, futures)):
        if i in direct and direct[i] is not None:
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
    """The error of reading ``index`` of ``key`` as plain files (None: it read back, or a
    chunk is missing, which the engine's read then reports)."""
    try:
        _direct.read([(plan, index, None)])
    except _direct.MissingChunk:
        return None
    except CorruptChunkError as err:
        return err
    except OSError as err:
        raise _futures.storage_error(f"reading column {key}", err) from err
    return None


__all__ = ["read_checked"]
