"""TreeStore: a store of pytree records, one zarr v3 array per leaf. Orchestration only.

Example:
    >>> import numpy as np, pytreestore
    >>> like = {"x": np.float32(0), "v": np.zeros(3, np.float32)}
    >>> store = pytreestore.create("memory://doc-store", like)
    >>> store.append({"x": np.float32(1), "v": np.ones(3, np.float32)})
    >>> store.extend([like] * 2)
    >>> len(store), store[:]["v"].shape
    (3, (3, 3))
    >>> store.close()
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np
from jax.tree_util import tree_flatten

from pytreestore import _device, _read
from pytreestore._location import Location
from pytreestore._lock import WriterLock
from pytreestore._schema import FORMAT_VERSION, TreeSchema
from pytreestore._stack import split_leaves
from pytreestore._write import Commit, Writer, layouts
from pytreestore.backends import Backend, get_backend
from pytreestore.errors import (
    ClosedStoreError,
    CorruptStoreError,
    FormatVersionError,
    NotAStoreError,
    ReadOnlyError,
    SchemaMismatchError,
    StoreExistsError,
    StoreNotFoundError,
)

ROOT_KEY = "zarr.json"
_ITER_BLOCK = 4096


class TreeStore:
    """A persistent, columnar store of pytree records.

    Create one with :func:`pytreestore.create` or open one with :func:`pytreestore.open`.
    Records are appended with :meth:`append`, :meth:`extend` or :meth:`extend_batch`, buffered
    in memory, and committed in whole chunks and at :meth:`flush`. Indexing (``store[i]``,
    ``store[a:b]``, ``store[[3, 1]]``, ``store[mask]``) and :meth:`load` return records of the
    stored classes whose leaves carry a leading record axis.

    Example:
        >>> import pytreestore
        >>> with pytreestore.create("memory://doc-treestore", {"a": 0, "b": 0.0}) as store:
        ...     store.extend({"a": i, "b": i / 2} for i in range(4))
        >>> reader = pytreestore.open("memory://doc-treestore")
        >>> reader[1:3]["b"]
        Array([0.5, 1. ], dtype=float32)
    """

    def __init__(
        self,
        *,
        location: Location,
        backend: Backend,
        backend_name: str,
        schema: TreeSchema,
        mode: str,
        commit: Commit,
        lock: WriterLock | None,
    ) -> None:
        self._location = location
        self._backend = backend
        self._backend_name = backend_name
        self._schema = schema
        self._mode = mode
        self._commit = commit
        self._lock = lock
        self._closed = False
        self._writer = Writer(backend, schema, commit) if mode == "a" else None

    # ---- description ---------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """Where the store lives: a directory, or ``memory://NAME``."""
        return str(self._location)

    @property
    def mode(self) -> str:
        """``"r"`` (read only) or ``"a"`` (append)."""
        return self._mode

    @property
    def schema(self) -> TreeSchema:
        """The store's structure and columns (tree path, dtype and per-record shape of each)."""
        return self._schema

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def committed(self) -> int:
        """Records durable in storage (excludes records still buffered)."""
        return self._writer.commit.records if self._writer else self._commit.records

    def __len__(self) -> int:
        self._check_open()
        return len(self._writer) if self._writer else self._commit.records

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"records={len(self)}"
        return (
            f"TreeStore({self.path!r}, mode={self._mode!r}, {state}, "
            f"columns={len(self._schema.columns)})"
        )

    # ---- writing -------------------------------------------------------------------------------

    def append(self, record: Any) -> None:
        """Appends one record. It is buffered; it becomes durable at the next commit.

        Raises:
            SchemaMismatchError: the record's structure, a shape or a dtype differs from the
                schema. Nothing is appended.
        """
        writer = self._writable()
        leaves, treedef = tree_flatten(record)
        if treedef != self._schema.treedef:
            raise SchemaMismatchError(self._schema.mismatch_message(record))
        writer.append(leaves)

    def extend(self, records: Iterable[Any]) -> None:
        """Appends every record of an iterable (a list, a generator, ...), all or none.

        If any record is refused, none of this call's records are appended and the error
        names the offending record's position.
        """
        writer = self._writable()
        treedef, schema = self._schema.treedef, self._schema
        seen = [0]

        def checked() -> Iterator[list[Any]]:
            for record in records:
                leaves, got = tree_flatten(record)
                if got != treedef:
                    raise SchemaMismatchError(schema.mismatch_message(record))
                yield leaves
                seen[0] += 1

        position = writer.snapshot()
        try:
            writer.append_many(checked())
        except SchemaMismatchError as err:
            writer.rollback(position)
            raise SchemaMismatchError(
                f"extend() refused record {seen[0]} (none of this call's records were "
                f"appended): {err}"
            ) from err
        except BaseException:
            writer.rollback(position)
            raise

    def extend_batch(self, batch: Any) -> None:
        """Appends a batched record: the schema's structure, leaves with a leading record axis.

        Raises:
            SchemaMismatchError: structure, per-record shape or dtype differ, or the leaves
                disagree on the number of records. Nothing is appended.
        """
        writer = self._writable()
        leaves, treedef = tree_flatten(batch)
        if treedef != self._schema.treedef:
            raise SchemaMismatchError(self._schema.mismatch_message(batch, what="batch"))
        count = _batch_length(leaves, self._schema.paths)
        blocks = [
            c.coerce(leaf, batch=count, what="batch") for c, leaf in zip(writer.casters, leaves)
        ]
        if count == 0:
            return
        position = writer.snapshot()
        try:
            writer.write_batch(blocks)
        except BaseException:
            writer.rollback(position)
            raise

    def flush(self) -> None:
        """Writes every buffered record and commits; afterwards all appended records are durable."""
        self._writable().flush()

    def close(self) -> None:
        """Flushes (in append mode), releases the writer lock and closes. A second call is a no-op."""
        if self._closed:
            return
        try:
            if self._writer is not None:
                self._writer.flush()
        finally:
            self._closed = True
            if self._lock is not None:
                self._lock.release()
            self._backend.close()

    def __enter__(self) -> TreeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reading -------------------------------------------------------------------------------

    def refresh(self) -> int:
        """Re-reads the commit record (a reader sees records committed since it opened).

        Returns:
            The number of records now visible.
        """
        self._check_open()
        if self._writer is None:
            self._commit = Commit.read(self._backend, self.path)
        return len(self)

    def load(
        self,
        index: Any = slice(None),
        *,
        columns: str | Sequence[str] | None = None,
        device: Any = None,
        as_numpy: bool = False,
        cast: bool = False,
    ) -> Any:
        """Loads records ``index`` as a record of the stored classes.

        Args:
            index: an int (one record), a slice, a list or array of ints, or a bool mask.
            columns: tree-path strings of the columns to load; a node's path selects every
                column below it (``".p[0]"``). Columns not selected come back as None.
            device: a ``jax.Device`` or ``jax.sharding.Sharding`` to place the leaves on
                (default: JAX's default device).
            as_numpy: return host numpy arrays, with every dtype exactly as stored.
            cast: load 64-bit columns while x64 is disabled by casting them to 32 bits
                (values that do not fit raise); without it they raise.

        Returns:
            For an int index, one record whose leaves have the per-record shape; otherwise a
            batched record whose leaves carry a leading record axis.

        Example:
            >>> import pytreestore
            >>> s = pytreestore.create("memory://doc-load", {"a": 0, "b": (0.0, 0.0)})
            >>> s.extend({"a": i, "b": (i * 1.0, i * 2.0)} for i in range(5))
            >>> s.load([4, 0], columns="['b']", as_numpy=True)
            {'a': None, 'b': (array([4., 0.], dtype=float32), array([8., 0.], dtype=float32))}
        """
        leaves = self._load_leaves(index, columns, device=device, as_numpy=as_numpy, cast=cast)
        return self._schema.unflatten(leaves)

    def __getitem__(self, index: Any) -> Any:
        return self.load(index)

    def __iter__(self) -> Iterator[Any]:
        return self.records()

    def records(
        self,
        *,
        columns: str | Sequence[str] | None = None,
        as_numpy: bool = False,
        cast: bool = False,
    ) -> Iterator[Any]:
        """Iterates over the records one at a time, reading a block of records per read.

        ``iter(store)`` is ``store.records()``. The arguments are those of :meth:`load`.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-records", {"t": np.float64(0)})
            >>> s.extend({"t": np.float64(i)} for i in range(2))
            >>> [r["t"].item() for r in s.records(as_numpy=True)]
            [0.0, 1.0]
        """
        n = len(self)
        for start in range(0, n, _ITER_BLOCK):
            block = slice(start, min(start + _ITER_BLOCK, n))
            leaves = self._load_leaves(block, columns, as_numpy=as_numpy, cast=cast)
            for row in zip(*[split_leaves(leaf) for leaf in leaves]):
                yield self._schema.unflatten(row)

    def _load_leaves(
        self,
        index: Any,
        columns: str | Sequence[str] | None,
        *,
        device: Any = None,
        as_numpy: bool = False,
        cast: bool = False,
    ) -> list[Any]:
        self._check_open()
        if self._writer is not None and self._writer.pending:
            self._writer.flush()
        n = len(self)
        selection = _read.normalize(index, n)
        chosen = self._schema.select(columns)
        specs = [self._schema.columns[i] for i in chosen]
        if selection.count == 0:
            arrays = [np.empty((0, *c.shape), c.dtype) for c in specs]
        else:
            arrays = self._backend.read([c.key for c in specs], selection.index, n)
        if selection.scalar:
            arrays = [a[0, ...] for a in arrays]
        leaves: list[Any] = [None] * len(self._schema.columns)
        for i, array in zip(chosen, arrays):
            leaves[i] = array
        if as_numpy:
            return leaves
        return _device.to_jax(leaves, self._schema.paths, device=device, cast=cast)

    # ---- guards --------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedStoreError(f"store {self.path} is closed; open it again to use it")

    def _writable(self) -> Writer:
        self._check_open()
        if self._writer is None:
            raise ReadOnlyError(
                f"store {self.path} is open read-only; open it with "
                "pytreestore.open(path, mode='a') to append"
            )
        return self._writer


