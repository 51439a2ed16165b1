"""Errors raised by pytreestore.

Every error derives from :class:`PyTreeStoreError` and also from the builtin exception a caller
would naturally catch (``ValueError``, ``FileNotFoundError``, ...), the way zarr-python does.

Example:
    >>> import pytreestore
    >>> try:
    ...     pytreestore.open("/no/such/store")
    ... except FileNotFoundError as err:
    ...     print(type(err).__name__)
    StoreNotFoundError
"""

from __future__ import annotations

__all__ = [
    "BadLocationError",
    "ClassResolutionError",
    "ClosedStoreError",
    "CorruptStoreError",
    "FormatVersionError",
    "NotAStoreError",
    "PyTreeStoreError",
    "ReadOnlyError",
    "SchemaMismatchError",
    "StoreExistsError",
    "StoreIndexError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnsupportedDtypeError",
    "UnsupportedTreeError",
    "X64DisabledError",
]


class PyTreeStoreError(Exception):
    """Base class of every error pytreestore raises."""


class SchemaMismatchError(PyTreeStoreError, ValueError):
    """A record or batch does not match the store's schema (structure, shape or dtype)."""


class UnsupportedTreeError(PyTreeStoreError, TypeError):
    """An example record holds a node or leaf that a store cannot represent."""


class UnsupportedDtypeError(UnsupportedTreeError):
    """A leaf has a dtype that no column can hold (object, string, ...)."""


class StoreNotFoundError(PyTreeStoreError, FileNotFoundError):
    """No store exists at the given location."""


class StoreExistsError(PyTreeStoreError, FileExistsError):
    """A store (or other data) already exists where one was to be created."""


class NotAStoreError(PyTreeStoreError, ValueError):
    """The location holds data that is not a pytreestore store."""


class FormatVersionError(NotAStoreError):
    """The store was written in a format version this pytreestore cannot read."""


class CorruptStoreError(PyTreeStoreError, OSError):
    """The store's metadata or data disagree with its schema or cannot be decoded."""


class ReadOnlyError(PyTreeStoreError, PermissionError):
    """A store opened read-only was written to."""


class StoreLockedError(PyTreeStoreError, BlockingIOError):
    """Another writer holds the store's lock."""


class ClosedStoreError(PyTreeStoreError, ValueError):
    """The store was used after :meth:`TreeStore.close`."""


class ClassResolutionError(PyTreeStoreError, ImportError):
    """A class named in the schema could not be imported, or is not a registered pytree node."""


class StoreIndexError(PyTreeStoreError, IndexError):
    """An index is out of range or of a type a store cannot be indexed with."""


class X64DisabledError(PyTreeStoreError, TypeError):
    """A 64-bit column was loaded to a device while JAX's x64 mode is disabled."""


class BadLocationError(PyTreeStoreError, ValueError):
    """A path or URL that names no place a store can live."""
