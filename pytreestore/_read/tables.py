"""Records gathered from a store's tables (the axis tables' step of
:mod:`pytreestore._read.engine`): one record exactly, many padded with a mask, flat
segments, and lengths (``TreeStore.load``, ``store[i]``, iteration and ``TreeStore.lengths``).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ragged-load", {"p": [np.int32(0)]},
    ...                        ragged=["['p']"])
    >>> s.extend([{"p": [np.int32(1), np.int32(2)]}, {"p": []}])
    >>> s[1], s.load(as_numpy=True)[1]["p"].tolist()
    ({'p': []}, [[True, True], [False, False]])
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

from pytreestore._format.dtypes import ragged_weak, weaken
from pytreestore._format.ragged import PRESENCE
from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._read import cache as _cache
from pytreestore._read import sharded as _sharded
from pytreestore._read import slabs as _hostpool
from pytreestore._read import slabs as _slabs
from pytreestore._read.ahead import RecordsBlock, host_block, on_device
from pytreestore._read.build import PRESENT, Flat, Padded, Segments, exact
from pytreestore._read.gather import Rows, gather, lengths
from pytreestore._read.index import Selection, rows
from pytreestore._read.place import fitted, jax_ready, to_jax
from pytreestore._read.reader import ReadContext, explained, holding
from pytreestore._read.request import LoadRequest
from pytreestore._runtime import RUNTIME
from pytreestore._tree.pad import check_pad_to
from pytreestore.errors import (
    ArgumentTypeError,
    RaggedDeclarationError,
    RaggedLengthError,
    SchemaMismatchError,
    ShardingError,
)

FORMS = ("pad", "segments")


@dataclasses.dataclass(frozen=True)
class RaggedRead:
    """The ragged part of a read: its form and padding options, checked."""

    form: str = "pad"
    pad_to: Any = None
    truncate: bool = False
    size: int | None = None

    @classmethod
    def build(cls, ragged: Any, pad_to: Any, truncate: Any, size: Any) -> RaggedRead:
        if ragged not in FORMS:
            raise RaggedDeclarationError(f"ragged= takes 'pad' or 'segments', got {ragged!r}")
        if not isinstance(truncate, bool):
            raise ArgumentTypeError(f"truncate must be a bool, got {truncate!r}")
        if size is not None and (
            not isinstance(size, int | np.integer) or isinstance(size, bool | np.bool_) or size < 0
        ):
            raise RaggedDeclarationError(f"size= takes an int >= 0 (elements), got {size!r}")
        size = None if size is None else int(size)
        if ragged == "pad" and size is not None:
            raise RaggedDeclarationError("size= applies to ragged='segments'; use pad_to= to pad")
        if ragged == "segments" and pad_to is not None:
            raise RaggedDeclarationError("pad_to= applies to ragged='pad'; use size= for segments")
        return cls(ragged, check_pad_to(pad_to), truncate, size)


def check_fixed(path: str, ragged: Any, pad_to: Any, truncate: Any, size: Any) -> None:
    """Refuses the ragged read options for a store without ragged axes."""
    if (ragged, pad_to, truncate, size) != ("pad", None, False, None):
        raise RaggedDeclarationError(
            f"store {path} was created without ragged= or optional=, so its records all have "
            "one structure; ragged=, pad_to=, trim= and size= do not apply"
        )


def split_form(request: LoadRequest, form: str) -> LoadRequest:
    """THE ONE REFUSAL of a split load (``sharding=``, ``pmap_devices=``, ``pad=``) of a
    ragged store. ``ragged="pad"`` takes them all, as a fixed store does: its leaves and
    masks are records first (:func:`_split`). The segments form's leaves are flat along
    each ragged axis, with no record axis to split per device or to pad, so it takes one
    sharding, on which every flat array is placed (as ``device=`` places them).

    Raises:
        ShardingError: ``ragged="segments"`` with ``pmap_devices=``, ``pad=`` or a sharding
            per column.
    """
    if not request.split or form == "pad":
        return request
    assert request.shardings is not None
    shardings = set(request.shardings)
    if request.pmap or request.pad or len(shardings) != 1:
        raise ShardingError(
            "ragged='segments' gives each leaf flat along its ragged axis, with no record "
            "axis to split per device or pad, so it takes one jax.sharding.Sharding for every "
            "leaf; pmap_devices=, pad= and a sharding per column apply to ragged='pad' loads "
            "(the padded leaves and masks are records first)"
        )
    return dataclasses.replace(request, device=shardings.pop(), shardings=None)


@holding
def load(
    context: ReadContext,
    commit: Callable[[], Commit],
    request: LoadRequest,
    index: Any,
    options: RaggedRead,
) -> Any:
    """Records ``index``: one record exactly for an int, else the padded ``(batch, mask)``
    or the flat ``(values, segments)``."""
    request = split_form(request, options.form)
    now = _commit(context, commit)
    selection = request.selection(index, now.records, now.first)
    if selection.scalar and context.ahead is not None:
        i = selection.index.start
        read = lambda i: _block(context, request, now, i)  # noqa: E731
        hit, record = context.ahead.record(request, i, read)
        if hit:
            context.check_not_replaced()  # the block belongs to the store opened
            return record
    if not selection.scalar and options.form == "pad":
        return _padded(context, request, now, selection, options)
    gathered = _gather(context, request, now, rows(selection.index))
    spec = request.schema.layout.spec
    if selection.scalar:
        (record,) = exact(spec, gathered, None, 1)
        return _placed(record, request)
    return _placed(Flat(gathered, request.schema, options.size).build(spec), request, True)


def _padded(
    context: ReadContext, request: LoadRequest, now: Commit, selection: Selection, options: Any
) -> Any:
    """The padded ``(batch, mask)`` of ``selection``: as numpy, placed (in slabs when big,
    :func:`_in_slabs`), or split over the request's shardings (:func:`_split`)."""
    slabbed = _in_slabs(context, request, now, selection, options)
    if slabbed is not None:
        return slabbed
    gathered = _gather(context, request, now, rows(selection.index))
    if not request.split:
        return from_rows(request, gathered, options)
    return _split(_build(gathered, _longest(request.schema, gathered), request, options), request)


