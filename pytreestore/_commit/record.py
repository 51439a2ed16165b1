"""The commit record ``.pytreestore/commit.json``: the one object readers trust.

It says how many records are durable, how many commits came before (the generation), and
(format 2) the store's identity, a random id chosen by ``create`` that every commit keeps, so
that a reader notices a store replaced under it. See :mod:`pytreestore._commit.protocol` for
how it is written.

Example:
    >>> Commit(0, 0).next(5)
    Commit(records=5, generation=1, store=None, tables=None)
    >>> Commit.from_bytes(Commit(3, 1).to_bytes(), "memory://doc-record").records
    3
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from pytreestore._format.names import COMMIT_KEY
from pytreestore._format.schema import FORMAT_VERSION
from pytreestore.backends import Backend
from pytreestore.errors import CorruptStoreError

_STORE_ID = re.compile("[0-9a-f]{32}")


@dataclasses.dataclass(frozen=True)
class Commit:
    """The commit record: how many records are durable, how many commits came before, and
    (format 2) the store's identity, a random id chosen by ``create`` that every commit keeps,
    so that a reader notices a store replaced under it (``create(overwrite=True)``)."""

    records: int
    generation: int
    store: str | None = None
    #: format 3, a ragged store: the committed rows of every ragged axis's table, by the
    #: axis's keypath (its offsets array has the rows of the table it lives in)
    tables: tuple[tuple[str, int], ...] | None = None

    def to_bytes(self) -> bytes:
        obj: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "records": self.records,
            "generation": self.generation,
        }
        if self.store is not None:
            obj["store"] = self.store
        if self.tables is not None:
            obj["tables"] = dict(self.tables)
        return json.dumps(obj).encode()

    def next(self, records: int, tables: dict[str, int] | None = None) -> Commit:
        """The commit after this one, holding ``records`` records (and, in a ragged store,
        ``tables`` rows of each axis's table; by default as before)."""
        rows = self.tables if tables is None else tuple(sorted(tables.items()))
        return Commit(records, self.generation + 1, self.store, rows)

    def rows(self, table: str | None) -> int:
        """The committed rows of ``table`` (None: the record table, one row per record)."""
        if table is None:
            return self.records
        return dict(self.tables or ()).get(table, 0)

    @classmethod
    def read(cls, backend: Backend, where: str) -> Commit:
        return cls.from_bytes(backend.read_bytes(COMMIT_KEY), where)

    @classmethod
    def from_bytes(cls, raw: bytes | None, where: str) -> Commit:
        if raw is None:
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is missing: the store was never committed"
            )
        try:
            obj = json.loads(raw)
        except ValueError as err:
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: {err}"
            ) from err
        if not isinstance(obj, dict):
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: expected a JSON object, "
                f"got {type(obj).__name__}"
            )
        records, generation = (_count(obj, name, where) for name in ("records", "generation"))
        store = obj.get("store")
        if store is not None and not (isinstance(store, str) and _STORE_ID.fullmatch(store)):
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: its 'store' must be 32 "
                f"lowercase hex digits, got {json.dumps(store)}. The store was damaged outside "
                "pytreestore; restore the file from a backup (nothing was read or written)."
            )
        return cls(records, generation, store, _tables(obj, where))


def _tables(obj: dict[str, Any], where: str) -> tuple[tuple[str, int], ...] | None:
    tables = obj.get("tables")
    if tables is None:
        return None
    if not isinstance(tables, dict):
        raise CorruptStoreError(
            f"{where}/{COMMIT_KEY} is not a valid commit record: its 'tables' must be an "
            f"object of row counts, got {json.dumps(tables)}"
        )
    return tuple(sorted((str(k), _count(tables, k, where)) for k in tables))


def _count(obj: dict[str, Any], name: str, where: str) -> int:
    """``obj[name]`` if it is an int (not a bool) in ``[0, 2**63)``, else CorruptStoreError."""
    value = obj.get(name)
    if type(value) is not int or not 0 <= value < 2**63:
        raise CorruptStoreError(
            f"{where}/{COMMIT_KEY} is not a valid commit record: its {name!r} must be an "
            f"integer in [0, 2**63), got {json.dumps(value)}. The store was damaged outside "
            "pytreestore; restore the file from a backup (nothing was read or written)."
        )
    return value


__all__ = ["COMMIT_KEY", "Commit"]
