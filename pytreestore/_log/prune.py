"""Going back and cleaning up: what ``truncate(n)`` commits, and what ``vacuum()`` removes.

What ``truncate(n)`` commits: the rows of every table at record ``n``, and the schema.

A fixed store's version of ``n`` records is rows ``[0, n)`` of its columns. In a ragged store
each axis's table holds the elements of the records before it: with cumulative end offsets,
the rows of an axis's table at ``n`` records are ``offsets[rows - 1]`` of the table its offsets
live in (0 for no rows), parents before children.

A column that ``evolve`` added (or a ragged structure first shown) after those rows starts
past them; its ``start`` is lowered to them (:func:`lower_starts`), which reads the same:
rows before ``start`` read the column's default, and the array holds its fill value, the
default, in every row no record wrote.

The root ``zarr.json`` is written *before* the truncate's commit record (:func:`shrink_root`):
its consolidated metadata then shows the truncated rows, fewer than either commit holds, so
zarr-python and xarray never see rows past the commit; its schema (the starts lowered) is
not the one the commit record in force names, so pytreestore's readers read with the
commit's schema from the version log until the commit record follows
(:func:`pytreestore._open.root.committed_schema`), and a writer opening after a crash
between the two puts the commit's schema back (:func:`pytreestore._log.protocol.restore_root`).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-truncate-rows", {"p": [np.int8(0)]}, ragged=True)
    >>> s.extend([{"p": [np.int8(1)] * 2}, {"p": [np.int8(2)] * 3}]); s.flush()
    >>> rows_at(s._backend, s.schema, s.commit_now(), 1, s.path)
    {None: 1, "['p']": 2}

``store.vacuum()``: removing what no version the log keeps still needs.

The log (:mod:`pytreestore._log.versions`) keeps the last ``keep_versions`` versions and
the tagged ones. Vacuum, with the writer lock held:

1. deletes the records of versions outside that (tagged ones stay) and of versions written
   over after a truncate (untagged);
2. for every column of a readable kept version, deletes the chunks wholly past the most rows
   any readable kept version holds in it, and shrinks the array to those rows; and the
   chunks wholly before the first row any of them reads, after ``keep_last`` released the
   front (:func:`front_rows`; a writer's partly filled chunk stays, as it reads it back);
3. deletes the arrays that no readable kept version's schema has (columns dropped by
   ``evolve``, and arrays an interrupted ``evolve`` left), and the schemas no kept version
   names (the latest schema always stays).

It lists the whole store once: it is maintenance, run when a user asks, never by a commit.

On a backend that keeps every storage generation (:class:`~pytreestore.backends.Snapshots`:
OCDBT) deleting a key frees nothing: the key is gone from the next generation only, and its
bytes stay in the database's files, readable at the generations before. TensorStore (0.1.86)
has no way to drop old generations or compact a database, so the report says
``reclaimed=False`` there, and the space comes back only by copying the store to a new one
(``pytreestore.copy``, which writes the latest version alone).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-vacuum-module", {"x": np.int8(0)}, chunk_records=1)
    >>> s.extend({"x": np.int8(i)} for i in range(3)); s.truncate(1); s.append({"x": np.int8(5)})
    >>> s.vacuum()
    VacuumReport(versions=1, schemas=0, arrays=0, chunks=1, fragments=0, reclaimed=True)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import TypeVar

from pytreestore._format import validate as _validate
from pytreestore._format.keys import CHUNK_KEY_PATTERN, META_DIR, ROOT_KEY, version_key
from pytreestore._format.ragged import AxisInfo, PresenceInfo
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore._log import metadata as consolidated
from pytreestore._log import versions
from pytreestore._log.commit_record import Commit
from pytreestore.backends import Backend, KeyListing, Snapshots
from pytreestore.errors import StorageError

_Starts = TypeVar("_Starts", ColumnSpec, AxisInfo, PresenceInfo)


def rows_at(
    backend: Backend, schema: TreeSchema, commit: Commit, records: int, where: str
) -> dict[str | None, int]:
    """The rows of every table of a store holding its first ``records`` records: the record
    table (None) and each axis's table."""
    rows: dict[str | None, int] = {None: records}
    for axis in schema.tables.axes:
        rows[axis.path] = _rows(backend, axis.offsets, rows[axis.table], commit, axis.table)
    return rows


