"""The commit record readers trust, and a version as a storage snapshot.

The commit record ``.pytreestore/commit.json``: the one object readers trust.

It says how many records are durable, how many commits came before (the generation), and
(format 2) the store's identity, a random id chosen by ``create`` that every commit keeps, so
that a reader notices a store replaced under it. See :mod:`pytreestore._log.protocol` for
how it is written.

Format 3 makes every commit a *version* (:mod:`pytreestore._log.versions`): the commit
record is also written, unchanged, as the immutable ``.pytreestore/versions/<generation>.json``,
and carries the id of its schema, its time and operation, and what ``truncate`` left for
older versions: ``high`` (the records older versions still reach past ``records``), ``cuts``
(the truncates, as ``(version, records)``) and ``rewrites`` (the commits that released the rows
of older versions past a truncate, as ``(version, first record)``: every version before that
one holding more records is gone).

``rewrites`` is bounded without forgetting: it keeps only the releases no later one implies
(a later release from the same or a lower record says more), and past :data:`_HISTORY` of
those it merges the oldest two into one, ``(the later version, the lower record)``, which
refuses every version either did and perhaps a few that were still whole. ``horizon`` then
names the version up to which the first pair stands for several releases, so that a refusal
by it says so. An older version is therefore never read as valid once its rows were written
over, however many truncates followed (readers of an older pytreestore, which know the pairs
but not ``horizon``, refuse it too).

``first`` (issue 46, absent: 0) is the row of the record table that holds record 0: the rows
before it were released from the front by ``keep_last``. Every row count of the record
(``records``, ``tables``, ``high``, ``cuts``, ``rewrites``) stays a count of rows from row
0, so that writers append at row ``records`` and nothing about storage changes; only the
records a reader sees do: record ``i`` is row ``first + i``, and the store holds
``records - first`` (:attr:`Commit.length`). Older versions keep their own ``first``.

Example:
    >>> c = Commit(0, 0).next(5)
    >>> c.records, c.generation
    (5, 1)
    >>> t = c.next(2, operation="truncate")
    >>> t.high, t.cuts, t.gone(c)
    (5, ((2, 2),), None)
    >>> r = t.next(2, operation="release")
    >>> r.high, r.rewrites, r.gone(c)
    (None, ((3, 2),), (3, 2))
    >>> Commit.from_bytes(Commit(3, 1).to_bytes(), "memory://doc-record").records
    3
    >>> k = c.next(5, operation="keep_last", first=3)
    >>> k.first, k.length, Commit.from_bytes(k.to_bytes(), "memory://doc-record").first
    (3, 2, 3)
    >>> k.next(7).first  # appends keep the front
    3

A store version as a storage snapshot: on a backend that keeps every generation
(:class:`~pytreestore.backends.Snapshots`, the OCDBT backend), ``open(path, version=N)`` reads
the generation that committed version N, so that version's rows are pinned by the storage,
not only by its version record.

A commit is one generation where the backend has transactions (:mod:`pytreestore._log.committer`),
and several otherwise (a writer sharing the store through an OCDBT coordinator: its resizes,
chunks, version record, commit record and root each land on their own, in that order). Either
way the commit record only ever names higher versions in later generations, and is written
after the rows it counts, so the generation of version N is the first whose commit record
names N, and it holds all of N's rows: found by bisecting the generations, reading one commit
record per step (about 14 for 10,000 generations).

Example:
    >>> import pytreestore
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import OcdbtBackend
    >>> with pytreestore.create("memory://doc-snapshots", {"x": 0}, backend="ocdbt") as s:
    ...     s.append({"x": 1}); s.flush(); s.append({"x": 2})
    >>> engine = OcdbtBackend(Location.parse("memory://doc-snapshots"))
    >>> generation_of(engine, 1) < generation_of(engine, 2)
    True
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from typing import Any

from pytreestore._format import upgrades as _upgrades
from pytreestore._format.keys import COMMIT_KEY
from pytreestore._format.ragged import tables_entry
from pytreestore._format.upgrades import FORMAT_VERSION
from pytreestore.backends import Backend, Snapshots
from pytreestore.errors import CorruptStoreError

_STORE_ID = re.compile("[0-9a-f]{32}")


_FRAGMENT_ID = re.compile("[0-9a-f]{32}")


#: what a commit did: ``release`` frees the rows older versions held past a truncate, before
#: the first append after it writes over them; ``keep_last`` releases the front (``first``)
OPERATIONS = ("create", "append", "evolve", "truncate", "release", "keep_last")


#: the most ``cuts`` (the oldest are dropped: readers need only the latest) and ``rewrites``
#: (the oldest two are merged) a commit record keeps
_HISTORY = 256


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
    #: format 3: the id (digest) of the schema this version's records are read with
    schema: str | None = dataclasses.field(default=None, compare=False)
    #: format 3: when the commit was made, ISO 8601 in UTC
    time: str | None = dataclasses.field(default=None, compare=False)
    #: format 3: what the commit did, one of :data:`OPERATIONS`
    operation: str | None = dataclasses.field(default=None, compare=False)
    #: format 3, after a truncate: the records older versions still reach (None: ``records``)
    high: int | None = None
    #: format 3: the truncates, ``(version, records)``, oldest first
    cuts: tuple[tuple[int, int], ...] = ()
    #: format 3: the releases, ``(version, first record written over)``, oldest first: only
    #: those no later one implies, at most :data:`_HISTORY` (see :func:`released`)
    rewrites: tuple[tuple[int, int], ...] = ()
    #: format 3 (issue 17): the ids of the fragments this commit appended, in order
    fragments: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    #: format 3 (issue 28): the version up to which ``rewrites[0]`` merges several releases
    #: (None: every pair is one release)
    horizon: int | None = None
    #: format 3 (issue 46): the row of the record table that holds record 0; the rows before
    #: it were released from the front (``keep_last``). ``records`` stays a row count: the
    #: store's records are rows ``first`` to ``records``
    first: int = 0

    @property
    def length(self) -> int:
        """The records of the store at this commit: rows ``first`` to ``records``."""
        return self.records - self.first

    def to_json(self) -> dict[str, object]:
        obj: dict[str, object] = {
            "format_version": FORMAT_VERSION,
            "records": self.records,
            "generation": self.generation,
        }
        if self.store is not None:
            obj["store"] = self.store
        obj.update(tables_entry(self.tables))
        optional = {"schema": self.schema, "time": self.time, "operation": self.operation}
        obj.update({k: v for k, v in optional.items() if v is not None})
        if self.high is not None:
            obj["high"] = self.high
        if self.cuts:
            obj["cuts"] = [list(c) for c in self.cuts]
        if self.rewrites:
            obj["rewrites"] = [list(r) for r in self.rewrites]
        if self.fragments:
            obj["fragments"] = list(self.fragments)
        if self.horizon is not None:
            obj["horizon"] = self.horizon
        if self.first:
            obj["first"] = self.first
        return obj

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json()).encode()

    def next(
        self,
        records: int,
        tables: dict[str, int] | None = None,
        *,
        schema: str | None = None,
        operation: str = "append",
        fragments: tuple[str, ...] = (),
        first: int | None = None,
    ) -> Commit:
        """The commit after this one, holding ``records`` rows of the record table (and, in
        a ragged store, ``tables`` rows of each axis's table; by default as before);
        ``fragments``: the ids of the fragments it appends; ``first``: the row of its record
        0 (by default this one's).

        ``operation="truncate"`` keeps what older versions reach as ``high``;
        ``"release"`` gives it up (older versions holding more than ``records`` are then gone).
        """
        rows = self.tables if tables is None else tuple(sorted(tables.items()))
        version = self.generation + 1
        high, cuts = self.high, self.cuts
        rewrites, horizon = self.rewrites, self.horizon
        if operation == "truncate":
            high = max(self.high or 0, self.records)
            cuts = (*cuts, (version, records))[-_HISTORY:]
        elif operation == "release" or (high is not None and records > self.records):
            rewrites, horizon = released(rewrites, horizon, (version, self.records))
            high = None
        if high is not None and high <= records:
            high = None
        return Commit(
            records,
            version,
            self.store,
            rows,
            schema or self.schema,
            now_utc(),
            operation,
            high,
            cuts,
            rewrites,
            fragments,
            horizon,
            self.first if first is None else first,
        )

    def gone(self, seen: Commit) -> tuple[int, int] | None:
        """The release ``(version, first record)`` by which this commit's store no longer
        holds every record of version ``seen``, or None while it does: the one from the lowest
        record (the pairs rise in record), so that ``seen``'s records before it are those of
        that version, whether it is one release or merged ones."""
        for version, start in self.rewrites:
            if version > seen.generation and start < seen.records:
                return version, start
        return None

    def why_gone(self, seen: Commit) -> str:
        """Why version ``seen`` is gone (:meth:`gone` found it so), as a clause."""
        gone = self.gone(seen)
        assert gone is not None, "why_gone() of a version that is not gone"
        version, start = gone
        if version == self.horizon:
            return (
                f"reruns after truncates had written new records over rows from {start} on by "
                f"version {version}, and the store's commit record keeps only its last "
                f"{_HISTORY} such reruns apart, so every version before {version} holding more "
                f"than {start} records is refused: some were written over, and which ones is "
                "no longer known"
            )
        return (
            f"after a truncate, version {version} wrote new records over its records from "
            f"{max(start - seen.first, 0)} on"  # records count from its front (keep_last)
        )

    def truncated_since(self, seen: Commit) -> bool:
        """Whether a truncate was committed after version ``seen``."""
        return any(version > seen.generation for version, _ in self.cuts)

    @property
    def reach(self) -> int:
        """The records this commit's store still holds for its versions: ``high`` or
        ``records``."""
        return self.records if self.high is None else self.high

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
        obj = _upgrades.commit(obj)
        records, generation = (_count(obj, name, where) for name in ("records", "generation"))
        store = obj.get("store")
        if store is not None and not (isinstance(store, str) and _STORE_ID.fullmatch(store)):
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: its 'store' must be 32 "
                f"lowercase hex digits, got {json.dumps(store)}. The store was damaged outside "
                "pytreestore; restore the file from a backup (nothing was read or written)."
            )
        commit = cls(records, generation, store, _tables(obj, where), *_history(obj, where))
        if "horizon" in obj:
            commit = dataclasses.replace(commit, horizon=_count(obj, "horizon", where))
        if "first" in obj:
            commit = dataclasses.replace(commit, first=_first(obj, records, where))
        fragments = obj.get("fragments", [])
        if not (
            isinstance(fragments, list) and all(_FRAGMENT_ID.fullmatch(str(f)) for f in fragments)
        ):
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: its 'fragments' must be a "
                f"list of fragment ids (32 hex digits), got {json.dumps(fragments)}"
            )
        return dataclasses.replace(commit, fragments=tuple(fragments)) if fragments else commit


def released(
    rewrites: tuple[tuple[int, int], ...], horizon: int | None, release: tuple[int, int]
) -> tuple[tuple[tuple[int, int], ...], int | None]:
    """``rewrites`` and ``horizon`` after ``release``, ``(version, first record)``.

    A pair ``(v, r)`` refuses every version before ``v`` holding more than ``r`` records, so a
    pair that a later pair of the same or a lower record follows refuses nothing more: it is
    dropped, and the pairs left rise in both version and record. Past :data:`_HISTORY` pairs
    the oldest two merge into one, ``(the later version, the lower record)``, which refuses
    all they did (and the versions between them holding records between theirs, which may
    be whole); ``horizon`` is its version while it stands first.

    Example:
        >>> released(((2, 5), (4, 9)), None, (7, 6))
        (((2, 5), (7, 6)), None)
    """
    pairs: list[tuple[int, int]] = []
    for pair in (*rewrites, release):
        while pairs and pairs[-1][1] >= pair[1]:
            pairs.pop()
        pairs.append(pair)
    while len(pairs) > _HISTORY:
        (_, record), (version, _) = pairs[0], pairs[1]
        pairs[:2] = [(version, record)]
        horizon = version
    return tuple(pairs), (horizon if horizon == pairs[0][0] else None)


def _tables(obj: dict[str, object], where: str) -> tuple[tuple[str, int], ...] | None:
    tables = obj.get("tables")
    if tables is None:
        return None
    if not isinstance(tables, dict):
        raise CorruptStoreError(
            f"{where}/{COMMIT_KEY} is not a valid commit record: its 'tables' must be an "
            f"object of row counts, got {json.dumps(tables)}"
        )
    return tuple(sorted((str(k), _count(tables, k, where)) for k in tables))


def _history(obj: dict[str, object], where: str) -> tuple[Any, ...]:
    """The format-3 members: schema, time, operation, high, cuts, rewrites."""
    texts = []
    for name in ("schema", "time", "operation"):
        value = obj.get(name)
        if value is not None and not isinstance(value, str):
            raise CorruptStoreError(
                f"{where}/{COMMIT_KEY} is not a valid commit record: its {name!r} must be a "
                f"string, got {json.dumps(value)}"
            )
        texts.append(value)
    high = _count(obj, "high", where) if "high" in obj else None
    pairs = [_pairs(obj, name, where) for name in ("cuts", "rewrites")]
    return (*texts, high, *pairs)


def _pairs(obj: dict[str, object], name: str, where: str) -> tuple[tuple[int, int], ...]:
    value = obj.get(name, [])
    if not isinstance(value, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(type(n) is int and n >= 0 for n in p)
        for p in value
    ):
        raise CorruptStoreError(
            f"{where}/{COMMIT_KEY} is not a valid commit record: its {name!r} must be a list "
            f"of [version, records] pairs, got {json.dumps(value)}"
        )
    return tuple((int(a), int(b)) for a, b in value)


def _first(obj: dict[str, object], records: int, where: str) -> int:
    """``obj["first"]``, a row of the record table at most ``records``."""
    first = _count(obj, "first", where)
    if first > records:
        raise CorruptStoreError(
            f"{where}/{COMMIT_KEY} is not a valid commit record: its 'first' ({first}) is past "
            f"its 'records' ({records}). The store was damaged outside pytreestore; restore "
            "the file from a backup (nothing was read or written)."
        )
    return first


def now_utc() -> str:
    """The time now, ISO 8601 in UTC to the microsecond."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _count(obj: dict[str, object], name: str, where: str) -> int:
    """``obj[name]`` if it is an int (not a bool) in ``[0, 2**63)``, else CorruptStoreError."""
    value = obj.get(name)
    if type(value) is not int or not 0 <= value < 2**63:
        raise CorruptStoreError(
            f"{where}/{COMMIT_KEY} is not a valid commit record: its {name!r} must be an "
            f"integer in [0, 2**63), got {json.dumps(value)}. The store was damaged outside "
            "pytreestore; restore the file from a backup (nothing was read or written)."
        )
    return value


def generation_of(engine: Snapshots, version: int) -> int | None:
    """The storage generation that committed store version ``version``: the first whose
    commit record names it; None when none does (a version committed before the store was
    moved to this backend, whose rows the version record alone then pins)."""
    latest = engine.latest_generation()
    low, high = 1, latest + 1
    while low < high:  # the first generation whose commit record is at least `version`
        middle = (low + high) // 2
        if _committed(engine, middle) >= version:
            high = middle
        else:
            low = middle + 1
    return low if low <= latest and _committed(engine, low) == version else None


def _committed(engine: Snapshots, generation: int) -> int:
    """The version the commit record of ``generation`` names (-1: none yet)."""
    raw = engine.at_generation(generation).read_bytes(COMMIT_KEY)
    return -1 if raw is None else Commit.from_bytes(raw, f"generation {generation}").generation


def pinned(engine: Backend, commit: Commit) -> Backend:
    """A read-only backend holding exactly ``commit``'s rows where ``engine`` keeps every
    generation (:class:`~pytreestore.backends.Snapshots`), else ``engine`` itself."""
    if not isinstance(engine, Snapshots):
        return engine
    generation = generation_of(engine, commit.generation)
    return engine if generation is None else engine.at_generation(generation)


__all__ = ["COMMIT_KEY", "OPERATIONS", "Commit", "generation_of", "now_utc", "pinned", "released"]
