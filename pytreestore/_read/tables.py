"""Records gathered from a store's tables (the axis tables' step of
:mod:`pytreestore._read.records`): one record exactly, many padded with a mask, flat
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

from pytreestore._commit.record import Commit
from pytreestore._format.ragged import LEAF, OFFSETS, PRESENCE
from pytreestore._format.schema import TreeSchema
from pytreestore._format.weak import ragged_weak
from pytreestore._read import cache as _cache
from pytreestore._read.ahead import JIT_MIN, RecordsBlock
from pytreestore._read.build import Padded, exact
from pytreestore._read.device import to_jax
from pytreestore._read.gather import Rows, gather, lengths, record_of
from pytreestore._read.index import rows
from pytreestore._read.placed import Placed, host_records, layouts_of, structure_keys, tags
from pytreestore._read.reader import ReadContext, explained
from pytreestore._read.request import LoadRequest
from pytreestore._tree.layout import Fixed, Kept, LayoutNode, Leaf, OptionalTree, RaggedList
from pytreestore._tree.pad import check_pad_to
from pytreestore.errors import (
    ArgumentTypeError,
    RaggedDeclarationError,
    RaggedLengthError,
    SchemaMismatchError,
    ShardingError,
)

FORMS = ("pad", "segments")
#: the key of an optional subtree's presence in the segments form: ``"present" + keypath``
#: (an axis's keypath never starts with a letter, so the two never meet)
PRESENT = "present"
ITER_BLOCK = 1024  # records gathered at once by iteration


class Segments(NamedTuple):
    """The elements of one ragged axis in the flat form, one entry per element.

    Attributes:
        record: the record (index into the selection) each element belongs to: the
            ``segment_ids`` of ``jax.ops.segment_sum(values, record, num_segments=records)``.
        parent: the row of the parent table (the element of the enclosing ragged list, or the
            record for a top-level axis) each element belongs to.
        position: each element's position in its list.
        valid: True for real elements, False for the padding that ``size=`` adds (whose
            ``record`` is the record count, out of range, so ``segment_sum`` drops them).
    """

    record: Any
    parent: Any
    position: Any
    valid: Any


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


def unsplit(request: LoadRequest) -> LoadRequest:
    """A sharded load of a ragged store as a load placed on that one sharding: the padded
    leaves (records first) are split along the record axis.

    Raises:
        ShardingError: ``pmap_devices=``, ``pad=``, or a sharding per column.
    """
    if not request.split:
        return request
    assert request.shardings is not None
    shardings = set(request.shardings)
    if request.pmap or request.pad or len(shardings) != 1 or None in shardings:
        raise ShardingError(
            "a ragged store's loads take one jax.sharding.Sharding for every leaf (sharding="
            "NamedSharding(mesh, P('data')) splits the padded records); pmap_devices=, pad= "
            "and a sharding per column apply to fixed stores only"
        )
    return dataclasses.replace(request, device=shardings.pop(), shardings=None)


def load(
    context: ReadContext,
    commit: Callable[[], Commit],
    request: LoadRequest,
    index: Any,
    options: RaggedRead,
) -> Any:
    """Records ``index``: one record exactly for an int, else the padded ``(batch, mask)``
    or the flat ``(values, segments)``."""
    request = unsplit(request)
    now = _commit(context, commit)
    selection = request.selection(index, now.records)
    if selection.scalar and context.ahead is not None:
        i = selection.index.start
        read = lambda i: _block(context, request, now, i)  # noqa: E731
        hit, record = context.ahead.record(request, i, read)
        if hit:
            context.check_not_replaced()  # the block belongs to the store opened
            return record
    records = rows(selection.index)
    gathered = _gather(context, request, now, records)
    spec = request.schema.layout.spec
    if selection.scalar:
        (record,) = exact(spec, gathered, None, 1)
        return _placed(record, request)
    if options.form == "segments":
        return _placed(Flat(gathered, request.schema, options.size).build(spec), request, True)
    longest = {a: int(v.max(initial=0)) for a, v in lengths(request.schema, gathered).items()}
    chosen = {c.path for c in request.specs}
    padder = Padded(
        gathered, longest, pad_to=options.pad_to, truncate=options.truncate, chosen=chosen
    )
    try:
        padded = padder.build(spec)
    except MemoryError as err:
        raise RaggedLengthError(
            f"padding {len(records)} records to pad_to={options.pad_to!r} needs more memory "
            f"than this machine has ({err}); choose a smaller pad_to, or load "
            "ragged='segments'"
        ) from None
    return _placed(padded, request, True)


def record_lengths(
    context: ReadContext, commit: Callable[[], Commit], schema: TreeSchema, index: Any
) -> dict[str, np.ndarray]:
    """Per ragged axis, each selected record's longest list there (offsets read only)."""
    now = _commit(context, commit)
    request = LoadRequest.build(schema, policy=False, columns=None)
    records = rows(request.selection(index, now.records).index)
    return lengths(schema, _gather(context, request, now, records, leaves=[]))