def from_rows(request: LoadRequest, gathered: dict[str | None, Rows], options: RaggedRead) -> Any:
    """The padded ``(batch, mask)`` of rows gathered elsewhere too (a replay buffer's rings,
    :mod:`pytreestore._pipelines.replay`), placed as ``request`` asks."""
    pair = _build(gathered, _longest(request.schema, gathered), request, options)
    return _placed(pair, request, True)


def _longest(schema: TreeSchema, gathered: dict[str | None, Rows]) -> dict[str, int]:
    """Per ragged axis, the longest list among the gathered records."""
    return {a: int(v.max(initial=0)) for a, v in lengths(schema, gathered).items()}


def _build(
    gathered: dict[str | None, Rows],
    longest: dict[str, int],
    request: LoadRequest,
    options: Any,
    zeros: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.zeros,
) -> Any:
    """``(batch, mask)`` of the gathered rows, padded to ``longest`` as ``pad_to`` says."""
    chosen = {c.path for c in request.specs}
    padder = Padded(
        gathered,
        longest,
        pad_to=options.pad_to,
        truncate=options.truncate,
        chosen=chosen,
        zeros=zeros,
    )
    try:
        return padder.build(request.schema.layout.spec)
    except MemoryError as err:
        raise RaggedLengthError(
            f"padding {gathered[None].count} records to pad_to={options.pad_to!r} needs more "
            f"memory than this machine has ({err}); choose a smaller pad_to, or load "
            "ragged='segments'"
        ) from None


