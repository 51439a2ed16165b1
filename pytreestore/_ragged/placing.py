"""Committing fragments to a ragged or optional store: every table's rows placed after its
committed rows, offsets rebased, structures the fragments learnt learnt by the store, one
commit (issue 17). :mod:`pytreestore._ragged.fragments` writes such fragments.

The steps of :func:`commit`, run by the store's writer once every fragment has passed the
checks of :func:`pytreestore._commit.fragments.check` (store, committed already, files):

1. **Structures, checked in memory.** A fragment written with the store's schema of now
   holds exactly its arrays. Any other (the fragment learnt a structure the store had
   pending, or the store learnt one since the fragment was written) has its schema read from
   its folder and merged into the store's, fragment after fragment, as a record showing
   those structures would be (:func:`~pytreestore._ragged.model.grow_schema`). A structure
   that departs from the store's, or a leaf whose dtype or shape differs from what the store
   learnt meanwhile, refuses the call, naming the keypath; nothing is written.
2. **Learnt.** If the fragments show structures the store has pending, the writer commits
   its buffered records and takes the grown schema
   (:meth:`~pytreestore._ragged.writer.RaggedWriter.use_schema`): the new arrays are created
   at their tables' committed rows and the schema is replaced in one atomic put, the step an
   ``append`` of a record showing them takes. It commits no record: a crash after it leaves
   every committed record, and a schema that knows the structures.
3. **Placed**, in one :func:`~pytreestore._commit.atomic.atomic` block with step 4: every
   table grows to its new rows; fragment ``k``'s rows of table ``t`` go to rows from
   ``base[k][t]``, the table's committed rows plus the fragments' before ``k``. An offsets
   array of axis ``a`` is read and written with ``base[k][a]`` added (offsets are absolute
   rows of the axis's table). A leaf or presence array whose rows start at a chunk boundary
   of its table has its encoded chunks placed unchanged
   (:class:`~pytreestore.backends.ChunkCopies`: hard links locally; raw bytes elsewhere);
   any other is read and written again. An array the fragment lacks (a structure it never
   saw) gets what an absent subtree or an empty list gets: zeros, False, offsets that add
   no element. Fragments go 32 at a time: their arrays are read on threads, and the rows of
   consecutive fragments of one table are written in one call.
4. **Committed**: one commit record with the records and every table's rows, listing the
   fragments' ids.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-placing", {"p": [], "n": np.int8(0)},
    ...                        ragged=["['p']"])
    >>> f = pytreestore.write_fragment("memory://doc-placing", [{"p": [1.5], "n": 1}])
    >>> s.schema.pending, f.tables
    (("['p']",), (("['p']", 1),))
    >>> s.commit_fragments([f]); s.schema.pending, s[0]["p"][0].item()
    ((), 1.5)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pytreestore._commit.atomic import atomic
from pytreestore._commit.fragment import Fragment
from pytreestore._commit.layouts import column_layouts
from pytreestore._commit.placing import place_chunks
from pytreestore._commit.record import Commit
from pytreestore._commit.tables import table_schemas
from pytreestore._format import validate as _validate
from pytreestore._format.columns import ColumnSpec
from pytreestore._format.dtypes import describe
from pytreestore._format.ragged import OFFSETS, slot
from pytreestore._format.schema import TreeSchema
from pytreestore._ragged.fragments import array_layouts, read_schema
from pytreestore._ragged.model import grow_schema, representative
from pytreestore._ragged.writer import RaggedWriter
from pytreestore.backends import Backend
from pytreestore.errors import (
    CorruptChunkError,
    CorruptStoreError,
    FragmentError,
    PyTreeStoreError,
    SchemaMismatchError,
)

#: fragments placed at once: their rewritten rows are held in memory together
_WINDOW = 32
#: fragments' arrays read at once
_THREADS = 8


@dataclasses.dataclass(frozen=True)
class _Part:
    """One fragment, the schema it was written with, and the first store row of each of
    its tables' rows."""

    fragment: Fragment
    schema: TreeSchema
    base: dict[str | None, int]


