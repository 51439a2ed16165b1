"""Versions: every commit kept as an immutable record, tags that name them, and the log's bound.

Each commit (:mod:`pytreestore._log.protocol`, step 6) first writes its commit record as
``.pytreestore/versions/<generation, 20 digits>.json``, only if that key is absent, and then
``.pytreestore/commit.json`` as before. Two writers can therefore never both make version *N*:
the second finds the key taken and gets :class:`~pytreestore.errors.CommitConflictError`.
A version record is never changed afterwards; the schema it names (its digest) is kept as
``.pytreestore/schemas/<hex>.json``, so that an evolved store still reads its older versions.

A version's records are rows ``[0, records)`` of the columns, which appends never change.
``truncate(n)`` commits a version of ``n`` records and rewrites nothing, so the versions before
it stay whole; the first append after it commits a *release* first (it gives up the rows past
``n``), and every version holding more than ``n`` records is then gone: listed with
``readable=False``, refused by ``open(version=...)``.

The log is bounded: a writer keeps the last ``keep_versions`` versions (1,000 by default) and
every tagged one; older records are deleted as commits go by (every 64 commits). Chunks that
no kept version reaches are removed only by an explicit ``store.vacuum()``
(:mod:`pytreestore._log.prune`).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-versions", {"x": np.int32(0)})
    >>> s.extend({"x": np.int32(i)} for i in range(3)); s.flush()
    >>> [(v.version, v.records, v.operation) for v in s.versions()]
    [(0, 0, 'create'), (1, 3, 'append')]
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from collections.abc import Sequence
from typing import Any

from pytreestore import _arguments
from pytreestore._format import validate as _validate
from pytreestore._format.keys import (
    NO_VALUE,
    ROOT_KEY,
    SCHEMAS_DIR,
    TAGS_DIR,
    VERSIONS_DIR,
    schema_key,
    tag_key,
    version_key,
)
from pytreestore._log.commit_record import Commit, now_utc
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, ConditionalWrites, KeyListing, ManyReads, capable
from pytreestore.errors import (
    ArgumentError,
    ArgumentTypeError,
    CorruptStoreError,
    TagExistsError,
    VersionNotFoundError,
)

#: versions a writer keeps by default (besides tagged ones)
KEEP_VERSIONS = 1000
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_VERSION_FILE = re.compile(r"(\d{20})\.json")


@dataclasses.dataclass(frozen=True)
class Version:
    """One version of a store, as :meth:`TreeStore.versions` lists it.

    Attributes:
        version: its number, the commit's generation (0: the empty store ``create`` made).
        records: the records it holds (``len`` of the store opened at it).
        time: when it was committed (UTC); None for a commit of an older pytreestore.
        operation: ``"create"``, ``"append"``, ``"evolve"``, ``"truncate"``,
            ``"release"`` (the first append after a truncate gives up the rows past it) or
            ``"keep_last"`` (records released from the front); None for a commit of an
            older pytreestore.
        tags: the names :meth:`TreeStore.tag` gave it.
        readable: False once a commit after a truncate wrote over its records.
        dropped: the records released from the front before it (``TreeStore.dropped``).

    Example:
        >>> Version(3, 10, None, "append", ()).readable
        True
    """

    version: int
    records: int
    time: datetime.datetime | None
    operation: str | None
    tags: tuple[str, ...] = ()
    readable: bool = True
    dropped: int = 0


# ---- version records -----------------------------------------------------------------------


def publish(engine: Backend, commit: Commit) -> bool:
    """Writes ``commit``'s version record if no record of its number exists; whether it did
    (True also when an identical record is there: a retry of a write that landed)."""
    key, data = version_key(commit.generation), commit.to_bytes()
    if isinstance(engine, ConditionalWrites):
        if engine.write_bytes_if(key, data, NO_VALUE) is not None:
            return True
    elif engine.read_bytes(key) is None:
        engine.write_bytes(key, data)
        return True
    return engine.read_bytes(key) == data


def read(engine: Backend, version: int, where: str) -> Commit | None:
    """Version ``version``'s record, or None if there is none."""
    raw = engine.read_bytes(version_key(version))
    if raw is None:
        return None
    commit = Commit.from_bytes(raw, f"{where} (version {version})")
    if commit.generation != version:
        raise CorruptStoreError(
            f"{where}/{version_key(version)} holds the record of version {commit.generation}, "
            "not its own; the store's version log was edited or damaged outside pytreestore. "
            "Delete that file (the version is then no longer listed) or restore it from a backup"
        )
    return commit


