"""The faces of a store, each using only its StoreCore: its reads and its versions.

The reads of a store: ``load``, indexing, iteration and ``lengths``, for fixed and ragged
stores alike (a face of :class:`~pytreestore.TreeStore`, using only its
:class:`~pytreestore._core.StoreCore`).

Example:
    >>> import pytreestore
    >>> s = pytreestore.create("memory://doc-reads", {"a": 0})
    >>> s.extend({"a": i} for i in range(3))
    >>> s[1:]["a"].tolist()
    [1, 2]

The store's versions: listing them, naming them, going back, and removing what none needs.

Every commit is a version (:mod:`pytreestore._log.versions`): :meth:`Versioning.versions`
lists them, :meth:`~Versioning.tag` names one, :meth:`~Versioning.truncate` commits a version
holding the first records only, :meth:`~Versioning.keep_last` one holding the last records
only, and :meth:`~Versioning.vacuum` removes the chunks, arrays and schemas that no version
the log keeps still needs. ``pytreestore.open(path, version=N)`` (or
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
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import numpy as np

from pytreestore import _arguments
from pytreestore._core import StoreCore
from pytreestore._fragments import fragment as _abandoned
from pytreestore._fragments.fragment import FRAGMENTS_OLDER_THAN
from pytreestore._log import prune as _vacuum
from pytreestore._log import versions as _versions
from pytreestore._log.commit_record import Commit
from pytreestore._log.prune import VacuumReport
from pytreestore._log.transaction import KeepLast, Tag, Truncate
from pytreestore._log.versions import Version
from pytreestore._read.engine import record_reads
from pytreestore._write.recorder import flush_recorders
from pytreestore.backends import Backend

#: the record type of a store (``TreeStore[T]``): the class of the example it was created with
T = TypeVar("T")


class Reads(Generic[T]):
    """``load``, ``store[...]``, iteration, ``records`` and ``lengths`` of a store of records
    of type ``T``."""

    _core: StoreCore

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def load(
        self,
        index: Any = slice(None),
        *,
        columns: str | Sequence[str] | Any | None = None,
        device: Any = None,
        as_numpy: bool = False,
        cast: bool | None = None,
        sharding: Any = None,
        pad: bool = False,
        pmap_devices: Sequence[Any] | None = None,
        ragged: str = "pad",
        pad_to: int | str | Sequence[int] | None = None,
        trim: bool = False,
        size: int | None = None,
        truncate: bool | None = None,
    ) -> Any:
        """Loads records ``index`` as a record of the stored classes.

        Args:
            index: an int (one record), a slice, a list or array of ints, or a bool mask.
            columns: tree-path strings of the columns to load; a node's path selects every
                column below it (``".p[0]"``). Or a mask: a pytree of bools shaped like a
                record (or a padded batch, or a prefix of either), True where a column is
                wanted, e.g. ``jax.tree.map(lambda _: False, record)`` with some leaves set
                True; under a ragged list any element's True selects that column. Columns not
                selected come back as None.
            device: a ``jax.Device`` or ``jax.sharding.Sharding`` to place the leaves on
                (default: JAX's default device).
            as_numpy: return host numpy arrays, with every dtype exactly as stored; a column
                of typed PRNG keys comes back as its key data (uint32, see
                :func:`jax.random.key_data`), since numpy has no key dtype.
            cast: load 64-bit columns while x64 is disabled by casting them to 32 bits
                (values that do not fit raise); without it they raise. None (default): the
                store's policy, set by ``pytreestore.open(..., cast=...)`` or ``create``.
            sharding: build each column as a global ``jax.Array`` split along the record axis:
                one ``jax.sharding.Sharding`` for every column, a pytree of them shaped like
                the schema (None replicates), or a callable from tree path to sharding. Each
                device's rows are read once, for that device only (under ``jax.distributed``,
                each process reads only its own devices' rows). A ragged store's padded
                leaves and masks split the same way, records first, each mask by its leaf's
                sharding cut to its axes (``ragged="segments"`` takes one sharding for every
                leaf). See docs/sharding.md.
            pad: with ``sharding`` or ``pmap_devices``, pad a record count that does not split
                evenly with fill values (zeros) and return ``(records, mask)``, where ``mask``
                is a bool ``jax.Array`` over the padded records, True for real ones (a
                ragged store's pair ``(batch, mask)`` keeps its form, its masks False in the
                padding records).
            pmap_devices: devices (e.g. ``jax.local_devices()``) to lay the records out for
                ``jax.pmap``: leaves shaped ``(len(devices), count // len(devices), ...)``,
                slice ``i`` already on ``devices[i]`` (a ragged store's padded leaves and
                masks too).
            ragged: for a store created with ``ragged=``/``optional=`` (docs/ragged.md):
                ``"pad"`` (default) returns ``(batch, mask)``, each ragged list stacked into
                one element padded to ``L``, ``mask`` True where a value is real;
                ``"segments"`` returns ``(values, segments)``, the leaves flat along each
                axis and, per axis, the :class:`~pytreestore.Segments` of its elements
                (and, per optional subtree, its presence under ``"present" + keypath``).
            pad_to: with ``ragged="pad"``: None (the longest in the selection), an int,
                ``"pow2"`` or increasing bucket sizes; a longer list raises
                :class:`~pytreestore.errors.RaggedLengthError`.
            trim: with ``pad_to``, cut longer lists instead of raising.
            size: with ``ragged="segments"``, pad every axis's elements to this many.
            truncate: the old name of ``trim`` (an alias; ``truncate`` now means only
                :meth:`truncate`).

        Returns:
            For an int index, one record whose leaves have the per-record shape; otherwise a
            batched record whose leaves carry a leading record axis; with ``pad=True`` a pair
            ``(records, mask)``.

        Raises:
            ShardingError: a sharding cannot split the record count (and ``pad`` is false) or
                a leaf's shape.

        Example:
            >>> import pytreestore
            >>> s = pytreestore.create("memory://doc-load", {"a": 0, "b": (0.0, 0.0)})
            >>> s.extend({"a": i, "b": (i * 1.0, i * 2.0)} for i in range(5))
            >>> s.load([4, 0], columns="['b']", as_numpy=True)
            {'a': None, 'b': (array([4., 0.], dtype=float32), array([8., 0.], dtype=float32))}
        """
        core = self._core
        request = core.request(
            columns=columns,
            device=device,
            as_numpy=as_numpy,
            cast=cast,
            sharding=sharding,
            pad=pad,
            pmap_devices=pmap_devices,
        )
        options = (ragged, pad_to, _arguments.trimmed(trim, truncate), size)
        reads = record_reads(request.schema)
        return reads.load(core.read_context(), core.head, request, index, options)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: Any) -> Any: ...

    def __getitem__(self, index: Any) -> Any:
        return self.load(index)

    def __iter__(self) -> Iterator[T]:
        return self.records()

    def records(
        self,
        *,
        columns: str | Sequence[str] | Any | None = None,
        as_numpy: bool = False,
        cast: bool | None = None,
    ) -> Iterator[T]:
        """Iterates over the records one at a time, reading a block of records per read.

        ``iter(store)`` is ``store.records()``. The arguments are those of :meth:`load`.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-records", {"t": np.float64(0)})
            >>> s.extend({"t": np.float64(i)} for i in range(2))
            >>> [r["t"].item() for r in s.records(as_numpy=True)]
            [0.0, 1.0]
        """
        core = self._core
        request = core.request(columns=columns, as_numpy=as_numpy, cast=cast)
        yield from record_reads(request.schema).iterate(core.read_context(), core.head, request)

    def lengths(self, index: Any = slice(None)) -> dict[str, np.ndarray]:
        """Per ragged axis, each selected record's longest list (or leading axis) there,
        reading only the offsets: what a sampler needs to bucket records by size.

        Returns:
            ``{axis keypath: int64 array over the selected records}``; a nested axis gives
            the longest list of the record's elements. ``load(index, pad_to=None)`` pads
            each axis to the largest of these.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-lengths", {"p": [np.int8(0)]},
            ...                        ragged=["['p']"])
            >>> s.extend([{"p": [np.int8(1)] * n} for n in (3, 0, 2)])
            >>> s.lengths()["['p']"].tolist()
            [3, 0, 2]
        """
        core = self._core
        return record_reads(core.schema).lengths(core.read_context(), core.head, core.schema, index)


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
        flush_recorders(id(self._core))  # records recorded before it are before it
        self._core.commit(Truncate(records, self._core.path))

    def keep_last(self, n: int) -> int:
        """Commits a version after which only the last ``n`` records are readable, and
        returns how many records it released from the front (0, committing no version of
        its own, when the store holds ``n`` records or fewer). Buffered records are
        committed first.

        Indices stay relative: afterwards ``len(store)`` is the kept count, ``store[0]`` the
        oldest kept record, and appends go on after the last; :attr:`dropped` counts the
        records released over the store's life (record ``i`` is the ``dropped + i``-th ever
        appended). A replay buffer with a capacity, or "keep the last K checkpoints".

        Nothing is deleted: older versions still read every record they held
        (``pytreestore.open(path, version=v)``). :meth:`vacuum` then deletes the chunks that
        hold only released rows and that no version the log keeps reads (chunks partly
        released stay whole), so that disk stays bounded by the records kept and the
        versions kept (``keep_versions``). A reader opened before the release sees the new
        front after :meth:`refresh` (or a new ``open``); one that reads rows vacuum deleted
        raises :class:`~pytreestore.errors.StoreReplacedError`.

        Args:
            n: how many of the last records to keep (an int >= 0).

        Raises:
            ArgumentError: ``n`` is negative or not an int; nothing is written, buffered
                records stay buffered.
            ReadOnlyError: the store is open with mode "r", or shared by writers through an
                OCDBT coordinator (a release needs the store's only writer).
            CommitConflictError: another writer committed since this one read the commit
                record. Nothing is changed; reopen the store.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-keep-last", {"x": np.int8(0)})
            >>> s.extend({"x": np.int8(i)} for i in range(5))
            >>> s.keep_last(2), len(s), s.dropped, int(s[0]["x"])
            (3, 2, 3, 3)
            >>> s.append({"x": np.int8(5)}); s.load(as_numpy=True)["x"].tolist()
            [3, 4, 5]
        """
        n = _arguments.count(n, "keep_last() takes how many records to keep (an int >= 0)")
        operation = KeepLast(n, self._core.path)
        flush_recorders(id(self._core))  # records recorded before it are before it
        self._core.commit(operation)
        return operation.released

    @property
    def dropped(self) -> int:
        """The records released from the front (:meth:`keep_last`) over the store's life:
        record ``i`` is the ``dropped + i``-th record ever appended (0 if none was).

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-dropped", {"x": np.int8(0)})
            >>> s.extend({"x": np.int8(i)} for i in range(4)); s.keep_last(1)
            3
            >>> s.dropped
            3
        """
        self._core.check_open()
        return self._core.head().first

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


__all__ = ["Reads", "T", "Version", "Versioning"]
