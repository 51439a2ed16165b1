"""Chunks placed between keys of a local store without copying a byte (the local side of
:class:`~pytreestore.backends.ChunkCopies`), and making such placements durable.

:func:`link_files` links each destination to its source's file (through a temporary name and
a rename when something is there already, so a reader sees the old object or the new one).
:func:`move_folders` renames whole folders (a fragment's chunk rows,
:mod:`pytreestore._log.placing`). Either way the folders that got an entry are then made
durable by :func:`sync_folders`, before the commit record that counts them is written: one
``fsync`` per folder when they are few, one ``syncfs`` of the file system when they are many
(Linux; elsewhere every folder is fsynced). A linked source file stays; a later write to
either key replaces its own name by a rename and never changes the other's bytes.

Example:
    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "f/x/c/0").mkdir(parents=True); (root / "f/x/c/0/0").write_bytes(b"chunk")
    5
    >>> link_files(str(root), [("f/x/c/0/0", "x/c/3/0")])
    >>> (root / "x/c/3/0").read_bytes(), (root / "x/c/3/0").stat().st_nlink
    (b'chunk', 2)
    >>> folders = set(); move_folders(str(root), [("f/x/c/0", "x/c/4")], folders)
    []
    >>> sync_folders(folders); (root / "x/c/4/0").read_bytes()
    b'chunk'
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pytreestore._format.keys import CHUNK_KEY_PATTERN
from pytreestore._runtime import RUNTIME
from pytreestore.backends._base import missing_chunk
from pytreestore.errors import PyTreeStoreError, StorageError


def link_files(root: str, pairs: Sequence[tuple[str, str]]) -> None:
    """Links every ``(source, destination)`` key pair below ``root``, durably.

    Raises:
        CorruptChunkError: a source file is missing.
        StorageError: the file system refused a link.
    """
    folders: set[str] = set()
    try:
        link_all(root, pairs, folders)
        sync_folders(folders)
    except PyTreeStoreError:
        raise  # a missing source (also an OSError)
    except OSError as err:
        raise StorageError(f"cannot link chunks in {root}: {err}") from err


def link_all(root: str, pairs: Iterable[tuple[str, str]], folders: set[str]) -> None:
    """Links every pair, not yet durably; notes in ``folders`` each folder that got an entry.

    Raises:
        CorruptChunkError: a source file is missing.
        OSError: the file system refused a link.
    """
    _by_folder(_link_each, root, pairs, folders)


def move_folders(root: str, moves: Sequence[tuple[str, str]], folders: set[str]) -> list[int]:
    """Renames each ``(source, destination)`` folder below ``root``, not yet durably (an empty
    destination folder is replaced); notes the folders that got an entry in ``folders``.
    Returns the indices of the moves left undone because their destination is a folder that
    is not empty (their sources stay where they are).

    Raises:
        CorruptChunkError: a source folder is missing.
        OSError: the file system refused a rename.
    """
    busy: list[int] = []  # appended from threads: list.append is atomic
    indexed = [(s, d, i) for i, (s, d) in enumerate(moves)]
    _by_folder(lambda r, group, found: _move_each(r, group, found, busy), root, indexed, folders)
    return sorted(busy)


def _by_folder(
    fn: Callable[[str, Sequence[Any], set[str]], None],
    root: str,
    pairs: Iterable[Any],
    folders: set[str],
) -> None:
    """``fn`` of the pairs of each destination folder, folders side by side on threads
    (entries made in one folder queue on its lock; different folders do not)."""
    groups: dict[str, list[Any]] = {}
    for pair in pairs:
        groups.setdefault(pair[1].rpartition("/")[0], []).append(pair)
    threads = min(len(groups), os.cpu_count() or 1, RUNTIME.threads.folder_syncs)
    if threads < 2:
        for group in groups.values():
            fn(root, group, folders)
        return

    def run(group: Sequence[Any]) -> set[str]:
        found: set[str] = set()
        fn(root, group, found)
        return found

    with RUNTIME.call_pool(threads) as pool:
        for found in pool.map(run, groups.values()):
            folders |= found


def _link_each(root: str, pairs: Sequence[tuple[str, str]], folders: set[str]) -> None:
    base = root.rstrip("/") + "/"
    for source, destination in pairs:  # links in one folder queue on its lock: in turn
        src, dst = base + source, base + destination
        try:
            os.link(src, dst)
        except FileExistsError:
            tmp = f"{dst}.{uuid.uuid4().hex}.link"
            os.link(src, tmp)
            os.replace(tmp, dst)
        except FileNotFoundError:
            if not os.path.exists(src):
                raise missing_source(source) from None
            make_folders(os.path.dirname(dst), folders)
            os.link(src, dst)
        folders.add(dst.rpartition("/")[0])


def _move_each(
    root: str, moves: Sequence[tuple[str, str, int]], folders: set[str], busy: list[int]
) -> None:
    base = root.rstrip("/") + "/"
    for source, destination, index in moves:
        src, dst = base + source, base + destination
        try:
            os.rename(src, dst)
        except FileNotFoundError:
            if not os.path.isdir(src):
                raise missing_source(source) from None
            make_folders(os.path.dirname(dst), folders)
            os.rename(src, dst)
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            busy.append(index)
            continue
        folders.add(dst.rpartition("/")[0])


def make_folders(folder: str, folders: set[str]) -> None:
    """Makes ``folder`` and its missing parents, noting each new entry's folder to sync."""
    missing = []
    while not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for made in reversed(missing):
        os.makedirs(made, exist_ok=True)
        folders.add(os.path.dirname(made))