def tables_of(rows: dict[str | None, int]) -> dict[str, int] | None:
    """The ``tables`` of a commit from :func:`rows_at` (None for a fixed store)."""
    tables = {str(t): n for t, n in rows.items() if t is not None}
    return tables if len(rows) > 1 else None


def after_truncate(
    backend: Backend, schema: TreeSchema, seen: Commit, now: Commit, path: str
) -> TreeSchema | None:
    """A reader's schema past a truncate since commit ``seen``: its columns starting at most
    at the rows the truncate left, so that rows written after it are read from storage, not
    as the default (None: no column starts past them)."""
    cuts = [n for version, n in now.cuts if version > seen.generation]
    rows = rows_at(backend, schema, now, min(cuts, default=now.records), path)
    return lower_starts(schema, rows)


def lower_starts(schema: TreeSchema, rows: dict[str | None, int]) -> TreeSchema | None:
    """``schema`` with every column, axis and optional subtree starting at most at its
    table's ``rows``; None when none starts past them."""
    columns = tuple(_lowered(c, rows[c.table]) for c in schema.columns)
    tables = schema.tables
    axes = tuple(_lowered(a, rows[a.table]) for a in tables.axes)
    presence = tuple(_lowered(p, rows[p.table]) for p in tables.presence)
    tables = dataclasses.replace(tables, axes=axes, presence=presence)
    if columns == schema.columns and tables == schema.tables:
        return None
    return dataclasses.replace(schema.with_tables(tables), columns=columns, digest=None)


def shrink_root(
    backend: Backend,
    schema: TreeSchema,
    rows: dict[str | None, int],
    where: str,
    *,
    lowered: bool,
) -> TreeSchema:
    """Writes the root ``zarr.json`` of a truncate to ``rows`` (:func:`rows_at`) before its
    commit record, in one atomic put: the consolidated metadata of those rows, and with
    ``lowered`` the new ``schema`` (:func:`lower_starts`, kept in the version log first);
    the schema for the commit to name (with its digest).

    Until the commit record follows, the root holds fewer rows than the commit in force (safe
    for zarr readers) and, with ``lowered``, a schema that commit does not name (pytreestore's
    readers then read with the one it names)."""
    raw = backend.read_bytes(ROOT_KEY)
    _validate.root_schema(raw, where)  # a root damaged outside pytreestore is not rewritten
    document = _validate.root_document(raw)
    if lowered:
        info = _validate.stamped(schema.to_json())
        versions.save_schema(backend, info)
        document.setdefault("attributes", {})["pytreestore"] = info
        schema = dataclasses.replace(schema, digest=info["digest"])
    shown = Commit(rows[None], 0, tables=_tables(rows))
    backend.write_bytes(ROOT_KEY, consolidated.with_consolidated(document, schema, shown))
    return schema


def _tables(rows: dict[str | None, int]) -> tuple[tuple[str, int], ...] | None:
    tables = tables_of(rows)
    return None if tables is None else tuple(sorted(tables.items()))


def _lowered(item: _Starts, rows: int) -> _Starts:
    return dataclasses.replace(item, start=rows) if item.start > rows else item


def _rows(backend: Backend, offsets: str, parent: int, commit: Commit, table: str | None) -> int:
    """Rows of an axis's table at ``parent`` rows of the table holding its offsets."""
    if parent == 0:
        return 0
    (end,) = backend.read([offsets], slice(parent - 1, parent), commit.rows(table))
    return int(end[0])


