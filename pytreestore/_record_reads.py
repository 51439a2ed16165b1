"""How a store's records are read, chosen once per schema (:func:`record_reads`).

A fixed store's records share one structure: they are read from the record table as
stacked leaves (:mod:`pytreestore._read.reader`). A ragged or optional store's are gathered
from its tables (:mod:`pytreestore._read.records`): each record exactly as appended, or a
batch padded along every ragged axis with its mask. The read face (``load``, ``records``,
``lengths``) and the pipelines (``map``, ``batches``, ``grain_source``) ask the object
:func:`record_reads` gives instead of testing the schema each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np

from pytreestore._core import StoreCore
from pytreestore._format.schema import TreeSchema
from pytreestore._read import reader as _reader
from pytreestore._read import records as _records
from pytreestore._read.reader import ReadContext
from pytreestore._read.request import LoadRequest

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
    """The reads of one kind of store (see the module docstring)."""

    def load(self, core: StoreCore, request: LoadRequest, index: Any, options: LoadOptions) -> Any:
        """``store.load(index)``; ``options``: its ``(ragged, pad_to, truncate, size)``."""
        ...

    def iterate(self, core: StoreCore, request: LoadRequest) -> Iterator[Any]:
        """``store.records()``."""
        ...

    def lengths(self, core: StoreCore, index: Any) -> dict[str, np.ndarray]:
        """``store.lengths(index)``: per ragged axis, each record's longest list."""
        ...

    def loader(
        self,
        core: StoreCore,
        context: ReadContext,
        request: LoadRequest,
        options: LoaderOptions,
    ) -> Callable[[Any], Any]:
        """The load function of a pipeline; ``options``: ``(ragged, pad_to, truncate)``."""
        ...

    def on_batch(self, fn: Callable[..., Any]) -> Callable[[Any], Any]:
        """``map(fn)``'s function of what :meth:`loader` gives."""
        ...

    def grain_padding(
        self, kinds: GrainPaddings[P], store: Any, padded: Any, pad_to: Any, truncate: Any
    ) -> P:
        """``grain_source()``'s padding, made the way this kind of store takes it."""
        ...


class FixedReads:
    """A fixed store's reads: one table, records as stacked leaves; the ragged read options
    (``ragged=``, ``pad_to=``, ``trim=``, ``size=``) are refused."""

    def load(self, core: StoreCore, request: LoadRequest, index: Any, options: LoadOptions) -> Any:
        _records.check_fixed(core.path, *options)
        return _reader.load(core.read_context(), request, index)

    def iterate(self, core: StoreCore, request: LoadRequest) -> Iterator[Any]:
        return _reader.iterate(core.read_context(), request)

    def lengths(self, core: StoreCore, index: Any) -> dict[str, np.ndarray]:
        return {}  # no ragged axis

    def loader(
        self,
        core: StoreCore,
        context: ReadContext,
        request: LoadRequest,
        options: LoaderOptions,
    ) -> Callable[[Any], Any]:
        _records.check_fixed(core.path, *options, None)
        return _reader.loader(context, request)

    def on_batch(self, fn: Callable[..., Any]) -> Callable[[Any], Any]:
        return fn

    def grain_padding(
        self, kinds: GrainPaddings[P], store: Any, padded: Any, pad_to: Any, truncate: Any
    ) -> P:
        return kinds.of_fixed(store, padded, pad_to, truncate)


class TableReads:
    """A ragged or optional store's reads: gathered from its tables, each record exactly
    or a batch as ``(records, mask)`` padded along every ragged axis."""

    def load(self, core: StoreCore, request: LoadRequest, index: Any, options: LoadOptions) -> Any:
        read = _records.RaggedRead.build(*options)
        return _records.load(core.read_context(), core.head, request, index, read)

    def iterate(self, core: StoreCore, request: LoadRequest) -> Iterator[Any]:
        return _records.iterate(core.read_context(), core.head, request)

    def lengths(self, core: StoreCore, index: Any) -> dict[str, np.ndarray]:
        return _records.record_lengths(core.read_context(), core.head, core.schema, index)

    def loader(
        self,
        core: StoreCore,
        context: ReadContext,
        request: LoadRequest,
        options: LoaderOptions,
    ) -> Callable[[Any], Any]:
        read = _records.RaggedRead.build(*options, None)

        def load(index: Any) -> Any:
            return _records.load(context, core.head, request, index, read)

        return load

    def on_batch(self, fn: Callable[..., Any]) -> Callable[[Any], Any]:
        def on_pair(pair: Any) -> Any:  # a batch is (records, mask): fn(records, mask)
            return fn(*pair)

        return on_pair

    def grain_padding(
        self, kinds: GrainPaddings[P], store: Any, padded: Any, pad_to: Any, truncate: Any
    ) -> P:
        return kinds.of_tables(store, padded, pad_to, truncate)


FIXED_READS = FixedReads()
TABLE_READS = TableReads()


def record_reads(schema: TreeSchema) -> RecordReads:
    """The reads of a store of ``schema``: the one place that chooses between reading
    stacked leaves from one table and gathering records from tables."""
    return FIXED_READS if schema.ragged is None else TABLE_READS  # reads: stacked or gathered


__all__ = ["FIXED_READS", "TABLE_READS", "FixedReads", "RecordReads", "TableReads", "record_reads"]
