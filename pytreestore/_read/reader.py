"""The read path: executing a :class:`~pytreestore._read.request.LoadRequest` against a store.

Every read goes through :func:`load` (a record or a batch of records) or
:func:`load_leaves` (the columns' arrays, for ``copy`` and the CLI), in the same steps:

1. the store's :class:`ReadContext` gives what a read sees (:class:`~pytreestore._read.
   index.View`: through a writer, its buffered records too, committing nothing) and the
   index is normalised against that count, as rows: record ``i`` is row ``first + i`` after a
   ``keep_last`` (:func:`pytreestore._read.index.normalize`);
2. ``Backend.read`` reads every chosen column at once (rows only a writer's memory holds
   taken from it); a damaged or missing chunk raises
   :class:`~pytreestore.errors.CorruptChunkError` naming the column's keypath, after a check
   that the store was not replaced meanwhile;
3. a scalar index drops the record axis; the host arrays are placed on device
   (:mod:`pytreestore._read.place`) unless ``as_numpy``;
4. a sharded or pmap request builds global arrays instead (:mod:`pytreestore._read.sharded`);
5. weakly typed columns are made weak again, typed PRNG key columns rewrapped, and the schema rebuilds the record's classes.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-read-reader", {"x": np.int32(0)})
    >>> store.extend({"x": np.int32(i)} for i in range(3))
    >>> request = LoadRequest.build(store.schema, policy=False, as_numpy=True)
    >>> load(store.read_context(), request, [2, 0])
    {'x': array([2, 0], dtype=int32)}
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from pytreestore._format import dtypes as _prng
from pytreestore._format.dtypes import weaken
from pytreestore._format.ragged import slot
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log import versions
from pytreestore._log.commit_record import Commit
from pytreestore._read import ahead as _ahead
from pytreestore._read import cache as _cache
from pytreestore._read import place as _device
from pytreestore._read import sharded as _sharded
from pytreestore._read import slabs as _slabs
from pytreestore._read.ahead import Block, ReadAhead
from pytreestore._read.cache import ChunkCache
from pytreestore._read.gather import Rows
from pytreestore._read.index import ReadFn, Selection, View
from pytreestore._read.request import LoadRequest
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, ReadsInto, capable
from pytreestore.errors import CorruptChunkError, CorruptStoreError, SchemaMismatchError


@dataclasses.dataclass(frozen=True)
class ReadContext:
    """What the read path needs of a store, as callables; made by ``TreeStore.read_context``.

    Attributes:
        location: where the store lives.
        readable: the records a read sees now (through a writer: buffered ones too).
        reading: a context manager lending the backend for one read (``close()`` waits
            for it).
        check_not_replaced: raises ``StoreReplacedError`` if the store was replaced since it
            was opened; ``always=True`` checks on object stores too (a request there), and
            ``failed=True`` (a read failed) also if the store no longer keeps the version.
        request: builds a :class:`LoadRequest` from the arguments of ``TreeStore.load`` with
            the store's schema and cast policy (raises ``ClosedStoreError`` once closed).
        ahead: the store's read-ahead block, which ``store[i]`` in a loop reads from
            (:mod:`pytreestore._read.ahead`; None: every record is read alone).
        cache: the decoded-chunk cache the store reads through (:mod:`pytreestore._read.cache`;
            None: none).
        cache_id: the store object's own key in the cache (a random id made when it opened).
        whole_chunks: the cache keeps whole chunks even of columns with inner chunks (a
            pipeline that reads every record of the chunks it touches: each chunk is then
            read in one piece); by default it keeps the inner chunks a read touches.
        viewing: what one read sees, held for the read (``StoreCore.viewing``; None: the
            commit ``readable`` counts).
        view: the view of the read this context is lent to (:meth:`held`), else None.
    """

    location: Location
    readable: Callable[[], int]
    reading: Callable[[], AbstractContextManager[Backend]]
    check_not_replaced: Callable[..., None]
    request: Callable[..., LoadRequest]
    ahead: ReadAhead | None = None
    cache: ChunkCache | None = None
    cache_id: str | None = None
    whole_chunks: bool = False
    viewing: Callable[[], AbstractContextManager[View]] | None = None
    view: View | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[ReadContext]:
        """This context for one read, with the :class:`View` it sees held until the read
        ends (a context lent to a read already: itself)."""
        if self.view is not None or self.viewing is None:
            yield self
            return
        with self.viewing() as view:
            yield dataclasses.replace(self, view=view)

    def rows(self) -> tuple[int, int]:
        """The rows of the record table the read sees, ``(first, end)``: record ``i`` is row
        ``first + i`` (rows before ``first`` were released by ``keep_last``); of the
        :class:`View` it holds, else of one taken now (no ``viewing``: ``(0, readable())``)."""
        if self.view is not None:
            return self.view.commit.first, self.view.records
        if self.viewing is not None:
            with self.viewing() as view:
                return view.commit.first, view.records
        return 0, self.readable()

    def overlaid(self, read: ReadFn) -> ReadFn:
        """``read`` (of storage) with the rows only a writer's memory holds taken from it."""
        if self.view is None or not self.view.held:
            return read
        return functools.partial(self.view.read, read)

    def unit(self, schema: TreeSchema) -> Callable[[Any], int] | None:
        """The records of each piece the cache keeps of a column of ``schema`` (None: a
        chunk)."""
        return None if self.whole_chunks else schema.read_unit

    @property
    def path(self) -> str:
        """The store's path or URL."""
        return str(self.location)


