"""The errors every backend raises in the same words, and a clear error in a forked child.

The errors every backend raises in the same words (the contract's "Errors", in
:mod:`pytreestore.backends._base`, which re-exports them): a damaged or missing chunk, named
with its column key, chunk and storage key, and a symbolic link loop inside a local store.

Example:
    >>> err = damaged_chunk("x", (3,), "bad checksum")
    >>> err.key, "store.verify()" in str(err)
    ('x/c/3', True)

A library whose I/O runs on threads that ``os.fork`` does not copy: a clear error in a
forked child, before the call that would abort or hang it.

A :class:`ForkGuard` notes that this process used the library (each :meth:`ForkGuard.check`
before its I/O does) and, in a child forked after that, raises
:class:`~pytreestore.errors.ForkedBackendError` instead. TensorStore aborts such a child
(:mod:`pytreestore.backends._tensorstore.futures`); obstore, which the zarr backend reaches S3
and web servers through, hangs it (:mod:`pytreestore.backends._zarr.stores`).

Example:
    >>> guard = ForkGuard("a library", "", "it would hang", "")
    >>> guard.check("memory://doc-fork")  # in the process that used it: nothing to say
"""

from __future__ import annotations

import errno
import os
import re

from pytreestore._format.keys import chunk_key
from pytreestore._runtime import at_fork
from pytreestore.errors import CorruptChunkError, CorruptStoreError, ForkedBackendError


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


class ForkGuard:
    """Whether this process used ``library``, and whether its parent had before a fork.

    Args:
        library: the library's name, as the error gives it.
        used_for: what it is used for, appended to its name in the error (or "").
        fate: what the library would do in the child.
        instead: another way out, appended to the advice to start workers by ``spawn``.
    """

    def __init__(self, library: str, used_for: str, fate: str, instead: str) -> None:
        self._library, self._used_for, self._fate, self._instead = library, used_for, fate, instead
        self._used = False
        self._forked = False
        at_fork(self._after_fork_in_child)

    def check(self, where: object) -> None:
        """Raises :class:`ForkedBackendError` if this process was forked from one that had
        used the library; otherwise notes that this process uses it.

        Args:
            where: the store (its location) the call was for, named in the error.
        """
        if self._forked:
            raise ForkedBackendError(
                f"{where}: this process was forked (os.fork, or multiprocessing's 'fork' start "
                f"method) from one that had already used {self._library}{self._used_for}, and "
                f"{self._library} cannot run in such a child ({self._fate}). Start worker "
                "processes with the 'spawn' or 'forkserver' start method and pass them the "
                f"pickled reader{self._instead}"
            )
        self._used = True

    def _after_fork_in_child(self) -> None:
        self._forked = self._forked or self._used


__all__ = ["ForkGuard", "MissingChunkError", "damaged_chunk", "missing_chunk", "symlink_loop"]
