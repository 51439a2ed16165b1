"""Fragments of a ragged or optional store: records written under it by any process, every
table's rows laid out like the store's, for its writer to commit (issue 17).

**Checked first.** The records (or a padded batch with its mask) are walked by a
:class:`~pytreestore._ragged.writer.RaggedWriter` whose tables are kept in memory
(:class:`TableRows`): the checks and casts of ``store.extend`` (``extend_batch``), and
nothing is written before every record has passed. A record that shows a structure the
store has not learnt yet (an element of a list empty so far, a subtree None so far:
``store.schema.pending``) is learnt by the fragment, in memory, exactly as the store would
learn it (:func:`~pytreestore._ragged.model.grow_schema` at the store's committed rows), and
the walk starts again with the grown schema, so every table holds its rows from row 0.

**Written**, under ``.pytreestore/fragments/<id>/``: ``begun.json``; one array per array of
the fragment's schema whose table has rows (leaves, offsets and presence; the store's
layout at the store's key); ``schema.json``, the fragment's schema (the store's, grown by
what the fragment learnt); last ``fragment.json``, whose ``tables`` gives each ragged axis's
rows. Offsets count the fragment's own rows: its elements of each table start at row 0.
:mod:`pytreestore._ragged.placing` commits such fragments.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ragged-fragments", {"p": [np.int8(0)]},
    ...                        ragged=["['p']"])
    >>> f = pytreestore.write_fragment("memory://doc-ragged-fragments",
    ...                                [{"p": [1, 2, 3]}, {"p": []}, {"p": [4]}])
    >>> f.records, f.tables
    (3, (("['p']", 4),))
    >>> s.commit_fragments([f]); [[int(x) for x in r["p"]] for r in s]
    [[1, 2, 3], [], [4]]
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pytreestore._commit import fragments as _fixed
from pytreestore._commit.fragment import Fragment, begun_key, manifest_key
from pytreestore._commit.layouts import column_layouts
from pytreestore._commit.protocol import group_json
from pytreestore._commit.record import Commit, now_utc
from pytreestore._format import validate as _validate
from pytreestore._format.columns import ColumnSpec
from pytreestore._format.schema import TreeSchema
from pytreestore._ragged.model import grow_schema, load_schema
from pytreestore._ragged.writer import RaggedWriter, _explain
from pytreestore._tree.convert import RowFiller, casters
from pytreestore.backends import Backend, ColumnLayout
from pytreestore.errors import FragmentError, PyTreeStoreError, SchemaMismatchError

#: the name of a ragged fragment's schema in its folder
SCHEMA = "schema.json"


def schema_key(fragment: Fragment) -> str:
    """The key of ``fragment``'s schema (a ragged store's fragment)."""
    return f"{fragment.folder}/{SCHEMA}"


class TableRows:
    """One table of a fragment's records, kept whole in memory: the part of a table's
    :class:`~pytreestore._commit.writer.Writer` that a ragged walk uses, nothing written.

    Example:
        >>> from pytreestore._format.schema import TreeSchema
        >>> rows = TableRows(TreeSchema.from_example({"x": np.int16(0)}, chunk_records=2))
        >>> rows.append([1]); rows.write_batch([np.array([2, 3], np.int16)])
        >>> len(rows), rows.blocks()[0].tolist()
        (3, [1, 2, 3])
    """

    chunk = sys.maxsize  # never full: a walk never writes a chunk
    start = 0

    def __init__(self, schema: TreeSchema) -> None:
        self.schema = schema
        self.casters = casters(schema.columns)
        self.fill = 0
        self._capacity = 0
        self.buffers: list[np.ndarray] = []
        self._filler = RowFiller(self.casters, self.buffers)

    def __len__(self) -> int:
        return self.fill

    def _reserve(self, n: int) -> None:
        if self.fill + n <= self._capacity:
            return
        capacity = max(2 * self._capacity, self.fill + n, 64)
        grown = [np.empty((capacity, *c.shape), c.dtype) for c in self.schema.columns]
        for new, old in zip(grown, self.buffers):
            new[: self.fill] = old[: self.fill]
        self.buffers, self._capacity = grown, capacity
        self._filler = RowFiller(self.casters, grown)

    def append(self, leaves: Sequence[Any]) -> None:
        """One row of already structure-checked leaves, cast as a Writer casts them."""
        self._reserve(1)
        self._filler.fill(leaves, self.fill)
        self.fill += 1

    def append_many(self, rows: Iterable[Sequence[Any]]) -> None:
        """Rows of leaves; raises RecordError (its ``index`` from the first) if one is refused."""
        rows = list(rows)
        self._reserve(len(rows))
        self._filler.fill_block(rows, self.fill)
        self.fill += len(rows)

    def write_batch(self, blocks: Sequence[np.ndarray]) -> None:
        """Checked and cast column blocks with one leading length."""
        count = len(blocks[0]) if blocks else 0
        self._reserve(count)
        for buf, block in zip(self.buffers, blocks):
            buf[self.fill : self.fill + count] = block
        self.fill += count

    def snapshot(self) -> tuple[int, int]:
        return (0, self.fill)

    def rollback(self, position: tuple[int, int]) -> None:
        self.fill = position[1]

    def flush(self) -> None:
        """Nothing to write: a fragment's rows are written when the walk is done."""

    def blocks(self) -> list[np.ndarray]:
        """Every column's rows."""
        return [b[: self.fill] for b in self.buffers]


class _NoCommits:
    """The committer of a fragment's walk: a fragment commits nothing."""

    commit = Commit(0, 0)
    holding = False

    def advance(self, records: int, tables: Any = None, **_: Any) -> Commit:
        return self.commit

    def release(self) -> None:
        pass

    def check(self) -> None:
        pass


