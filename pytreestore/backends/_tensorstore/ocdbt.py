"""The OCDBT backend: TensorStore's ``zarr3`` arrays inside one OCDBT database.

Every key of the store (arrays, chunks, the commit record, the version log) lives in one
Optionally-Cooperative Distributed B+Tree (OCDBT) database at the store root, so a store of
thousands of columns is a handful of files (``manifest.ocdbt`` and ``d/``), and a commit can
be one atomic step: :meth:`OcdbtBackend.transaction` stages every write of a block in one
``ts.Transaction(atomic=True)`` and commits it as one new OCDBT generation. Every array handle
and the key-value store share the backend's one ``ts.Context`` (separate contexts would
silently split the transaction); handles are kept unbound and bound to each block anew (a
handle left bound to a committed transaction fails with "Transaction not open").

Each commit of the store is one OCDBT generation, and every generation stays readable:
:meth:`OcdbtBackend.at_generation` opens the database as it was then
(:mod:`pytreestore._commit.snapshots` finds the generation of a store version).

Example:
    >>> import numpy as np
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import ColumnLayout
    >>> b = OcdbtBackend(Location.parse("memory://doc-ocdbt"))
    >>> b.create_columns([ColumnLayout("x", np.dtype("int32"), (), (4,), None, ("record",), 0)])
    >>> with b.transaction():
    ...     b.resize(["x"], 2); b.write(["x"], 0, [np.array([7, 8], np.int32)])
    ...     b.write_bytes("note", b"both or neither")
    >>> b.read(["x"], slice(0, 2), 2)[0], b.read_bytes("note")
    (array([7, 8], dtype=int32), b'both or neither')
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import tensorstore as ts

from pytreestore._format.names import LOCK_KEY, META_DIR
from pytreestore._location import Location
from pytreestore.backends._base import Snapshots, Transactions, delete_folder
from pytreestore.backends._links import missing_source
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.backends._tensorstore.backend import TensorStoreBackend, _memory_context
from pytreestore.backends._tensorstore.direct import DirectColumn
from pytreestore.backends._tensorstore.kvstore import kvstore_spec
from pytreestore.errors import CommitConflictError, PyTreeStoreError

#: the files of an OCDBT database in its base folder
MANIFEST = "manifest.ocdbt"
DATA_DIR = "d"
_LOCK_SUFFIX = ".__lock"


def is_ocdbt(location: Location) -> bool:
    """Whether an OCDBT database (its ``manifest.ocdbt``) lies at ``location``'s root."""
    if location.kind == "file":
        return (Path(location.root) / MANIFEST).is_file()
    spec, cleanup = kvstore_spec(location)
    try:
        context = _context_of(location)
        base = _futures.result(ts.KvStore.open(spec, context=context), None)
        return _futures.result(base.read(MANIFEST), None).state == "value"
    except ValueError:
        return False  # unreachable storage: the store's own open reports it
    finally:
        cleanup()


def _context_of(location: Location) -> ts.Context:
    return _memory_context() if location.kind == "memory" else ts.Context()


