"""The partial writes a killed writer leaves on TensorStore's file kvstore.

TensorStore's file kvstore writes a key through ``<key>.__lock`` and renames it over the key;
a writer killed in between leaves that file (a partial chunk's bytes). Repair on open for
append deletes them (step 4 of :mod:`pytreestore._commit.protocol`), through the backends'
``remove_partial_writes``.

Such a file is also the lock of a write in flight: TensorStore's rule (its
``file_key_value_store.cc``) is that only the holder of an exclusive lock on the file, while
the file still has its path, may remove or rename it. A process writing beside the writer
holds one (``write_fragment``, which writes into the same OCDBT database and its shared
``manifest.ocdbt.__lock``): deleting its file made its rename fail. So
:func:`remove_abandoned` takes each file's lock without waiting first (the open file
description lock TensorStore takes on Linux, ``flock`` elsewhere) and deletes only files
whose lock it got, whose path still names them: files no live process is writing.

Example:
    >>> from pathlib import Path
    >>> partial_writes(Path("/nonexistent-store"), [], 0)[0].name
    'commit.json.__lock'
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from pytreestore._format.names import (
    COMMIT_KEY,
    ROOT_KEY,
    SCHEMAS_DIR,
    TAGS_DIR,
    VERSIONS_DIR,
    array_json,
)
from pytreestore._platform import flock_module


def partial_writes(root: Path, keys: Sequence[str], tail_chunk: int) -> list[Path]:
    """The ``.__lock`` files that may lie in the store at ``root``: of the commit record, the
    root, the version log's objects, the columns' metadata and their chunks from chunk
    ``tail_chunk`` on (on the record axis; chunks below it are never written again)."""
    found = [root / f"{COMMIT_KEY}.__lock", root / f"{ROOT_KEY}.__lock"]
    for folder in (VERSIONS_DIR, TAGS_DIR, SCHEMAS_DIR):  # the version log's objects
        found.extend((root / folder).glob("*.__lock"))
    for key in keys:
        found.append(root / f"{array_json(key)}.__lock")
        chunks = root / key / "c"
        if not chunks.is_dir():
            continue
        with os.scandir(chunks) as entries:
            for entry in entries:
                index = entry.name.split(".", 1)[0]
                if entry.name.endswith(".__lock"):
                    found.append(Path(entry.path))
                elif entry.is_dir() and index.isdigit() and int(index) >= tail_chunk:
                    found.extend(Path(entry.path).rglob("*.__lock"))
    return found


def remove_abandoned(paths: Sequence[Path]) -> list[str]:
    """Deletes each of ``paths`` (lock files) that is there and that no live process is
    writing (see the module); the ones deleted."""
    removed = []
    for path in paths:
        if _remove_if_unlocked(str(path)):
            removed.append(str(path))
    return removed


def _remove_if_unlocked(path: str) -> bool:
    """Deletes ``path`` if its lock is free, as TensorStore's rule allows; whether it did."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if not _try_lock(fd, flock_module(path, "removing the partial write")):
            return False  # a live writer holds it: its write is in flight
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):  # still the canonical file
                os.unlink(path)
                return True
        return False
    finally:
        os.close(fd)  # releases the lock


def _try_lock(fd: int, fcntl: ModuleType) -> bool:
    """Takes the exclusive lock TensorStore's file kvstore takes on a lock file, without
    waiting; False if another holds it."""
    try:
        if hasattr(fcntl, "F_OFD_SETLK"):  # Linux: an open file description lock, whole file
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        else:  # macOS and the BSDs: flock
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    return True
