"""The OCDBT backend (``backend="ocdbt"``): one OCDBT database at the store root
(:class:`~pytreestore.backends._tensorstore.database.OcdbtDatabase`), each commit one atomic
transaction (:class:`~pytreestore.backends.Transactions`).

:meth:`OcdbtBackend.transaction` stages every write of a block in one
``ts.Transaction(atomic=True)`` and commits it as one new OCDBT generation. Every array handle
and the key-value store share the backend's one ``ts.Context`` (separate contexts would
silently split the transaction); handles are kept unbound and bound to each block anew (a
handle left bound to a committed transaction fails with "Transaction not open"). TensorStore
has atomic multi-key transactions only without an OCDBT coordinator, so a writer sharing the
store through one uses :class:`~pytreestore.backends._tensorstore.database.CoordinatedOcdbtBackend`,
which has none.

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
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorstore as ts

from pytreestore._location import Location
from pytreestore.backends._base import Transactions, missing_chunk
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.backends._tensorstore.database import OcdbtDatabase, is_ocdbt
from pytreestore.errors import CommitConflictError, PyTreeStoreError


class OcdbtBackend(OcdbtDatabase, Transactions):
    """Columns as ``zarr3`` arrays in one OCDBT database on the ``file``, ``memory``, ``s3``
    or ``gcs`` kvstore; commits as atomic transactions (:class:`Transactions`).

    Args:
        location: the store root, which is the OCDBT database's base.
        ocdbt_options: extra keys of the OCDBT kvstore spec, passed through as they are
            (for example ``"config"``); ``driver``, ``base``, ``path`` and ``version`` are
            the backend's own. Not a coordinator: through one, TensorStore refuses atomic
            transactions (writers sharing a store use ``open(..., coordinator=ADDRESS)``).
        version: read-only: the OCDBT generation to read (see :meth:`at_generation`).
        context: the ``ts.Context`` to share.
    """

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
        # a block's copied chunks, by column key: destination -> source
        self._copied: dict[str, dict[str, str]] = {}
        if "coordinator" in (ocdbt_options or {}):
            raise PyTreeStoreError(
                "ocdbt_options may not set 'coordinator': through an OCDBT coordinator "
                "TensorStore has no atomic transaction over two keys, which this backend "
                "promises. Writers sharing a store open it with pytreestore.open(path, 'a', "
                "backend='ocdbt', coordinator=ADDRESS)"
            )
        super().__init__(location, ocdbt_options=ocdbt_options, version=version, context=context)
        self._txn_lock = threading.Lock()
        self._staged: list[tuple[str, bytes, bytes | None]] = []  # key, staged token, value
        self._tokens: dict[tuple[str, bytes], bytes] = {}  # a staged token -> its real one

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
            self._copied = {}
            try:
                yield
            except BaseException:
                txn.abort()
                raise
            finally:
                self._txn = self._owner = None
                block, self._block_handles, self._copied = self._block_handles, {}, {}
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
            return super().write_bytes_if(key, data, generation)
        if super().read_bytes_versioned(key)[1] != generation:
            return None
        token = super().write_bytes_if(key, data, generation)
        if token is not None:
            self._staged.append((key, token, data))
        return token

    # ---- chunks copied in a block, then written again ----------------------------------------

    def copy_chunks(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Copies keys inside the database (:meth:`OcdbtDatabase.copy_chunks`); inside a
        :meth:`transaction`, each copy is remembered until the block ends (see :meth:`write`)."""
        super().copy_chunks(pairs)
        if self._active() is not None:
            for source, dest in pairs:  # dest is KEY/c/ROW/..., the chunk's indices digits
                self._copied.setdefault(dest.rpartition("/c/")[0], {})[dest] = source

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> None:
        """Writes rows (see the base class). Inside a :meth:`transaction`, a chunk that the
        block copied with :meth:`copy_chunks` and now writes again is first written as its
        source's bytes: TensorStore 0.1.86 never commits a transaction that copies a key
        (``experimental_copy_range_to``) and then reads it to modify it (the commit hangs)."""
        if self._copied and self._active() is not None and blocks:
            self._settle_copies(keys, start, len(blocks[0]))
        super().write(keys, start, blocks)

    def _settle_copies(self, keys: Sequence[str], start: int, rows: int) -> None:
        touched, sources = [], []
        for key in keys:
            copied = self._copied.get(key)
            if not copied:
                continue
            layout = self._layouts.get(key)
            per = layout.chunks[0] if layout is not None else 1
            first, last = start // per, (start + max(rows, 1) - 1) // per
            for dest in list(copied):
                row = dest[len(key) + 3 :].split("/", 1)[0]
                if layout is None or not row.isdigit() or first <= int(row) <= last:
                    touched.append(dest)
                    sources.append(copied.pop(dest))
        if not touched:
            return
        committed = super(OcdbtDatabase, self).kvstore  # the fragments' keys as committed
        reads = [committed.read(s) for s in sources]
        found = _futures.wait(reads, sources, f"reading {self._location}", timeout=self._timeout)
        for source, result in zip(sources, found):
            if result.state != "value":
                raise missing_chunk(source, None, f"no object at {source}")
        writes = [self.kvstore.write(d, r.value) for d, r in zip(touched, found)]
        _futures.wait(writes, touched, f"writing to {self._location}", timeout=self._timeout)

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

    def column_handles(self, keys: Sequence[str], records: int = 0) -> list[ts.TensorStore]:
        handles = super().column_handles(keys, records)
        txn = self._active()
        if txn is None:
            return handles
        return [h if h.transaction is not None else h.with_transaction(txn) for h in handles]


__all__ = ["OcdbtBackend", "is_ocdbt"]
