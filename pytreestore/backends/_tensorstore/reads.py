"""The TensorStore backend's column reads: uncompressed chunks of a local store are read
straight from their files (:mod:`.direct`) while TensorStore decodes the others, all at once.

:func:`read_parts` reads into new arrays. :func:`read_into` reads into the caller's
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

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorstore as ts

from pytreestore.backends._tensorstore import direct as _direct
from pytreestore.backends._tensorstore import fork as _fork
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
) -> list[np.ndarray]:
    """Each ``(key, index, part)`` request's rows of column ``key`` (open as ``handles[key]``;
    ``plans[key]`` how to read its files directly, or None), in new arrays."""
    out: list[Any] = [None] * len(requests)
    mine = [(i, plan, index, p) for i, (k, index, p) in enumerate(requests) if (plan := plans[k])]
    direct = [i for i, (k, _, _) in enumerate(requests) if plans[k] is None]
    engine = _start_reads(location, handles, requests, direct)
    if mine:
        try:
            got = _direct.read([(plan, index, part) for _, plan, index, part in mine])
            for (i, _, _, _), array in zip(mine, got):
                out[i] = array
        except _direct.MissingChunk:  # TensorStore knows the fill value
            engine += _start_reads(location, handles, requests, [m[0] for m in mine])
        except PyTreeStoreError:
            raise
        except OSError as err:
            raise _futures.storage_error(f"reading columns of {location}", err) from err
    keys_read = [requests[i][0] for i, _ in engine]
    done = _futures.wait(
        [f for _, f in engine], keys_read, "reading column", read=True, timeout=timeout
    )
    for (i, _), array in zip(engine, done):
        out[i] = array
    return out


def _start_reads(
    location: Location,
    handles: Mapping[str, ts.TensorStore],
    requests: Sequence[_Part],
    which: list[int],
) -> list[tuple[int, Any]]:
    """Issues the reads of ``requests[i]`` for every ``i`` in ``which``, in one batch."""
    if which:
        _fork.check(location)
    with ts.Batch() as batch:
        return [
            (i, _part(handles[requests[i][0]], *requests[i][1:]).read(batch=batch)) for i in which
        ]


def _part(handle: ts.TensorStore, index: Any, part: slice | None) -> ts.TensorStore:
    """``handle[index]``, restricted to ``part`` of its second axis when one is given."""
    return handle[index] if part is None else handle[index, part]


def read_into(
    location: Location,
    handles: Sequence[ts.TensorStore],
    plans: Sequence[_direct.DirectColumn | None],
    keys: Sequence[str],
    index: slice,
    outs: Sequence[np.ndarray],
    timeout: float | None,
) -> list[np.ndarray]:
    """Rows ``index`` of the columns ``keys`` (open as ``handles``; ``plans[i]`` how to read
    column ``i``'s files directly, or None) written into ``outs``, which it returns."""
    mine = [i for i, plan in enumerate(plans) if plan is not None]
    engine = _start(location, handles, index, outs, [i for i, p in enumerate(plans) if p is None])
    try:
        if mine:
            try:
                _direct.read([(plans[i], index, None) for i in mine], [outs[i] for i in mine])  # type: ignore[misc]
            except _direct.MissingChunk:  # TensorStore knows the fill value
                engine += _start(location, handles, index, outs, mine)
            except PyTreeStoreError:
                raise
            except OSError as err:
                raise _futures.storage_error(f"reading columns of {location}", err) from err
        _futures.wait(
            [f for _, f in engine],
            [keys[i] for i, _ in engine],
            "reading column",
            read=True,
            timeout=timeout,
        )
    except BaseException:  # a damaged chunk, a timeout, Ctrl-C
        _stop([f for _, f in engine])  # nothing writes into outs once this raises
        raise
    return list(outs)


def _stop(futures: Sequence[Any]) -> None:
    """Cancels TensorStore's ``futures`` and waits for each to end."""
    for future in futures:
        with contextlib.suppress(Exception):
            future.cancel()
    for future in futures:
        with contextlib.suppress(Exception):
            future.result()


def _start(
    location: Location,
    handles: Sequence[ts.TensorStore],
    index: slice,
    outs: Sequence[np.ndarray],
    which: list[int],
) -> list[tuple[int, Any]]:
    """Starts copying rows ``index`` of ``handles[i]`` into ``outs[i]`` for each ``i`` in
    ``which``."""
    if which:
        _fork.check(location)
    return [(i, ts.array(outs[i], copy=False, write=True).write(handles[i][index])) for i in which]


__all__ = ["read_into", "read_parts"]
