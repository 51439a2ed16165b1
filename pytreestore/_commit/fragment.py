"""A fragment: records written under a store by any process, not yet committed, and the
small description of them that travels to the process that commits.

:func:`pytreestore.write_fragment` writes the records as arrays laid out like the store's
columns under ``.pytreestore/fragments/<id>/`` and returns a :class:`Fragment`;
``store.commit_fragments([...])`` appends them (:mod:`pytreestore._fragments.commit`). A
fragment holds no data: its ids, its record count (and, in a ragged store, the rows of each
ragged axis's table) and where its arrays lie. It pickles, and :meth:`Fragment.to_json` /
:meth:`Fragment.from_json` carry it between processes as text.

Example:
    >>> f = Fragment(
    ...     id="0" * 32, store="1" * 32, schema="blake2b-160:" + "2" * 40, records=3,
    ...     generation=1, time="2026-01-01T00:00:00.000000Z",
    ... )
    >>> f.folder
    '.pytreestore/fragments/00000000000000000000000000000000'
    >>> Fragment.from_json(f.to_json()) == f
    True
    >>> g = dataclasses.replace(f, tables=(("['p']", 7),))
    >>> json.loads(g.to_json())["tables"], Fragment.from_json(g.to_json()) == g
    ({"['p']": 7}, True)
"""

from __future__ import annotations

import dataclasses
import json
import re

from pytreestore._format.names import fragment_folder
from pytreestore._format.ragged import tables_entry
from pytreestore.errors import FragmentError

_HEX32 = re.compile("[0-9a-f]{32}")
_SCHEMA_ID = re.compile("blake2b-160:[0-9a-f]{40}")
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z")
#: the members of a fragment's JSON, each with the pattern (or type) its value must match
_FIELDS: dict[str, type[int] | re.Pattern[str]] = {
    "id": _HEX32,
    "store": _HEX32,
    "schema": _SCHEMA_ID,
    "records": int,
    "generation": int,
    "time": _TIME,
}
#: every member a fragment's JSON may hold: ``tables`` only for a ragged store's fragment
_MEMBERS = (*_FIELDS, "tables")
#: the name of the fragment's own description in its folder, written last
MANIFEST = "fragment.json"
#: the name of the marker written first in a fragment's folder (when it was begun)
BEGUN = "begun.json"
#: the name of a ragged or optional store's fragment's schema in its folder
SCHEMA = "schema.json"


@dataclasses.dataclass(frozen=True)
class Fragment:
    """Uncommitted records under a store, as :func:`pytreestore.write_fragment` returned them.

    Attributes:
        id: the fragment's unique id (32 hex digits).
        store: the id of the store it was written under (its commit record's ``store``).
        schema: the id of the schema its records were checked against.
        records: how many records it holds.
        generation: the store's version when it was written.
        time: when it was written, ISO 8601 in UTC.
        tables: in a ragged or optional store, the rows of each ragged axis's table the
            fragment holds, as ``(axis keypath, rows)`` sorted by keypath (None: a store of
            one fixed structure, whose fragments hold records only).
    """

    id: str
    store: str
    schema: str
    records: int
    generation: int
    time: str
    tables: tuple[tuple[str, int], ...] | None = None

    def rows(self, table: str | None) -> int:
        """The rows the fragment holds in ``table`` (None: the record table)."""
        if table is None:
            return self.records
        return dict(self.tables or ()).get(table, 0)

    @property
    def own_schema(self) -> bool:
        """Whether the fragment keeps the schema it was written with in its folder: a ragged
        or optional store's does (it lists ``tables``); a fixed store's names the store's
        schema, which must still be the store's when it is committed (format 3)."""
        return self.tables is not None  # fragments: a fixed store's carry no schema file

    @property
    def folder(self) -> str:
        """Where its arrays lie: a folder below the store root."""
        return fragment_folder(self.id)

    def to_json(self) -> str:
        """The fragment as JSON text, for :meth:`from_json` in another process: canonical
        (members sorted, one spacing), so equal fragments give equal text."""
        obj: dict[str, object] = {name: getattr(self, name) for name in _FIELDS}
        obj.update(tables_entry(self.tables))
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Fragment:
        """The fragment :meth:`to_json` wrote.

        Raises:
            FragmentError: ``text`` is not such JSON (each wrong member is named).
        """
        try:
            obj = json.loads(text)
        except (TypeError, ValueError) as err:
            raise FragmentError(
                f"not a fragment's JSON ({err}); pass the text Fragment.to_json() returned"
            ) from err
        if not isinstance(obj, dict):
            raise FragmentError(
                f"not a fragment's JSON: expected an object, got {type(obj).__name__}; pass "
                "the text Fragment.to_json() returned"
            )
        problems = [_problem(name, want, obj.get(name)) for name, want in _FIELDS.items()]
        problems += [f"unknown member {name!r}" for name in obj if name not in _MEMBERS]
        problems.append(_tables_problem(obj.get("tables")))
        found = [p for p in problems if p]
        if found:
            raise FragmentError(
                f"not a fragment's JSON: {'; '.join(found)}. Pass the text Fragment.to_json() "
                "returned, unchanged"
            )
        tables = obj.get("tables")
        rows = None if tables is None else tuple(sorted(tables.items()))
        return cls(**{name: obj[name] for name in _FIELDS}, tables=rows)


def _tables_problem(value: object) -> str | None:
    if value is None or (
        isinstance(value, dict) and all(type(v) is int and 0 <= v < 2**63 for v in value.values())
    ):
        return None
    return f"'tables' must map keypaths to integers >= 0, got {json.dumps(value)}"


def _problem(name: str, want: type[int] | re.Pattern[str], value: object) -> str | None:
    if not isinstance(want, re.Pattern):
        ok = type(value) is int and 0 <= value < 2**63
        return None if ok else f"{name!r} must be an integer >= 0, got {json.dumps(value)}"
    if isinstance(value, str) and want.fullmatch(value):
        return None
    return f"{name!r} must match {want.pattern}, got {json.dumps(value)}"


def manifest_key(fragment: str) -> str:
    """The key of the description of fragment ``fragment`` (an id), written last."""
    return f"{fragment_folder(fragment)}/{MANIFEST}"


def begun_key(fragment: str) -> str:
    """The key of the marker written first in fragment ``fragment``'s folder."""
    return f"{fragment_folder(fragment)}/{BEGUN}"


def schema_key(fragment: Fragment) -> str:
    """The key of ``fragment``'s schema (a ragged or optional store's fragment)."""
    return f"{fragment.folder}/{SCHEMA}"


__all__ = ["BEGUN", "MANIFEST", "SCHEMA", "Fragment", "begun_key", "manifest_key", "schema_key"]
