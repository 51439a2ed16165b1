"""``pytreestore.evolve(path, ...)``: a store's schema changed without importing its classes.

The store is attached as a writer (its lock taken, repaired for appending) with the schema
it stores, bound to no class and with no layout of records: an evolve reads and writes schema
documents only, so every kind of store (fixed, ragged, optional) takes the same steps as
:meth:`TreeStore.evolve <pytreestore.TreeStore.evolve>`: check, apply, commit a version
naming the new schema (:mod:`pytreestore._log.evolve`).

Example:
    >>> import numpy as np, pytreestore
    >>> pytreestore.create("memory://doc-evolve-path", {"a": np.int8(1)}).close()
    >>> evolve_at(Location.parse("memory://doc-evolve-path"), None, rename={"['a']": "['b']"})
    >>> pytreestore.open("memory://doc-evolve-path").schema.paths
    ("['b']",)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pytreestore import _arguments
from pytreestore._format import validate as _validate
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._log import protocol, transaction
from pytreestore._log.commit_record import Commit
from pytreestore._log.committer import Committer
from pytreestore._log.transaction import Evolve
from pytreestore._log.versions import committed_info
from pytreestore._open.root import read_root
from pytreestore.backends import Backend, default_backend
from pytreestore.backends._packed import packed
from pytreestore.backends._registry import backend_at


def evolve(
    path: str | os.PathLike[str],
    *,
    add: Mapping[str, Any] | None = None,
    drop: Sequence[str] | None = None,
    rename: Mapping[str, str] | None = None,
    rename_class: Mapping[str, str] | None = None,
    backend: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Changes the schema of the store at ``path``, without importing its classes.

    The way to evolve a store that today's classes can no longer open, of any kind (ragged
    and optional stores included: no class is imported). The arguments are
    those of :meth:`TreeStore.evolve`, plus ``backend`` and ``storage_options`` of
    :func:`pytreestore.open`.

    Example:
        >>> import numpy as np, pytreestore
        >>> pytreestore.create("memory://doc-evolve-fn", {"a": np.int8(1)}).close()
        >>> pytreestore.evolve("memory://doc-evolve-fn", rename={"['a']": "['b']"})
        >>> pytreestore.open("memory://doc-evolve-fn").schema.paths
        ("['b']",)
    """
    _arguments.backend_name(backend)
    location = Location.parse(path, storage_options)
    evolve_at(location, backend, add=add, drop=drop, rename=rename, rename_class=rename_class)


def evolve_at(location: Location, backend: str | None, **changes: Any) -> None:
    """Applies ``changes`` (the keyword arguments of :meth:`TreeStore.evolve`) to the store
    at ``location`` on ``backend`` (None: the default for the location), whose classes need
    not be importable; one new version names the new schema.

    Raises:
        StoreLockedError: another writer holds the store.
        SchemaMismatchError, UnsupportedDtypeError: bad changes; nothing is written.
    """
    location.check_writable("evolve a store")
    where = str(location)
    engine: Backend = backend_at(backend or default_backend(location), location)
    root = _stored(engine, read_root(engine, location), where)
    engine = packed(engine, root.packs, (*root.columns, *root.dropped))  # packs never change
    commit, schema, lock = protocol.attach(
        engine, location, lambda c: _committed(engine, root, c, where), append=True
    )
    try:
        committer = Committer(engine, commit, _validate.id_of(schema), tree=schema)
        head = _Head(commit, committer, schema)
        operation = Evolve(where, changes)
        operation.check(engine, head)
        transaction.commit(engine, head, transaction.Transaction(commit.generation, operation))
    finally:
        protocol.detach(engine, lock)


@dataclasses.dataclass(frozen=True)
class _Head:
    """What :func:`~pytreestore._log.transaction.commit` needs of a writer: the commit it
    stands on, its committer and its schema (this evolve buffers no record)."""

    commit: Commit
    committer: Committer
    schema: TreeSchema

    def __len__(self) -> int:
        return self.commit.records  # nothing buffered


def _stored(engine: Backend, raw: bytes, where: str) -> TreeSchema:
    """The schema document in ``raw`` bound to no class (the generic view), with no layout
    of records; the backend told of its arrays."""
    schema = _validate.load_schema(raw, where, generic=True)
    engine.open_columns(schema.storage_columns)
    return schema


def _committed(engine: Backend, root: TreeSchema, commit: Commit, where: str) -> TreeSchema:
    """The schema ``commit`` names: ``root``, unless a change whose commit never came left
    its own in the root (:func:`~pytreestore._log.versions.committed_info`)."""
    info = committed_info(engine, commit, where)
    if info.get("digest") == root.digest:
        return root
    return _stored(engine, protocol.group_json({"pytreestore": info}), where)


__all__ = ["evolve", "evolve_at"]