def numbers(engine: Backend, head: Commit | None = None) -> list[int]:
    """The numbers of every version record stored, ascending.

    Where keys cannot be listed (a store read over HTTP), the records of the versions
    before ``head`` are looked for one by one, ``RUNTIME.writes.version_probe`` at once (one
    request per
    commit ever made); without ``head``, none are found."""
    if not isinstance(engine, KeyListing):
        return [] if head is None else _probed(engine, head.generation)
    found = (_VERSION_FILE.fullmatch(k.rpartition("/")[2]) for k in _listing(engine, VERSIONS_DIR))
    return sorted(int(m.group(1)) for m in found if m)


def _probed(engine: Backend, below: int) -> list[int]:
    """The versions before ``below`` whose records ``engine`` holds, found by reading them."""
    found = []
    for start in range(0, below, RUNTIME.writes.version_probe):
        keys = [
            version_key(n) for n in range(start, min(below, start + RUNTIME.writes.version_probe))
        ]
        found += [start + i for i, raw in enumerate(_read_all(engine, keys)) if raw is not None]
    return found


def _read_all(engine: Backend, keys: list[str]) -> list[bytes | None]:
    if capable(engine, ManyReads):
        return engine.read_many_bytes(keys)
    return [engine.read_bytes(k) for k in keys]


def _listing(engine: KeyListing, folder: str) -> list[str]:
    return engine.list_keys(folder + "/")


def discard_orphan(engine: Backend, head: Commit) -> None:
    """Deletes the record of version ``head + 1`` if a writer that crashed between the version
    record and the commit record left one (the caller holds the writer lock)."""
    orphan = version_key(head.generation + 1)
    if engine.read_bytes(orphan) is not None:
        engine.delete_keys([orphan])


# ---- resolving a version -------------------------------------------------------------------


def resolve(engine: Backend, head: Commit, wanted: int | str, where: str) -> Commit:
    """The commit of version ``wanted`` (a number, or a tag's name) of the store whose latest
    commit is ``head``.

    Raises:
        VersionNotFoundError: no such version or tag, a version after ``head``, or one
            whose records a later commit wrote over.
    """
    number = _tagged(engine, wanted, where) if isinstance(wanted, str) else wanted
    if number == head.generation:
        return head
    found = read(engine, number, where) if 0 <= number < head.generation else None
    if found is None:
        raise VersionNotFoundError(
            f"{where} has no version {number}{_named(wanted)}: it keeps "
            f"{_kept(engine, head, where)} (store.versions() lists them)"
        )
    gone = head.gone(found)
    if gone is not None:
        raise VersionNotFoundError(
            f"version {number}{_named(wanted)} of {where} ({found.length} records) is gone: "
            f"{head.why_gone(found)}. Its first {max(gone[1] - found.first, 0)} records are "
            f"those of version {gone[0]}; open that version or a later one."
        )
    if found.store is not None and head.store is not None and found.store != head.store:
        raise CorruptStoreError(
            f"{where}/{version_key(number)} belongs to another store (id {found.store}, this "
            f"store's is {head.store}); the store's files were mixed with another's"
        )
    return found


def _kept(engine: Backend, head: Commit, where: str) -> str:
    """The versions and tags the store keeps, compactly: ``versions 0, 5 to 9 and 64 to
    131; tags 'a' (5), 'b' (7)``; of more than 8 runs or tags, the first and last few."""
    kept = sorted({n for n in numbers(engine, head) if n <= head.generation} | {head.generation})
    runs = _runs(kept)
    if len(runs) > 8:
        runs = [*runs[:4], f"... {len(runs) - 7} more runs ...", *runs[-3:]]
    text = f"version{'s' if len(kept) > 1 else ''} {_listed_words(runs)}"
    named = sorted(tags(engine, where).items(), key=lambda item: (item[1], item[0]))
    if named:
        shown = [f"{name!r} ({n})" for name, n in named[:8]]
        more = f" and {len(named) - 8} more" if len(named) > 8 else ""
        text += f"; tags {', '.join(shown)}{more}"
    return text


def _runs(kept: Sequence[int]) -> list[str]:
    """``[0, 5, 6, 7]`` as ``["0", "5 to 7"]``."""
    runs: list[list[int]] = []
    for n in kept:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [str(a) if a == b else f"{a} to {b}" for a, b in runs]


