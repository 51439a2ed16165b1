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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

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


__all__ = ["StoreSpec", "reopen"]
