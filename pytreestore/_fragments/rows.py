"""A fragment's records, checked and cast in memory into the rows of each table, before
anything is written (:mod:`pytreestore._fragments.write` writes them).

A store of one fixed structure has one table, the record table: :func:`column_blocks` turns
records (or a batch) into one array per column, with the checks and casts of
``store.extend`` (``extend_batch``). A ragged or optional store's records are walked by a
:class:`~pytreestore._commit.records.RecordWriter` whose tables are kept in memory
(:class:`~pytreestore._commit.memory.TableRows`,
:class:`~pytreestore._commit.memory.MemoryCommits`): a record that shows a structure the store has
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

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from jax.tree_util import tree_flatten

from pytreestore._commit.memory import MemoryCommits
from pytreestore._commit.record import Commit
from pytreestore._commit.records import RecordWriter
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.convert import RecordError, RowFiller, casters
from pytreestore._tree.device import VALID, refuse_unreadable
from pytreestore._tree.stack import batch_length
from pytreestore.backends import Backend
from pytreestore.errors import FragmentError, SchemaMismatchError

#: how a fragment's refused record (``{i}``: its position) and refused batch are reported
REFUSALS = (
    "write_fragment() refused record {i} (nothing was written)",
    "write_fragment() refused the batch (nothing was written)",
)

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
    commits = MemoryCommits(head, where)
    rows = RecordWriter(engine, schema, Commit(0, 0), commits, refusals=REFUSALS)
    if mask is None:
        rows.extend(_records(data, where))
    else:
        rows.extend_batch(data, mask)
    tables = commits.rows
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
            refuse_unreadable(err, data, REFUSALS[1] + ": ", fix=VALID)
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
            refuse_unreadable(err, record, REFUSALS[0].format(i=i) + ": ", fix=VALID)
        raise
    return buffers


def _records(data: Any, where: str) -> list[Any]:
    if isinstance(data, Mapping | np.ndarray | str | bytes) or not isinstance(data, Iterable):
        raise SchemaMismatchError(
            f"write_fragment() to {where}, a store of ragged or optional records, takes an "
            "iterable of records, or a padded batch with its mask: write_fragment(path, "
            "batch, mask=mask), as extend_batch(batch, mask=mask) takes the pair load() "
            f"returns; got a {type(data).__name__}. Nothing was written."
        )
    return list(data)


__all__ = [
    "REFUSALS",
    "Tables",
    "check_unpacked",
    "column_blocks",
    "table_rows",
]
