"""Writing a fragment: its arrays, laid out exactly like the store's columns.

A fragment's arrays: written under its folder laid out exactly like the store's columns,
and placed into the store's columns at a commit. One path for every store: a store of one
fixed structure has one table (the record table), a ragged or optional store one per
ragged axis besides.

**Written** (:func:`save`), under ``.pytreestore/fragments/<id>/``: ``begun.json`` (the time,
for vacuum); one array per array of the fragment's schema whose table has rows (leaves,
offsets and presence), the store's layout (chunks, codec, fill value) at the store's key;
in a ragged or optional store ``schema.json``, the fragment's schema (the store's, grown by
what the fragment learnt); last ``fragment.json``, its description. A folder without
``fragment.json`` is a fragment still being written, or abandoned by a killed writer: never
committed, removed by vacuum. Offsets count the fragment's own rows (from row 0).

**Placed** (:func:`place`), by the commit (:mod:`pytreestore._fragments.commit`), inside its
atomic block: fragment ``k``'s rows of table ``t`` go to store rows from ``base[k][t]``, the
table's committed rows plus the fragments' before ``k``. An array whose rows start at a
chunk boundary of its table and whose layout is the store's has its encoded chunks placed
unchanged, every fragment's at once before any row is rewritten
(:func:`~pytreestore._fragments.fastpath.place_aligned`: chunk-row folders renamed and chunk
files linked on local disk, keys copied inside an OCDBT database, raw bytes elsewhere). An
offsets array is read and written with ``base[k][axis]`` added (offsets are absolute rows
of the axis's table); any other array is read and written again; an array the fragment
lacks (a structure it never saw) gets what an absent subtree or an empty list gets: zeros,
False, offsets that add no element. Rewrites go ``RUNTIME.writes.fragment_window`` fragments at a
time: their
arrays read on threads, the rows of consecutive fragments of one table written in one call.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-columns", {"p": [], "n": np.int8(0)},
    ...                        ragged=["['p']"])
    >>> f = pytreestore.write_fragment("memory://doc-columns", [{"p": [1.5], "n": 1}])
    >>> s.schema.pending, f.tables
    (("['p']",), (("['p']", 1),))
    >>> s.commit_fragments([f]); s.schema.pending, s[0]["p"][0].item()
    ((), 1.5)

Writing a fragment (``pytreestore.write_fragment``, :mod:`pytreestore._open.sharing`):
records written under a store by any process, for its writer to commit with
``store.commit_fragments`` (:mod:`pytreestore._fragments.commit`).

The records are checked and cast against the store's schema in memory first, into each
table's rows (:mod:`pytreestore._fragments.cast`; nothing is written for bad input), then
written under the fragment's folder laid out like the store's columns
(:func:`pytreestore._fragments.write.save`). A store of one fixed structure's fragment has
one table and ``tables`` None; a ragged or optional store's names each ragged axis's rows.

Example:
    >>> import numpy as np, pytreestore
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import get_backend
    >>> s = pytreestore.create("memory://doc-fragments-write", {"x": np.float32(0)})
    >>> engine = get_backend("tensorstore")(Location.parse("memory://doc-fragments-write"))
    >>> f = write(engine, s.schema, Commit.read(engine, "s"), [{"x": 1.5}], None, "s")
    >>> f.records, f.tables, len(s)
    (1, None, 0)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from pytreestore._format import validate as _validate
from pytreestore._format.columns import ColumnSpec
from pytreestore._format.ragged import OFFSETS, slot
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import fragment as remove
from pytreestore._fragments.cast import table_rows
from pytreestore._fragments.fastpath import Aligned, place_aligned
from pytreestore._fragments.fragment import Fragment, begun_key, manifest_key, schema_key
from pytreestore._log.commit_record import Commit, now_utc
from pytreestore._log.evolve_tables import table_schemas
from pytreestore._log.metadata import column_layouts
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, ColumnLayout
from pytreestore.errors import CorruptChunkError, CorruptStoreError, FragmentError, PyTreeStoreError


def save(
    engine: Backend,
    schema: TreeSchema,
    fragment: Fragment,
    tables: dict[str | None, list[np.ndarray]],
    columns: dict[str | None, Sequence[ColumnSpec]],
) -> None:
    """Writes ``fragment``'s files: each table's rows ``tables[t]`` (one array per column of
    ``columns[t]``) laid out as ``schema`` lays them out, its schema (a ragged or optional
    store's) and last its description. A failure removes what was written (one left is
    vacuum's: it has no ``fragment.json``, so it is never committed)."""
    engine.write_bytes(begun_key(fragment.id), json.dumps({"time": fragment.time}).encode())
    try:
        full = {t: columns[t] for t, blocks in tables.items() if blocks and len(blocks[0])}
        lays = [lay for cols in full.values() for lay in array_layouts(cols, schema, fragment)]
        if lays:
            engine.create_columns(lays)
        for t, cols in full.items():
            keys = [lay.key for lay in array_layouts(cols, schema, fragment)]
            engine.resize(keys, len(tables[t][0]))
            engine.write(keys, 0, tables[t])
        if fragment.own_schema:
            info = {**_validate.stamped(schema.to_json()), "digest": fragment.schema}
            engine.write_bytes(schema_key(fragment), json.dumps(info).encode())
        engine.write_bytes(manifest_key(fragment.id), fragment.to_json().encode())
    except BaseException:
        with contextlib.suppress(PyTreeStoreError):
            remove.remove(engine, [fragment.id])
        raise


def array_layouts(
    columns: Sequence[ColumnSpec], schema: TreeSchema, fragment: Fragment
) -> list[ColumnLayout]:
    """The layouts of ``fragment``'s arrays of ``columns``: the store's, below its folder."""
    return [
        dataclasses.replace(lay, key=f"{fragment.folder}/{lay.key}")
        for lay in column_layouts(columns, schema.codec, schema.inner_chunk_bytes)
    ]


@dataclasses.dataclass(frozen=True)
class Part:
    """One fragment, the schema it was written with, and the first store row of each of
    its tables' rows."""

    fragment: Fragment
    schema: TreeSchema
    base: dict[str | None, int]


def plan(
    tables: Sequence[str | None],
    fragments: Sequence[Fragment],
    own: Sequence[TreeSchema],
    committed: dict[str | None, int],
) -> tuple[list[Part], dict[str | None, int]]:
    """Each fragment's first store row per table (after the ``committed`` rows), and every
    table's rows after them all."""
    at = {t: committed[t] for t in tables}
    parts = []
    for fragment, mine in zip(fragments, own):
        parts.append(Part(fragment, mine, dict(at)))
        for t in at:
            at[t] += fragment.rows(t)
    return parts, at


@dataclasses.dataclass
class _TablePlan:
    """How one fragment's rows of one table are placed: chunks placed unchanged
    (``aligned``), arrays read and written again (``read``: store column, fragment column),
    arrays made (``made``: store column, fill value), from store row ``base`` on, ``rows`` of
    them."""

    part: Part
    table: str | None
    base: int
    rows: int
    aligned: list[Aligned] = dataclasses.field(default_factory=list)
    read: list[tuple[ColumnSpec, ColumnSpec]] = dataclasses.field(default_factory=list)
    made: list[tuple[ColumnSpec, int]] = dataclasses.field(default_factory=list)


def place(
    engine: Backend, tables: dict[str | None, TreeSchema], parts: list[Part], version: int
) -> tuple[int, int]:
    """Writes every part's rows of every table at its bases, for a commit after ``version``
    (the store's columns already hold the rows); (arrays placed unchanged, rewritten).

    Raises:
        FragmentError: one of a fragment's arrays is missing a chunk or rows (nothing is
            committed; chunk-row folders renamed are renamed back).
    """
    same = _Layouts(tables)
    plans = [
        _plan_table(sub, t, part, same)
        for part in parts
        for t, sub in tables.items()
        if part.fragment.rows(t)
    ]
    with _owned(parts):
        _place_aligned(engine, [a for p in plans for a in p.aligned], version)
    for i in range(0, len(plans), RUNTIME.writes.fragment_window * len(tables)):
        _rewrite(engine, tables, plans[i : i + RUNTIME.writes.fragment_window * len(tables)])
    return sum(len(p.aligned) for p in plans), sum(len(p.read) + len(p.made) for p in plans)


def _place_aligned(engine: Backend, aligned: list[Aligned], version: int) -> None:
    """Places the chunks of every aligned array unchanged (the fast path)."""
    place_aligned(engine, aligned, version)


def _rewrite(
    engine: Backend, tables: dict[str | None, TreeSchema], plans: list[_TablePlan]
) -> None:
    """Reads the ``plans``' arrays to rewrite (on threads) and writes them with the made ones."""
    reading = [plan for plan in plans if plan.read]
    lays = [lay for plan in reading for lay in _read_layouts(plan)]
    if lays:
        with _owned([p.part for p in reading]):
            engine.open_columns(lays)
    with RUNTIME.call_pool(
        RUNTIME.threads.fragment_reads
    ) as pool:  # reads of the fragments' own arrays only
        blocks = dict(zip(map(id, reading), pool.map(lambda plan: _read(engine, plan), reading)))
    for table in tables:
        _write_table(engine, [p for p in plans if p.table == table], blocks)


class _Layouts:
    """Whether a fragment's array is laid out as the store's (its chunks place as they are),
    each schema's layouts computed once."""

    def __init__(self, tables: dict[str | None, TreeSchema]) -> None:
        self._store = {slot(c): _bare(c, sub.codec) for sub in tables.values() for c in sub.columns}
        self._seen: dict[tuple[int, Any], bool] = {}

    def __call__(self, own: ColumnSpec, column: ColumnSpec, schema: TreeSchema) -> bool:
        key = (id(schema), slot(column))
        if key not in self._seen:
            self._seen[key] = _bare(own, schema.codec) == self._store[slot(column)]
        return self._seen[key]


def _bare(column: ColumnSpec, codec: str | None) -> ColumnLayout:
    return dataclasses.replace(column_layouts([column], codec)[0], key="")


def _plan_table(table: TreeSchema, name: str | None, part: Part, same: _Layouts) -> _TablePlan:
    plan = _TablePlan(part, name, part.base[name], part.fragment.rows(name))
    mine = {slot(c): c for c in part.schema.storage_columns}
    aligned = plan.base % table.chunk_records == 0
    first = plan.base // table.chunk_records
    for c in table.columns:
        own = mine.get(slot(c))
        if own is None:  # what a record without the structure holds there
            plan.made.append((c, part.base[c.path] if c.role == OFFSETS else 0))
        elif c.role != OFFSETS and aligned and same(own, c, part.schema):
            plan.aligned.append(Aligned(part.fragment.folder, own.key, c, plan.rows, first))
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


def _made(plan: _TablePlan) -> list[np.ndarray]:
    return [np.full((plan.rows, *c.shape), fill, c.dtype) for c, fill in plan.made]


def _write_table(engine: Backend, plans: list[_TablePlan], blocks: dict[int, Any]) -> None:
    """Each plan's read and made rows, consecutive plans of the same arrays in one write."""
    keys: list[str] = []
    start, parts = 0, []
    for plan in plans:
        columns = [c.key for c, _ in plan.read] + [c.key for c, _ in plan.made]
        rows = blocks.get(id(plan), []) + _made(plan)
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
def _owned(parts: Sequence[Part]) -> Iterator[None]:
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


def write(
    engine: Backend, schema: TreeSchema, head: Commit, data: Any, mask: Any, where: str
) -> Fragment:
    """Writes ``data`` (records; a batch; with ``mask``, a ragged store's padded batch) as a
    fragment of the store behind ``engine``, whose latest commit is ``head``; its
    description.

    Raises:
        FragmentError: the store packs leaves (``pack=``), or has no store id (written
            before format 2).
        SchemaMismatchError: a record (or the batch and mask) does not match the store's
            schema, as ``store.extend`` (``extend_batch``) would refuse it; nothing written.
    """
    if head.store is None:
        raise FragmentError(
            f"store {where} was written by a pytreestore before format 2 and has no store id, "
            "which fragments are checked against; copy it to a new store "
            "(pytreestore.copy) to write fragments to it. Nothing was written."
        )
    grown, tables, rows = table_rows(engine, schema, head, data, mask, where)
    listed = grown.tables.listed(rows)
    fragment = Fragment(
        uuid.uuid4().hex,
        head.store,
        _validate.id_of(grown),
        rows[None],
        head.generation,
        now_utc(),
        listed,
    )
    subs = table_schemas(grown)
    save(engine, grown, fragment, tables, {t: sub.columns for t, sub in subs.items()})
    return fragment


__all__ = ["Part", "array_layouts", "place", "plan", "save", "write"]