def commit(
    engine: Backend, writer: RaggedWriter, fragments: Sequence[Fragment], where: str, like: Any
) -> None:
    """Steps 1 to 4 of the module: appends ``fragments`` (checked by
    :func:`pytreestore._commit.fragments.check`) through the store's ``writer``.

    Raises:
        FragmentError: a fragment's structure or arrays do not fit the store's, or its files
            are incomplete; nothing of the fragments is committed.
        CommitConflictError: another writer committed meanwhile; nothing is committed.
    """
    own = [_schema_of(engine, f, writer.schema, where, like) for f in fragments]
    grown = learnt(writer.schema, fragments, own, _rows_of(writer))
    writer.flush()
    committer = writer.committer
    committer.check()  # another writer committed: nothing is placed
    if any(f.records for f in fragments):  # rows past a truncate: its older versions
        committer.release()  # give them up (fragments of no records write none)
    if grown is not writer.schema:
        writer.use_schema(grown)
    schema, head = writer.schema, committer.commit
    parts, totals = _plan(schema, fragments, own, head)
    tables = table_schemas(schema)
    try:
        with atomic(engine):
            for t, sub in tables.items():
                if totals[t] != head.rows(t):
                    engine.resize([c.key for c in sub.columns], totals[t])
            _place_all(engine, tables, parts)
            rows = {t: n for t, n in totals.items() if t is not None}
            committer.advance(totals[None], rows, fragments=tuple(f.id for f in fragments))
    except FragmentError:
        with contextlib.suppress(PyTreeStoreError):  # rows past the commit: harmless
            for t, sub in tables.items():
                engine.resize([c.key for c in sub.columns], head.rows(t))
        raise


def _rows_of(writer: RaggedWriter) -> Callable[[str | None], int]:
    """Each table's rows once the writer has committed what it buffers."""
    return lambda t: len(writer.tables[t]) if t in writer.tables else 0


def _schema_of(
    engine: Backend, fragment: Fragment, schema: TreeSchema, where: str, like: Any
) -> TreeSchema:
    own = schema if fragment.schema == _validate.id_of(schema) else None
    own = own or read_schema(engine, fragment, where, like=like)
    axes = {a.path for a in own.ragged.axes} if own.ragged is not None else None
    if fragment.tables is None or {t for t, _ in fragment.tables} != axes:
        raise FragmentError(
            f"fragment {fragment.id} does not describe the tables of its schema (its tables "
            f"{dict(fragment.tables or {})}, its schema's ragged axes {sorted(axes or ())}); "
            "write it again. Nothing was committed."
        )
    return own


def learnt(
    schema: TreeSchema,
    fragments: Sequence[Fragment],
    own: Sequence[TreeSchema],
    rows: Callable[[str | None], int],
) -> TreeSchema:
    """``schema`` grown by the structures of every fragment's schema ``own`` (``schema``
    itself when they show none it lacks), new arrays starting at ``rows`` of their tables.

    Raises:
        FragmentError: a fragment's structure departs from the store's, or one of its
            arrays differs from the store's array at that keypath.
    """
    now, merged_in = schema, {_validate.id_of(schema)}  # schemas whose structures it has
    for i, (fragment, mine) in enumerate(zip(fragments, own)):
        if _validate.id_of(mine) in merged_in:  # many fragments share one schema
            continue
        try:
            merged = grow_schema(now, representative(mine.layout.spec), rows)
        except (SchemaMismatchError, ValueError) as err:
            raise FragmentError(
                f"fragment {fragment.id} (item {i}) holds records whose structure departs "
                f"from the store's: {err}. Nothing was committed."
            ) from err
        _check_arrays(mine, merged, fragment, i)
        if merged.to_json() != now.to_json():
            now = merged
        merged_in.add(_validate.id_of(mine))
    return now


