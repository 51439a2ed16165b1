"""Placing aligned fragments' chunks in a store on local disk, without copying a byte, and
undoing a placement whose commit never came.

A column of scalar leaves stores each chunk as a file ``KEY/c/I``; its fragment's chunk files
are hard-linked into the store (the fragment keeps its own names). A column of array leaves
stores each chunk row as a folder ``KEY/c/I/`` holding the row's chunks ``J/...``; making a
new folder per chunk row costs far more than a link (a directory's inode and block), so the
fragment's row folders are **renamed** into the store instead, under an intent record:

1. Every folder to move is checked to hold its chunk files (a damaged fragment is refused
   before anything moves); then ``.pytreestore/placing.json``
   (:data:`~pytreestore._format.keys.PLACING_KEY`) is written durably: the version the
   commit follows (``base``) and every ``[source, destination]`` folder pair.
2. The folders are renamed (one whose destination is a folder that is not empty, left past
   the commit by an earlier failure, has its files linked into it instead and stays) and the
   files linked; every folder that got an entry is synced.
3. The commit record is written; then the intent is deleted.

A crash (or a failure) before the commit record leaves the intent: :func:`settle`, run before
the next writer repairs the store (``open(mode="a")``) and before each ``commit_fragments``,
renames every moved folder back into its fragment when the store is still at ``base`` (a
source was there when the intent was written, so one that is gone while its destination
exists was moved there by step 2), so the
fragments are whole again and can be committed. Past ``base`` (the commit was made, or
another commit came after a failed one) nothing is moved back. Either way the intent is then
deleted. Readers never look at rows past the commit, so they never see a placement.

Example:
    >>> import json, os, pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "f/x/c/0").mkdir(parents=True); (root / "f/x/c/0/0").write_bytes(b"chunk")
    5
    >>> place_local(str(root), 4, [("f/x/c/0", "x/c/2")], [], [("0",)])
    >>> sorted(os.listdir(root / "x/c/2")), json.loads((root / PLACING_KEY).read_text())["base"]
    (['0'], 4)
    >>> undo(str(root), [("f/x/c/0", "x/c/2")]); (root / "f/x/c/0/0").read_bytes()
    b'chunk'
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from typing import Any

from pytreestore._format.keys import FRAGMENTS_DIR, META_DIR, PLACING_KEY
from pytreestore._log.commit_record import Commit
from pytreestore.backends import Backend, ChunkCopies, LocalFiles
from pytreestore.backends import _links as links
from pytreestore.backends._base import missing_chunk
from pytreestore.errors import CorruptStoreError, PyTreeStoreError, StorageError

Pair = tuple[str, str]


def local_root(engine: Backend) -> str | None:
    """The folder whose files are ``engine``'s keys (so fragments are read, moved, linked and
    deleted as files), or None: every call goes through the engine (S3, OCDBT, memory)."""
    return engine.files_root if isinstance(engine, LocalFiles) else None


def place_local(
    root: str,
    base: int,
    moves: Sequence[Pair],
    pairs: Sequence[Pair],
    chunks: Sequence[Sequence[str]],
) -> None:
    """Renames the ``moves`` (fragment chunk-row folder, store chunk-row folder) and links the
    ``pairs`` (fragment chunk file, store chunk file) below ``root``, durably, for a commit
    after version ``base``; the intent record stays until :func:`done` or :func:`settle`.

    ``chunks[i]`` names the chunk files the folder of ``moves[i]`` must hold (keys below
    it); each is checked before anything is moved. A move whose destination
    is a folder that is not empty gets its chunk files linked into it instead.

    Raises:
        CorruptChunkError: a fragment's chunk file or chunk-row folder is missing (nothing
            was moved, or every folder moved is moved back).
        StorageError: the file system refused (moved folders are moved back where it can).
    """
    try:
        _check_sources(root, moves, chunks)
        if moves:
            _write_intent(root, base, moves)
        folders: set[str] = set()
        try:
            busy = links.move_folders(root, moves, folders)
            linked = [(f"{moves[i][0]}/{n}", f"{moves[i][1]}/{n}") for i in busy for n in chunks[i]]
            links.link_all(root, [*pairs, *linked], folders)
            links.sync_folders(folders)
        except BaseException:
            if moves:
                with contextlib.suppress(OSError):  # else settle() does it later
                    undo(root, moves)
                    done(root)
            raise
    except PyTreeStoreError:
        raise  # a missing source (also an OSError)
    except OSError as err:
        raise StorageError(f"cannot place fragment chunks in {root}: {err}") from err


def _check_sources(root: str, moves: Sequence[Pair], chunks: Sequence[Sequence[str]]) -> None:
    """Raises CorruptChunkError unless every folder to move holds its chunk files: so every
    folder the intent lists was there, and one missing after a crash was moved."""
    base = root.rstrip("/") + "/"
    for (source, _), names in zip(moves, chunks, strict=True):
        for name in names:
            key = f"{source}/{name}"
            try:
                os.stat(base + key)
            except (FileNotFoundError, NotADirectoryError):
                raise links.missing_source(key) from None


def _write_intent(root: str, base: int, moves: Sequence[Pair]) -> None:
    """Writes the intent record durably (a temporary file, synced, renamed into place, and
    its folder synced) before the first folder moves."""
    path = os.path.join(root, PLACING_KEY)
    text = json.dumps({"base": base, "moves": [list(m) for m in moves]}, separators=(",", ":"))
    tmp = path + ".partial"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    links.fsync_folder(os.path.dirname(path))


def done(root: str) -> None:
    """Deletes the intent record of a placement that was committed or undone."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(root, PLACING_KEY))