def _batch_length(leaves: Sequence[Any], paths: Sequence[str]) -> int:
    lengths = []
    for leaf, path in zip(leaves, paths):
        shape = np.shape(leaf)
        if not shape:
            raise SchemaMismatchError(
                f"batch leaf at {path or 'the root'} has no leading record axis (shape ()); "
                "extend_batch takes leaves shaped (records, *leaf_shape); use append for one record"
            )
        lengths.append(shape[0])
    if len(set(lengths)) > 1:
        detail = ", ".join(f"{p or 'the root'}: {n}" for p, n in zip(paths, lengths))
        raise SchemaMismatchError(
            f"batch leaves disagree on the number of records ({detail}); every leaf of a batch "
            "needs the same leading length"
        )
    return lengths[0] if lengths else 0


# ---- create and open -----------------------------------------------------------------------------


def create(
    path: str | os.PathLike[str],
    like: Any,
    *,
    chunk_records: int | None = None,
    codec: str | None = "zstd",
    backend: str = "tensorstore",
    overwrite: bool = False,
) -> TreeStore:
    """Creates an empty store for records shaped like ``like`` and opens it for appending.

    Args:
        path: a local directory, or ``memory://NAME`` for an in-memory store.
        like: an example record; its structure, static fields, leaf dtypes and shapes become
            the schema. Its values are not stored.
        chunk_records: records per chunk; by default chosen so chunks hold about 4 MiB.
        codec: ``"zstd"`` (default), ``"blosc"``, ``"gzip"``, or None for uncompressed.
        backend: the storage engine, ``"tensorstore"``.
        overwrite: replace an existing store at ``path``.

    Raises:
        UnsupportedTreeError: ``like`` holds a node or leaf a store cannot represent.
        StoreExistsError: a store (or other data) is at ``path`` and ``overwrite`` is false.

    Example:
        >>> import pytreestore
        >>> store = pytreestore.create("memory://doc-create", {"x": 0.0}, overwrite=True)
        >>> [c.path for c in store.schema.columns]
        ["['x']"]
    """
    location = Location.parse(path)
    schema = TreeSchema.from_example(like, chunk_records=chunk_records, codec=codec)
    if not schema.columns:
        raise SchemaMismatchError(
            "the example record has no leaves, so a store would have no columns; "
            "give like= at least one array or scalar"
        )
    if codec not in ("zstd", "blosc", "gzip", None):
        raise ValueError(f"unknown codec {codec!r}; choose 'zstd', 'blosc', 'gzip' or None")
    engine: Backend = get_backend(backend)(location)
    _clear_for_create(engine, location, overwrite)
    lock = WriterLock.acquire(location)
    try:
        engine.create_columns(layouts(schema))
        groups = {k: _group_json({}) for k in _group_keys(schema)}
        engine.write_many_bytes(groups)
        commit = Commit(0, 0)
        engine.write_bytes(".pytreestore/commit.json", commit.to_bytes())
        engine.write_bytes(ROOT_KEY, _group_json({"pytreestore": schema.to_json()}))
    except BaseException:
        lock.release()
        raise
    return TreeStore(
        location=location,
        backend=engine,
        backend_name=backend,
        schema=schema,
        mode="a",
        commit=commit,
        lock=lock,
    )


