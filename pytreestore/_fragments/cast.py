"""A fragment's records, checked and cast in memory into the rows of each table, before
anything is written (:mod:`pytreestore._fragments.write` writes them).

The records (or a batch) go through the store's own record writer,
:class:`~pytreestore._write.records.RecordWriter`, whose tables are kept in memory
(:class:`~pytreestore._write.commits.TableRows`,
:class:`~pytreestore._write.commits.MemoryCommits`), with the checks and casts of
``store.extend`` (``extend_batch``) whatever the kind of store: a store of one structure
has one table, whose rows are the records; a ragged or optional store's records are walked,
and a record that shows a structure the store has not learnt yet (an element of a list
empty so far, a subtree None so far: ``store.schema.pending``) is learnt by the fragment,
in memory, exactly as the store would learn it
(:func:`~pytreestore._log.model.grow_schema` at the store's committed rows), and the walk
starts again with the grown schema, so every table holds its rows from row 0.
:func:`table_rows` gives the schema the rows fit and each table's rows.

Example:
    >>> from pytreestore._log.commit_record import Commit
    >>> schema = TreeSchema.from_example({"x": np.int16(0)})
    >>> got, tables, rows = table_rows(None, schema, Commit(0, 0), [{"x": 1}, {"x": 2}], None, "")
    >>> got is schema, tables[None][0].tolist(), rows
    (True, [1, 2], {None: 2})
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from jax.tree_util import tree_structure

from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._write.commits import MemoryCommits
from pytreestore._write.records import RecordWriter
from pytreestore.backends import Backend
from pytreestore.errors import FragmentError, SchemaMismatchError

#: how a fragment's refused record (``{i}``: its position), refused batch, and a mask given
#: for a store of one structure (``{where}``: the store) are reported
REFUSALS = (
    "write_fragment() refused record {i} (nothing was written)",
    "write_fragment() refused the batch (nothing was written)",
    "store {where} holds records of one structure: write_fragment takes no mask= (that is "
    "for stores created with ragged= or optional=). Nothing was written.",
)

#: each table's rows of a fragment, one array per column of the table
Tables = dict[str | None, list[np.ndarray]]


def table_rows(
    engine: Backend, schema: TreeSchema, head: Commit, data: Any, mask: Any, where: str
) -> tuple[TreeSchema, Tables, dict[str | None, int]]:
    """``data`` (records; a batch of the schema's structure; with ``mask``, a ragged or
    optional store's padded batch) as each table's rows, checked and cast against the store
    whose schema is ``schema`` and latest commit ``head``; with the schema they fit (the
    store's, grown by the structures the records show) and each table's rows.

    Raises:
        FragmentError: the store packs leaves (``pack=``).
        SchemaMismatchError: a record or the batch does not match the store's schema, or
            ``mask`` is given for a store of one fixed structure.
    """
    check_unpacked(schema, where)
    commits = MemoryCommits(head, where)
    rows = RecordWriter(engine, schema, Commit(0, 0), commits, refusals=REFUSALS)
    if mask is not None or _batch(schema, data):
        rows.extend_batch(data, mask, where=where)
    else:
        rows.extend(_records(data, where))
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


def _batch(schema: TreeSchema, data: Any) -> bool:
    """Whether ``data`` is a batch of the schema's structure (leaves with a leading record
    axis), not records: a batch of a store of one structure needs no mask."""
    return not isinstance(data, Iterator) and schema.holds(tree_structure(data))


def _records(data: Any, where: str) -> list[Any]:
    if isinstance(data, Mapping | np.ndarray | str | bytes) or not isinstance(data, Iterable):
        raise SchemaMismatchError(
            f"write_fragment() to {where} takes an iterable of records, or a batch: of the "
            "store's structure (a store of one structure), or padded, with its mask (a store "
            "created with ragged= or optional=: write_fragment(path, batch, mask=mask), as "
            "extend_batch(batch, mask=mask) takes the pair load() returns); got a "
            f"{type(data).__name__}. Nothing was written."
        )
    return list(data)


__all__ = [
    "REFUSALS",
    "Tables",
    "check_unpacked",
    "table_rows",
]