P = ParamSpec("P")
R = TypeVar("R")


def holding(
    read: Callable[Concatenate[ReadContext, P], R],
) -> Callable[Concatenate[ReadContext, P], R]:
    """``read`` (of a context first) run with what it sees held (:meth:`ReadContext.held`)."""

    @functools.wraps(read)
    def held_read(context: ReadContext, *args: P.args, **kwargs: P.kwargs) -> R:
        with context.held() as lent:
            return read(lent, *args, **kwargs)

    return held_read


@holding
def load(context: ReadContext, request: LoadRequest, index: Any) -> Any:
    """Records ``index`` of the store, as ``request`` asks (see ``TreeStore.load``)."""
    first, records = context.rows()
    selection = request.selection(index, records, first)
    if request.split:
        return _load_split(context, request, selection, records)
    if selection.scalar and context.ahead is not None:
        i = selection.index.start
        hit, record = context.ahead.record(
            request, i, lambda i: _block(context, request, i, records)
        )
        if hit:
            context.check_not_replaced()  # the block belongs to the store opened
            return record
    return request.schema.unflatten(_leaves(context, request, selection, records))


@holding
def load_leaves(context: ReadContext, request: LoadRequest, index: Any) -> list[Any]:
    """The leaves of records ``index``, in column order (None for columns not chosen)."""
    first, records = context.rows()
    return _leaves(context, request, request.selection(index, records, first), records)


def iterate(context: ReadContext, request: LoadRequest) -> Iterator[Any]:
    """Every record, one at a time, read a block at a time (:mod:`pytreestore._read.ahead`:
    with jax leaves, each block is placed once and each record taken by one call)."""
    first, end = context.rows()
    for start in range(first, end, _ahead.block_size(request.record_nbytes)):
        with context.held() as lent:  # each block's read, not the caller's loop
            block = _block(lent, request, start, end)
        for j in range(block.count):
            yield block.record(j, copy=False)  # views: the block is not kept for reuse


def _block(context: ReadContext, request: LoadRequest, start: int, records: int) -> Block:
    """Records from ``start`` (one read-ahead block, fewer at the end) of ``records``."""
    stop = min(start + _ahead.block_size(request.record_nbytes), records)
    selection = Selection(slice(start, stop, 1), stop - start, False)
    return Block.of(request, start, _spread(request, _read(context, request, selection, records)))


