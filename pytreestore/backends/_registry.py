"""The backend registry (the names ``backend=`` accepts), backends' optional capabilities, and read-only locations.

Telling a backend's optional capabilities (the ``runtime_checkable`` Protocols of
:mod:`pytreestore.backends._base`) fast and right: :func:`capable`.

Example:
    >>> from pytreestore.backends import BatchedReads
    >>> class Plain:
    ...     def read_many(self, requests, records): ...
    >>> capable(Plain(), BatchedReads), capable(object(), BatchedReads)
    (True, False)

Backends at read-only locations (``http://`` and ``https://``): any backend, with its reads
only.

A web server serves files: it answers GET (and HEAD) for a key and nothing else, so a store
there can be read, never written, and its keys cannot be listed. :class:`ReadOnly` wraps the
backend a store is opened with there and keeps the :class:`~pytreestore.backends.Backend`
contract: every read goes to the wrapped backend; every write raises
:class:`~pytreestore.errors.ReadOnlyError` before anything is sent; ``is_empty`` looks for the
objects that make a store (no listing). Of the optional capabilities it keeps only the reads
(``BatchedReads``, ``PartialReads``, ``ReadsInto``, ``ManyReads``, ``CheckedReads`` where the
wrapped backend has them); the others (listing, conditional writes, local files, ...) it does not even name, so
the package's fallbacks apply: ``verify`` reads every chunk and cannot name chunks that lie
past the commit, ``versions()`` reads the version records one by one up to the latest commit
(tags are found by name only), and operations that only a writer runs never start
(``Location.check_writable`` refuses them first).

Example:
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import KeyListing, TensorStoreBackend, capable
    >>> backend = read_only(TensorStoreBackend, Location.parse("http://127.0.0.1:9/s"))
    >>> capable(backend, KeyListing)
    False
    >>> backend.write_bytes("x", b"1")
    Traceback (most recent call last):
    ...
    pytreestore.errors.ReadOnlyError: cannot write x at http://127.0.0.1:9/s: ...

The backend registry: the names ``backend=`` accepts in ``create``, ``open`` and ``copy``.

``"zarr"`` is a factory, not a class: it makes a :class:`ZarrS3Backend` for an ``s3://``
location, a :class:`ZarrHttpBackend` for an ``http(s)://`` one and a :class:`ZarrBackend`
elsewhere (which refuses locations it cannot store at). :func:`backend_at` is how the package
makes the backend of a location: at a read-only location (``http(s)://``) whatever backend is
named comes wrapped in :class:`~pytreestore.backends._registry.ReadOnly`.

Example:
    >>> from pytreestore._location import Location
    >>> type(zarr_backend(Location.parse("memory://doc-registry-zarr"))).__name__
    'ZarrBackend'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeGuard, TypeVar

import numpy as np

from pytreestore._format.keys import COMMIT_KEY, INCOMPLETE_KEY, ROOT_KEY
from pytreestore._location import Location
from pytreestore.backends._base import Backend, ColumnLayout, ColumnShape
from pytreestore.backends._tensorstore.backend import TensorStoreBackend
from pytreestore.backends._tensorstore.database import is_ocdbt
from pytreestore.backends._tensorstore.ocdbt import OcdbtBackend
from pytreestore.backends._zarr.backend import ZarrBackend
from pytreestore.backends._zarr.remote import ZarrHttpBackend, ZarrS3Backend
from pytreestore.errors import UnknownBackendError

_C = TypeVar("_C")


#: whether a backend of each class chain (a wrapper's class, then what it wraps: see
#: :func:`capable`) has each capability: ``isinstance`` of a runtime Protocol checks every
#: member by name (about 60 us), once per chain here
_CAPABLE: dict[tuple[type, ...], bool] = {}


def capable(backend: Any, capability: type[_C]) -> TypeGuard[_C]:
    """Whether ``backend`` is ``capability`` (a ``runtime_checkable`` Protocol of the backend contract), told
    once per class. A wrapper (a class with an ``inner`` property, such as the packed
    columns' backend) answers as what it wraps does, so the answer is kept per chain of
    classes, not per the wrapper's class alone.

    """
    chain: list[type] = [capability]
    seen = backend
    while True:
        chain.append(type(seen))
        if not isinstance(getattr(type(seen), "inner", None), property):
            break
        seen = seen.inner
    key = tuple(chain)
    known = _CAPABLE.get(key)
    if known is None:
        known = _CAPABLE[key] = isinstance(backend, capability)
    return known


#: the optional read capabilities a wrapped backend keeps, by method name
_READS = ("read_many", "read_parts", "read_into", "read_many_bytes", "read_checked")


class ReadOnly:
    """``inner``'s reads at a read-only ``location``; its writes refused (see the module).

    Args:
        inner: the backend that reads the store (made for ``location``).
        location: where the store is (``http``).
    """

    def __init__(self, inner: Backend, location: Location) -> None:
        self._inner = inner
        self._location = location

    @property
    def inner(self) -> Backend:
        """The wrapped backend (what :func:`~pytreestore.backends.capable` also asks)."""
        return self._inner

    def __getattr__(self, name: str) -> Any:  # the read capabilities the inner has, no other
        if name in _READS:
            return getattr(self._inner, name)
        raise AttributeError(name)

    # ---- reads ---------------------------------------------------------------------------------

    def read_bytes(self, key: str) -> bytes | None:
        return self._inner.read_bytes(key)

    def open_columns(self, columns: Sequence[ColumnShape]) -> None:
        self._inner.open_columns(columns)

    def column_shapes(self, keys: Sequence[str]) -> list[tuple[int, ...]]:
        return self._inner.column_shapes(keys)

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        return self._inner.read(keys, index, records)

    def is_empty(self) -> bool:
        """Whether none of the objects that make a store (or a store being made) is there:
        the root ``zarr.json``, the commit record, the incomplete marker. A web server lists
        no folders, so other files there are not seen."""
        return all(
            self._inner.read_bytes(k) is None for k in (ROOT_KEY, COMMIT_KEY, INCOMPLETE_KEY)
        )

    def close(self) -> None:
        self._inner.close()

    # ---- writes: refused -------------------------------------------------------------------------

    def write_bytes(self, key: str, data: bytes) -> NoReturn:
        self._refuse(f"write {key}")

    def write_many_bytes(self, items: dict[str, bytes]) -> NoReturn:
        self._refuse(f"write {', '.join(items)}")

    def delete_keys(self, keys: Sequence[str]) -> NoReturn:
        self._refuse(f"delete {', '.join(keys)}")

    def delete_all(self) -> NoReturn:
        self._refuse("delete a store")

    def create_columns(self, layouts: Sequence[ColumnLayout]) -> NoReturn:
        self._refuse("create columns")

    def resize(self, keys: Sequence[str], records: int) -> NoReturn:
        self._refuse("resize columns")

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> NoReturn:
        self._refuse("write columns")

    def _refuse(self, doing: str) -> NoReturn:
        self._location.check_writable(doing)
        raise AssertionError(f"{self._location} is not read-only")  # only made for read-only


def read_only(factory: Callable[..., Backend], location: Location) -> Backend:
    """The backend ``factory`` makes for ``location``, wrapped in :class:`ReadOnly` where the
    location is read-only (``http(s)://``)."""
    engine = factory(location)
    return ReadOnly(engine, location) if location.read_only else engine  # type: ignore[return-value]


def zarr_backend(location: Location, **options: Any) -> ZarrBackend:
    """The zarr backend of ``location``: :class:`ZarrS3Backend` on ``s3://``,
    :class:`ZarrHttpBackend` on ``http(s)://``, else :class:`ZarrBackend` (local disk,
    ``memory://``; it refuses ``gs://`` and the like).

    Raises:
        BadLocationError: the zarr backends do not store at ``location``.
    """
    if location.kind == "s3":
        return ZarrS3Backend(location, **options)
    if location.kind == "http":
        return ZarrHttpBackend(location, **options)
    return ZarrBackend(location, **options)


#: ``factory(location, **options)`` makes a backend; a backend class is one
BackendFactory = Callable[..., Backend]


_REGISTRY: dict[str, BackendFactory] = {
    "tensorstore": TensorStoreBackend,
    "zarr": zarr_backend,
    "ocdbt": OcdbtBackend,
}


def register_backend(name: str, factory: BackendFactory, *, replace: bool = False) -> None:
    """Makes ``backend=name`` in ``create``, ``open`` and ``copy`` use ``factory``.

    Args:
        name: the name users pass as ``backend=``.
        factory: called as ``factory(location, **options)`` with the parsed location (its
            ``kind``: ``"file"``, ``"memory"``, ``"s3"`` or ``"gcs"``, its ``path`` and its
            storage options; docs/architecture.md, "The backend contract"); returns an object
            keeping the :class:`Backend` contract (a backend class is such a factory).
        replace: allow replacing a backend already registered under ``name``.

    Raises:
        UnknownBackendError: ``name`` is not a non-empty string, ``factory`` is not callable,
            or ``name`` is taken and ``replace`` is False.

    Example:
        >>> from pytreestore.backends import ZarrBackend, register_backend
        >>> register_backend("zarr-again", ZarrBackend)
        >>> import pytreestore
        >>> with pytreestore.create("memory://doc-registry", {"x": 0.0}, backend="zarr-again") as s:
        ...     s.append({"x": 1.0})
        >>> float(pytreestore.open("memory://doc-registry", backend="zarr-again")[0]["x"])
        1.0
    """
    if not isinstance(name, str) or not name:
        raise UnknownBackendError(f"a backend name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise UnknownBackendError(
            f"the factory of backend {name!r} must be callable as factory(location, **options), "
            f"got {factory!r}"
        )
    if name in _REGISTRY and not replace and _REGISTRY[name] is not factory:
        raise UnknownBackendError(
            f"a backend is already registered as {name!r} ({_REGISTRY[name]!r}); pass "
            "replace=True to replace it, or choose another name"
        )
    _REGISTRY[name] = factory


def registered_backends() -> list[str]:
    """The names ``backend=`` accepts, the built-in ones first."""
    return list(_REGISTRY)


def default_backend(location: Location) -> str:
    """The backend ``open`` uses without ``backend=``: ``"ocdbt"`` where an OCDBT database
    lies at ``location`` (its ``manifest.ocdbt``: one stat on local disk, one read elsewhere),
    else ``"tensorstore"``."""
    return "ocdbt" if is_ocdbt(location) else "tensorstore"


def backend_at(name: str, location: Location) -> Backend:
    """The backend registered as ``name``, made for ``location``: read-only at a read-only
    location (:func:`~pytreestore.backends._registry.read_only`).

    Raises:
        UnknownBackendError: no backend is registered under ``name``.
    """
    return read_only(get_backend(name), location)


def get_backend(name: str) -> BackendFactory:
    """The factory registered under ``name``.

    Raises:
        UnknownBackendError: no backend is registered under ``name``.
    """
    factory = _REGISTRY.get(name) if isinstance(name, str) else None
    if factory is None:
        raise UnknownBackendError(
            f"unknown backend {name!r}; registered backends: {', '.join(registered_backends())}. "
            "Register another with pytreestore.backends.register_backend(name, factory)"
        )
    return factory


__all__ = [
    "BackendFactory",
    "ReadOnly",
    "backend_at",
    "capable",
    "default_backend",
    "get_backend",
    "read_only",
    "register_backend",
    "registered_backends",
    "zarr_backend",
]
