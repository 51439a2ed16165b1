"""One OCDBT database at a store root: what both OCDBT backends share.

Every key of the store (arrays, chunks, the commit record, the version log) lives in one
Optionally-Cooperative Distributed B+Tree (OCDBT) database at the store root, so a store of
thousands of columns is a handful of files (``manifest.ocdbt`` and ``d/``). Every batch of
writes makes a new OCDBT generation and every generation stays readable
(:class:`~pytreestore.backends.Snapshots`): :meth:`OcdbtDatabase.at_generation` opens the
database as it was then (:mod:`pytreestore._log.commit_record` finds the generation of a store
version).

:class:`OcdbtDatabase` has no transactions: its writes land one by one, as on the file
kvstore. The backends built on it say what they add:
:class:`~pytreestore.backends._tensorstore.ocdbt.OcdbtBackend` (``backend="ocdbt"``) makes
each commit one atomic transaction (:class:`~pytreestore.backends.Transactions`);
:class:`~pytreestore.backends._tensorstore.database.CoordinatedOcdbtBackend`, a writer
sharing the store through an OCDBT coordinator, cannot (TensorStore refuses a transaction over
two keys there) and so does not declare it.

Nothing is ever removed from the files: a deleted key is gone from the next generation only,
and its bytes stay on disk, readable in the generations before (TensorStore 0.1.86 has no
garbage collection of old generations). ``pytreestore.copy`` to a new store is how the space
comes back (docs/scaling.md).

Example:
    >>> import numpy as np
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import ColumnLayout, Transactions
    >>> db = OcdbtDatabase(Location.parse("memory://doc-ocdbt-database"))
    >>> db.write_bytes("a", b"1"); db.write_bytes("a", b"2")
    >>> db.at_generation(db.latest_generation() - 1).read_bytes("a"), db.read_bytes("a")
    (b'1', b'2')
    >>> isinstance(db, Transactions)
    False

Writers sharing one OCDBT store through TensorStore's OCDBT coordinator.

:func:`ocdbt_coordinator` starts a coordinator server (``ts.ocdbt.DistributedCoordinatorServer``)
in this process; :class:`CoordinatedOcdbtBackend` is the OCDBT backend of one writer that
commits through it (``pytreestore.open(path, mode="a", backend="ocdbt", coordinator=ADDRESS)``).

What the coordinator gives and what it does not (TensorStore 0.1.86, read from
``tensorstore/kvstore/ocdbt/driver.cc`` and measured): each key's write, conditional writes
included, is atomic across every process of the coordinator, and B+tree leases keep
concurrent writers from rewriting each other's nodes; but with a coordinator OCDBT refuses an
atomic transaction over two keys ("Cannot read/write ... as single atomic transaction"). So
this backend does not declare :class:`~pytreestore.backends.Transactions`: its writes land one
by one, in the commit protocol's order (:mod:`pytreestore._log.protocol`), and the writers
take turns through the commit claim (:mod:`pytreestore._log.locks`). A coordinator that is gone fails every write that needs
a lease at once with ``UNAVAILABLE`` (a :class:`~pytreestore.errors.StorageError` here); one
that hangs is caught by the backend's ``timeout``.

Example:
    >>> with ocdbt_coordinator() as address:
    ...     address.startswith("127.0.0.1:")
    True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import tensorstore as ts

from pytreestore._format.keys import LOCK_KEY, META_DIR
from pytreestore._location import Location
from pytreestore._runtime import RUNTIME
from pytreestore.backends._base import Snapshots, delete_folder
from pytreestore.backends._links import missing_source
from pytreestore.backends._tensorstore import futures as _fork
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.backends._tensorstore.backend import (
    TensorStoreBackend,
    memory_context,
)
from pytreestore.backends._tensorstore.direct import DirectColumn
from pytreestore.backends._tensorstore.kvstore import kvstore_spec, remove_abandoned
from pytreestore.errors import (
    ArgumentError,
    BadLocationError,
    PyTreeStoreError,
    ReadOnlyError,
    StorageError,
)

#: the files of an OCDBT database in its base folder
MANIFEST = "manifest.ocdbt"


DATA_DIR = "d"


_LOCK_SUFFIX = ".__lock"


def is_ocdbt(location: Location) -> bool:
    """Whether an OCDBT database (its ``manifest.ocdbt``) lies at ``location``'s root."""
    if location.kind == "file":
        return (Path(location.root) / MANIFEST).is_file()
    _fork.check(location)
    spec, cleanup = kvstore_spec(location)
    try:
        context = memory_context() if location.kind == "memory" else ts.Context()
        timeout = getattr(location.options, "total_timeout", None)
        base = _futures.result(ts.KvStore.open(spec, context=context), timeout)
        return _futures.result(base.read(MANIFEST), timeout).state == "value"
    except ValueError:
        return False  # unreachable storage: the store's own open reports it
    finally:
        cleanup()


