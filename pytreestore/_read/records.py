"""The one read route of records: ``load``, ``store[i]``, iteration, lengths and the
pipelines' loads all enter here, through :data:`RECORD_READS`.

A read takes three steps: the record table's rows of the selected records, then the rows
each axis table holds for them (offsets -> element rows), then the records built from those
rows. A store that declared no ragged axis and no optional subtree has no table to gather
from (:attr:`~pytreestore._read.request.LoadRequest.gathers` is False), so its reads are
the first step alone, as stacked leaves whose build is one ``unflatten``
(:mod:`pytreestore._read.reader`: each column read straight into the result, each device's
rows read for it alone). The others take every step (:mod:`pytreestore._read.tables`): each
record exactly as appended, or a batch padded along every ragged axis with its mask. Both
take the same fast paths and placements: slabs onto an accelerator in reused host buffers
(:mod:`pytreestore._read.slabs`), and ``sharding=`` (one, or one per column),
``pmap_devices=`` and ``pad=`` (:mod:`pytreestore._read.sharded`). What a batch is, records
or ``(records, mask)``, is the request's too (:meth:`RecordReads.on_batch`).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-record-reads", {"x": np.int32(0)})
    >>> s.extend({"x": np.int32(i)} for i in range(3))
    >>> request = s.read_context().request(as_numpy=True)
    >>> request.gathers, int(s[2]["x"])
    (False, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, final

import numpy as np

from pytreestore._commit.record import Commit
from pytreestore._format.schema import TreeSchema
from pytreestore._read import reader as _reader
from pytreestore._read import tables as _tables
from pytreestore._read.reader import ReadContext
from pytreestore._read.request import LoadRequest, gathers

#: the commit a read reads at (the store's latest, asked at each read)
Head = Callable[[], Commit]
#: ``load``'s ``(ragged, pad_to, truncate, size)``
LoadOptions = tuple[Any, Any, Any, Any]
#: a pipeline's ``(ragged, pad_to, truncate)``
LoaderOptions = tuple[Any, Any, Any]


@final
class RecordReads:
    """The reads of every store (see the module docstring); ``context`` reads the store,
    ``head`` gives the commit to read at. The ragged read options (``ragged=``, ``pad_to=``,
    ``trim=``, ``size=``) are checked in one place, :meth:`~pytreestore._read.tables.
    RaggedRead.of`: refused on a store with no tables."""

    def load(
        self,
        context: ReadContext,
        head: Head,
        request: LoadRequest,
        index: Any,
        options: LoadOptions,
    ) -> Any:
        """``store.load(index)``; ``options``: its ``(ragged, pad_to, truncate, size)``."""
        read = _tables.RaggedRead.of(request, context.path, *options)
        return _load(context, head, request, index, read)

    def iterate(self, context: ReadContext, head: Head, request: LoadRequest) -> Iterator[Any]:
        """``store.records()``: every record exactly, read a block at a time."""
        if request.gathers:
            return _tables.iterate(context, head, request)
        return _reader.iterate(context, request)

    def lengths(
        self, context: ReadContext, head: Head, schema: TreeSchema, index: Any
    ) -> dict[str, np.ndarray]:
        """``store.lengths(index)``: per ragged axis, each record's longest list."""
        if gathers(schema):
            return _tables.record_lengths(context, head, schema, index)
        return {}  # no table: no ragged axis

    def loader(
        self, context: ReadContext, head: Head, request: LoadRequest, options: LoaderOptions
    ) -> Callable[[Any], Any]:
        """The load function of a pipeline; ``options``: ``(ragged, pad_to, truncate)``,
        checked now."""
        read = _tables.RaggedRead.of(request, context.path, *options, None)

        def load(index: Any) -> Any:
            return _load(context, head, request, index, read)

        return load

    def on_batch(self, request: LoadRequest, fn: Callable[..., Any]) -> Callable[[Any], Any]:
        """``map(fn)``'s function of what :meth:`loader` gives: ``fn(records, mask)`` of a
        batch gathered from tables, ``fn(records)`` of the record table's rows."""
        if not request.gathers:
            return fn

        def on_pair(pair: Any) -> Any:
            return fn(*pair)

        return on_pair


def _load(
    context: ReadContext, head: Head, request: LoadRequest, index: Any, read: _tables.RaggedRead
) -> Any:
    """Records ``index``: gathered from the tables and built, or, with no table to gather
    from, the record table's rows as stacked leaves (the first step alone)."""
    if request.gathers:
        return _tables.load(context, head, request, index, read)
    return _reader.load(context, request, index)


#: the reads of every store
RECORD_READS = RecordReads()


__all__ = ["RECORD_READS", "Head", "RecordReads"]