def missing_source(source: str, thing: str = "file") -> Exception:
    """The CorruptChunkError of a missing source key (its column and chunk when it is a
    chunk key); ``thing``: what is missing (a file, an object)."""
    found = CHUNK_KEY_PATTERN.match(source)
    if found:
        chunk = tuple(int(i) for i in found.group(2).split("/"))
        return missing_chunk(found.group(1), chunk, f"no {thing} at {source}")
    return missing_chunk(source, None, f"no {thing} at {source}")


# ---- durability ----------------------------------------------------------------------------


def sync_folders(folders: Iterable[str]) -> None:
    """Makes the entries of ``folders`` (absolute paths) durable: each folder fsynced when
    they are at most ``RUNTIME.writes.few_folders``, else one ``syncfs`` of their file system (which
    flushes everything on it: far fewer waits than thousands of fsyncs).

    Raises:
        OSError: the file system failed to sync.
    """
    found = sorted(folders)
    if len(found) > RUNTIME.writes.few_folders and _syncfs_all(found):
        return
    _each(fsync_folder, found)


def _syncfs_all(folders: Sequence[str]) -> bool:
    """One ``syncfs`` per file system holding ``folders``; False where there is none."""
    syncfs = _syncfs()
    if syncfs is None:
        return False
    devices: dict[int, str] = {}
    for folder in folders:
        devices.setdefault(os.stat(folder).st_dev, folder)
    for folder in devices.values():
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if syncfs(fd) != 0:
                code = ctypes.get_errno()
                raise OSError(code, f"syncfs failed: {os.strerror(code)}", folder)
        finally:
            os.close(fd)
    return True


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    """The C library's ``syncfs`` (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None


def fsync_folder(folder: str) -> None:
    """Makes the entries of ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _each(fn: Callable[[Any], None], items: Sequence[Any]) -> None:
    """``fn`` of every item, on threads when there are many (fsyncs wait on the disk, and
    a journal commits concurrent ones together)."""
    if len(items) <= 4:
        for item in items:
            fn(item)
        return
    with RUNTIME.call_pool(min(RUNTIME.threads.folder_syncs, len(items))) as pool:
        for _ in pool.map(fn, items):
            pass


__all__ = [
    "fsync_folder",
    "link_all",
    "link_files",
    "make_folders",
    "missing_source",
    "move_folders",
    "sync_folders",
]
