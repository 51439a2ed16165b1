"""The one read path of records: ``load``, ``store[i]``, iteration, lengths and the
pipelines' loads all enter here, through the reads of the store's schema (:func:`record_reads`).

A read takes three steps: the record table's rows of the selected records, then the rows
each axis table holds for them (offsets -> element rows), then the records built from those
rows. A fixed store has no axis table, so its reads are the first step alone, as stacked
leaves whose build is one ``unflatten`` (:mod:`pytreestore._read.reader`: each column read
straight into the result, each device's rows read for it alone). A ragged or optional
store's reads take every step (:mod:`pytreestore._read.tables`): each record exactly as
appended, or a batch padded along every ragged axis with its mask. Both kinds take the same
fast paths and placements: slabs onto an accelerator in reused host buffers
(:mod:`pytreestore._read.slabs`), and ``sharding=`` (one, or one per column),
``pmap_devices=`` and ``pad=`` (:mod:`pytreestore._read.sharded`). The read face
(``load``, ``records``, ``lengths``) and the pipelines (``map``, ``batches``,
``grain_source``) ask the object :func:`record_reads` gives instead of testing the schema.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-record-reads", {"x": np.int32(0)})
    >>> s.extend({"x": np.int32(i)} for i in range(3))
    >>> type(record_reads(s.schema)).__name__, int(s[2]["x"])
    ('FixedReads', 2)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np

from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._read import reader as _reader
from pytreestore._read import tables as _tables
from pytreestore._read.gather import Rows
from pytreestore._read.reader import ReadContext
from pytreestore._read.request import LoadRequest

#: the commit a read reads at (the store's latest, asked at each read)
Head = Callable[[], Commit]
P = TypeVar("P")
P_co = TypeVar("P_co", covariant=True)
#: ``load``'s ``(ragged, pad_to, truncate, size)``
LoadOptions = tuple[Any, Any, Any, Any]
#: a pipeline's ``(ragged, pad_to, truncate)``
LoaderOptions = tuple[Any, Any, Any]


class GrainPaddings(Protocol[P_co]):
    """The two ways :class:`~pytreestore._pipelines.batches.GrainPadding` is made."""

    def of_fixed(self, store: Any, padded: Any, pad_to: Any, truncate: Any) -> P_co: ...
    def of_tables(self, store: Any, padded: Any, pad_to: Any, truncate: Any) -> P_co: ...


class RecordReads(Protocol):
    """The reads of one kind of store (see the module docstring); ``context`` reads the
    store, ``head`` gives the commit to read at."""

    def load(
        self,
        context: ReadContext,
        head: Head,
        request: LoadRequest,
        index: Any,
        options: LoadOptions,
    ) -> Any:
        """``store.load(index)``; ``options``: its ``(ragged, pad_to, truncate, size)``."""
        ...

    def iterate(self, context: ReadContext, head: Head, request: LoadRequest) -> Iterator[Any]:
        """``store.records()``."""
        ...

    def lengths(
        self, context: ReadContext, head: Head, schema: TreeSchema, index: Any
    ) -> dict[str, np.ndarray]:
        """``store.lengths(index)``: per ragged axis, each record's longest list."""
        ...

    def loader(
        self, context: ReadContext, head: Head, request: LoadRequest, options: LoaderOptions
    ) -> Callable[[Any], Any]:
        """The load function of a pipeline; ``options``: ``(ragged, pad_to, truncate)``."""
        ...

    def on_batch(self, fn: Callable[..., Any]) -> Callable[[Any], Any]:
        """``map(fn)``'s function of what :meth:`loader` gives."""
        ...

    def from_rows(self, request: LoadRequest, gathered: dict[str | None, Rows]) -> Any:
        """The batch ``load`` of a list index builds, of rows gathered elsewhere (a replay
        buffer's rings in host memory): stacked leaves, or the padded ``(batch, mask)``."""
        ...

    def grain_padding(
        self, kinds: GrainPaddings[P], store: Any, padded: Any, pad_to: Any, truncate: Any
    ) -> P:
        """``grain_source()``'s padding, made the way this kind of store takes it."""
        ...


