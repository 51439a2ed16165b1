"""Storage engines. A backend moves bytes and column blocks; the store owns the protocol.

Example:
    >>> from pytreestore.backends import get_backend
    >>> get_backend("tensorstore").__name__
    'TensorStoreBackend'
"""

from __future__ import annotations

from pytreestore.backends._base import Backend, ColumnLayout
from pytreestore.backends._tensorstore import TensorStoreBackend

_BACKENDS: dict[str, type] = {"tensorstore": TensorStoreBackend}


def get_backend(name: str) -> type:
    """The backend class registered under ``name``."""
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(_BACKENDS)}") from None


__all__ = ["Backend", "ColumnLayout", "TensorStoreBackend", "get_backend"]