def undo(root: str, moves: Sequence[Pair]) -> None:
    """Renames back, durably, every folder of ``moves`` that was moved: its destination
    exists and its source does not (and the fragment's folder is still there)."""
    base = root.rstrip("/") + "/"
    folders: set[str] = set()
    for source, destination in reversed(moves):
        src, dst = base + source, base + destination
        parent = os.path.dirname(src)
        if os.path.lexists(src) or not os.path.isdir(dst) or not os.path.isdir(parent):
            continue
        os.rename(dst, src)
        folders.add(parent)
    links.sync_folders(folders)


def settle(engine: Backend, where: str) -> bool:
    """Finishes a placement an earlier writer left (its intent record): moves its folders
    back into their fragments if the store is still at the version it followed; then deletes
    the record. Whether there was one. Only the writer (holding the lock) calls this.

    Raises:
        CorruptStoreError: the intent record is damaged (delete it to go on: the
            fragments it moved are then lost, the store's records are not).
        StorageError: the file system refused a rename.
    """
    root = local_root(engine)
    if root is None:
        return False
    path = os.path.join(root, PLACING_KEY)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return False
    except OSError as err:
        raise StorageError(f"cannot read {path}: {err}") from err
    base, moves = _parse(raw, path)
    if Commit.read(engine, where).generation == base:
        try:
            undo(root, moves)
        except OSError as err:
            raise StorageError(
                f"cannot move the chunk rows of an unfinished commit of fragments in {where} "
                f"back into their fragments ({err}); nothing committed is affected. Fix the "
                "file system's error and open the store again"
            ) from err
    done(root)
    return True


def _parse(raw: bytes, path: str) -> tuple[int, list[Pair]]:
    try:
        obj: Any = json.loads(raw)
        base, moves = obj["base"], [(str(s), str(d)) for s, d in obj["moves"]]
        if type(base) is not int:
            raise TypeError("base is not an integer")
        bad = next((m for m in moves if not _inside(*m)), None)
        if bad is not None:
            raise ValueError(f"the move {list(bad)} leaves a fragment's or a column's folder")
    except (ValueError, TypeError, KeyError) as err:
        raise CorruptStoreError(
            f"{path} is damaged ({err}): expected the JSON object a commit of fragments "
            'writes, {"base": N, "moves": [[source, destination], ...]}. It was edited '
            "outside pytreestore; delete it to open the store (fragments whose chunk rows it "
            "lists may then be incomplete: write them again)"
        ) from err
    return base, moves


def _inside(source: str, destination: str) -> bool:
    """Whether a move is one a commit of fragments makes: a chunk-row folder of a column in
    a fragment's folder (``FRAGMENTS_DIR/ID/KEY/c/I``) to a chunk-row folder of the same
    column in the store (``KEY/c/J``), both below the root. Undoing any other (a whole
    column, another column's rows) would move committed chunks away."""
    parts = [*source.split("/"), *destination.split("/")]
    if any(p in ("", ".", "..") for p in parts) or destination.startswith(META_DIR):
        return False
    head = FRAGMENTS_DIR + "/"
    fragment_id, _, rest = source.removeprefix(head).partition("/")
    if not source.startswith(head) or not fragment_id:
        return False
    key, _, row = rest.rpartition("/c/")
    column, _, placed = destination.rpartition("/c/")
    return bool(key) and key == column and _row(row) and _row(placed)


def _row(text: str) -> bool:
    """Whether ``text`` is a chunk row's index (ASCII digits)."""
    return text.isascii() and text.isdigit()


def place_chunks(engine: Backend, pairs: Sequence[Pair]) -> None:
    """Places encoded chunks ``(source, destination)`` as they are: copied by the backend
    where it can (:class:`~pytreestore.backends.ChunkCopies`: hard links, keys copied inside
    a database), else read and written as raw bytes.

    Raises:
        CorruptChunkError: a source holds nothing.
    """
    if not pairs:
        return
    if isinstance(engine, ChunkCopies):
        engine.copy_chunks(pairs)
        return
    found = {source: engine.read_bytes(source) for source, _ in pairs}
    missing = [s for s, raw in found.items() if raw is None]
    if missing:
        raise missing_chunk(missing[0], None, f"no object at {missing[0]}")
    engine.write_many_bytes({d: found[s] or b"" for s, d in pairs})


__all__ = ["Pair", "done", "local_root", "place_chunks", "place_local", "settle", "undo"]
