"""Storage engines. A backend moves bytes and column blocks; the store owns the protocol.

The contract every backend keeps, and its optional capabilities, are in
:mod:`pytreestore.backends._base`. ``create``, ``open`` and ``copy`` find a backend by the
name it is registered under; :func:`register_backend` adds one.

Example:
    >>> from pytreestore.backends import get_backend, registered_backends
    >>> get_backend("tensorstore").__name__, get_backend("zarr").__name__
    ('TensorStoreBackend', 'ZarrBackend')
    >>> registered_backends()[:2]
    ['tensorstore', 'zarr']
"""

from __future__ import annotations

from collections.abc import Callable

from pytreestore.backends._base import (
    Backend,
    BatchedReads,
    CheckedReads,
    ColumnLayout,
    ColumnShape,
    ConditionalWrites,
    KeyListing,
    PartialWriteCleanup,
    TensorStoreKvStore,
)
from pytreestore.backends._tensorstore.backend import TensorStoreBackend
from pytreestore.backends._zarr.backend import ZarrBackend
from pytreestore.errors import UnknownBackendError

#: ``factory(location, **options)`` makes a backend; a backend class is one
BackendFactory = Callable[..., Backend]

_REGISTRY: dict[str, BackendFactory] = {"tensorstore": TensorStoreBackend, "zarr": ZarrBackend}


def register_backend(name: str, factory: BackendFactory, *, replace: bool = False) -> None:
    """Makes ``backend=name`` in ``create``, ``open`` and ``copy`` use ``factory``.

    Args:
        name: the name users pass as ``backend=``.
        factory: called as ``factory(location, **options)`` with a parsed
            :class:`~pytreestore._open.location.Location`; returns an object keeping the
            :class:`Backend` contract (a backend class is such a factory).
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
    "Backend",
    "BackendFactory",
    "BatchedReads",
    "CheckedReads",
    "ColumnLayout",
    "ColumnShape",
    "ConditionalWrites",
    "KeyListing",
    "PartialWriteCleanup",
    "TensorStoreBackend",
    "TensorStoreKvStore",
    "ZarrBackend",
    "get_backend",
    "register_backend",
    "registered_backends",
]
