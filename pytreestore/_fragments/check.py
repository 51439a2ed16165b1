"""The checks of a commit of fragments, made before anything is written: each item is a
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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from pytreestore._commit import versions
from pytreestore._commit.fragment import Fragment, manifest_key
from pytreestore._commit.placing import local_root
from pytreestore._commit.record import Commit
from pytreestore._format import validate as _validate
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, ManyReads
from pytreestore.errors import FragmentError, StorageError


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
    hold structures the store learns: :mod:`pytreestore._fragments.learn` checks it).

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


__all__ = ["check"]