@dataclasses.dataclass(frozen=True)
class VacuumReport:
    """What :meth:`TreeStore.vacuum` removed.

    Attributes:
        versions: version records (outside the log's bound, or written over).
        schemas: schemas no kept version names.
        arrays: arrays of columns no kept version has (each with its chunks).
        chunks: chunks past every kept version's rows.
        fragments: fragment folders (issue 17): committed ones left behind, and abandoned
            ones (see docs/scaling.md).
        reclaimed: whether removing them freed their space. False on a backend that keeps
            every generation (OCDBT): they are gone from the latest version, but their bytes
            stay on disk, readable at older generations; ``pytreestore.copy`` to a new store
            frees them (docs/scaling.md).
    """

    versions: int = 0
    schemas: int = 0
    arrays: int = 0
    chunks: int = 0
    fragments: int = 0
    reclaimed: bool = True


def vacuum(engine: Backend, head: Commit, keep: int | None, where: str) -> VacuumReport:
    """Vacuums the store behind ``engine`` whose latest commit is ``head`` (the caller holds
    the writer lock and has nothing buffered)."""
    root = _validate.root_schema(engine.read_bytes(ROOT_KEY), where)
    latest = _validate.schema_id(root)
    tagged = set(versions.tags(engine, where).values())
    old = [c for c in _records(engine, head, where) if c.generation < head.generation]
    stale = set(versions.stale(engine, head, keep)) if keep is not None else set()
    drop = [
        c.generation
        for c in old
        if c.generation not in tagged and (c.generation in stale or head.gone(c) is not None)
    ]
    live = [c for c in old if c.generation not in drop and head.gone(c) is None] + [head]
    schemas = {latest: root}
    for c in live:
        if c.schema is not None and c.schema not in schemas:
            schemas[c.schema] = versions.schema_info(engine, c.schema, where)
    reach = _reach(live, schemas, latest)
    if not isinstance(engine, KeyListing):
        raise StorageError(
            f"vacuum needs to list the keys of {where}, which its backend "
            f"({type(engine).__name__}) cannot do; nothing was removed"
        )
    keys = engine.list_keys("")
    arrays = _dead_arrays(engine, keys, reach, schemas)
    low = _low(engine, live, schemas, latest, where)
    chunks = _dead_chunks(keys, reach, arrays, low)
    spare = [s for s in versions.schema_ids(engine) if s not in schemas]
    engine.delete_keys([version_key(n) for n in drop])
    engine.delete_keys(chunks + [k for k in keys if _array_of(k, arrays)])
    _shrink(engine, reach)
    engine.delete_keys([f"{META_DIR}/schemas/{s.rpartition(':')[2]}.json" for s in spare])
    reclaimed = not isinstance(engine, Snapshots)
    return VacuumReport(len(drop), len(spare), len(arrays), len(chunks), reclaimed=reclaimed)


def _records(engine: Backend, head: Commit, where: str) -> list[Commit]:
    found = (versions.read(engine, n, where) for n in versions.numbers(engine))
    return [c for c in found if c is not None and c.generation <= head.generation]


def _reach(live: Iterable[Commit], schemas: dict[str, dict], latest: str) -> dict[str, tuple]:
    """Column key -> (its spec, the most rows a live version holds in it)."""
    reach: dict[str, tuple[ColumnSpec, int]] = {}
    for commit in live:
        info = schemas[commit.schema or latest]
        for column in _columns(info):
            rows = commit.rows(column.table)
            _, best = reach.get(column.key, (column, 0))
            reach[column.key] = (column, max(best, rows))
    return reach


def front_rows(backend: Backend, schema: TreeSchema, commit: Commit, where: str) -> dict[str, int]:
    """Per storage column of ``schema`` (by key), the first row a read of ``commit`` needs:
    the row of its table where record 0 (row ``commit.first``) starts, or the row before in
    a table holding offsets arrays (the offset there is where record 0's elements start,
    and a read takes the row before with the rows it reads, in one read of every column of
    the table: :mod:`pytreestore._read.gather`). Every row when nothing was released
    (``commit.first`` is 0).

    Example:
        >>> import numpy as np, pytreestore
        >>> s = pytreestore.create("memory://doc-front-rows", {"p": [np.int8(0)]}, ragged=True)
        >>> s.extend([{"p": [np.int8(1)] * 2}, {"p": [np.int8(2)] * 3}]); s.keep_last(1)
        1
        >>> front_rows(s._backend, s.schema, s.commit_now(), s.path)  # offsets: the row before
        {'p/-2A': 2, 'p-offsets': 0}
    """
    if not commit.first:
        return {c.key: 0 for c in schema.storage_columns}
    rows = rows_at(backend, schema, commit, commit.first, where)
    before = {a.table for a in schema.tables.axes}  # the tables holding offsets arrays
    return {
        c.key: max(rows[c.table] - 1, 0) if c.table in before else rows[c.table]
        for c in schema.storage_columns
    }


