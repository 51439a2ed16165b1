"""A fragment's records, checked and cast in memory into the rows of each table, before
anything is written (:mod:`pytreestore._fragments.write` writes them).

A store of one fixed structure has one table, the record table: :func:`column_blocks` turns
records (or a batch) into one array per column, with the checks and casts of
``store.extend`` (``extend_batch``). A ragged or optional store's records are walked by a
:class:`~pytreestore._commit.records.RecordWriter` whose tables are kept in memory
(:class:`TableRows`, :class:`FragmentRows`): a record that shows a structure the store has
not learnt yet (an element of a list empty so far, a subtree None so far:
``store.schema.pending``) is learnt by the fragment, in memory, exactly as the store would
learn it (:func:`~pytreestore._commit.model.grow_schema` at the store's committed rows), and
the walk starts again with the grown schema, so every table holds its rows from row 0.
Either way :func:`table_rows` gives the schema the rows fit and each table's rows.

Example:
    >>> from pytreestore._commit.record import Commit
    >>> schema = TreeSchema.from_example({"x": np.int16(0)})
    >>> got, tables, rows = table_rows(None, schema, Commit(0, 0), [{"x": 1}, {"x": 2}], None, "")
    >>> got is schema, tables[None][0].tolist(), rows
    (True, [1, 2], {None: 2})
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jax.tree_util import tree_flatten

from pytreestore._commit.record import Commit
from pytreestore._commit.records import RecordWriter
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.convert import RecordError, RowFiller, casters
from pytreestore._tree.device import VALID, refuse_unreadable
from pytreestore._tree.stack import batch_length
from pytreestore.backends import Backend
from pytreestore.errors import FragmentError, SchemaMismatchError

#: each table's rows of a fragment, one array per column of the table
Tables = dict[str | None, list[np.ndarray]]


def table_rows(
    engine: Backend, schema: TreeSchema, head: Commit, data: Any, mask: Any, where: str
) -> tuple[TreeSchema, Tables, dict[str | None, int]]:
    """``data`` (records; a batch of the schema's structure; in a ragged or optional store
    with ``mask``, a padded batch) as each table's rows, checked and cast against the store
    whose schema is ``schema`` and latest commit ``head``; with the schema they fit (the
    store's, grown by the structures the records show) and each table's rows.

    Raises:
        FragmentError: the store packs leaves (``pack=``).
        SchemaMismatchError: a record or the batch does not match the store's schema, or
            ``mask`` is given for a store of one fixed structure.
    """
    check_unpacked(schema, where)
    if schema.ragged is None:  # one table, no structure to learn: one array per column
        if mask is not None:
            raise SchemaMismatchError(
                f"store {where} holds records of one structure: write_fragment takes no "
                "mask= (that is for stores created with ragged= or optional=). Nothing was "
                "written."
            )
        blocks = column_blocks(schema, data)
        return schema, {None: blocks}, {None: len(blocks[0]) if blocks else 0}
    rows = FragmentRows(engine, schema, head)
    if mask is None:
        rows.extend(_records(data, where))
    else:
        rows.extend_batch(data, mask)
    tables = rows.rows_of()
    return (
        rows.schema,
        {t: w.blocks() for t, w in tables.items()},
        {t: len(w) for t, w in tables.items()},
    )


def check_unpacked(schema: TreeSchema, where: str) -> None:
    """Raises FragmentError for a store that packs leaves: fragments need one array each."""
    if schema.packs:
        raise FragmentError(
            f"store {where} packs small leaves into shared arrays (created with pack=); "
            "fragments need one array per leaf. Append to it from one writer, or copy it to "
            "a store created without pack= (pytreestore.copy). Nothing was written."
        )


def column_blocks(schema: TreeSchema, data: Any) -> list[np.ndarray]:
    """One array per column of a store of one fixed structure from ``data``: a batch (the
    schema's structure, leaves with a leading record axis) or an iterable of records,
    checked and cast.

    Raises:
        SchemaMismatchError: names the record (or batch leaf) refused.
    """
    leaves, treedef = tree_flatten(data)
    if schema.holds(treedef) and not isinstance(data, Iterator):
        leaves = schema.column_leaves(leaves)
        count = batch_length(leaves, schema.paths)
        try:
            return [
                c.coerce(leaf, batch=count, what="batch")
                for c, leaf in zip(casters(schema.columns), leaves)
            ]
        except Exception as err:  # JAX's, reading a jax.Array of the batch
            refuse_unreadable(err, data, FragmentRows.batch_refusal + ": ", fix=VALID)
            raise
    if isinstance(data, Mapping | np.ndarray) or not isinstance(data, Iterable):
        raise SchemaMismatchError(
            "write_fragment() takes an iterable of records or a batch of the store's "
            f"structure; {schema.mismatch_message(data, what='batch')} Nothing was written."
        )
    rows, records = [], []
    for i, record in enumerate(data):
        leaves, got = tree_flatten(record)
        if not schema.holds(got):
            raise SchemaMismatchError(
                f"write_fragment() refused record {i} (nothing was written): "
                f"{schema.mismatch_message(record)}"
            )
        rows.append(schema.column_leaves(leaves))
        records.append(record)
    buffers = [np.empty((len(rows), *c.shape), c.dtype) for c in schema.columns]
    try:
        RowFiller(casters(schema.columns), buffers).fill_block(rows, 0)
    except RecordError as err:
        raise SchemaMismatchError(
            f"write_fragment() refused record {err.index} (nothing was written): {err.error}"
        ) from err.error
    except Exception as err:  # JAX's, reading a jax.Array of a record
        for i, record in enumerate(records):
            refuse_unreadable(err, record, FragmentRows.refusal.format(i=i) + ": ", fix=VALID)
        raise
    return buffers


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
    """The committer of a fragment's walk: a fragment commits nothing; its ``commit`` is
    the store's latest (where the arrays a record teaches the fragment start)."""

    holding = False

    def __init__(self, head: Commit) -> None:
        self.commit = head

    def advance(self, records: int, tables: Any = None, **_: Any) -> Commit:
        return self.commit

    def release(self) -> None:
        pass

    def check(self) -> None:
        pass


class FragmentRows(RecordWriter):
    """A :class:`RecordWriter` whose tables are :class:`TableRows`: the rows of a fragment
    of the store of ``schema`` whose latest commit is ``head``, checked and cast."""

    refusal = "write_fragment() refused record {i} (nothing was written)"
    batch_refusal = "write_fragment() refused the batch (nothing was written)"

    def __init__(self, engine: Backend, schema: TreeSchema, head: Commit) -> None:
        super().__init__(engine, schema, Commit(0, 0), _NoCommits(head))

    def _table(self, table: str | None, schema: TreeSchema, commit: Commit) -> Any:
        return TableRows(schema)

    def use_schema(self, grown: TreeSchema) -> None:
        """The structures a record showed, learnt in memory: the tables start again."""
        self._open_tables(grown, Commit(0, 0))

    def flush(self) -> None:
        """Commits nothing: :func:`write` writes the tables."""

    def rows_of(self) -> dict[str | None, TableRows]:
        return self.tables  # type: ignore[return-value]


def _records(data: Any, where: str) -> list[Any]:
    if isinstance(data, Mapping | np.ndarray | str | bytes) or not isinstance(data, Iterable):
        raise SchemaMismatchError(
            f"write_fragment() to {where}, a store of ragged or optional records, takes an "
            "iterable of records, or a padded batch with its mask: write_fragment(path, "
            "batch, mask=mask), as extend_batch(batch, mask=mask) takes the pair load() "
            f"returns; got a {type(data).__name__}. Nothing was written."
        )
    return list(data)


__all__ = ["FragmentRows", "TableRows", "Tables", "check_unpacked", "column_blocks", "table_rows"]
