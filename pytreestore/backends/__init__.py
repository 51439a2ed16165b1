"""Storage engines. A backend moves bytes and column blocks; the store owns the protocol.

Example:
    >>> from pytreestore.backends import get_backend
    >>> get_backend("tensorstore").__name__, get_backend("zarr").__name__
    ('TensorStoreBackend', 'ZarrBackend')
"""

from __future__ import annotations

from pytreestore.backends._base import Backend, ColumnLayout, ColumnShape
from pytreestore.backends._tensorstore import TensorStoreBackend
from pytreestore.backends._zarr import ZarrBackend

_BACKENDS: dict[str, type] = {"tensorstore": TensorStoreBackend, "zarr": ZarrBackend}


def get_backend(name: str) -> type:
    """The backend class registered under ``name``."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(_BACKENDS)}") from None


__all__ = [
    "Backend",
    "ColumnLayout",
    "ColumnShape",
    "TensorStoreBackend",
    "ZarrBackend",
    "get_backend",
]
