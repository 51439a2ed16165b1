"""One commit, one atomic step, where the backend can: the resizes, the chunks, the version
record, the commit record and the root of a commit inside one backend transaction.

Example:
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import TensorStoreBackend
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-atomic"))
    >>> with atomic(backend):  # no transactions on this backend: the writes land one by one
    ...     backend.write_bytes("a", b"1")
    >>> backend.read_bytes("a")
    b'1'
"""

from __future__ import annotations

import contextlib

from pytreestore.backends import Backend, Transactions


def atomic(backend: Backend) -> contextlib.AbstractContextManager[None]:
    """The backend's transaction (:class:`~pytreestore.backends.Transactions`) when it has
    one, else a block that does nothing: writes land one by one, as the commit protocol's
    order makes safe (:mod:`pytreestore._commit.protocol`)."""
    if isinstance(backend, Transactions):
        return backend.transaction()
    return contextlib.nullcontext()
