"""The store's versions: listing them, naming them, going back, and removing what none needs.

Every commit is a version (:mod:`pytreestore._commit.versions`): :meth:`Versioning.versions`
lists them, :meth:`~Versioning.tag` names one, :meth:`~Versioning.truncate` commits a version
holding the first records only, and :meth:`~Versioning.vacuum` removes the chunks, arrays and
schemas that no version the log keeps still needs. ``pytreestore.open(path, version=N)`` (or
a tag's name) reads a store as it was at a version.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-versioning", {"x": np.int32(0)})
    >>> s.extend({"x": np.int32(i)} for i in range(5)); s.flush(); s.tag("five")
    >>> s.truncate(2); s.append({"x": np.int32(9)}); s.flush()
    >>> s.load(as_numpy=True)["x"].tolist(), [v.operation for v in s.versions()]
    ([0, 1, 9], ['create', 'append', 'truncate', 'release', 'append'])
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pytreestore import _arguments
from pytreestore._commit import vacuum as _vacuum
from pytreestore._commit import versions as _versions
from pytreestore._commit.operations import Tag, Truncate
from pytreestore._commit.record import Commit
from pytreestore._commit.vacuum import VacuumReport
from pytreestore._commit.versions import Version
from pytreestore._core import StoreCore
from pytreestore._fragments import abandoned as _abandoned
from pytreestore._fragments.abandoned import FRAGMENTS_OLDER_THAN
from pytreestore.backends import Backend


class Versioning:
    """The version methods of :class:`~pytreestore.TreeStore` (a face using only its
    :class:`~pytreestore._core.StoreCore`)."""

    _core: StoreCore

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    @property
    def version(self) -> int:
        """The version this store object reads (a writer: its latest commit's)."""
        self._core.check_open()
        return self._core.head().generation

    def versions(self) -> list[Version]:
        """Every version the store keeps, oldest first, the latest committed one last.

        A version is a commit: its number, records, time and operation, its tags, and
        whether it can still be read (a version holding more records than a later truncate
        left is gone once an append writes over them). A store written before versions
        existed lists only its latest commit.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-versions-method", {"x": np.int8(0)})
            >>> s.append({"x": np.int8(1)}); s.flush()
            >>> [(v.version, v.records) for v in s.versions()]
            [(0, 0), (1, 1)]
        """
        core = self._core
        with core.reading() as backend:
            return _versions.history(backend, _head(core, backend), core.path)

    def tag(self, name: str, version: int | None = None) -> None:
        """Names a version, for ``pytreestore.open(path, version=name)``; tags never move.

        Buffered records are committed first. Tagged versions stay in the log whatever
        ``keep_versions`` says.

        Args:
            name: 1 to 128 of ``A-Z a-z 0-9 _ . -``, not starting with ``.`` or ``-``.
            version: the version to name (default: the latest commit).

        Raises:
            ReadOnlyError: the store is open with mode "r".
            TagExistsError: ``name`` names a version already; nothing is written.
            VersionNotFoundError: ``version`` is not one the store keeps.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-tag", {"x": np.int8(0)})
            >>> s.append({"x": np.int8(1)}); s.tag("first")
            >>> pytreestore.open("memory://doc-tag", version="first").version
            1
        """
        _versions.check_tag_name(name)
        if version is not None:
            version = _arguments.count(version, "tag(name, version): version must be an int >= 0")
        self._core.commit(Tag(name, version, self._core.path))

    def truncate(self, records: int) -> None:
        """Commits a new version holding the first ``records`` records only.

        Nothing committed is rewritten: ``pytreestore.open(path, version=v)`` still reads
        every earlier version, until the next append writes over the records they hold past
        ``records`` (a version of the log then says so, and those versions are gone).
        Buffered records are committed first.

        Raises:
            ReadOnlyError: the store is open with mode "r".
            StoreIndexError: ``records`` is negative or more than the store holds (buffered
                records included); nothing is committed, buffered records stay buffered.
            CommitConflictError: another writer committed since this one read the commit
                record. Nothing is changed; reopen the store.

        A column added (by ``evolve``, or a ragged structure first shown) after ``records``
        then starts at ``records``: its records before read its default, as they did.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-truncate", {"x": np.int8(0)})
            >>> s.extend({"x": np.int8(i)} for i in range(4)); s.truncate(1)
            >>> len(s), len(pytreestore.open("memory://doc-truncate", version=1))
            (1, 4)
        """
        records = _arguments.count(
            records, "truncate() takes a record count (an int)", minimum=None
        )
        self._core.commit(Truncate(records, self._core.path))

    def vacuum(self, *, fragments_older_than: float = FRAGMENTS_OLDER_THAN) -> VacuumReport:
        """Removes what no version the log keeps needs: chunks past every kept version's
        records, arrays of columns no kept version has (dropped by ``evolve``, or left by an
        interrupted one), schemas no kept version names, and the records of versions written
        over or past ``keep_versions``. Buffered records are committed first.

        It also removes fragments (:func:`pytreestore.write_fragment`) that were committed
        but left behind by a crash, and those nobody committed within
        ``fragments_older_than`` seconds (default one day) of being begun: younger ones,
        still being written or waiting for their commit, are left alone.

        Readers open at a version the log no longer keeps may then fail to read.

        On OCDBT (``backend="ocdbt"``) the removed keys leave the latest version only: OCDBT
        keeps every generation and TensorStore cannot drop old ones, so no disk space comes
        back (the report's ``reclaimed`` is False). ``pytreestore.copy(path, new_path,
        backend="ocdbt")`` writes a new store holding the latest version alone.

        Raises:
            ReadOnlyError: the store is open with mode "r".

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-vacuum", {"x": np.int8(0)}, chunk_records=2)
            >>> s.extend({"x": np.int8(i)} for i in range(6)); s.truncate(2)
            >>> s.append({"x": np.int8(7)}); s.vacuum().chunks
            1
        """
        fragments_older_than = _check_age(fragments_older_than)
        core = self._core
        with core.writing() as writer:
            writer.flush()
            keep, head, where = writer.committer.keep, writer.commit, core.path
            core.settle()  # committed fragments' folders, deleted on a thread
            swept = _abandoned.sweep(core.backend, core.location, head, fragments_older_than, where)
            report = _vacuum.vacuum(core.backend, head, keep, where)
            return dataclasses.replace(report, fragments=swept)


def _head(core: StoreCore, backend: Backend) -> Commit:
    """The latest commit: the writer's, or the commit record now."""
    if core.writer is not None:
        return core.writer.commit
    return Commit.read(backend, core.path)


def _check_age(seconds: Any) -> float:
    return _arguments.seconds(seconds, "fragments_older_than is an age in seconds (a number >= 0)")


__all__ = ["Version", "Versioning"]