class Outputs(NamedTuple):
    """A padded pair's leaves, and which of them carry the record axis (:func:`outputs`)."""

    treedef: Any
    leaves: list[Any]
    keypaths: list[tuple[Any, ...]]
    placed: list[int]  # the leaves placed: the chosen columns' values, and the masks
    columns: list[int | None]  # each one's position among the chosen columns (None: none)


def outputs(pair: Any, request: LoadRequest) -> Outputs:
    """The leaves of a padded ``(batch, mask)``: a leaf placed with the record axis is a
    chosen column's values (its keypath the column's without ``[*]``) or a mask; a kept
    (constant) value stays as it is."""
    flat, treedef = tree_flatten_with_path(pair, is_leaf=lambda x: x is None)
    columns = request.schema.columns
    of_path = {columns[i].path.replace("[*]", ""): k for k, i in enumerate(request.chosen)}
    placed, chosen = [], []
    for n, (keypath, leaf) in enumerate(flat):
        column = of_path.get(keystr(keypath[1:]))
        if isinstance(leaf, np.ndarray) and (column is not None or keypath[0].idx == 1):
            placed.append(n)
            chosen.append(column)
    return Outputs(treedef, [x for _, x in flat], [k for k, _ in flat], placed, chosen)


def _split(pair: Any, request: LoadRequest) -> Any:
    """``(batch, mask)`` split over the request's shardings as a fixed store's columns are:
    each leaf and its mask by its column's sharding (the mask's cut to its axes), the record
    axis padded with ``pad=`` (mask False there), laid out per device with ``pmap_devices=``."""
    out = outputs(pair, request)
    assert request.shardings is not None
    arrays, columns, shardings = [], [], []
    for n, column in zip(out.placed, out.columns):
        path = keystr(out.keypaths[n][1:]) if column is None else request.specs[column].path
        array = jax_ready(out.leaves[n], path, request.cast)
        sharding = request.shardings[column or 0]
        arrays.append(array)
        columns.append((path, array.dtype, array.shape[1:]))
        shardings.append(sharding if request.pmap else fitted(sharding, array.ndim))
    placed = _sharded.place(arrays, columns, shardings, pad=request.pad, pmap=request.pmap)
    return _rebuilt(out, placed, request)


def _rebuilt(out: Outputs, placed: Sequence[Any], request: LoadRequest) -> Any:
    """The pair of ``out`` with its placed leaves replaced by ``placed``, weak types kept."""
    leaves = list(out.leaves)
    for n, array in zip(out.placed, placed):
        leaves[n] = array
    leaves = weaken(leaves, _weak(request.schema, out.keypaths, True))
    return out.treedef.unflatten(leaves)


def _in_slabs(
    context: ReadContext, request: LoadRequest, now: Commit, selection: Selection, options: Any
) -> Any | None:
    """A big padded load onto one accelerator in slabs of records (:mod:`pytreestore._read.
    slabs`), as a fixed store's: the lengths read first (offsets only), then each slab's
    rows gathered and padded to them in a reused host buffer, copied while the next slabs
    are read, and the slabs joined on the device. None: read whole."""
    index = selection.index
    if request.as_numpy or request.split:
        return None
    if _slabs.planned(index, RUNTIME.reads.slab_min_bytes, request.device) is None:
        return None  # an index array, or not onto an accelerator
    if _stored_nbytes(request, now, selection.count) < RUNTIME.reads.slab_min_bytes // 2:
        return None
    schema = request.schema
    longest = _longest(schema, _gather(context, request, now, rows(index), leaves=[]))
    empty = _gather(context, request, now, np.arange(0))
    out = outputs(_build(empty, longest, request, options), request)
    shapes = [(out.leaves[n].shape[1:], out.leaves[n].dtype) for n in out.placed]
    per_record = sum(int(np.prod(s, dtype=np.int64)) * d.itemsize for s, d in shapes)
    if _slabs.planned(index, per_record * selection.count, request.device) is None:
        return None

    def read(piece: _slabs.Piece, buffer: Callable[[int], np.ndarray]) -> list[np.ndarray]:
        count = piece.rows.stop - piece.rows.start
        arena = _hostpool.Arena(buffer(_hostpool.nbytes([((count, *s), d) for s, d in shapes])))
        gathered = _gather(context, request, now, np.arange(piece.rows.start, piece.rows.stop))
        got = outputs(_build(gathered, longest, request, options, arena.zeros), request)
        paths = [keystr(out.keypaths[n][1:]) for n in out.placed]
        return [jax_ready(got.leaves[n], p, request.cast) for n, p in zip(got.placed, paths)]

    chosen = tuple(range(len(out.placed)))
    slabs = _slabs.plan_slabs(index, schema.chunk_records, per_record, RUNTIME.reads.slab_bytes)
    pieces = [_slabs.Piece(chosen, r) for r in slabs]
    return _rebuilt(out, _slabs.load(read, pieces, len(chosen), request.device), request)