def iterate(
    context: ReadContext, commit: Callable[[], Commit], request: LoadRequest
) -> Iterator[Any]:
    """Every record exactly, gathered :data:`ITER_BLOCK` records at a time: the blocks
    ``store[i]`` in a loop reads (as numpy, the records built from the block's reads)."""
    now = _commit(context, commit)
    for start in range(0, now.records, ITER_BLOCK):
        block = _block(context, request, now, start)
        if request.as_numpy:
            yield from block.records  # each record's arrays are its own rows of the reads
        else:
            yield from (block.record(j) for j in range(block.count))


def _block(context: ReadContext, request: LoadRequest, now: Commit, start: int) -> RecordsBlock:
    """Records from ``start`` (:data:`ITER_BLOCK` of them, fewer at the end), exactly, for
    ``store[i]`` in a loop to read from; their rows placed on the device once when the
    records are wanted there (:mod:`pytreestore._read.placed`)."""
    records = np.arange(start, min(start + ITER_BLOCK, now.records))
    gathered = _gather(context, request, now, records)
    spec = request.schema.layout.spec
    build = functools.partial(exact, spec, gathered, None, len(records))
    if request.as_numpy:  # each record built by its structure's layout (views of the rows)
        build = functools.partial(_host_records, request, spec, gathered, len(records), build)
    device = request.device
    placed = None
    if (
        not request.as_numpy
        and len(records) >= JIT_MIN
        and (device is None or isinstance(device, jax.Device))
    ):
        placed = _on_device(request, spec, gathered, len(records))
    place = functools.partial(_placed, request=request)
    return RecordsBlock(request, start, len(records), build, place, placed)


@dataclasses.dataclass(frozen=True)
class _BlockRows:
    """A block's leaf columns (each table's rows of each leaf, numbered as the tags number
    them), where each record's rows start in each, and each record's structure key."""

    host: list[np.ndarray]
    paths: list[str]
    tables: list[str | None]
    starts: np.ndarray
    keys: list[Any]

    @classmethod
    def of(cls, schema: TreeSchema, gathered: dict[str | None, Rows], count: int) -> _BlockRows:
        host, paths, tables = [], [], []
        for table, table_rows in gathered.items():
            for key, array in table_rows.values.items():
                if key[0] == LEAF:
                    host.append(array)
                    paths.append(key[1])
                    tables.append(table)
        first = _first_rows(schema, gathered, count)
        starts = np.stack([first[t] for t in tables], axis=1) if tables else np.zeros((count, 0))
        parts = _structure(gathered, first, count)
        keys = structure_keys(parts) if parts else [()] * count
        return cls(host, paths, tables, starts, keys)

    @property
    def single(self) -> frozenset[int]:
        """The columns of the record table (a record holds one row of each)."""
        return frozenset(c for c, t in enumerate(self.tables) if t is None)

    def layouts(self, schema: TreeSchema, use: str) -> dict[Any, Any]:
        """The layouts the read's blocks share for ``use`` ("device" or "host")."""
        return layouts_of(schema, (use, tuple(self.paths), tuple(self.tables)))


def _host_records(
    request: LoadRequest,
    spec: LayoutNode,
    gathered: dict[str | None, Rows],
    count: int,
    fallback: Callable[[], list[Any]],
) -> list[Any]:
    """The block's records exactly, as numpy trees whose leaves are views of the gathered
    rows, each built by its structure's layout (:func:`~pytreestore._read.placed.host_records`)."""
    rows = _BlockRows.of(request.schema, gathered, count)
    if not rows.host:
        return fallback()
    return host_records(
        rows.host,
        rows.starts,
        rows.keys,
        lambda: _tags(spec, gathered, count),
        rows.single,
        rows.layouts(request.schema, "host"),
        fallback,
    )


def _on_device(
    request: LoadRequest, spec: LayoutNode, gathered: dict[str | None, Rows], count: int
) -> Placed | None:
    """The gathered leaf columns on the device, with where each record's rows start in
    them, and each record's tags (its structure, with each leaf's column and rows for
    values), built only when a record's structure is new to the read."""
    rows = _BlockRows.of(request.schema, gathered, count)
    if not rows.host:
        return None
    weak = {c.path for c in request.schema.columns if c.weak_type}
    return Placed.of(
        rows.host,
        rows.paths,
        rows.starts,
        lambda: _tags(spec, gathered, count),
        rows.single,
        device=request.device,
        cast=request.cast,
        layouts=rows.layouts(request.schema, "device"),
        weak=[p in weak for p in rows.paths] if weak else None,
        keys=rows.keys,
    )