def _low(
    engine: Backend, live: list[Commit], schemas: dict[str, dict], latest: str, where: str
) -> dict[str, int]:
    """Column key -> the first row any live version reads in it (:func:`front_rows`),
    capped for the latest version's columns at the start of the chunk its writer fills,
    which it reads back when it opens (released or not).

    A front only moves on (``keep_last``), and rows before a front are never written again,
    so per schema the live version with the lowest front reads the most."""
    lowest: dict[str, Commit] = {}
    for commit in live:
        key = commit.schema or latest
        if key not in lowest or commit.first < lowest[key].first:
            lowest[key] = commit
    low: dict[str, int] = {}
    for key, commit in lowest.items():
        schema = TreeSchema.from_json(schemas[key], generic=True)
        for column, row in front_rows(engine, schema, commit, where).items():
            low[column] = min(low.get(column, row), row)
    head = live[-1]
    for column in _columns(schemas[head.schema or latest]):
        rows, chunk = head.rows(column.table), column.chunks[0]
        low[column.key] = min(low.get(column.key, 0), rows - rows % chunk)
    return low


def _columns(info: dict) -> tuple[ColumnSpec, ...]:
    schema = TreeSchema.from_json(info, generic=True)
    return schema.storage_columns


def _dead_arrays(
    engine: Backend, keys: list[str], reach: dict[str, tuple], schemas: dict[str, dict]
) -> set[str]:
    """Keys of the arrays stored that no live version has."""
    found = set()
    for key in keys:
        if not key.endswith("/" + ROOT_KEY) or key.startswith(META_DIR + "/"):
            continue
        column = key[: -len(ROOT_KEY) - 1]
        if column in reach:
            continue
        try:
            node = json.loads(engine.read_bytes(key) or b"")
        except ValueError:
            continue  # not a zarr node pytreestore wrote: leave it
        if isinstance(node, dict) and node.get("node_type") == "array":
            found.add(column)
    return found


def _array_of(key: str, arrays: set[str]) -> bool:
    column = key.rpartition("/" + ROOT_KEY)[0] if key.endswith("/" + ROOT_KEY) else None
    if column in arrays:
        return True
    match = CHUNK_KEY_PATTERN.match(key)
    return bool(match and match.group(1) in arrays)


def _dead_chunks(
    keys: list[str], reach: dict[str, tuple], arrays: set[str], low: dict[str, int]
) -> list[str]:
    """Chunk keys of live columns wholly past the rows live versions hold, or wholly before
    the first row any of them reads (``low``: rows released from the front)."""
    dead = []
    for key in keys:
        match = CHUNK_KEY_PATTERN.match(key)
        if not match or match.group(1) not in reach:
            continue
        column, rows = reach[match.group(1)]
        first = int(match.group(2).split("/")[0]) * column.chunks[0]
        if first >= rows or first + column.chunks[0] <= low.get(column.key, 0):
            dead.append(key)
    return dead


def _shrink(engine: Backend, reach: dict[str, tuple]) -> None:
    """Shrinks every live column's array to the rows live versions hold in it."""
    by_rows: dict[int, list[str]] = {}
    keys = list(reach)
    for key, shape in zip(keys, engine.column_shapes(keys)):
        rows = reach[key][1]
        if shape[0] > rows:
            by_rows.setdefault(rows, []).append(key)
    for rows, group in by_rows.items():
        engine.resize(group, rows)


__all__ = [
    "VacuumReport",
    "front_rows",
    "lower_starts",
    "rows_at",
    "shrink_root",
    "tables_of",
    "vacuum",
]