def open(
    path: str | os.PathLike[str],
    mode: Literal["r", "a"] = "r",
    *,
    like: Any = None,
    generic: bool = False,
    backend: str = "tensorstore",
) -> TreeStore:
    """Opens an existing store.

    Args:
        path: the store's directory, or ``memory://NAME``.
        mode: ``"r"`` to read, ``"a"`` to append (takes the store's writer lock).
        like: an example record whose classes to use instead of importing the classes the
            schema names (for classes defined in ``__main__`` or since moved).
        generic: return dicts, lists and tuples instead of the stored classes (read only).
        backend: the storage engine, ``"tensorstore"``.

    Raises:
        StoreNotFoundError: nothing is at ``path``.
        NotAStoreError: ``path`` holds something that is not a store.
        FormatVersionError: the store's format is newer than this pytreestore.
        ClassResolutionError: a class the schema names cannot be imported.
        StoreLockedError: ``mode="a"`` and another writer holds the store.

    Example:
        >>> import pytreestore
        >>> pytreestore.create("memory://doc-open", {"x": 0}).close()
        >>> pytreestore.open("memory://doc-open")
        TreeStore('memory://doc-open', mode='r', records=0, columns=1)
    """
    if mode not in ("r", "a"):
        raise ValueError(f"mode must be 'r' (read) or 'a' (append), got {mode!r}")
    if generic and mode == "a":
        raise ValueError("generic=True gives a read-only view; open with mode='r'")
    location = Location.parse(path)
    engine: Backend = get_backend(backend)(location)
    schema = TreeSchema.from_json(_read_root(engine, location), like=like, generic=generic)
    lock = WriterLock.acquire(location) if mode == "a" else None
    try:
        commit = Commit.read(engine, str(location))
        if mode == "a":
            _repair(engine, schema, commit)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return TreeStore(
        location=location,
        backend=engine,
        backend_name=backend,
        schema=schema,
        mode=mode,
        commit=commit,
        lock=lock,
    )


