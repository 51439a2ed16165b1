"""A commit of fragments checked before anything is written: each item, and the structures it teaches the store.

The checks of a commit of fragments, made before anything is written: each item is a
:class:`~pytreestore.Fragment` of this store, listed once, not committed by any version the
log keeps, and its description is still in its folder, unchanged.

Example:
    >>> import numpy as np, pytreestore
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import get_backend
    >>> s = pytreestore.create("memory://doc-check", {"x": np.int8(0)})
    >>> f = pytreestore.write_fragment("memory://doc-check", [{"x": 1}])
    >>> engine = get_backend("tensorstore")(Location.parse("memory://doc-check"))
    >>> check(engine, None, [f], Commit.read(engine, "s"), s.schema) == [f]
    True

The structures a commit of fragments teaches the store, checked in memory before anything
is written.

A fragment written with the store's schema of now holds exactly its arrays (every fragment
of a store of one fixed structure: :func:`~pytreestore._fragments.check.check` refuses any
other). A ragged or optional store's fragment written with another schema (it learnt a
structure the store had pending, or the store learnt one since) has its schema read from
its folder (``schema.json``) and merged into the store's, fragment after fragment, as a
record showing those structures would be (:func:`~pytreestore._log.model.grow_schema`). A
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
import os
from collections.abc import Callable, Sequence
from typing import Any

from pytreestore._format import validate as _validate
from pytreestore._format.dtypes import describe
from pytreestore._format.ragged import slot
from pytreestore._format.schema import TreeSchema
from pytreestore._fragments.fragment import SCHEMA, Fragment, manifest_key, schema_key
from pytreestore._location import Location
from pytreestore._log import versions
from pytreestore._log.commit_record import Commit
from pytreestore._log.model import grow_schema, load_schema, representative
from pytreestore._log.placing import local_root
from pytreestore._log.protocol import group_json
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, ManyReads
from pytreestore.errors import FragmentError, PyTreeStoreError, SchemaMismatchError, StorageError


def check(
    engine: Backend,
    location: Location | None,
    fragments: Sequence[Any],
    head: Commit,
    schema: TreeSchema,
) -> list[Fragment]:
    """The fragments, each checked for a commit after ``head`` to the store of ``schema``;
    reads, writes nothing. A fragment written with another schema is refused unless it
    carries its own (``tables``: a ragged or optional store's fragment, whose schema may
    hold structures the store learns: :mod:`pytreestore._fragments.check` checks it).

    Raises:
        FragmentError: one is not a Fragment, is listed twice, belongs to another store or
            schema, was committed already, or its files are gone.
    """
    where = str(location)
    found: list[Fragment] = []
    schema_id, seen = _validate.id_of(schema), set()
    for i, f in enumerate(fragments):
        if not isinstance(f, Fragment):
            raise FragmentError(
                f"commit_fragments() takes Fragments (what pytreestore.write_fragment "
                f"returned, or Fragment.from_json of its JSON); item {i} is a "
                f"{type(f).__name__}. Nothing was committed."
            )
        if f.id in seen:
            raise _refused(f, i, "is listed twice")
        if f.store != head.store:
            raise _refused(
                f, i, f"belongs to another store (store id {f.store}; {where} is {head.store})"
            )
        if f.schema != schema_id and not f.own_schema:
            raise _refused(
                f,
                i,
                f"was written with another schema ({f.schema}; the store's is now {schema_id}, "
                "after an evolve or in another store); write it again against this schema",
            )
        seen.add(f.id)
        found.append(f)
    _check_not_committed(engine, found, head, where)
    _check_written(engine, location, found)
    return found


def _refused(f: Fragment, i: int, why: str) -> FragmentError:
    return FragmentError(f"fragment {f.id} (item {i}) {why}. Nothing was committed.")


def _check_not_committed(
    engine: Backend, fragments: Sequence[Fragment], head: Commit, where: str
) -> None:
    """Every version since the oldest fragment was written, against the fragments' ids. A
    version the log no longer keeps (``keep_versions``) could have committed a fragment
    written before it, whose folder a crash left: such a fragment is refused, as unknown."""
    if not fragments:
        return
    ids = {f.id: i for i, f in enumerate(fragments)}
    for number in range(min(f.generation for f in fragments) + 1, head.generation + 1):
        commit = head if number == head.generation else versions.read(engine, number, where)
        if commit is None:
            i, f = next((i, f) for i, f in enumerate(fragments) if f.generation < number)
            raise _refused(
                f,
                i,
                f"was written at version {f.generation}, and the store's version log no longer "
                f"keeps version {number} (it keeps the last keep_versions versions), so "
                "whether that version committed it cannot be checked; write its records "
                "again (pytreestore.write_fragment) and commit the new fragment",
            )
        for fid in commit.fragments:
            if fid in ids:
                raise _refused(
                    fragments[ids[fid]], ids[fid], f"was committed already, in version {number}"
                )


def _check_written(
    engine: Backend, location: Location | None, fragments: Sequence[Fragment]
) -> None:
    keys = [manifest_key(f.id) for f in fragments]
    root = local_root(engine)
    if root is not None:  # plain reads: no engine call
        found = [_read_file(os.path.join(root, k)) for k in keys]
    elif isinstance(engine, ManyReads):  # each read waits on storage: all at once
        found = engine.read_many_bytes(keys)
    elif len(keys) > 8:
        with RUNTIME.call_pool(RUNTIME.threads.fragment_checks) as pool:
            found = list(pool.map(engine.read_bytes, keys))
    else:
        found = [engine.read_bytes(k) for k in keys]
    for i, (f, raw) in enumerate(zip(fragments, found)):
        if raw is None:
            raise _refused(
                f,
                i,
                f"has no files under the store ({f.folder}/ holds no fragment.json): it was "
                "committed already, removed by vacuum(), or deleted. Write it again",
            )
        if raw != f.to_json().encode():  # to_json is canonical: sorted keys, one spacing
            raise _refused(f, i, f"differs from the description in {manifest_key(f.id)}")


def _read_file(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise StorageError(f"cannot read {path}: {err}") from err
    try:
        parts = [os.read(fd, 4096)]
        while parts[-1]:
            parts.append(os.read(fd, 1 << 16))
        return b"".join(parts)
    except OSError as err:
        raise StorageError(f"cannot read {path}: {err}") from err
    finally:
        os.close(fd)


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


__all__ = ["check", "learnt", "read_schema", "schema_of"]
