"""The commit claim: how writers sharing a store (``open(mode="a", coordinator=...)``)
take turns to commit.

Through an OCDBT coordinator each key is written atomically, conditional writes included,
but a transaction over several keys is refused ("Cannot ... as single atomic transaction"),
so a commit (resizes, the tail chunk, the version record, the commit record, the root) cannot
be one atomic step. Writers therefore commit one at a time: a writer creates the claim
object ``.pytreestore/claim`` with a conditional write (only if absent), commits, and deletes
it with a conditional write on its own token. The claim names its holder (host, boot, pid
namespace, pid and start time, as the writer lock of object stores does,
:mod:`pytreestore._commit.lock`) and when it expires.

A claim whose holder is provably dead (same host, boot and pid namespace, process gone) is
taken over at once; any other claim after it expires (``RUNTIME.waits.claim_s``). Two writers
racing to take a dead claim over both write conditionally on its token: one wins.

Example:
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import TensorStoreBackend
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-claim"))
    >>> with CommitClaim.take(backend, "memory://doc-claim", wait=1.0):
    ...     backend.read_bytes(CLAIM_KEY) is not None
    True
    >>> backend.read_bytes(CLAIM_KEY) is None
    True
"""

from __future__ import annotations

import json
import random
import time

from pytreestore._commit.lock import holder_info, holder_is_dead
from pytreestore._format.names import CLAIM_KEY, NO_VALUE
from pytreestore._runtime import RUNTIME
from pytreestore.backends import ConditionalWrites
from pytreestore.errors import CommitConflictError, StorageError


class CommitClaim:
    """A held commit claim; leaving the ``with`` block (or :meth:`release`) gives it back."""

    def __init__(self, backend: ConditionalWrites, token: bytes) -> None:
        self._backend = backend
        self._token: bytes | None = token
        #: the token of this claim if giving it back failed (storage down): pass it to the
        #: next :meth:`take` as ``leftover``, which deletes it first
        self.left: bytes | None = None

    @classmethod
    def take(
        cls,
        backend: ConditionalWrites,
        where: str,
        *,
        wait: float = RUNTIME.waits.claim_wait_s,
        leftover: bytes | None = None,
    ) -> CommitClaim:
        """Takes the claim, waiting up to ``wait`` seconds while a live writer holds it;
        ``leftover`` (a claim of the caller's that could not be given back, :attr:`left`)
        is deleted first, if it is still there.

        Raises:
            CommitConflictError: another live writer held the claim for all of ``wait``.
            StorageError: storage (or the coordinator) could not be reached.
        """
        if leftover is not None:
            backend.write_bytes_if(CLAIM_KEY, None, leftover)
        deadline = time.monotonic() + wait
        pause = 0.0005
        while True:
            mine = _claim_json()
            token = backend.write_bytes_if(CLAIM_KEY, mine, NO_VALUE)
            if token is not None:
                return cls(backend, token)
            raw, generation = backend.read_bytes_versioned(CLAIM_KEY)
            holder = _parse(raw)
            if raw is not None and (holder_is_dead(holder) or _expired(holder)):
                token = backend.write_bytes_if(CLAIM_KEY, mine, generation)
                if token is not None:
                    return cls(backend, token)
            if time.monotonic() > deadline:
                raise _busy(where, holder, wait)
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 0.005)  # a commit takes a few ms: look again soon

    def release(self) -> None:
        """Deletes the claim if it is still this writer's; a second call does nothing.

        A storage failure here leaves the claim behind (its token kept as :attr:`left`),
        which the holder's next :meth:`take`, its expiry or this process's death frees; the
        commit it guarded stands or fails on its own.
        """
        token, self._token = self._token, None
        if token is None:
            return
        try:
            self._backend.write_bytes_if(CLAIM_KEY, None, token)
        except StorageError:
            self.left = token

    def __enter__(self) -> CommitClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _claim_json() -> bytes:
    return json.dumps({**holder_info(), "expires": time.time() + RUNTIME.waits.claim_s}).encode()


def _parse(raw: bytes | None) -> dict[str, object]:
    try:
        holder = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}  # damaged: it expires like any other (no expiry: at once)
    return holder if isinstance(holder, dict) else {}


def _expired(holder: dict[str, object]) -> bool:
    expires = holder.get("expires")
    if not isinstance(expires, int | float) or isinstance(expires, bool):
        return True  # not a claim this format writes: nothing keeps it
    return time.time() > expires


def _busy(where: str, holder: dict[str, object], wait: float) -> CommitConflictError:
    who = (
        f"pid {holder.get('pid')} on host {holder.get('host')!r} since {holder.get('acquired')}"
        if holder
        else "another writer"
    )
    return CommitConflictError(
        f"could not commit to {where} within {wait:g} s: its commit claim ({CLAIM_KEY}) is held "
        f"by {who}, and writers sharing a store commit one at a time; nothing was committed by "
        "this writer. A claim whose holder died on this host is taken over at once, any other "
        f"after {RUNTIME.waits.claim_s:g} s"
    )


__all__ = ["CommitClaim"]
