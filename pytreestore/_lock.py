"""One writer per store: an exclusive lock held while a store is open for writing.

On local disk the lock is ``flock`` on ``.pytreestore/lock``: the kernel releases it when the
holder dies, so a writer killed with SIGKILL leaves no stale lock behind. ``memory://`` stores
are locked within the process.

Example:
    >>> from pytreestore._location import Location
    >>> lock = WriterLock.acquire(Location.parse("memory://doc-lock"))
    >>> lock.release()
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from pytreestore._location import Location
from pytreestore.errors import StoreLockedError

LOCK_KEY = ".pytreestore/lock"
_HELD: set[str] = set()
_HELD_LOCK = threading.Lock()


class WriterLock:
    """A held writer lock; :meth:`release` gives it back."""

    def __init__(self, location: Location, fd: int | None) -> None:
        self._location = location
        self._fd = fd

    @classmethod
    def acquire(cls, location: Location) -> WriterLock:
        """Takes the lock or raises :class:`StoreLockedError` at once."""
        if location.kind == "memory":
            with _HELD_LOCK:
                if location.root in _HELD:
                    raise _locked(location)
                _HELD.add(location.root)
            return cls(location, None)
        path = Path(location.root) / LOCK_KEY
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _locked(location) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(location, fd)

    def release(self) -> None:
        """Gives the lock back; a second call does nothing."""
        if self._location.kind == "memory":
            with _HELD_LOCK:
                _HELD.discard(self._location.root)
        elif self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        self._fd = None
        self._location = Location("released", "")


def _locked(location: Location) -> StoreLockedError:
    return StoreLockedError(
        f"store {location} is open for writing elsewhere (another process or another "
        "TreeStore object holds its writer lock). Close that writer first, or open this one "
        "with mode='r' to read."
    )
