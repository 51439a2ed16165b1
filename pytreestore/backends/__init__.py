"""Storage engines. A backend moves bytes and column blocks; the store owns the protocol.

The contract every backend keeps, and its optional capabilities, are in
:mod:`pytreestore.backends._base`. ``create``, ``open`` and ``copy`` find a backend by the
name it is registered under (:mod:`pytreestore.backends._registry`); :func:`register_backend`
adds one.

Example:
    >>> from pytreestore.backends import get_backend, registered_backends
    >>> get_backend("tensorstore").__name__, get_backend("zarr").__name__
    ('TensorStoreBackend', 'zarr_backend')
    >>> registered_backends()[:2]
    ['tensorstore', 'zarr']
"""

from __future__ import annotations

from pytreestore.backends._base import (
    Backend,
    BatchedReads,
    CheckedReads,
    ChunkCopies,
    ColumnLayout,
    ColumnShape,
    ConditionalWrites,
    DirectReads,
    FolderDeletes,
    KeyListing,
    LocalFiles,
    ManyReads,
    PartialReads,
    PartialWriteCleanup,
    ReadsInto,
    Snapshots,
    TensorStoreKvStore,
    Transactions,
)
from pytreestore.backends._registry import (
    BackendFactory,
    capable,
    default_backend,
    get_backend,
    register_backend,
    registered_backends,
)
from pytreestore.backends._tensorstore.backend import TensorStoreBackend
from pytreestore.backends._tensorstore.database import OcdbtDatabase, is_ocdbt, ocdbt_coordinator
from pytreestore.backends._tensorstore.ocdbt import OcdbtBackend
from pytreestore.backends._zarr.backend import ZarrBackend

__all__ = [
    "Backend",
    "BackendFactory",
    "BatchedReads",
    "CheckedReads",
    "ChunkCopies",
    "ColumnLayout",
    "ColumnShape",
    "ConditionalWrites",
    "DirectReads",
    "FolderDeletes",
    "KeyListing",
    "LocalFiles",
    "ManyReads",
    "OcdbtBackend",
    "OcdbtDatabase",
    "PartialReads",
    "PartialWriteCleanup",
    "ReadsInto",
    "Snapshots",
    "TensorStoreBackend",
    "TensorStoreKvStore",
    "Transactions",
    "ZarrBackend",
    "capable",
    "default_backend",
    "get_backend",
    "is_ocdbt",
    "ocdbt_coordinator",
    "register_backend",
    "registered_backends",
]
