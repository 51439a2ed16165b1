"""Hard links between keys of a local store: a fragment's chunks placed at the store's keys
without copying a byte (the local side of :class:`~pytreestore.backends.ChunkCopies`).

Each destination is linked to its source's file (through a temporary name and a rename
when something is there already, so a reader sees the old object or the new one), then every
folder that got an entry is fsynced, so the links are durable before the commit record that
counts them is written. The source file stays; a later write to either key replaces its own
name by a rename and never changes the other's bytes.

Example:
    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "f/x/c").mkdir(parents=True); (root / "f/x/c/0").write_bytes(b"chunk")
    5
    >>> link_files(str(root), [("f/x/c/0", "x/c/3")])
    >>> (root / "x/c/3").read_bytes(), (root / "x/c/3").stat().st_nlink
    (b'chunk', 2)
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pytreestore._format.names import CHUNK_KEY_PATTERN
from pytreestore.backends._base import missing_chunk
from pytreestore.errors import PyTreeStoreError, StorageError

_THREADS = 16  # folders fsynced at once


def link_files(root: str, pairs: Sequence[tuple[str, str]]) -> None:
    """Links every ``(source, destination)`` key pair below ``root``, durably.

    Raises:
        CorruptChunkError: a source file is missing.
        StorageError: the file system refused a link.
    """
    folders: set[str] = set()

    try:
        for source, destination in pairs:  # links in one folder queue on its lock: in turn
            _link(os.path.join(root, source), os.path.join(root, destination), source, folders)
        _each(_fsync_folder, sorted(folders))
    except PyTreeStoreError:
        raise  # a missing source (also an OSError)
    except OSError as err:
        raise StorageError(f"cannot link chunks in {root}: {err}") from err


def _each(fn: Callable[[Any], None], items: Sequence[Any]) -> None:
    """``fn`` of every item, on threads when there are many (fsyncs wait on the disk, and
    a journal commits concurrent ones together)."""
    if len(items) <= 4:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(_THREADS) as pool:
        for _ in pool.map(fn, items):
            pass


def _link(src: str, dst: str, source: str, folders: set[str]) -> None:
    try:
        os.link(src, dst)
    except FileExistsError:
        tmp = f"{dst}.{uuid.uuid4().hex}.link"
        os.link(src, tmp)
        os.replace(tmp, dst)
    except FileNotFoundError:
        if not os.path.exists(src):
            raise _missing(source) from None
        parent = os.path.dirname(dst)
        _make_folders(parent, folders)
        os.link(src, dst)
    folders.add(os.path.dirname(dst))


def _make_folders(folder: str, folders: set[str]) -> None:
    """Makes ``folder`` and its missing parents, noting each new entry's folder to fsync."""
    missing = []
    while not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for made in reversed(missing):
        os.makedirs(made, exist_ok=True)
        folders.add(os.path.dirname(made))


def _missing(source: str) -> Exception:
    found = CHUNK_KEY_PATTERN.match(source)
    if found:
        chunk = tuple(int(i) for i in found.group(2).split("/"))
        return missing_chunk(found.group(1), chunk, f"no file at {source}")
    return missing_chunk(source, None, f"no file at {source}")


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["link_files"]
