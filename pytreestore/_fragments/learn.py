"""The structures a commit of fragments teaches the store, checked in memory before anything
is written.

A fragment written with the store's schema of now holds exactly its arrays (every fragment
of a store of one fixed structure: :func:`~pytreestore._fragments.check.check` refuses any
other). A ragged or optional store's fragment written with another schema (it learnt a
structure the store had pending, or the store learnt one since) has its schema read from
its folder (``schema.json``) and merged into the store's, fragment after fragment, as a
record showing those structures would be (:func:`~pytreestore._commit.model.grow_schema`). A
structure that departs from the store's, or a leaf whose dtype or shape differs from what
the store learnt meanwhile, refuses the commit, naming the keypath.

Example:
    >>> import numpy as np, pytreestore
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import get_backend
    >>> s = pytreestore.create("memory://doc-learn", {"p": [], "n": np.int8(0)},
    ...                        ragged=["['p']"])
    >>> f = pytreestore.write_fragment("memory://doc-learn", [{"p": [1.5], "n": 1}])
    >>> engine = get_backend("tensorstore")(Location.parse("memory://doc-learn"))
    >>> own = [schema_of(engine, f, s.schema, "s", like=None)]
    >>> grown = learnt(s.schema, [f], own, lambda table: 0)
    >>> s.schema.pending, grown.pending
    (("['p']",), ())
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from pytreestore._commit.fragment import SCHEMA, Fragment, schema_key
from pytreestore._commit.model import grow_schema, load_schema, representative
from pytreestore._commit.protocol import group_json
from pytreestore._format import validate as _validate
from pytreestore._format.dtypes import describe
from pytreestore._format.ragged import slot
from pytreestore._format.schema import TreeSchema
from pytreestore.backends import Backend
from pytreestore.errors import FragmentError, PyTreeStoreError, SchemaMismatchError


def schema_of(
    engine: Backend, fragment: Fragment, schema: TreeSchema, where: str, *, like: Any
) -> TreeSchema:
    """The schema ``fragment`` was written with: ``schema`` (the store's) when it names it,
    else the one in its folder.

    Raises:
        FragmentError: its schema is missing or damaged, or its ``tables`` are not its
            schema's ragged axes.
    """
    own = schema if fragment.schema == _validate.id_of(schema) else None
    own = own or read_schema(engine, fragment, where, like=like)
    axes = own.tables.axis_paths()
    if not own.tables.lists_axes(fragment.tables):
        raise FragmentError(
            f"fragment {fragment.id} does not describe the tables of its schema (its tables "
            f"{dict(fragment.tables or {})}, its schema's ragged axes {sorted(axes or ())}); "
            "write it again. Nothing was committed."
        )
    return own


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


__all__ = ["learnt", "read_schema", "schema_of"]
