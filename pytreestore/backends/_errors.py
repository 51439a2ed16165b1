"""The errors every backend raises in the same words (the contract's "Errors", in
:mod:`pytreestore.backends._base`, which re-exports them): a damaged or missing chunk, named
with its column key, chunk and storage key, and a symbolic link loop inside a local store.

Example:
    >>> err = damaged_chunk("x", (3,), "bad checksum")
    >>> err.key, "store.verify()" in str(err)
    ('x/c/3', True)
"""

from __future__ import annotations

import errno
import os
import re

from pytreestore._format.names import chunk_key
from pytreestore.errors import CorruptChunkError, CorruptStoreError


def symlink_loop(doing: str, err: BaseException) -> CorruptStoreError | None:
    """The error of a failure caused by a symbolic link loop inside a local store (a chunk,
    column folder or file that links back to itself), naming its path; None for any other
    failure. Every backend raises it in these words, never the engine's ``OSError``."""
    text = str(err)
    if not (getattr(err, "errno", None) == errno.ELOOP or os.strerror(errno.ELOOP) in text):
        return None
    quoted = re.search(r"[\"']([^\"']*/[^\"']*)[\"']", text)  # the first quoted path
    path = getattr(err, "filename", None) or (quoted.group(1) if quoted else "a path")
    return CorruptStoreError(
        f"{doing} failed: {path} is a symbolic link loop inside the store "
        f"({os.strerror(errno.ELOOP)}): the store was damaged outside pytreestore. Remove the "
        "link and restore the file or folder it replaced from a backup; run store.verify() "
        "to list what else is missing."
    )


class MissingChunkError(CorruptChunkError):
    """:func:`missing_chunk`'s error: a chunk (or a shard's inner chunk) is absent, rather
    than damaged."""


def missing_chunk(column: str, chunk: tuple[int, ...] | None, why: object) -> CorruptChunkError:
    """The error of a committed chunk of ``column`` (a storage key) whose object is gone: its
    records are lost, and are never read as the fill value (zeros)."""
    key = chunk_key(column, chunk) if chunk else None
    where = f"chunk {chunk} ({key})" if chunk else "a chunk"
    return MissingChunkError(
        f"column {column}: {where} is missing, so committed records in it cannot be read "
        f"({why}); they are not returned as zeros. Restore the chunk from a backup, or copy "
        "the records before it to a new store. Run store.verify() to list every problem.",
        path=column,
        chunk=chunk,
        key=key,
    )


def damaged_chunk(column: str, chunk: tuple[int, ...] | None, why: object) -> CorruptChunkError:
    """The error of a chunk of ``column`` (a storage key) that cannot be read, naming the chunk
    and its key when known; every backend raises it in these words."""
    key = chunk_key(column, chunk) if chunk else None
    where = f"chunk {chunk} ({key})" if chunk else "a chunk"
    return CorruptChunkError(
        f"column {column}: {where} is damaged and cannot be read ({why}). "
        "Run store.verify() to list every damaged chunk.",
        path=column,
        chunk=chunk,
        key=key,
    )


__all__ = ["MissingChunkError", "damaged_chunk", "missing_chunk", "symlink_loop"]