def _stored_nbytes(request: LoadRequest, now: Commit, count: int) -> float:
    """About the bytes ``count`` records of the chosen columns take as stored (each table's
    rows per record on average)."""
    per = max(now.records, 1)
    return count * sum(c.record_nbytes * now.rows(c.table) / per for c in request.specs)


@holding
def record_lengths(
    context: ReadContext, commit: Callable[[], Commit], schema: TreeSchema, index: Any
) -> dict[str, np.ndarray]:
    """Per ragged axis, each selected record's longest list there (offsets read only)."""
    now = _commit(context, commit)
    request = LoadRequest.build(schema, policy=False, columns=None)
    records = rows(request.selection(index, now.records, now.first).index)
    return lengths(schema, _gather(context, request, now, records, leaves=[]))


def iterate(
    context: ReadContext, commit: Callable[[], Commit], request: LoadRequest
) -> Iterator[Any]:
    """Every record exactly, gathered ``RUNTIME.reads.iter_block`` records at a time: the blocks
    ``store[i]`` in a loop reads (as numpy, the records built from the block's reads)."""
    with context.held() as lent:
        now = _commit(lent, commit)
    for start in range(now.first, now.records, RUNTIME.reads.iter_block):
        with context.held() as lent:  # each block's read, not the caller's loop
            block = _block(lent, request, now, start)
        if request.as_numpy:
            yield from block.records  # each record's arrays are its own rows of the reads
        else:
            yield from (block.record(j) for j in range(block.count))


def _block(context: ReadContext, request: LoadRequest, now: Commit, start: int) -> RecordsBlock:
    """Records from ``start`` (``RUNTIME.reads.iter_block`` of them, fewer at the end), exactly, for
    ``store[i]`` in a loop to read from; their rows placed on the device once when the
    records are wanted there (:mod:`pytreestore._read.placed`)."""
    records = np.arange(start, min(start + RUNTIME.reads.iter_block, now.records))
    gathered = _gather(context, request, now, records)
    spec = request.schema.layout.spec
    build = functools.partial(exact, spec, gathered, None, len(records))
    if request.as_numpy:  # each record built by its structure's layout (views of the rows)
        build = functools.partial(host_block, request, spec, gathered, len(records), build)
    device = request.device
    placed = None
    if (
        not request.as_numpy
        and len(records) >= RUNTIME.reads.ahead_jit_min
        and (device is None or isinstance(device, jax.Device))
    ):
        placed = on_device(request, spec, gathered, len(records))
    place = functools.partial(_placed, request=request)
    return RecordsBlock(request, start, len(records), build, place, placed)


def _commit(context: ReadContext, commit: Callable[[], Commit]) -> Commit:
    """The commit the read sees (a writer's: its buffered rows counted, none committed)."""
    if context.view is not None:
        return context.view.commit
    context.readable()
    return commit()


