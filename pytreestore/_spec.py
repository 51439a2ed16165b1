"""How to open a store again: a frozen, picklable description of an open store.

A reader (``TreeStore.__reduce__``) and a Grain source pickle as their :class:`StoreSpec` and
reopen, read-only, where they are unpickled. The spec carries the function that opens it
(:func:`pytreestore.open`, pickled by reference) so that this module imports nothing that
imports the store.

Example:
    >>> import pickle, pytreestore
    >>> from pytreestore._location import Location
    >>> spec = StoreSpec.of(Location.parse("memory://doc-spec"), "zarr", opener=pytreestore.open)
    >>> spec.options()["backend"], pickle.loads(pickle.dumps(spec)) == spec
    ('zarr', True)

A reader's schema, parsed when it is first needed.

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

import dataclasses
import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pytreestore._location import Location


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreSpec:
    """Where a store lives and the options it was opened with.

    Attributes:
        path: the location, as :func:`pytreestore.open` takes it.
        backend: the backend's registered name.
        storage_options: the object-store options that differ from their defaults, as
            ``(name, value)`` pairs (empty for local and in-memory stores).
        cache_bytes, like, generic, cast: as given to :func:`pytreestore.open`.
        version: the version a reader was opened at with ``open(version=...)`` (None: the
            latest at each open).
        opener: the function that opens a store from these options (``pytreestore.open``).
        creator: the function that creates a store (``pytreestore.create``), for
            ``store.map(fn, out=path)``.
    """

    path: str
    backend: str
    storage_options: tuple[tuple[str, Any], ...] = ()
    cache_bytes: int | None = None
    like: Any = None
    generic: bool = False
    cast: bool = False
    version: int | None = None
    opener: Callable[..., Any] | None = dataclasses.field(default=None, compare=False)
    creator: Callable[..., Any] | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def of(cls, location: Location, backend: str, **options: Any) -> StoreSpec:
        """The spec of a store at ``location`` opened through ``backend`` with ``options``."""
        given = location.options
        storage = (
            tuple(
                (f.name, getattr(given, f.name))
                for f in dataclasses.fields(given)
                if getattr(given, f.name) != f.default
            )
            if given is not None
            else ()
        )
        return cls(path=str(location), backend=backend, storage_options=storage, **options)

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`pytreestore.open` that open the store, read-only."""
        pinned = {} if self.version is None else {"version": self.version}
        return {
            **pinned,
            "like": self.like,
            "generic": self.generic,
            "cache_bytes": self.cache_bytes,
            "cast": self.cast,
            "path": self.path,
            "mode": "r",
            "backend": self.backend,
            "storage_options": dict(self.storage_options) or None,
        }

    def open(self) -> Any:
        """Opens the store again, read-only: a new :class:`~pytreestore.TreeStore`."""
        assert self.opener is not None, "a spec made without opener= cannot open"
        return self.opener(**self.options())


def reopen(spec: StoreSpec) -> Any:
    """Opens ``spec``'s store read-only; what an unpickled reader calls."""
    return spec.open()


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


__all__ = ["Deferred", "StoreSpec", "reopen"]