def _structure(
    gathered: dict[str | None, Rows], first: dict[str | None, np.ndarray], count: int
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Per table with offsets or presence arrays, each row's lengths and presence flags,
    and the bounds of each record's rows there (None: the record table): what
    :func:`~pytreestore._read.placed.structure_keys` tells records' structures by."""
    parts = []
    for table, table_rows in gathered.items():
        codes = []
        for key, array in table_rows.values.items():
            if key[0] == OFFSETS:
                codes.append(array[1] - array[0])  # (starts, ends): each row's length
            elif key[0] == PRESENCE:
                codes.append(array)
        if codes:
            bounds = None if table is None else np.append(first[table], table_rows.count)
            parts.append((np.stack(codes, axis=1).astype(np.int64), bounds))
    return parts


def _first_rows(
    schema: TreeSchema, gathered: dict[str | None, Rows], count: int
) -> dict[str | None, np.ndarray]:
    """Per table, the row where each record's rows start (a record's rows are consecutive:
    gathered in record order)."""
    records = np.arange(count)
    return {t: np.searchsorted(r, records) for t, r in record_of(schema, gathered).items()}


def _tags(spec: LayoutNode, gathered: dict[str | None, Rows], count: int) -> list[Any]:
    """Each record built with each leaf's values replaced by their tags (column, row)."""
    column = 0
    tagged: dict[str | None, Rows] = {}
    for table, table_rows in gathered.items():
        values = dict(table_rows.values)
        for key, array in table_rows.values.items():
            if key[0] == LEAF:
                values[key] = tags(column, len(array))
                column += 1
        tagged[table] = dataclasses.replace(table_rows, values=values)
    return exact(spec, tagged, None, count)


def _commit(context: ReadContext, commit: Callable[[], Commit]) -> Commit:
    context.readable()  # commits a writer's pending records first
    return commit()


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


class Flat:
    """Builds ``(values, segments)``: each leaf's gathered rows as they are, per ragged axis
    the record, parent and position of each element (padded to ``size``), and per optional
    subtree its presence in each row of its table, under ``"present" + keypath``."""

    def __init__(self, gathered: dict[str | None, Rows], schema: TreeSchema, size: int | None):
        self.rows = gathered
        self.size = size
        self.segments: dict[str, Any] = {}
        n = gathered[None].count
        records = record_of(schema, gathered)
        for a in schema.tables.axes:
            rows = gathered[a.path]
            assert rows.parent is not None and rows.position is not None
            self.segments[a.path] = Segments(  # int32: JAX's index type without x64
                self._pad(records[a.path].astype(np.int32), n, a.path),
                self._pad(rows.parent.astype(np.int32), gathered[a.table].count, a.path),
                self._pad(rows.position.astype(np.int32), 0, a.path),
                self._pad(np.ones(rows.count, bool), False, a.path),
            )

    def _pad(self, values: np.ndarray, fill: Any, axis: str) -> np.ndarray:
        if self.size is None:
            return values
        if len(values) > self.size:
            raise RaggedLengthError(
                f"the selection holds {len(values)} elements at {axis or 'the root'}, more "
                f"than size={self.size}; raise size, or load fewer records"
            )
        out = np.full((self.size, *values.shape[1:]), fill, values.dtype)
        out[: len(values)] = values
        return out

    def build(self, spec: LayoutNode) -> tuple[Any, dict[str, Any]]:
        return self.node(spec, None), self.segments

    def node(self, spec: LayoutNode | None, table: str | None) -> Any:
        if isinstance(spec, Leaf):
            table = table if spec.axis is None else spec.axis.path
            values = self.rows[table].values.get((LEAF, spec.path))
            if values is None or table is None:
                return values
            return self._pad(values, 0, table)
        if isinstance(spec, Kept):
            return spec.value
        if isinstance(spec, RaggedList):
            return None if spec.element is None else self.node(spec.element, spec.axis.path)
        if isinstance(spec, OptionalTree):
            present = self.rows[table].values[(PRESENCE, spec.path)]
            self.segments[PRESENT + spec.path] = (
                present if table is None else self._pad(present, False, table)
            )
            return None if spec.inner is None else self.node(spec.inner, table)
        assert isinstance(spec, Fixed), spec
        return spec.treedef.unflatten([self.node(c, table) for c in spec.children])


__all__ = [
    "FORMS",
    "RaggedRead",
    "Segments",
    "check_fixed",
    "iterate",
    "load",
    "record_lengths",
]