def _check_arrays(mine: TreeSchema, merged: TreeSchema, fragment: Fragment, i: int) -> None:
    stored = {slot(c): c for c in merged.storage_columns}
    for c in mine.storage_columns:
        there = stored.get(slot(c))
        if there is None or (there.dtype, there.shape, there.table) != (c.dtype, c.shape, c.table):
            found = "nothing" if there is None else describe(there.dtype, there.shape)
            raise FragmentError(
                f"fragment {fragment.id} (item {i}) holds {describe(c.dtype, c.shape)} at "
                f"{c.path or 'the root'}, where the store holds {found}: the store learnt that "
                "structure from another record or fragment after this fragment was written. "
                "Write the fragment again (write_fragment checks records against the store's "
                "schema of now). Nothing was committed."
            )


def _plan(
    schema: TreeSchema, fragments: Sequence[Fragment], own: Sequence[TreeSchema], head: Commit
) -> tuple[list[_Part], dict[str | None, int]]:
    """Each fragment's first store row per table, and every table's rows after them all."""
    info = schema.ragged
    assert info is not None
    at = {t: head.rows(t) for t in info.tables()}
    parts = []
    for fragment, mine in zip(fragments, own):
        parts.append(_Part(fragment, mine, dict(at)))
        for t in at:
            at[t] += fragment.rows(t)
    return parts, at


@dataclasses.dataclass
class _TablePlan:
    """How one fragment's rows of one table are placed: chunks linked or copied (``pairs``),
    arrays read and written again (``read``: store column, fragment column), arrays made
    (``made``: store column, rows), from store row ``base`` on, ``rows`` of them."""

    part: _Part
    table: str | None
    base: int
    rows: int
    pairs: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    read: list[tuple[ColumnSpec, ColumnSpec]] = dataclasses.field(default_factory=list)
    made: list[tuple[ColumnSpec, np.ndarray]] = dataclasses.field(default_factory=list)


def _place_all(engine: Backend, tables: dict[str | None, TreeSchema], parts: list[_Part]) -> None:
    """Writes every part's rows of every table at its bases, :data:`_WINDOW` fragments at a
    time (their rewritten rows are held in memory together).

    Raises:
        FragmentError: one of a fragment's arrays is missing a chunk or rows.
    """
    for i in range(0, len(parts), _WINDOW):
        _place(engine, tables, parts[i : i + _WINDOW])


def _place(engine: Backend, tables: dict[str | None, TreeSchema], parts: list[_Part]) -> None:
    plans = [
        _plan_table(sub, t, part)
        for part in parts
        for t, sub in tables.items()
        if part.fragment.rows(t)
    ]
    with _owned(parts):
        place_chunks(engine, [pair for plan in plans for pair in plan.pairs])
    reading = [plan for plan in plans if plan.read]
    lays = [lay for plan in reading for lay in _read_layouts(plan)]
    if lays:
        engine.open_columns(lays)
    with ThreadPoolExecutor(_THREADS) as pool:  # reads of the fragments' own arrays only
        blocks = dict(zip(map(id, reading), pool.map(lambda plan: _read(engine, plan), reading)))
    for table in tables:
        _write_table(engine, [p for p in plans if p.table == table], blocks)


def _plan_table(table: TreeSchema, name: str | None, part: _Part) -> _TablePlan:
    plan = _TablePlan(part, name, part.base[name], part.fragment.rows(name))
    mine = {slot(c): c for c in part.schema.storage_columns}
    aligned = plan.base % table.chunk_records == 0
    for c in table.columns:
        own = mine.get(slot(c))
        if own is None:  # what a record without the structure holds there
            offset = part.base[c.path] if c.role == OFFSETS else 0
            plan.made.append((c, np.full((plan.rows, *c.shape), offset, c.dtype)))
        elif c.role != OFFSETS and aligned and _same(own, c, part, table):
            first = plan.base // table.chunk_records
            plan.pairs.extend(_pairs(part.fragment, own, c, plan.rows, first))
        else:
            plan.read.append((c, own))
    return plan