class FragmentRows(RaggedWriter):
    """A :class:`RaggedWriter` whose tables are :class:`TableRows`: the rows of a fragment
    of the store of ``schema`` whose latest commit is ``head``, checked and cast."""

    refusal = "write_fragment() refused record {i} (nothing was written)"

    def __init__(self, engine: Backend, schema: TreeSchema, head: Commit) -> None:
        self._rows = head.rows  # where the arrays it learns start in the store
        super().__init__(engine, schema, Commit(0, 0), _NoCommits())

    def _table(self, table: str | None, schema: TreeSchema, commit: Commit) -> Any:
        return TableRows(schema)

    def _learn(self, record: Any) -> None:
        """The structures ``record`` shows, learnt in memory: the tables start again."""
        try:
            grown = grow_schema(self.schema, record, self._rows)
        except SchemaMismatchError:
            raise _explain(self.model, record, "record") from None
        self._open_tables(grown, Commit(0, 0))

    def flush(self) -> None:
        """Commits nothing: :func:`write` writes the tables."""

    def rows_of(self) -> dict[str | None, TableRows]:
        return self.tables  # type: ignore[return-value]


def write(
    engine: Backend, schema: TreeSchema, head: Commit, data: Any, mask: Any, where: str
) -> Fragment:
    """Writes ``data`` (records; with ``mask``, a padded batch) as a fragment of the ragged
    store behind ``engine``, whose latest commit is ``head``; its description.

    Raises:
        SchemaMismatchError: a record (or the batch and mask) does not match the store's
            layout, as ``store.extend`` (``extend_batch``) would refuse it; nothing written.
    """
    rows = FragmentRows(engine, schema, head)
    if mask is None:
        rows.extend(_records(data, where))
    else:
        rows.extend_batch(data, mask)
    grown, tables = rows.schema, rows.rows_of()
    fragment = Fragment(
        uuid.uuid4().hex,
        str(head.store),
        _validate.id_of(grown),
        len(rows),
        head.generation,
        now_utc(),
        tuple(sorted((t, len(w)) for t, w in tables.items() if t is not None)),
    )
    engine.write_bytes(begun_key(fragment.id), json.dumps({"time": fragment.time}).encode())
    try:
        _write_tables(engine, grown, fragment, tables)
        info = {**_validate.stamped(grown.to_json()), "digest": fragment.schema}
        engine.write_bytes(schema_key(fragment), json.dumps(info).encode())
        engine.write_bytes(manifest_key(fragment.id), fragment.to_json().encode())
    except BaseException:
        # one left is vacuum's: it has no fragment.json, so it is never committed
        with contextlib.suppress(PyTreeStoreError):
            _fixed.remove(engine, [fragment.id])
        raise
    return fragment


def _records(data: Any, where: str) -> list[Any]:
    if isinstance(data, Mapping | np.ndarray | str | bytes) or not isinstance(data, Iterable):
        raise SchemaMismatchError(
            f"write_fragment() to {where}, a store of ragged or optional records, takes an "
            "iterable of records, or a padded batch with its mask: write_fragment(path, "
            "batch, mask=mask), as extend_batch(batch, mask=mask) takes the pair load() "
            f"returns; got a {type(data).__name__}. Nothing was written."
        )
    return list(data)


def _write_tables(
    engine: Backend, schema: TreeSchema, fragment: Fragment, tables: dict[str | None, TableRows]
) -> None:
    """Each table's arrays (those of tables with rows), from row 0."""
    full = {t: w for t, w in tables.items() if len(w) and w.schema.columns}
    lays = [lay for w in full.values() for lay in array_layouts(w.schema.columns, schema, fragment)]
    if not lays:
        return
    engine.create_columns(lays)
    for w in full.values():
        keys = [lay.key for lay in array_layouts(w.schema.columns, schema, fragment)]
        engine.resize(keys, len(w))
        engine.write(keys, 0, w.blocks())


def array_layouts(
    columns: Sequence[ColumnSpec], schema: TreeSchema, fragment: Fragment
) -> list[ColumnLayout]:
    """The layouts of ``fragment``'s arrays of ``columns``: the store's, below its folder."""
    return [
        dataclasses.replace(lay, key=f"{fragment.folder}/{lay.key}")
        for lay in column_layouts(columns, schema.codec)
    ]


def read_schema(engine: Backend, fragment: Fragment, where: str, *, like: Any) -> TreeSchema:
    """The schema ``fragment`` was written with (its ``schema.json``), with its layout.

    Raises:
        FragmentError: the file is missing, is not the schema the fragment names, or does
            not bind to today's classes.
    """
    raw = engine.read_bytes(schema_key(fragment))
    try:
        info = json.loads(raw or b"null")
        if not isinstance(info, dict) or info.get("digest") != fragment.schema:
            raise ValueError(f"{SCHEMA} is not the schema {fragment.schema} it names")
        return load_schema(group_json({"pytreestore": info}), where, like=like, generic=False)
    except (ValueError, PyTreeStoreError) as err:
        missing = raw is None
        raise FragmentError(
            f"fragment {fragment.id} cannot be committed: "
            f"{'its ' + SCHEMA + ' is missing' if missing else err} (in {fragment.folder}/). "
            "Its files were changed or partly deleted after it was written; write it again. "
            "Nothing was committed."
        ) from err


__all__ = [
    "SCHEMA",
    "FragmentRows",
    "TableRows",
    "array_layouts",
    "read_schema",
    "schema_key",
    "write",
]
