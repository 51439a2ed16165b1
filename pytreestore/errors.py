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
    "ArgumentError",
    "ArgumentTypeError",
    "BadLocationError",
    "ChunkSizeError",
    "ClassResolutionError",
    "ClosedStoreError",
    "CommitConflictError",
    "CorruptChunkError",
    "CorruptStoreError",
    "DeletedArrayError",
    "DeviceFetchError",
    "ForkedBackendError",
    "ForkedIteratorError",
    "ForkedWriterError",
    "FormatVersionError",
    "FragmentError",
    "MultiHostError",
    "NotAStoreError",
    "OptionalDependencyError",
    "PyTreeStoreError",
    "RaggedDeclarationError",
    "RaggedLengthError",
    "ReadOnlyError",
    "SchemaMismatchError",
    "ShardingError",
    "StorageError",
    "StoreExistsError",
    "StoreIndexError",
    "StoreLockedError",
    "StoreNotFoundError",
    "StoreReplacedError",
    "TagExistsError",
    "UnknownBackendError",
    "UnknownColumnError",
    "UnpicklableStoreError",
    "UnsupportedDtypeError",
    "UnsupportedPlatformError",
    "UnsupportedTreeError",
    "VersionNotFoundError",
    "X64DisabledError",
]


class PyTreeStoreError(Exception):
    """Base class of every error pytreestore raises."""


class ArgumentError(PyTreeStoreError, ValueError):
    """An argument a function or method cannot take: a value out of range, or options that
    do not go together. Nothing was written."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument of a type a function or method does not take (a float or a bool where a
    count is wanted, a number where a mapping is). Also a ``ValueError``, like every
    :class:`ArgumentError`. Nothing was written."""


class SchemaMismatchError(PyTreeStoreError, ValueError):
    """A record or batch does not match the store's schema (structure, shape or dtype)."""


class RaggedDeclarationError(PyTreeStoreError, ValueError):
    """A ``ragged=``, ``optional=`` or ``pad_to=`` argument that cannot apply: a keypath naming
    nothing, ``[*]`` under a node that is not a list, a bad ``pad_to``, or a ragged or optional
    structure that no record (nor ``like``) shows."""


class RaggedLengthError(PyTreeStoreError, ValueError):
    """A ragged list or leading axis longer than an explicit ``pad_to`` (and no
    ``truncate=True``)."""


class UnsupportedTreeError(PyTreeStoreError, TypeError):
    """An example record holds a node or leaf that a store cannot represent."""


class UnsupportedDtypeError(UnsupportedTreeError):
    """A leaf has a dtype that no column can hold (object, string, ...)."""


class UnsupportedPlatformError(PyTreeStoreError, OSError):
    """The operating system lacks what an operation needs: writing a local store needs
    ``fcntl.flock`` (POSIX), see docs/reliability.md, "Platforms"."""


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


class CorruptChunkError(CorruptStoreError):
    """A chunk of a column cannot be read back: its checksum or its encoding is damaged.

    Attributes:
        path: the column's tree path (``keystr``), or its storage key where no path is known.
        chunk: the chunk's grid index, record axis first (``(3, 0)``), or None if not known.
        key: the chunk's storage key below the store root, or None if not known.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        chunk: tuple[int, ...] | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path, self.chunk, self.key = path, chunk, key


class StorageError(PyTreeStoreError, OSError):
    """Storage could not be reached or refused a request (server down, disk full, ...).

    What was committed before stays committed; a failed flush can be retried.
    """


class ReadOnlyError(PyTreeStoreError, PermissionError):
    """A store opened read-only was written to."""


class StoreLockedError(PyTreeStoreError, BlockingIOError):
    """Another writer holds the store's lock."""


class CommitConflictError(StoreLockedError):
    """Another writer committed to the store (or took its lock) since this writer opened it."""


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


class ShardingError(PyTreeStoreError, ValueError):
    """A sharded or pmap load asked for a split the record count or a leaf shape cannot take."""


class UnpicklableStoreError(PyTreeStoreError, TypeError):
    """A store open for appending was pickled; only read-only stores pickle (and reopen)."""


class ForkedBackendError(PyTreeStoreError, RuntimeError):
    """A store read or written through TensorStore in a process forked from one that had
    already used TensorStore, which cannot run there (it would abort the process)."""


class ForkedIteratorError(PyTreeStoreError, RuntimeError):
    """An iterator that loads ahead (``batches``, ``map``) made before ``os.fork`` was used in
    the child past what it had loaded: its loading thread stayed in the parent."""


class DeletedArrayError(PyTreeStoreError, RuntimeError):
    """A ``jax.Array`` appended to a store was deleted (donated to a jitted function, or
    ``.delete()``-d) before the store fetched its values; the message names the records kept
    and dropped, and how to append a copy instead."""


class DeviceFetchError(PyTreeStoreError, RuntimeError):
    """A ``jax.Array`` appended to a store could not be fetched from its device (the
    computation that made it failed); the message names the record, the keypath and the
    records dropped with it."""


class ForkedWriterError(PyTreeStoreError, RuntimeError):
    """A store open for appending was used in a process forked from the one that opened it."""


class MultiHostError(PyTreeStoreError, RuntimeError):
    """A multi-host write (``multihost=True``, :meth:`TreeStore.extend_batch` on every
    process) could not go ahead: the processes passed different batches, a process failed
    in a way no other error class names, or a method that writes on one process only was
    called. Nothing was committed."""


class OptionalDependencyError(PyTreeStoreError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the
    extra to install (``pip install 'pytreestore[ray]'``)."""


class ChunkSizeError(PyTreeStoreError, ValueError):
    """``chunk_records`` asks for a writer buffer (one chunk of every column) too large for
    this machine's memory."""


class StoreReplacedError(PyTreeStoreError, FileNotFoundError):
    """The store a reader opened was deleted or replaced (e.g. by ``create(overwrite=True)``)
    since it was opened, or the version it reads was written over after a ``truncate`` or
    removed by ``vacuum()``: what it would read is no longer what it opened."""


class VersionNotFoundError(PyTreeStoreError, LookupError):
    """``open(version=...)`` names a version the store does not keep (never made, dropped
    from its log, or written over after a truncate), or a tag it does not have."""


class TagExistsError(PyTreeStoreError, ValueError):
    """:meth:`TreeStore.tag` was given a name that already tags a version (tags never move)."""


class FragmentError(PyTreeStoreError, ValueError):
    """A fragment (:func:`pytreestore.write_fragment`) that cannot be committed: of another
    store or schema, committed already, its files gone, or its JSON malformed; or data that
    cannot become one (a ragged store). Nothing was written or committed."""


class UnknownBackendError(PyTreeStoreError, ValueError):
    """A ``backend=`` name that no backend is registered under (see
    :func:`pytreestore.backends.register_backend`)."""


class UnknownColumnError(PyTreeStoreError, KeyError):
    """A keypath or column selector that names no leaf of the store's schema."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""