def loader(context: ReadContext, request: LoadRequest) -> Callable[[Any], Any]:
    """``load`` bound to ``context`` and ``request``: a function of the index alone."""

    def load_index(index: Any) -> Any:
        return load(context, request, index)

    return load_index


@contextlib.contextmanager
def explained(context: ReadContext, schema: TreeSchema) -> Iterator[None]:
    """Around a read of ``schema``'s columns: a failure that the store's change since it
    opened explains (replaced, records written over, version no longer kept) raises
    ``StoreReplacedError`` saying so; a damaged chunk names its column by tree path."""
    try:
        yield
    except CorruptStoreError as err:
        context.check_not_replaced(failed=True)  # a replaced store lacks our chunks
        if isinstance(err, CorruptChunkError):
            raise name_column(err, schema) from err
        raise


def name_column(err: CorruptChunkError, schema: TreeSchema) -> CorruptChunkError:
    """``err`` (which names a column by storage key) naming the column by its tree path."""
    path = next((c.path for c in schema.storage_columns if c.key == err.path), None)
    if path is None:
        return err
    message = str(err).replace(f"column {err.path}:", f"column {path or 'the root'}:", 1)
    return CorruptChunkError(message, path=path, chunk=err.chunk, key=err.key)


def _key_impls(schema: TreeSchema) -> list[str | None]:
    """The PRNG key implementation of each column of ``schema`` (None for other columns)."""
    return [c.key_impl for c in schema.columns]


def _leaves(
    context: ReadContext, request: LoadRequest, selection: Selection, records: int
) -> list[Any]:
    if not request.as_numpy and not selection.scalar:
        nbytes = selection.count * request.record_nbytes
        if _slabs.planned(selection.index, nbytes, request.device) is not None:
            return _slab_leaves(context, request, selection, records)
    arrays = _read(context, request, selection, records)
    if selection.scalar:
        arrays = [a[0, ...] for a in arrays]
    return placed(request, arrays)


def placed(request: LoadRequest, arrays: list[np.ndarray]) -> list[Any]:
    """The leaves of the chosen columns' host ``arrays`` (None elsewhere), placed as
    ``request`` asks (kept as numpy with ``as_numpy``), with their columns' weak types and
    PRNG key types."""
    leaves = _spread(request, arrays)
    if request.as_numpy:
        return leaves
    schema = request.schema
    on_device = _device.to_jax(
        leaves, schema.paths, device=request.device, cast=request.cast, weak=schema.weak
    )
    return _prng.wrap_columns(on_device, _key_impls(schema))


def from_rows(request: LoadRequest, gathered: dict[str | None, Rows]) -> Any:
    """The records of rows gathered elsewhere (a replay buffer's rings,
    :mod:`pytreestore._pipelines.replay`), as :func:`load` builds a batch: stacked leaves."""
    rows = gathered[None].values
    return request.schema.unflatten(placed(request, [rows[slot(c)] for c in request.specs]))


def _slab_leaves(
    context: ReadContext, request: LoadRequest, selection: Selection, records: int
) -> list[Any]:
    """The leaves of a big load onto one accelerator, read and copied in pieces that overlap
    (:mod:`pytreestore._read.slabs`)."""
    specs = request.specs
    unit = context.unit(request.schema)  # a sharded column decodes an inner chunk at least
    chunk = max(c.chunks[0] if unit is None else unit(c) for c in specs)
    nbytes = [c.record_nbytes for c in specs]

    def read(piece: _slabs.Piece, buffer: Callable[[int], np.ndarray]) -> list[np.ndarray]:
        chosen = tuple(request.chosen[i] for i in piece.columns)
        part = dataclasses.replace(request, chosen=chosen)
        count = piece.rows.stop - piece.rows.start
        rows = Selection(piece.rows, count, False)
        shapes = [((count, *c.shape), np.dtype(c.dtype)) for c in part.specs]
        outs = _slabs.views(buffer(_slabs.nbytes(shapes)), shapes)
        arrays = _read(context, part, rows, records, outs)
        paths = [request.schema.paths[i] for i in chosen]
        return [_device.jax_ready(a, p, request.cast) for a, p in zip(arrays, paths)]

    pieces = _slabs.plan(selection.index, nbytes, chunk, RUNTIME.reads.slab_bytes)
    placed = _slabs.load(read, pieces, len(specs), request.device)  # None stays uncommitted
    return _placed_leaves(request, placed)


