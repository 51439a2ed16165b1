"""Fragments nobody will commit, removed by ``store.vacuum()``.

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

import datetime
import json
import os
import time
from collections.abc import Iterable

from pytreestore._commit import versions
from pytreestore._commit.fragment import BEGUN, MANIFEST
from pytreestore._commit.placing import local_root
from pytreestore._commit.record import Commit
from pytreestore._format.names import FRAGMENTS_DIR
from pytreestore._fragments import remove as _fragments
from pytreestore._location import Location
from pytreestore.backends import Backend, KeyListing

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
        _fragments.remove(engine, gone)
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


__all__ = ["FRAGMENTS_OLDER_THAN", "sweep"]
