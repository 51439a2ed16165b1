"""The tables of a ragged store (format 3), each seen as a fixed store of its own columns.

A ragged store keeps a record table and one table per ragged axis
(:mod:`pytreestore._format.ragged`); each is a set of columns with one row count, which is
what the writer (:mod:`pytreestore._commit.writer`) and the repair
(:mod:`pytreestore._commit.repair`) handle. This module cuts a ragged schema into them.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-tables", {"p": [np.int8(0)]}, ragged=["['p']"])
    >>> {t: [c.key for c in sub.columns] for t, sub in table_schemas(s.schema).items()}
    {None: ['p-offsets'], "['p']": ['p/-2A']}
"""

from __future__ import annotations

from pytreestore._format.schema import TreeSchema


def table_schemas(schema: TreeSchema) -> dict[str | None, TreeSchema]:
    """One schema per table of a store, record table (None) first (a fixed store's only
    table): the table's columns (leaves, then offsets and presence arrays) and its rows per
    chunk."""
    info = schema.tables
    by_table: dict[str | None, list] = {t: [] for t in info.tables()}
    for c in schema.table_columns:  # packed leaves by their keys: the backend packs them
        by_table[c.table].append(c)
    return {
        t: TreeSchema(
            {},
            tuple(cols),
            info.chunk_rows(t, schema.chunk_records),
            schema.codec,
            None,
            inner_chunk_bytes=schema.inner_chunk_bytes,
        )
        for t, cols in by_table.items()
    }


__all__ = ["table_schemas"]
