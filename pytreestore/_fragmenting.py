"""``store.commit_fragments``: appending fragments written by other processes in one commit.

Any process writes records under a store with :func:`pytreestore.write_fragment`, without
the writer lock; the store's one writer appends them with :meth:`Fragmenting.commit_fragments`
(:mod:`pytreestore._fragments.commit` has the steps). See docs/scaling.md.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-fragmenting", {"x": np.int8(0)})
    >>> f = pytreestore.write_fragment("memory://doc-fragmenting", [{"x": 5}, {"x": 6}])
    >>> s.commit_fragments([f]); len(s), s.versions()[-1].operation
    (2, 'append')
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pytreestore import _arguments
from pytreestore import _threads as background
from pytreestore._commit import placing
from pytreestore._commit.fragment import Fragment
from pytreestore._fragments import remove as _remove
from pytreestore._fragments.commit import PlaceFragments
from pytreestore.errors import PyTreeStoreError

if TYPE_CHECKING:
    from pytreestore._core import StoreCore


class Fragmenting:
    """The fragment methods of :class:`~pytreestore.TreeStore` (a mixin)."""

    _core: StoreCore
    _purging: background.Job | None = None  # deleting committed fragments' folders

    def commit_fragments(self, fragments: Iterable[Fragment]) -> None:
        """Appends fragments (:func:`pytreestore.write_fragment`) in the given order, as one
        commit: one version, whose record lists the fragments' ids.

        Buffered records are committed first, so the order is: this writer's records, then
        the fragments'. A fragment that starts at a chunk boundary of the store (every
        fragment, when each holds a multiple of ``chunk_records`` records and the store did
        before them) has its chunks placed without copying data where the backend can (on
        local disk its chunk files hard-linked and its chunk-row folders renamed into the
        store; in an OCDBT database its keys copied; elsewhere the raw chunk bytes); any
        other is read and written again. When this returns, the commit is durable. The
        fragments' folders are deleted once the commit is made: on OCDBT in the commit's own
        transaction, locally on a background thread (:meth:`close` waits for it). An empty
        list commits nothing.

        A ragged or optional store's fragments hold every table's rows: each table's are
        placed after its committed rows (offsets rebased; every other array's chunks placed
        without copying, as above, where the table's rows start at a chunk boundary of
        the table), and structures that the
        fragments' records show and the store had pending (``store.schema.pending``) are
        learnt first, as an append of such a record would learn them (docs/ragged.md).

        Raises:
            ReadOnlyError: the store is open with mode "r", or shares its writes through an
                OCDBT coordinator (``coordinator=``): commit fragments from its only writer.
            FragmentError: a fragment of another store or of another schema, one committed
                already (or listed twice), one written before a version the log no longer
                keeps (``keep_versions``), one whose files are gone; in a ragged store, one
                whose structure departs from the store's (a leaf of another dtype than the
                store learnt meanwhile). Checked before anything is written: nothing is
                committed.
            CommitConflictError: another writer committed meanwhile (one that took the lock
                over with ``break_lock=True``); nothing of this call was committed, and the
                fragments are intact (but on local disk one whose chunk rows were renamed
                into the store before the other commit landed, which must be written
                again): reopen the store and call this again.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-commit-fragments", {"x": np.int8(0)})
            >>> s.append({"x": np.int8(1)})
            >>> f = pytreestore.write_fragment("memory://doc-commit-fragments", {"x": np.arange(2)})
            >>> s.commit_fragments([f]); s.load(as_numpy=True)["x"].tolist()
            [1, 0, 1]
        """
        items = list(
            _arguments.iterable(fragments, "commit_fragments()", "pytreestore.Fragment objects")
        )
        if not items:  # nothing to commit (a writer sharing the store still refuses)
            with self._core.writing() as writer:
                _ = writer.committer
            return
        operation = PlaceFragments(items, self._core.location, self._core.spec.like)
        self._core.commit(operation)  # the one commit sequence (_commit/transaction.py)
        self._retire([] if operation.removed else [f.id for f in operation.found])

    def _retire(self, ids: list[str]) -> None:
        """Deletes committed fragments' folders (one left, if storage failed, is vacuum's):
        locally as a background job (:meth:`close` and the interpreter's exit wait for it),
        elsewhere now; none when the commit's own transaction deleted them."""
        if not ids:
            return
        root = placing.local_root(self._core.backend)
        if root is None:
            with contextlib.suppress(PyTreeStoreError):
                _remove.remove(self._core.backend, ids)
            return
        placing.done(root)  # the placement's intent record: the commit is made
        self._purged()
        self._purging = background.start(functools.partial(_purge, root, ids))

    def _purged(self) -> None:
        """Waits for the deletion of committed fragments' folders (close, vacuum)."""
        if self._purging is not None:
            self._purging.join()
            self._purging = None


def _purge(root: str, ids: list[str], stopping: object) -> None:
    """The background job of :meth:`Fragmenting._retire`: runs to the end (a few folder
    deletions), even when asked to stop."""
    _remove.purge(root, ids)


__all__ = ["Fragmenting"]
