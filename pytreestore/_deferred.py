"""A reader's schema, parsed when it is first needed.

Opening a store for reading reads two objects whatever the store's width, the root
``zarr.json`` and the commit record, and checks what an open must (the format version, the
commit record). Parsing the schema, binding it to today's classes and checking it against the
commit record cost time in proportion to the store's width (about 13 ms for 1,000 leaves), so
:func:`pytreestore.open` hands the store a :class:`Deferred` that does them on first use: the
first read, ``store.schema``, ``repr(store)``. Errors those steps find (a damaged schema, a
class that cannot be imported) are raised there, each time until the schema parses.

Example:
    >>> d = Deferred(lambda: ("schema", "backend"))
    >>> d.get()
    ('schema', 'backend')
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

S = TypeVar("S")
B = TypeVar("B")


class Deferred(Generic[S, B]):
    """The schema of an opened store and the backend that reads it, made once on first use.

    Args:
        make: parses the schema and readies the backend (every check of an eager open);
            called at most once successfully, under a lock, so that threads sharing the store
            wait for one parse. A failure is raised to the caller and the next call tries
            again.
    """

    def __init__(self, make: Callable[[], tuple[S, B]]) -> None:
        self._make: Callable[[], tuple[S, B]] | None = make
        self._made: tuple[S, B] | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @classmethod
    def ready(cls, schema: S, backend: B) -> Deferred[S, B]:
        """One made already (an eager open, a writer, a schema changed by evolve)."""
        deferred = cls(lambda: (schema, backend))
        deferred.get()
        return deferred

    @property
    def done(self) -> bool:
        """Whether the schema has been made."""
        return self._made is not None

    def get(self) -> tuple[S, B]:
        """The schema and backend, made now if this is the first call that succeeds."""
        made = self._made
        if made is not None:
            return made
        if os.getpid() != self._pid:  # forked while another thread parsed: a lock of our own
            self._lock, self._pid = threading.Lock(), os.getpid()
        with self._lock:
            if self._made is None:
                assert self._make is not None
                self._made = self._make()
                self._make = None  # what it closed over (the root's bytes) can go
            return self._made


__all__ = ["Deferred"]
