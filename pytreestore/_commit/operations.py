"""The operations a store commits through :func:`pytreestore._commit.transaction.commit`:
:class:`Evolve`, :class:`Truncate` and :class:`Tag` (each an
:class:`~pytreestore._commit.transaction.Operation`).

Each holds its arguments, checked where they came in; :meth:`check` refuses what needs the
store (nothing is written yet), :meth:`apply` is the operation's part of the atomic step.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-operations", {"x": np.int8(0)})
    >>> s.extend({"x": np.int8(i)} for i in range(3))
    >>> s._core.commit(Truncate(1, s.path)).records, len(s)
    (1, 1)
"""

from __future__ import annotations

from collections.abc import Mapping

from pytreestore._commit import evolve as _evolve
from pytreestore._commit import truncate as _truncate
from pytreestore._commit import versions as _versions
from pytreestore._commit.record import Commit
from pytreestore._commit.transaction import Change, Head
from pytreestore._format.schema import TreeSchema
from pytreestore.backends import Backend
from pytreestore.errors import StoreIndexError


class _Operation:
    """What the operations share: no check beyond their own, nothing to undo."""

    name = ""
    commits = True
    releases = False

    def check(self, engine: Backend, writer: Head) -> None:
        """Nothing to check against the store."""

    def prepare(self, engine: Backend, writer: Head) -> None:
        """No step of its own before the atomic step."""

    def abort(self, engine: Backend, head: Commit, error: BaseException) -> None:
        """Nothing to undo: what was written is harmless past the commit in force."""


class Evolve(_Operation):
    """Changes the schema (:mod:`pytreestore._commit.evolve`): added columns' arrays and the
    new root, then a version naming the new schema."""

    name = "evolve"

    def __init__(self, where: str, changes: Mapping[str, object]) -> None:
        """``changes``: the keyword arguments of ``TreeStore.evolve``."""
        self.where = where
        self.changes = dict(changes)

    def check(self, engine: Backend, writer: Head) -> None:
        """Plans the change on the writer's schema; refuses what cannot be done."""
        _evolve.check(engine, writer.schema, **self.changes)

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> Change:
        """Creates the added columns' arrays and writes the new root."""
        new = _evolve.apply(engine, schema, head, self.where, **self.changes)
        return Change(head.records, schema=new)


class Truncate(_Operation):
    """A version holding the first ``records`` records only (:mod:`pytreestore._commit.truncate`):
    the root's metadata of those rows and, where a column started past them, the schema with
    its start lowered."""

    name = "truncate"

    def __init__(self, records: int, where: str) -> None:
        self.records = records
        self.where = where

    def check(self, engine: Backend, writer: Head) -> None:
        """Refuses a count past the records appended (buffered ones included).

        Raises:
            StoreIndexError: ``records`` is negative or more than the store holds.
        """
        holds = len(writer)
        if not 0 <= self.records <= holds:
            raise StoreIndexError(
                f"cannot truncate {self.where} to {self.records} records: it holds {holds}; "
                f"give a count from 0 to {holds}. Nothing was changed."
            )

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> Change:
        """Writes the root of the first ``records`` records (and the lowered schema)."""
        rows = _truncate.rows_at(engine, schema, head, self.records, self.where)
        lowered = _truncate.lower_starts(schema, rows)
        root = _truncate.shrink_root(
            engine, lowered or schema, rows, self.where, lowered=lowered is not None
        )
        new = root if lowered is not None else None
        return Change(
            self.records,
            _truncate.tables_of(rows),
            schema=new,
            schema_id=None if new is None else new.digest,
        )


class Tag(_Operation):
    """Names a version (``version``, or the latest commit's); commits none."""

    name = "tag"
    commits = False

    def __init__(self, name: str, version: int | None, where: str) -> None:
        self.tag = name
        self.version = version
        self.where = where

    def apply(self, engine: Backend, head: Commit, schema: TreeSchema) -> None:
        """Writes the tag, once the version is found to be one the store keeps."""
        number = head.generation if self.version is None else self.version
        if self.version is not None:
            _versions.resolve(engine, head, number, self.where)
        _versions.add_tag(engine, self.tag, number, self.where)


__all__ = ["Evolve", "Tag", "Truncate"]