class OcdbtBackend(TensorStoreBackend, Transactions, Snapshots):
    """Columns as ``zarr3`` arrays in one OCDBT database on the ``file``, ``memory``, ``s3``
    or ``gcs`` kvstore; commits as atomic transactions (:class:`Transactions`).

    Args:
        location: the store root, which is the OCDBT database's base.
        ocdbt_options: extra keys of the OCDBT kvstore spec, passed through as they are
            (for example ``{"ocdbt_coordinator": {"address": "host:port"}}`` for writers that
            commit through a coordinator, or ``"config"``); ``driver``, ``base``, ``path`` and
            ``version`` are the backend's own.
        version: read-only: the OCDBT generation to read (see :meth:`at_version`).
    """

    @property
    def files_root(self) -> None:
        """None: the keys live inside the OCDBT database's files, not as files."""
        return None

    def __init__(
        self,
        location: Location,
        *,
        ocdbt_options: Mapping[str, Any] | None = None,
        version: int | None = None,
        context: ts.Context | None = None,
    ) -> None:
        self._txn: ts.Transaction | None = None
        self._owner: int | None = None
        self._committed: dict[str, ts.TensorStore] = {}
        self._block_handles: dict[str, ts.TensorStore] = {}
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
        self._txn_lock = threading.Lock()
        self._staged: list[tuple[str, bytes, bytes | None]] = []  # key, staged token, value
        self._tokens: dict[tuple[str, bytes], bytes] = {}  # a staged token -> its real one

    def _ocdbt_spec(self, version: int | None) -> dict[str, Any]:
        spec: dict[str, Any] = {**self._options, "driver": "ocdbt", "base": self._base}
        spec["path"] = ""
        if version is not None:
            spec["version"] = version
        return spec

    # ---- the transaction ---------------------------------------------------------------------

    def _active(self) -> ts.Transaction | None:
        """The open transaction, if this thread is the one that opened it."""
        return self._txn if self._owner == threading.get_ident() else None

    @property
    def kvstore(self) -> ts.KvStore:
        kv = super().kvstore
        txn = self._active()
        return kv if txn is None else kv.with_transaction(txn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A block whose writes commit as one OCDBT generation (see :class:`Transactions`).

        Raises:
            CommitConflictError: a conditional write of the block found its key changed when
                the block committed; nothing of the block landed.
            StorageError: the commit failed; nothing of the block landed unless the storage
                failed after writing the new manifest.
        """
        if self._active() is not None:
            yield  # joins the block this thread has open
            return
        self._refuse_pinned("write")
        with self._txn_lock:
            txn = ts.Transaction(atomic=True)
            self._block_handles = dict(self._committed)
            self._txn, self._owner, self._staged = txn, threading.get_ident(), []
            try:
                yield
            except BaseException:
                txn.abort()
                raise
            finally:
                self._txn = self._owner = None
                block, self._block_handles = self._block_handles, {}
            self._commit(txn)
            self._committed = {k: h.with_transaction(None) for k, h in block.items()}

    def _commit(self, txn: ts.Transaction) -> None:
        try:
            _futures.result(txn.commit_async(), self._timeout)
        except ValueError as err:
            if "Generation mismatch" in str(err):
                raise CommitConflictError(
                    f"another writer committed to {self._location} while this one was "
                    "writing (a key this commit wrote conditionally had changed). Nothing of "
                    "this commit landed; reopen the store to append after the other writer's "
                    "records"
                ) from err
            raise _futures.storage_error(f"committing to {self._location}", err) from err
        self._learn_tokens()

    def _learn_tokens(self) -> None:
        """Maps the tokens conditional writes of the block returned (TensorStore's staged
        generations) to the generations their keys got; a key already changed again by
        someone else maps to a token that never matches."""
        staged, self._staged = self._staged, []
        if not staged:
            return
        reads = [self.kvstore.read(key) for key, _, _ in staged]
        for (key, token, value), fut in zip(staged, reads):
            got = _futures.result(fut, self._timeout)
            found = bytes(got.value) if got.state == "value" else None
            self._tokens[(key, token)] = bytes(got.stamp.generation) if found == value else b"!"

    def write_bytes_if(self, key: str, data: bytes | None, generation: bytes) -> bytes | None:
        """Writes ``key`` only if its generation is ``generation`` (see the base class).

        Inside a :meth:`transaction` the check is made twice: now, against the key's
        committed generation (None is returned when it is stale), and again when the block
        commits, atomically with the rest of it (a stale token then aborts the whole block).
        """
        generation = self._tokens.get((key, generation), generation)
        if self._active() is None:
            self._refuse_pinned("write")
            return super().write_bytes_if(key, data, generation)
        if super().read_bytes_versioned(key)[1] != generation:
            return None
        token = super().write_bytes_if(key, data, generation)
        if token is not None:
            self._staged.append((key, token, data))
        return token

    def write_many_bytes(self, items: dict[str, bytes]) -> None:
        self._refuse_pinned("write")
        super().write_many_bytes(items)

    def copy_chunks(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Places each source key's value at its destination key inside the database: the
        key's entry is copied (TensorStore's ``experimental_copy_range_to``), its value is
        neither read nor rewritten. Inside a :meth:`transaction`, part of it.

        Raises:
            CorruptChunkError: a source key holds nothing.
            StorageError: storage failed.
        """
        self._refuse_pinned("write")
        if not pairs:
            return
        committed = super().kvstore  # the sources as committed (the block's writes aside)
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

    def delete_keys(self, keys: Sequence[str]) -> None:
        """Deletes ``keys`` inside the database; on local disk the writer lock's key is the
        file beside it (:mod:`pytreestore._commit.lock`), deleted as a file."""
        self._refuse_pinned("delete")
        super().delete_keys(keys)
        if self._location.kind == "file" and LOCK_KEY in keys:
            with contextlib.suppress(FileNotFoundError):
                (Path(self._location.root) / LOCK_KEY).unlink()

    def _refuse_pinned(self, what: str) -> None:
        if self.version is not None:
            raise PyTreeStoreError(
                f"cannot {what} {self._location} at OCDBT generation {self.version}: an old "
                "version is read-only. Open the store without version= to write"
            )

    # ---- columns: every handle bound to this thread's transaction, or to none ----------------

    @property
    def _handles(self) -> dict[str, ts.TensorStore]:
        """The handles this thread uses: inside its transaction the block's own (resized in
        it), else the committed ones (unbound)."""
        return self._block_handles if self._active() is not None else self._committed

    @_handles.setter
    def _handles(self, handles: dict[str, ts.TensorStore]) -> None:
        if self._active() is not None:
            self._block_handles = handles
        else:
            self._committed = handles

    def _open(self, keys: Sequence[str], records: int = 0) -> list[ts.TensorStore]:
        handles = super()._open(keys, records)
        txn = self._active()
        if txn is None:
            return handles
        return [h if h.transaction is not None else h.with_transaction(txn) for h in handles]

    def resize(self, keys: Sequence[str], records: int) -> None:
        self._refuse_pinned("resize")
        super().resize(keys, records)

    def _plan(self, key: str, handle: ts.TensorStore) -> DirectColumn | None:
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
        file (a later write must not reuse it). Data files of a commit that never reached the
        manifest are unreferenced and harmless. Chunks are keys inside the database, so
        ``keys`` and ``tail_chunk`` need no look. Only the holder of the writer lock may call
        this.
        """
        del keys, tail_chunk
        if self._location.kind != "file":
            return []
        root = Path(self._location.root)
        found = [root / f"{MANIFEST}{_LOCK_SUFFIX}"]
        found.extend((root / DATA_DIR).glob(f"*{_LOCK_SUFFIX}"))
        removed = []
        for path in found:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(str(path))
        return removed

    # ---- snapshots ---------------------------------------------------------------------------

    def latest_generation(self) -> int:
        """The database's newest OCDBT generation number (0: none yet)."""
        try:
            manifest = _futures.result(ts.ocdbt.dump(self._base_kvstore()), self._timeout)
        except ValueError as err:
            raise _futures.storage_error(f"reading the manifest of {self._location}", err) from err
        versions = manifest.get("versions") or [{"generation_number": 0}]
        return int(versions[-1]["generation_number"])

    def at_generation(self, generation: int) -> OcdbtBackend:
        """A read-only backend of the database as OCDBT generation ``generation`` left it,
        with this backend's columns declared."""
        pinned = OcdbtBackend(
            self._location, ocdbt_options=self._options, version=generation, context=self._context
        )
        pinned.open_columns(list(self._layouts.values()))
        return pinned


def _own_file(root: Path, name: str) -> bool:
    """Whether ``root/name`` is part of an OCDBT database or the local writer lock."""
    if name in (MANIFEST, DATA_DIR) or name == MANIFEST + _LOCK_SUFFIX:
        return True
    return name == META_DIR and set(os.listdir(root / name)) <= {"lock"}