class OcdbtDatabase(TensorStoreBackend, Snapshots):
    """Columns as ``zarr3`` arrays in one OCDBT database on the ``file``, ``memory``, ``s3``
    or ``gcs`` kvstore, each write landing on its own (see the module); every generation
    kept and readable (:class:`Snapshots`).

    Args:
        location: the store root, which is the OCDBT database's base.
        ocdbt_options: extra keys of the OCDBT kvstore spec, passed through as they are
            (for example ``{"config": {...}}``, or a ``"coordinator"``); ``driver``,
            ``base``, ``path`` and ``version`` are the backend's own.
        version: read-only: the OCDBT generation to read (see :meth:`at_generation`).
        context: the ``ts.Context`` to share (a pinned generation shares its backend's).
    """

    def __init__(
        self,
        location: Location,
        *,
        ocdbt_options: Mapping[str, Any] | None = None,
        version: int | None = None,
        context: ts.Context | None = None,
    ) -> None:
        super().__init__(location)
        if context is not None:
            self._context = context
        own = {"driver", "base", "path", "version"} & set(ocdbt_options or {})
        if own:
            raise PyTreeStoreError(
                f"ocdbt_options may not set {sorted(own)}: the OCDBT backend sets them from the "
                "store's location (open the store at a version with pytreestore.open(path, "
                "version=N))"
            )
        self._base = self._kv_spec
        self._options = dict(ocdbt_options or {})
        self.version = version
        self._kv_spec = self._ocdbt_spec(version)

    @property
    def files_root(self) -> None:
        """None: the keys live inside the OCDBT database's files, not as files."""
        return None

    def _ocdbt_spec(self, version: int | None) -> dict[str, Any]:
        spec: dict[str, Any] = {**self._options, "driver": "ocdbt", "base": self._base}
        spec["path"] = ""
        if version is not None:
            spec["version"] = version
        return spec

    # ---- writes: refused at a pinned generation ----------------------------------------------

    def write_bytes_if(self, key: str, data: bytes | None, generation: bytes) -> bytes | None:
        self._refuse_pinned("write")
        return super().write_bytes_if(key, data, generation)

    def write_many_bytes(self, items: dict[str, bytes]) -> None:
        self._refuse_pinned("write")
        super().write_many_bytes(items)

    def delete_keys(self, keys: Sequence[str]) -> None:
        """Deletes ``keys`` from the database's next generation (their bytes stay in the
        files, for the generations before); on local disk the writer lock's key is the file
        beside the database (:mod:`pytreestore._log.locks`), deleted as a file."""
        self._refuse_pinned("delete")
        super().delete_keys(keys)
        if self._location.kind == "file" and LOCK_KEY in keys:
            with contextlib.suppress(FileNotFoundError):
                (Path(self._location.root) / LOCK_KEY).unlink()

    def resize(self, keys: Sequence[str], records: int) -> None:
        self._refuse_pinned("resize")
        super().resize(keys, records)

    def delete_folders(self, folders: Sequence[str]) -> None:
        self._refuse_pinned("delete")
        super().delete_folders(folders)

    def copy_chunks(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Places each source key's value at its destination key inside the database: the
        key's entry is copied (TensorStore's ``experimental_copy_range_to``), its value is
        neither read nor rewritten. Inside a transaction (:class:`OcdbtBackend`), part of it.

        Raises:
            CorruptChunkError: a source key holds nothing.
            StorageError: storage failed.
        """
        self._refuse_pinned("write")
        if not pairs:
            return
        committed = super().kvstore  # the sources as committed (a transaction's writes aside)
        sources = sorted(s for s, _ in pairs)
        span = ts.KvStore.KeyRange(sources[0], sources[-1] + "\x00")
        try:
            stored = {
                bytes(k).decode() for k in _futures.result(committed.list(span), self._timeout)
            }
        except ValueError as err:
            raise _futures.storage_error(f"listing {self._location}", err) from err
        missing = next((s for s in sources if s not in stored), None)
        if missing is not None:
            raise missing_source(missing, "object")
        target, exact = self.kvstore, ts.KvStore.KeyRange("", "\x00")  # the key itself only
        copies = [(committed / s).experimental_copy_range_to(target / d, exact) for s, d in pairs]
        where = f"copying chunks in {self._location}"
        _futures.wait(copies, [d for _, d in pairs], where, timeout=self._timeout)

    def _refuse_pinned(self, what: str) -> None:
        if self.version is not None:
            raise ReadOnlyError(
                f"cannot {what} {self._location} at OCDBT generation {self.version}: an old "
                "version is read-only. Open the store without version= to write"
            )

    def direct_plan(self, key: str, handle: ts.TensorStore) -> DirectColumn | None:
        return None  # chunks live inside the database, not as files

    # ---- the whole store ---------------------------------------------------------------------

    def is_empty(self) -> bool:
        """Whether the root holds nothing but an OCDBT database without keys (and, on local
        disk, the writer's lock file)."""
        if self._location.kind == "file":
            root = Path(self._location.root)
            if not root.is_dir():
                return True
            if any(not _own_file(root, entry) for entry in os.listdir(root)):
                return False
        elif self._foreign_keys():
            return False
        return super().is_empty()

    def _foreign_keys(self) -> bool:
        base = self._base_kvstore()
        try:
            keys = _futures.result(base.list(), self._timeout)
        except ValueError as err:
            raise _futures.storage_error(f"listing {self._location}", err) from err
        names = (bytes(k).decode() for k in keys)
        return any(n != MANIFEST and not n.startswith(DATA_DIR + "/") for n in names)

    def _base_kvstore(self) -> ts.KvStore:
        self.check_usable()
        return _futures.result(ts.KvStore.open(self._base, context=self._context), self._timeout)

    def delete_all(self) -> None:
        """Deletes the database: on local disk its folder, elsewhere every key inside it."""
        self._refuse_pinned("delete")
        if self._location.kind == "file":
            self._handles.clear()
            self._kv = None
            delete_folder(self._location.root)
            self._context = ts.Context()  # it cached the deleted manifest
            return
        super().delete_all()

    def remove_partial_writes(self, keys: Sequence[str], tail_chunk: int) -> list[str]:
        """Deletes the ``*.__lock`` files a killed writer left in the database's folder.

        TensorStore's file kvstore writes the manifest and each data file through
        ``<name>.__lock`` and renames it over the name; a writer killed in between leaves that
        file. Another process may be writing the database now (``write_fragment`` needs no
        writer lock): a file whose lock a live process holds is its write in flight, and is
        kept (:func:`~pytreestore.backends._tensorstore.kvstore.remove_abandoned`). Data files
        of a commit that never reached the manifest are unreferenced and harmless. Chunks are keys inside the database, so
        ``keys`` and ``tail_chunk`` need no look. Only the holder of the writer lock may call
        this.
        """
        del keys, tail_chunk
        if self._location.kind != "file":
            return []
        root = Path(self._location.root)
        try:
            found = [root / f"{MANIFEST}{_LOCK_SUFFIX}"]
            found.extend((root / DATA_DIR).glob(f"*{_LOCK_SUFFIX}"))
            return remove_abandoned(found)
        except OSError as err:  # a symlink loop in the database's folder
            raise _futures.storage_error(f"cleaning up {self._location}", err) from err

    # ---- snapshots ---------------------------------------------------------------------------

    def latest_generation(self) -> int:
        """The database's newest OCDBT generation number (0: none yet)."""
        try:
            manifest = _futures.result(ts.ocdbt.dump(self._base_kvstore()), self._timeout)
        except ValueError as err:
            raise _futures.storage_error(f"reading the manifest of {self._location}", err) from err
        versions = manifest.get("versions") or [{"generation_number": 0}]
        return int(versions[-1]["generation_number"])

    def at_generation(self, generation: int) -> OcdbtDatabase:
        """A read-only backend of the database as OCDBT generation ``generation`` left it,
        with this backend's columns declared (it has no transactions: it writes nothing)."""
        pinned = OcdbtDatabase(
            self._location, ocdbt_options=self._options, version=generation, context=self._context
        )
        pinned.open_columns(list(self._layouts.values()))
        return pinned


def _own_file(root: Path, name: str) -> bool:
    """Whether ``root/name`` is part of an OCDBT database or the local writer lock."""
    if name in (MANIFEST, DATA_DIR) or name == MANIFEST + _LOCK_SUFFIX:
        return True
    return name == META_DIR and set(os.listdir(root / name)) <= {"lock"}


@contextlib.contextmanager
def ocdbt_coordinator(host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Runs an OCDBT coordinator server in this process for the ``with`` block.

    Args:
        host: the address to bind; the default serves this machine only. The coordinator has
            no authentication: bind it only where every client is trusted.
        port: the port; 0 picks a free one.

    Yields:
        The coordinator's address, ``"HOST:PORT"``, for ``pytreestore.open(...,
        coordinator=address)`` in every writer process.

    Raises:
        StorageError: the server could not bind ``host:port``.

    Example:
        >>> with ocdbt_coordinator() as address:
        ...     int(address.rpartition(":")[2]) > 0
        True
    """
    try:
        server = ts.ocdbt.DistributedCoordinatorServer({"bind_addresses": [f"{host}:{port}"]})
    except ValueError as err:
        raise StorageError(
            f"cannot start an OCDBT coordinator on {host}:{port}: {err}. Choose another port "
            "(or port=0 for a free one)"
        ) from err
    try:
        yield f"{host}:{server.port}"
    finally:
        del server  # its destructor stops it


def check_address(address: object) -> str:
    """``address`` if it is ``"HOST:PORT"``, else ValueError saying what is expected."""
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ArgumentError(
            f"coordinator must be the address of an OCDBT coordinator, 'HOST:PORT' (for "
            f"example '127.0.0.1:5000', as pytreestore.backends.ocdbt_coordinator() yields), "
            f"got {address!r}"
        )
    return address  # type: ignore[return-value]


class CoordinatedOcdbtBackend(OcdbtDatabase):
    """The OCDBT backend of a writer that commits through the coordinator at ``address``.

    It has no transactions (:class:`~pytreestore.backends.Transactions`): through a
    coordinator OCDBT refuses a transaction over two keys, so every write lands on its own,
    in the commit protocol's order, as on the file kvstore, and the commit claim keeps the
    commits of writers apart. Its generations are kept and readable as on every OCDBT
    database (:class:`~pytreestore.backends.Snapshots`).

    Args:
        location: a local store (the OCDBT database's folder).
        address: the coordinator, ``"HOST:PORT"``.
        lease: seconds of each B+tree lease the writer asks the coordinator for.
        timeout: seconds one storage call may wait.

    Raises:
        BadLocationError: ``location`` is not a local directory.
    """

    def __init__(
        self,
        location: Location,
        address: str,
        *,
        lease: float = RUNTIME.waits.lease_s,
        timeout: float = RUNTIME.waits.coordinator_timeout_s,
    ) -> None:
        if location.kind != "file":
            raise BadLocationError(
                f"writers share a store through an OCDBT coordinator on local disk only, not "
                f"{location}; open it with mode='a' and no coordinator for one writer"
            )
        self.address = check_address(address)
        coordinator = {"address": self.address, "lease_duration": f"{lease:g}s"}
        super().__init__(location, ocdbt_options={"coordinator": coordinator})
        self._timeout = timeout


__all__ = [
    "DATA_DIR",
    "MANIFEST",
    "CoordinatedOcdbtBackend",
    "OcdbtDatabase",
    "check_address",
    "is_ocdbt",
    "ocdbt_coordinator",
]
