"""One commit, one atomic step, where the backend can: the resizes, the chunks, the version
record, the commit record and the root of a commit inside one backend transaction.

A backend without :class:`~pytreestore.backends.Transactions` (the file kvstore, zarr-python,
a writer sharing an OCDBT store through its coordinator) gets a block that does nothing: its
writes land one by one, in the commit protocol's order, which keeps every crash safe
(:mod:`pytreestore._commit.protocol`). :func:`transactional` tells the two apart.

Blocks nest: an inner block joins the outer one, and only the outermost commits. What a block
changed in memory before it committed (a committer's token) is given back with
:func:`on_abort` when the outermost block commits nothing; what may be told only once its
writes are in storage (a committer's commit, which other threads read as the records a crash
keeps) is told by :func:`on_commit` when the outermost block has committed.

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
import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import cast

from pytreestore.backends import Backend, Transactions, capable

_OPEN = threading.local()  # this thread's outermost blocks: id(backend) -> _Block


@dataclasses.dataclass
class _Block:
    """An outermost block's calls: ``undos`` if it commits nothing, ``landed`` once it has
    committed."""

    undos: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    landed: list[Callable[[], None]] = dataclasses.field(default_factory=list)


def transactions(backend: Backend) -> Transactions | None:
    """``backend`` where it is :class:`~pytreestore.backends.Transactions` (told once per
    chain of classes, :func:`~pytreestore.backends.capable`), else None."""
    return cast(Transactions, backend) if capable(backend, Transactions) else None


def _blocks() -> dict[int, _Block]:
    if not hasattr(_OPEN, "blocks"):
        _OPEN.blocks = {}
    return _OPEN.blocks


@contextlib.contextmanager
def atomic(backend: Backend) -> Iterator[None]:
    """The backend's transaction (:class:`~pytreestore.backends.Transactions`) when it has
    one, else a block that does nothing: writes land one by one, as the commit protocol's
    order makes safe (:mod:`pytreestore._commit.protocol`)."""
    txn = transactions(backend)
    if txn is None:
        yield
        return
    blocks = _blocks()
    if id(backend) in blocks:  # joins the outer block
        with txn.transaction():
            yield
        return
    block = blocks[id(backend)] = _Block()
    try:
        with txn.transaction():
            yield
    except BaseException:
        for undo in reversed(block.undos):
            undo()
        raise
    finally:
        del blocks[id(backend)]
    for landed in block.landed:
        landed()


def transactional(backend: Backend) -> bool:
    """Whether this thread is inside an atomic block of ``backend`` that is a real
    transaction (its writes land at the block's end, or none of them)."""
    return id(backend) in _blocks()


def on_abort(backend: Backend, undo: Callable[[], None]) -> None:
    """Calls ``undo`` if the atomic block open on ``backend`` in this thread commits nothing
    (it raised, or its commit failed); nothing when no block is open."""
    block = _blocks().get(id(backend))
    if block is not None:
        block.undos.append(undo)


def on_commit(backend: Backend, landed: Callable[[], None]) -> None:
    """Calls ``landed`` once the atomic block open on ``backend`` in this thread has
    committed (its writes are in storage), or at once when no transaction is open (writes
    land as they are made)."""
    block = _blocks().get(id(backend))
    if block is None:
        landed()
    else:
        block.landed.append(landed)