def _read_root(engine: Backend, location: Location) -> dict[str, Any]:
    where = f"{location}/{ROOT_KEY}"
    raw = engine.read_bytes(ROOT_KEY)
    if raw is None:
        if engine.is_empty():
            raise StoreNotFoundError(f"no store at {location}")
        raise NotAStoreError(f"{location} is not a pytreestore store: {ROOT_KEY} is missing")
    try:
        meta = json.loads(raw)
    except ValueError as err:
        raise NotAStoreError(
            f"{where} is not valid JSON ({err}); the store's root metadata is damaged"
        ) from err
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    info = attrs.get("pytreestore") if isinstance(attrs, dict) else None
    if not isinstance(info, dict):
        raise NotAStoreError(
            f"{location} is a zarr node but not a pytreestore store: {where} has no "
            "'pytreestore' attribute"
        )
    version = info.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise NotAStoreError(f"{where} has an invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise FormatVersionError(
            f"{location} is in pytreestore format {version}, newer than the {FORMAT_VERSION} "
            "this version reads; upgrade pytreestore to read it"
        )
    return info


def _repair(engine: Backend, schema: TreeSchema, commit: Commit) -> None:
    """Trims columns that a crashed writer grew past the commit back to the committed length."""
    keys = [c.key for c in schema.columns]
    shapes = engine.column_shapes(keys)
    for c, shape in zip(schema.columns, shapes):
        if tuple(shape[1:]) != c.shape:
            raise CorruptStoreError(
                f"column {c.path} has shape {shape} on disk, expected (records, "
                f"{', '.join(map(str, c.shape))}) per the schema"
            )
        if shape[0] < commit.records:
            raise CorruptStoreError(
                f"column {c.path} holds {shape[0]} records but {commit.records} are committed"
            )
    grown = [k for k, shape in zip(keys, shapes) if shape[0] != commit.records]
    if grown:
        engine.resize(grown, commit.records)


def _clear_for_create(engine: Backend, location: Location, overwrite: bool) -> None:
    if engine.is_empty():
        return
    is_store = (
        engine.read_bytes(ROOT_KEY) is not None
        or engine.read_bytes(".pytreestore/commit.json") is not None
    )
    if not overwrite:
        raise StoreExistsError(
            f"{location} already holds "
            + ("a store; pass overwrite=True to replace it" if is_store else "other data")
        )
    if not is_store:
        raise StoreExistsError(
            f"{location} holds data that is not a pytreestore store; refusing to delete it. "
            "Choose an empty or new location."
        )
    WriterLock.acquire(location).release()
    engine.delete_all()


def _group_keys(schema: TreeSchema) -> list[str]:
    groups: set[str] = set()
    for c in schema.columns:
        parts = c.key.split("/")
        groups.update("/".join(parts[:i]) + "/" + ROOT_KEY for i in range(1, len(parts)))
    return sorted(groups)


def _group_json(attributes: dict[str, Any]) -> bytes:
    return json.dumps(
        {"zarr_format": 3, "node_type": "group", "attributes": attributes}, indent=1
    ).encode()


__all__ = ["TreeStore", "create", "open"]
