"""Writing a fragment (``pytreestore.write_fragment``, :mod:`pytreestore._open.fragments`):
records written under a store by any process, for its writer to commit with
``store.commit_fragments`` (:mod:`pytreestore._fragments.commit`).

The records are checked and cast against the store's schema in memory first, into each
table's rows (:mod:`pytreestore._fragments.rows`; nothing is written for bad input), then
written under the fragment's folder laid out like the store's columns
(:func:`pytreestore._fragments.columns.save`). A store of one fixed structure's fragment has
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

import uuid
from typing import Any

from pytreestore._commit.fragment import Fragment
from pytreestore._commit.record import Commit, now_utc
from pytreestore._commit.tables import table_schemas
from pytreestore._format import validate as _validate
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments import columns
from pytreestore._fragments.rows import table_rows
from pytreestore.backends import Backend
from pytreestore.errors import FragmentError


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
    columns.save(engine, grown, fragment, tables, {t: sub.columns for t, sub in subs.items()})
    return fragment


__all__ = ["write"]