def _read(
    context: ReadContext,
    request: LoadRequest,
    selection: Selection,
    records: int,
    outs: list[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """The chosen columns' rows of ``selection``, read at once, as host arrays: into
    ``outs`` (a slice's rows, each of its column's dtype and shape) where the backend
    reads into the caller's arrays (:class:`~pytreestore.backends.ReadsInto`)."""
    specs = request.specs
    if selection.count == 0:
        return [np.empty((0, *c.shape), c.dtype) for c in specs]
    with explained(context, request.schema), context.reading() as backend:

        def stored(keys: Any, index: Any, records: int) -> list[np.ndarray]:
            arrays = None
            if context.cache is not None and context.cache_id is not None:
                unit = context.unit(request.schema)
                cache, owner = context.cache, context.cache_id
                arrays = _cache.read(cache, owner, backend, specs, index, records, unit)
            if arrays is None and outs is not None and index is selection.index:
                arrays = _read_into(backend, keys, index, records, outs)
            if arrays is None:
                arrays = backend.read(keys, index, records)
            return arrays

        read = context.overlaid(stored)
        arrays = read([c.key for c in specs], selection.index, records)
    context.check_not_replaced()  # what was read belongs to the store opened
    return arrays


def _read_into(
    backend: Backend, keys: list[str], index: Any, records: int, outs: list[np.ndarray]
) -> list[np.ndarray] | None:
    """``backend.read_into`` where the backend reads into the caller's arrays, else None."""
    if capable(backend, ReadsInto):
        return backend.read_into(keys, index, records, outs)
    return None


def _load_split(
    context: ReadContext, request: LoadRequest, selection: Selection, records: int
) -> Any:
    assert request.shardings is not None
    with explained(context, request.schema), context.reading() as backend:
        arrays, mask = _sharded.load(
            backend if context.view is None else context.view.reads(backend),
            request.specs,
            selection,
            records,
            request.shardings,
            pad=request.pad,
            cast=request.cast,
            pmap=request.pmap,
        )
        context.check_not_replaced()
    tree = request.schema.unflatten(_placed_leaves(request, arrays))
    return (tree, mask) if request.pad else tree


def _placed_leaves(request: LoadRequest, placed: list[Any]) -> list[Any]:
    """The leaves of the chosen columns' ``jax.Array``s (None elsewhere), with their
    columns' weak types and PRNG key types."""
    leaves = weaken(_spread(request, placed), request.schema.weak)
    return _prng.wrap_columns(leaves, _key_impls(request.schema))


def _spread(request: LoadRequest, arrays: list[Any]) -> list[Any]:
    """One entry per column of the schema: the chosen columns' arrays, None elsewhere."""
    leaves: list[Any] = [None] * len(request.schema.columns)
    for i, array in zip(request.chosen, arrays):
        leaves[i] = array
    return leaves


def check_columns_kept(backend: Backend, schema: TreeSchema, path: str, now: Commit) -> None:
    """Raises SchemaMismatchError if an evolve since a reader opened dropped one of its
    columns (``schema``'s): the records committed since (to ``now``, whose schema counts,
    not a root an evolve wrote before a commit that never came) hold no values there."""
    info = versions.committed_info(backend, now, path)
    keys = {c.get("key") for c in info["columns"]}
    gone = [c.path for c in schema.columns if c.key not in keys]
    if gone:
        raise SchemaMismatchError(
            f"{path}: the store's schema was changed (evolve dropped {gone}) since this "
            "reader opened it, so the records committed since have no values for them; "
            "open it again with pytreestore.open() to read them in the new schema"
        )