class FixedReads:
    """A fixed store's reads: the record table alone, records as stacked leaves; the ragged
    read options (``ragged=``, ``pad_to=``, ``trim=``, ``size=``) are refused."""

    def load(
        self,
        context: ReadContext,
        head: Head,
        request: LoadRequest,
        index: Any,
        options: LoadOptions,
    ) -> Any:
        _tables.check_fixed(context.path, *options)
        return _reader.load(context, request, index)

    def iterate(self, context: ReadContext, head: Head, request: LoadRequest) -> Iterator[Any]:
        return _reader.iterate(context, request)

    def lengths(
        self, context: ReadContext, head: Head, schema: TreeSchema, index: Any
    ) -> dict[str, np.ndarray]:
        return {}  # no ragged axis

    def loader(
        self, context: ReadContext, head: Head, request: LoadRequest, options: LoaderOptions
    ) -> Callable[[Any], Any]:
        _tables.check_fixed(context.path, *options, None)
        return _reader.loader(context, request)

    def on_batch(self, fn: Callable[..., Any]) -> Callable[[Any], Any]:
        return fn

    def from_rows(self, request: LoadRequest, gathered: dict[str | None, Rows]) -> Any:
        return _reader.from_rows(request, gathered)

    def grain_padding(
        self, kinds: GrainPaddings[P], store: Any, padded: Any, pad_to: Any, truncate: Any
    ) -> P:
        return kinds.of_fixed(store, padded, pad_to, truncate)


class TableReads:
    """A ragged or optional store's reads: every step, the rows gathered from its tables,
    each record exactly or a batch as ``(records, mask)`` padded along every ragged axis."""

    def load(
        self,
        context: ReadContext,
        head: Head,
        request: LoadRequest,
        index: Any,
        options: LoadOptions,
    ) -> Any:
        read = _tables.RaggedRead.build(*options)
        return _tables.load(context, head, request, index, read)

    def iterate(self, context: ReadContext, head: Head, request: LoadRequest) -> Iterator[Any]:
        return _tables.iterate(context, head, request)

    def lengths(
        self, context: ReadContext, head: Head, schema: TreeSchema, index: Any
    ) -> dict[str, np.ndarray]:
        return _tables.record_lengths(context, head, schema, index)

    def loader(
        self, context: ReadContext, head: Head, request: LoadRequest, options: LoaderOptions
    ) -> Callable[[Any], Any]:
        read = _tables.RaggedRead.build(*options, None)

        def load(index: Any) -> Any:
            return _tables.load(context, head, request, index, read)

        return load

    def on_batch(self, fn: Callable[..., Any]) -> Callable[[Any], Any]:
        def on_pair(pair: Any) -> Any:  # a batch is (records, mask): fn(records, mask)
            return fn(*pair)

        return on_pair

    def from_rows(self, request: LoadRequest, gathered: dict[str | None, Rows]) -> Any:
        return _tables.from_rows(request, gathered, _tables.RaggedRead())

    def grain_padding(
        self, kinds: GrainPaddings[P], store: Any, padded: Any, pad_to: Any, truncate: Any
    ) -> P:
        return kinds.of_tables(store, padded, pad_to, truncate)


FIXED_READS = FixedReads()
TABLE_READS = TableReads()


def record_reads(schema: TreeSchema) -> RecordReads:
    """The reads of a store of ``schema``: the one place that chooses whether a read has
    axis tables to gather from (:class:`TableReads`) or is the record table's rows alone
    (:class:`FixedReads`)."""
    return FIXED_READS if schema.ragged is None else TABLE_READS  # reads: stacked or gathered


__all__ = [
    "FIXED_READS",
    "TABLE_READS",
    "FixedReads",
    "Head",
    "RecordReads",
    "TableReads",
    "record_reads",
]