def _read_layouts(plan: _TablePlan) -> list[Any]:
    return array_layouts([own for _, own in plan.read], plan.part.schema, plan.part.fragment)


def _read(engine: Backend, plan: _TablePlan) -> list[np.ndarray]:
    """The fragment's rows of ``plan``'s read arrays, offsets rebased."""
    with _owned([plan.part]):
        keys = [lay.key for lay in _read_layouts(plan)]
        got = engine.read(keys, slice(0, plan.rows), plan.rows)
    base = plan.part.base
    return [b + base[c.path] if c.role == OFFSETS else b for (c, _), b in zip(plan.read, got)]


def _write_table(engine: Backend, plans: list[_TablePlan], blocks: dict[int, Any]) -> None:
    """Each plan's read and made rows, consecutive plans of the same arrays in one write."""
    keys: list[str] = []
    start, parts = 0, []
    for plan in plans:
        columns = [c.key for c, _ in plan.read] + [c.key for c, _ in plan.made]
        rows = blocks.get(id(plan), []) + [b for _, b in plan.made]
        if columns != keys or start + sum(len(p[0]) for p in parts) != plan.base:
            _write_rows(engine, keys, start, parts)
            keys, start, parts = columns, plan.base, []
        if columns:
            parts.append(rows)
    _write_rows(engine, keys, start, parts)


def _write_rows(engine: Backend, keys: list[str], start: int, parts: list[Any]) -> None:
    if keys and parts:
        engine.write(keys, start, [np.concatenate(cols) for cols in zip(*parts)])


@contextlib.contextmanager
def _owned(parts: Sequence[_Part]) -> Iterator[None]:
    """Reports a chunk or rows missing from a fragment's arrays as that fragment's
    FragmentError (nothing is committed)."""
    try:
        yield
    except (CorruptChunkError, CorruptStoreError) as err:  # a chunk or an array's rows gone
        where = str(getattr(err, "key", None) or getattr(err, "path", None) or err)
        owner = next((p.fragment for p in parts if p.fragment.folder in where), None)
        owner = owner or (parts[0].fragment if len(parts) == 1 else None)
        name = f"fragment {owner.id}" if owner is not None else "a fragment"
        raise FragmentError(
            f"{name} is incomplete: {err}. Its files were changed or partly deleted after it "
            "was written; write it again. Nothing was committed."
        ) from err


def _same(own: ColumnSpec, column: ColumnSpec, part: _Part, table: TreeSchema) -> bool:
    """Whether the fragment's array is laid out as the store's (its chunks copy as they are)."""
    a = column_layouts([own], part.schema.codec)[0]
    b = column_layouts([column], table.codec)[0]
    return dataclasses.replace(a, key="") == dataclasses.replace(b, key="")


def _pairs(
    fragment: Fragment, own: ColumnSpec, column: ColumnSpec, rows: int, first: int
) -> list[tuple[str, str]]:
    """(fragment chunk key, store chunk key) of each chunk of ``rows`` rows of the array,
    placed from chunk row ``first`` of the store's on."""
    if 0 in column.shape:
        return []
    grid: list[tuple[int, ...]] = [()]
    for size, chunk in zip(column.shape, column.chunks[1:]):
        grid = [(*g, i) for g in grid for i in range(-(-size // chunk))]
    source = f"{fragment.folder}/{own.key}"
    return [
        (f"{source}/c/{r}{tail}", f"{column.key}/c/{r + first}{tail}")
        for r in range(-(-rows // column.chunks[0]))
        for tail in ("".join(f"/{i}" for i in g) for g in grid)
    ]


__all__ = ["commit", "learnt"]