@holding
def table_rows(
    context: ReadContext,
    commit: Callable[[], Commit],
    request: LoadRequest,
    start: int,
    stop: int,
) -> dict[str | None, Rows]:
    """The rows of every table that records ``[start, stop)`` hold, at the commit a read
    sees now: each table's a run of consecutive rows, in order (``copy`` appends them as
    they are). Record ``i`` is row ``first + i`` of the record table (a released front)."""
    now = _commit(context, commit)
    return _gather(context, request, now, np.arange(start, stop) + now.first)


def check_learnt(schema: TreeSchema, gathered: dict[str | None, Rows], where: str) -> None:
    """Raises SchemaMismatchError when the rows read hold a structure that was still pending
    when this reader read the schema (a writer has learnt it since)."""
    for path in schema.pending:
        rows = gathered.get(path)
        learnt = rows is not None and rows.count > 0
        for table_rows in gathered.values():
            present = table_rows.values.get((PRESENCE, path))
            learnt = learnt or (present is not None and bool(np.any(present)))
        if learnt:
            raise SchemaMismatchError(
                f"{where}: records read hold the structure at {path or 'the root'}, which "
                "a writer learnt after this reader read the schema; call store.refresh() "
                "(or open the store again) to read them"
            )


def _gather(
    context: ReadContext,
    request: LoadRequest,
    commit: Commit,
    records: np.ndarray,
    leaves: Sequence[Any] | None = None,
) -> dict[str | None, Rows]:
    with explained(context, request.schema), context.reading() as backend:
        columns = request.schema.table_columns  # packed leaves by their own keys
        unit = context.unit(request.schema)
        read = _cache.reader(context.cache, context.cache_id, backend, columns, unit)
        read = context.overlaid(read)  # rows only a writer's memory holds, from it
        chosen = request.specs if leaves is None else leaves
        out = gather(request.schema, commit, records, read, leaves=chosen)
    context.check_not_replaced()
    if leaves is None:
        check_learnt(request.schema, out, context.path)
    return out


def _placed(tree: Any, request: LoadRequest, pair: bool = False) -> Any:
    """``tree`` with its array leaves on the device (unless ``as_numpy``); ``pair``: a
    ``(values, mask or segments)`` pair of the padded or segments form, not one record."""
    if request.as_numpy:
        return tree
    pairs, treedef = tree_flatten_with_path(tree, is_leaf=lambda x: x is None)
    paths, leaves = [keystr(p) for p, _ in pairs], [x for _, x in pairs]
    arrays = [x if isinstance(x, np.ndarray | np.generic) else None for x in leaves]
    try:
        placed = to_jax(
            [None if a is None else np.asarray(a) for a in arrays],
            paths,
            device=request.device,
            cast=request.cast,
            weak=_weak(request.schema, [p for p, _ in pairs], pair),
        )
    except ValueError as err:  # a sharding that does not divide the padded shapes
        raise ShardingError(
            f"cannot place the loaded records on {request.device}: {err}. Load a record "
            "count the sharding divides, or pad_to= a length it divides"
        ) from None
    return treedef.unflatten([p if a is not None else x for p, a, x in zip(placed, arrays, leaves)])


def _weak(schema: TreeSchema, keypaths: list[tuple[Any, ...]], pair: bool) -> list[bool] | None:
    """Whether each leaf read (at ``keypaths``) is of a weak column; None: no column is."""
    if schema.weak is None:
        return None
    weak = {c.path for c in schema.columns if c.weak_type}
    lists = {a.path for a in schema.tables.axes} - set(schema.paths)  # not leading axes
    if not pair:
        return ragged_weak(keypaths, weak, lists, exact=True)
    values = ragged_weak([kp[1:] for kp in keypaths], weak, lists, exact=False)
    return [w and kp[0].idx == 0 for w, kp in zip(values or (), keypaths)]  # [1]: mask


__all__ = [
    "FORMS",
    "PRESENT",
    "RaggedRead",
    "Segments",
    "check_fixed",
    "from_rows",
    "iterate",
    "load",
    "record_lengths",
    "table_rows",
]