def _listed_words(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _named(wanted: int | str) -> str:
    return f" (tag {wanted!r})" if isinstance(wanted, str) else ""


def check_wanted(wanted: object) -> int | str:
    """A ``version=``: a tag name, or a version number (any integer, as a Python int).

    Raises:
        ArgumentError: neither a version number nor a tag name (an ArgumentTypeError where
            it is not even of their types).
    """
    if isinstance(wanted, str):
        check_tag_name(wanted)
        return wanted
    return _arguments.count(
        wanted, "version must be a version number (an int >= 0) or a tag's name (a str)"
    )


# ---- tags ----------------------------------------------------------------------------------


def check_tag_name(name: object) -> None:
    """Refuses a tag name outside ``[A-Za-z0-9_][A-Za-z0-9_.-]*`` (at most 128 characters)."""
    if not isinstance(name, str) or not _TAG.fullmatch(name):
        error = ArgumentTypeError if not isinstance(name, str) else ArgumentError
        raise error(
            f"a tag's name must be 1 to 128 of the characters A-Z a-z 0-9 _ . - and must not "
            f"start with . or -, got {name!r:.200}"
        )


def add_tag(engine: Backend, name: str, version: int, where: str) -> None:
    """Names ``version`` ``name``; never moves an existing tag.

    Raises:
        TagExistsError: the tag names a version already.
    """
    check_tag_name(name)
    data = json.dumps({"tag": name, "version": version, "time": now_utc()}).encode()
    key = tag_key(name)
    if isinstance(engine, ConditionalWrites):
        written = engine.write_bytes_if(key, data, NO_VALUE) is not None
    else:
        written = engine.read_bytes(key) is None
        if written:
            engine.write_bytes(key, data)
    if not written:
        raise TagExistsError(
            f"{where} has a tag {name!r} already (on version {_tag_version(engine, name, where)}); "
            "tags never move. Choose another name; nothing was written."
        )


def tags(engine: Backend, where: str) -> dict[str, int]:
    """Every tag of the store: name -> version; none where keys cannot be listed (a store
    read over HTTP, whose tags are still found by name: :func:`resolve`)."""
    if not isinstance(engine, KeyListing):
        return {}
    names = [k.rpartition("/")[2][: -len(".json")] for k in _listing(engine, TAGS_DIR)]
    return {n: _tag_version(engine, n, where) for n in names if _TAG.fullmatch(n)}


def _tagged(engine: Backend, name: str, where: str) -> int:
    check_tag_name(name)
    if engine.read_bytes(tag_key(name)) is None:
        known = sorted(tags(engine, where))
        raise VersionNotFoundError(
            f"{where} has no tag {name!r}; its tags: {', '.join(map(repr, known)) or 'none'}"
        )
    return _tag_version(engine, name, where)


def _tag_version(engine: Backend, name: str, where: str) -> int:
    raw = engine.read_bytes(tag_key(name))
    try:
        obj = json.loads(raw or b"")
        version = obj["version"]
        if type(version) is not int or version < 0:
            raise ValueError(version)
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptStoreError(
            f"{where}/{tag_key(name)} is not a valid tag ({err!r}); it was damaged outside "
            "pytreestore. Delete it (only the name is lost) or restore it from a backup"
        ) from err
    return version


# ---- listing -------------------------------------------------------------------------------


def history(engine: Backend, head: Commit, where: str) -> list[Version]:
    """Every version the store keeps, oldest first: its version records up to ``head`` (a
    store written before format 3 has none: ``head`` alone)."""
    named: dict[int, list[str]] = {}
    for name, number in tags(engine, where).items():
        named.setdefault(number, []).append(name)
    found = [n for n in numbers(engine, head) if n < head.generation]
    commits = [c for c in (read(engine, n, where) for n in found) if c is not None]
    return [_listed(c, head, named) for c in (*commits, head)]


def _listed(commit: Commit, head: Commit, named: dict[int, list[str]]) -> Version:
    time = None
    if commit.time is not None:
        time = datetime.datetime.strptime(commit.time, "%Y-%m-%dT%H:%M:%S.%fZ")
        time = time.replace(tzinfo=datetime.UTC)
    return Version(
        commit.generation,
        commit.length,
        time,
        commit.operation,
        tuple(sorted(named.get(commit.generation, ()))),
        head.gone(commit) is None,
        commit.first,
    )


def trim(
    engine: Backend, head: Commit, keep: int | None, *, every: int = RUNTIME.writes.trim_every
) -> None:
    """Deletes the records of versions older than the last ``keep`` (tagged ones stay), once
    every ``every`` commits; ``keep=None`` keeps every version."""
    if keep is None or head.generation % every:
        return
    drop = stale(engine, head, keep)
    if drop:
        engine.delete_keys([version_key(n) for n in drop])


def stale(engine: Backend, head: Commit, keep: int) -> list[int]:
    """Versions the log no longer keeps: older than the last ``keep``, and not tagged."""
    tagged = set(tags(engine, "the store").values())
    return [n for n in numbers(engine) if n <= head.generation - keep and n not in tagged]


# ---- schemas -------------------------------------------------------------------------------


def save_schema(engine: Backend, info: dict[str, object]) -> None:
    """Keeps the stamped schema ``info`` as ``.pytreestore/schemas/<its digest>.json``."""
    engine.write_bytes(schema_key(str(info["digest"])), json.dumps(info).encode())


def schema_file(info: dict[str, object]) -> dict[str, bytes]:
    """The file :func:`save_schema` writes for the stamped schema ``info``, by its key (for
    a caller writing it together with other files)."""
    return {schema_key(str(info["digest"])): json.dumps(info).encode()}  # as save_schema writes it


def record_file(commit: Commit) -> dict[str, bytes]:
    """The version record of ``commit``, by its key, as :func:`publish` writes it: for a
    caller that knows no record of its number can exist (a store being created, behind its
    incomplete marker, with the writer lock held) and writes it with other files."""
    return {version_key(commit.generation): commit.to_bytes()}


def other_schema(engine: Backend, commit: Commit, digest: str | None) -> dict[str, object] | None:
    """The schema document ``commit`` names, if it is another than the one whose id is
    ``digest`` (a root's) and the log keeps both: two schemas a writer wrote. None: read
    ``commit`` with the root's.

    A commit of a store written before versions names none; a root schema missing from the
    log is such a store's or was edited by hand (the checks of what it says then apply); a
    commit naming a schema the log lacks is one of a copy made before copies named their
    own."""
    if commit.schema is None or digest is None or commit.schema == digest:
        return None
    if engine.read_bytes(schema_key(digest)) is None:
        return None
    raw = engine.read_bytes(schema_key(commit.schema))
    return None if raw is None else schema_info(engine, commit.schema, "", raw)


def committed_info(engine: Backend, commit: Commit, where: str) -> dict[str, Any]:
    """The schema document the latest ``commit`` names: the root ``zarr.json``'s, unless a
    change whose commit never came (an evolve's, a truncate's, a learning's) left its own
    there and the log keeps the committed one (:func:`other_schema`)."""
    info = _validate.root_schema(engine.read_bytes(ROOT_KEY), where)
    return other_schema(engine, commit, _validate.schema_id(info)) or info


def schema_info(
    engine: Backend, schema_id: str, where: str, raw: bytes | None = None
) -> dict[str, object]:
    """The schema document whose digest is ``schema_id`` (``raw``: its bytes, read already).

    Raises:
        CorruptStoreError: it is missing or not the document its name says.
    """
    raw = engine.read_bytes(schema_key(schema_id)) if raw is None else raw
    try:
        info = json.loads(raw or b"")
        ok = isinstance(info, dict) and info.get("digest") == schema_id
    except ValueError:
        ok = False
    if not ok:
        raise CorruptStoreError(
            f"{where}/{schema_key(schema_id)}, the schema of the version asked for, is "
            f"{'missing' if raw is None else 'damaged'}; restore it from a backup, or read "
            "the latest version"
        )
    return info


def schema_ids(engine: Backend) -> list[str]:
    """The digests of every schema kept under ``.pytreestore/schemas``."""
    if not isinstance(engine, KeyListing):
        return []
    files = [k.rpartition("/")[2] for k in _listing(engine, SCHEMAS_DIR)]
    return [f"blake2b-160:{f[: -len('.json')]}" for f in files if f.endswith(".json")]


def kept_commits(engine: Backend, head: Commit, where: str) -> Sequence[Commit]:
    """The commits of every version still readable, oldest first, ``head`` last."""
    found = [n for n in numbers(engine, head) if n < head.generation]
    commits = [c for c in (read(engine, n, where) for n in found) if c is not None]
    return [c for c in commits if head.gone(c) is None] + [head]


__all__ = [
    "KEEP_VERSIONS",
    "Version",
    "add_tag",
    "check_tag_name",
    "check_wanted",
    "committed_info",
    "discard_orphan",
    "history",
    "kept_commits",
    "numbers",
    "other_schema",
    "publish",
    "read",
    "record_file",
    "resolve",
    "save_schema",
    "schema_file",
    "schema_ids",
    "schema_info",
    "stale",
    "tags",
    "trim",
]
