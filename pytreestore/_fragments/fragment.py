"""A fragment: what it is on disk, and removing fragments, committed or abandoned.

A fragment: records written under a store by any process, not yet committed, and the
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

Removing fragments' folders: committed ones after their commit (locally on a thread of
the writer's, :func:`purge`), abandoned ones by vacuum, one whose writing failed at once
(:func:`remove`). The description goes first, so that a removal cut short leaves a folder
that is never committed (vacuum removes it).

Example:
    >>> import numpy as np, pytreestore
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import get_backend
    >>> s = pytreestore.create("memory://doc-remove", {"x": np.int8(0)})
    >>> f = pytreestore.write_fragment("memory://doc-remove", [{"x": 1}])
    >>> engine = get_backend("tensorstore")(Location.parse("memory://doc-remove"))
    >>> remove(engine, [f.id]); engine.read_bytes(f"{f.folder}/fragment.json") is None
    True

Fragments nobody will commit, removed by ``store.vacuum()``.

A fragment folder under ``.pytreestore/fragments/`` is removed by vacuum when:

* a version record names it (it was committed, and a crash left its folder behind); or
* it was begun (its ``begun.json``, else its ``fragment.json``) more than ``older_than``
  seconds ago and no version names it: abandoned by a writer that died or gave up. A
  fragment younger than that is left alone, whether it is still being written or written
  and waiting for its commit; or
* it has neither file readable (what a deletion cut short leaves; what a writer killed
  before its ``begun.json`` landed leaves: locally an empty folder, or one holding only
  TensorStore's ``begun.json.__lock`` or zarr-python's ``.begun.json.*.partial``, which no
  key listing shows, so local fragment folders are found on disk too). Locally only once
  the folder itself is older than ``older_than`` (its modification time), since a writer
  creates the folder just before its ``begun.json``; elsewhere (S3, OCDBT, memory), where
  a key is written whole or not at all and there is no folder without keys, at once.

Ages are measured with this machine's clock against the time the writer's clock wrote, so
``older_than`` must exceed the clock skew between hosts, and the longest a fragment may wait
for its commit.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-abandoned", {"x": np.int8(0)})
    >>> f = pytreestore.write_fragment("memory://doc-abandoned", [{"x": 1}])
    >>> s.vacuum().fragments, s.vacuum(fragments_older_than=0).fragments
    (0, 1)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable, Sequence

from pytreestore._format.keys import FRAGMENTS_DIR, fragment_folder
from pytreestore._format.ragged import tables_entry
from pytreestore._location import Location
from pytreestore._log import versions
from pytreestore._log.commit_record import Commit
from pytreestore._log.placing import local_root
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, FolderDeletes, KeyListing
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


def purge(root: str, ids: Sequence[str]) -> int:
    """Deletes the folders of the committed fragments ``ids`` of the local store at
    ``root`` (a thread's work after the commit); how many were there."""
    folders = [os.path.join(root, fragment_folder(i)) for i in ids]
    try:
        with RUNTIME.call_pool(RUNTIME.threads.fragment_deletes) as pool:
            return sum(pool.map(_delete_folder, folders))
    except RuntimeError:  # the interpreter is exiting: it starts no new threads
        return sum(map(_delete_folder, folders))


def _delete_folder(folder: str) -> bool:
    """Deletes ``folder``: its description first, so that a deletion cut short leaves a
    folder that is never committed (vacuum removes it); whether it was there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, MANIFEST))
    if not os.path.isdir(folder):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def remove(engine: Backend, ids: Iterable[str]) -> None:
    """Deletes the folders of the fragments ``ids`` (locally with one tree removal each;
    inside a :class:`~pytreestore.backends.Transactions` block, as part of it)."""
    ids = list(ids)
    folders = [fragment_folder(i) for i in ids]
    root = local_root(engine)
    if root is not None:
        purge(root, ids)
        return
    if isinstance(engine, FolderDeletes):
        engine.delete_folders(folders)
        return
    if not isinstance(engine, KeyListing):
        engine.delete_keys([manifest_key(i) for i in ids] + [begun_key(i) for i in ids])
        return
    keys = [k for folder in folders for k in engine.list_keys(folder + "/")]
    # the description first: a deletion cut short leaves a folder vacuum removes
    engine.delete_keys(sorted(keys, key=lambda k: not k.endswith("/fragment.json")))


#: the default age (seconds) after which vacuum removes a fragment nobody committed
FRAGMENTS_OLDER_THAN = 24 * 3600.0


def sweep(engine: Backend, location: Location, head: Commit, older_than: float, where: str) -> int:
    """Removes the committed and abandoned fragments of the store behind ``engine`` (its
    writer, whose latest commit is ``head``, calls it); how many folders it removed."""
    if not isinstance(engine, KeyListing):
        return 0
    folders = _folders(engine)
    committed = _committed(engine, head, where) if folders else set()
    now = time.time()
    gone = [
        fid
        for fid, names in folders.items()
        if fid in committed or _age(engine, location, fid, names, now) > older_than
    ]
    if gone:
        remove(engine, gone)
    return len(gone)


def _folders(engine: Backend) -> dict[str, list[str]]:
    """Every fragment folder: its id, and the names of its keys (relative to the folder).

    Locally, the folders on disk too: one a writer killed before its first key landed is
    empty, or holds only a temporary file no listing shows."""
    prefix = FRAGMENTS_DIR + "/"
    folders: dict[str, list[str]] = {}
    assert isinstance(engine, KeyListing), "sweep looks only where keys can be listed"
    for key in engine.list_keys(prefix):
        fid, _, rest = key[len(prefix) :].partition("/")
        folders.setdefault(fid, []).append(rest)
    root = local_root(engine)
    if root is not None:
        for fid in _folders_on_disk(os.path.join(root, FRAGMENTS_DIR)):
            folders.setdefault(fid, [])
    return folders


def _folders_on_disk(path: str) -> list[str]:
    """The names of the folders in ``path`` (none if it is not there)."""
    try:
        with os.scandir(path) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _committed(engine: Backend, head: Commit, where: str) -> set[str]:
    """The fragment ids every version record the log keeps names."""
    found = set(head.fragments)
    for number in versions.numbers(engine):
        commit = versions.read(engine, number, where)
        found.update(commit.fragments if commit is not None else ())
    return found


def _age(engine: Backend, location: Location, fid: str, names: Iterable[str], now: float) -> float:
    """Seconds since fragment ``fid`` was begun (infinite: it has neither marker)."""
    names = set(names)
    for marker in (BEGUN, MANIFEST):
        if marker in names:
            raw = engine.read_bytes(f"{FRAGMENTS_DIR}/{fid}/{marker}")
            begun = _time_of(raw)
            if begun is not None:
                return now - begun
    root = local_root(engine)
    if root is not None:
        try:
            return now - os.stat(os.path.join(root, FRAGMENTS_DIR, fid)).st_mtime
        except FileNotFoundError:
            return 0.0
    return float("inf")


def _time_of(raw: bytes | None) -> float | None:
    try:
        text = json.loads(raw or b"")["time"]
        moment = datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")
    except (ValueError, KeyError, TypeError):
        return None
    return moment.replace(tzinfo=datetime.UTC).timestamp()


#: a Fragment pickled before the package's folders were renamed (issue 45) names its class's
#: module then, ``pytreestore._commit.fragment``: such pickles still load, as this module
sys.modules.setdefault("pytreestore._commit.fragment", sys.modules[__name__])


__all__ = [
    "BEGUN",
    "FRAGMENTS_OLDER_THAN",
    "MANIFEST",
    "SCHEMA",
    "Fragment",
    "begun_key",
    "manifest_key",
    "purge",
    "remove",
    "schema_key",
    "sweep",
]
