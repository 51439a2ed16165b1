"""The backend registry: the names ``backend=`` accepts in ``create``, ``open`` and ``copy``.

``"zarr"`` is a factory, not a class: it makes a :class:`ZarrS3Backend` for an ``s3://``
location, a :class:`ZarrHttpBackend` for an ``http(s)://`` one and a :class:`ZarrBackend`
elsewhere (which refuses locations it cannot store at). :func:`backend_at` is how the package
makes the backend of a location: at a read-only location (``http(s)://``) whatever backend is
named comes wrapped in :class:`~pytreestore.backends._readonly.ReadOnly`.

Example:
    >>> from pytreestore._location import Location
    >>> type(zarr_backend(Location.parse("memory://doc-registry-zarr"))).__name__
    'ZarrBackend'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytreestore._location import Location
from pytreestore.backends._base import Backend
from pytreestore.backends._readonly import read_only
from pytreestore.backends._tensorstore.backend import TensorStoreBackend
from pytreestore.backends._tensorstore.database import is_ocdbt
from pytreestore.backends._tensorstore.ocdbt import OcdbtBackend
from pytreestore.backends._zarr.backend import ZarrBackend
from pytreestore.backends._zarr.http import ZarrHttpBackend
from pytreestore.backends._zarr.s3 import ZarrS3Backend
from pytreestore.errors import UnknownBackendError


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
    location (:func:`~pytreestore.backends._readonly.read_only`).

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
    "backend_at",
    "default_backend",
    "get_backend",
    "register_backend",
    "registered_backends",
    "zarr_backend",
]
