"""Reading a store into Ray Data: ``read_store(path)``, a dataset of one row per record.

**Planning, on the driver.** :class:`TreeStoreDatasource` opens the store read-only once, when
it is made: the version it reads is resolved there (the latest, or ``version=``), and every
read task opens the store at that version, so all tasks read one snapshot whatever a writer
commits meanwhile. ``columns=`` (as ``store.load`` takes it), the leaves' dtypes and the
version are checked there too, before any task runs.

**Read tasks.** The records are split on the store's chunk boundaries (``chunk_records`` of
the record table; a ragged store's axis tables follow their records): at most
``parallelism`` ranges of whole chunks, as even as chunks allow. Each task opens the store at
the pinned version, reads its range with one ``store.load`` (as numpy) and gives Ray one
block.

**Columns.** One per leaf loaded, named as the datasink names them
(:mod:`pytreestore._ray.blocks`), in column order, in the forms of
:mod:`pytreestore._ray.arrow`: a fixed leaf's tensor column, a ragged leaf's variable-shaped
tensor column, Python objects (lists, None) below two ragged axes or in an optional subtree.
So ``ds.write_datasink(TreeStoreDatasink(out))`` writes the records back exactly, straight or
after ``map_batches``.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("/tmp/doc-ray-source", {"x": np.int32(0)}, chunk_records=4,
    ...                        overwrite=True)
    >>> s.extend({"x": np.int32(i)} for i in range(10))
    >>> s.close()
    >>> source = TreeStoreDatasource("/tmp/doc-ray-source")  # ray.data.read_datasource(source)
    >>> source.version, source.columns, [t.metadata.num_rows for t in source.get_read_tasks(2)]
    (2, ['x'], [4, 6])
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import ray.data
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

import pytreestore
from pytreestore._format.schema import TreeSchema
from pytreestore._ray.arrow import block, check_dtypes
from pytreestore._ray.blocks import blocks_of, column_names, worker_path


@dataclasses.dataclass(frozen=True)
class _Reading:
    """What a read task needs to open the store at the pinned version and read it."""

    path: str
    version: int
    columns: Any
    like: Any
    options: Mapping[str, Any]

    def open(self) -> pytreestore.TreeStore:
        return pytreestore.open(
            self.path, "r", version=self.version, like=self.like, cache_bytes=0, **self.options
        )

    def read(self, start: int, stop: int) -> list[pa.Table]:
        """Records ``[start, stop)`` as one Arrow block (in a read task)."""
        with self.open() as store:
            leaves = blocks_of(store.schema).read(store, slice(start, stop), self.columns)
            names = dict(zip(store.schema.paths, column_names(store.schema)))
        return [block({names[p]: column for p, column in leaves.items()})]


def chunk_ranges(records: int, chunk: int, parallelism: int) -> list[tuple[int, int]]:
    """At most ``parallelism`` ranges of whole chunks (of ``chunk`` records) covering
    ``records`` records, as even as chunks allow; ``parallelism`` < 1: one per chunk.

    Example:
        >>> chunk_ranges(10, 4, 2), chunk_ranges(10, 4, 8), chunk_ranges(0, 4, 2)
        ([(0, 4), (4, 10)], [(0, 4), (4, 8), (8, 10)], [])
    """
    chunks = -(-records // chunk)
    tasks = chunks if parallelism < 1 else min(parallelism, chunks)
    bounds = [i * chunks // tasks for i in range(tasks + 1)] if tasks else []
    return [(a * chunk, min(b * chunk, records)) for a, b in itertools.pairwise(bounds)]


class TreeStoreDatasource(Datasource):
    """A Ray Data datasource reading a store's records, one row per record (module
    docstring): ``ray.data.read_datasource(TreeStoreDatasource(path))``, or
    :func:`read_store`.

    Args:
        path: the store's location, on storage every Ray worker reaches.
        columns: the columns to read, as ``store.load`` takes them (keypath strings; a
            node's keypath selects every column below it); default all.
        version: the version (a number from ``store.versions()``) or tag to read; default
            the latest, resolved now.
        like: an example record whose classes to use (as in :func:`pytreestore.open`).
        backend: the store's storage engine, as in :func:`pytreestore.open`.
        storage_options: for ``s3://`` and ``gs://`` stores, as in :func:`pytreestore.open`.

    Attributes:
        version: the version every read task reads.
        columns: the Ray column of each leaf read, in column order.

    Raises:
        StoreNotFoundError: no store at ``path``.
        VersionNotFoundError: the store keeps no such version or tag.
        UnknownColumnError: ``columns`` names no column of the store.
        UnsupportedDtypeError: a leaf read has a dtype no Arrow column holds (bfloat16,
            float8, int4, complex).
        BadLocationError: ``path`` is a ``memory://`` store.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        columns: Any = None,
        version: int | str | None = None,
        like: Any = None,
        backend: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        where = worker_path(path, storage_options, "read")
        options = {"backend": backend, "storage_options": storage_options}
        with pytreestore.open(where, "r", version=version, like=like, **options) as store:
            schema = store.schema
            self._reading = _Reading(where, store.version, columns, like, options)
            self._records, self._chunk = len(store), schema.chunk_records
            read = blocks_of(schema).read(store, slice(0, 0), columns)  # checks columns=
        check_dtypes(schema, read)
        names = dict(zip(schema.paths, column_names(schema)))
        self.version: int = self._reading.version
        self.columns: list[str] = [names[p] for p in read]
        self._record_bytes = _record_bytes(schema, read)

    def get_name(self) -> str:
        return "TreeStore"

    def estimate_inmemory_data_size(self) -> int | None:
        """The bytes of the records' leaves read, a ragged axis counted as one element."""
        return self._records * self._record_bytes

    def get_read_tasks(
        self,
        parallelism: int,
        per_task_row_limit: int | None = None,
        data_context: Any = None,
    ) -> list[ReadTask]:
        """One read task per range of whole chunks, at most ``parallelism`` of them."""
        tasks = []
        for start, stop in chunk_ranges(self._records, self._chunk, parallelism):
            size = (stop - start) * self._record_bytes
            meta = BlockMetadata(num_rows=stop - start, size_bytes=size, exec_stats=None)
            read = functools.partial(self._reading.read, start, stop)
            tasks.append(ReadTask(read, meta, per_task_row_limit=per_task_row_limit))
        return tasks


def _record_bytes(schema: TreeSchema, paths: Any) -> int:
    chosen = set(paths)
    return int(
        sum(
            np.dtype(c.dtype).itemsize * int(np.prod(c.shape))
            for c in schema.columns
            if c.path in chosen
        )
    )


def read_store(
    path: str | os.PathLike[str],
    *,
    columns: Any = None,
    version: int | str | None = None,
    like: Any = None,
    backend: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    override_num_blocks: int | None = None,
) -> ray.data.Dataset:
    """A Ray dataset of a store's records, one row per record, one column per leaf.

    The columns are those :class:`~pytreestore.ray.TreeStoreDatasink` reads, so
    ``read_store(a).map_batches(f).write_datasink(TreeStoreDatasink(b))`` writes ``f``'s rows
    into store ``b`` exactly. The version read is resolved now; each read task reads a range of
    whole chunks at that version (see :class:`TreeStoreDatasource` for the arguments and
    errors, all raised here, before any task runs).

    Args:
        path: the store's location, on storage every Ray worker reaches.
        columns: the columns to read, as ``store.load`` takes them; default all.
        version: the version or tag to read; default the latest.
        like: an example record whose classes to use.
        backend: the store's storage engine.
        storage_options: for ``s3://`` and ``gs://`` stores.
        override_num_blocks: the most read tasks (Ray's default: its own choice); a task
            reads at least one chunk.

    Example:
        >>> import numpy as np, pytreestore
        >>> s = pytreestore.create("/tmp/doc-read-store", {"x": np.int32(0), "p": [np.int8(0)]},
        ...                        ragged=["['p']"], overwrite=True)
        >>> s.extend({"x": np.int32(i), "p": [np.int8(i)] * i} for i in range(3))
        >>> s.close()
        >>> TreeStoreDatasource("/tmp/doc-read-store").columns  # read_store's columns
        ['p', 'x']

        On a Ray cluster (docs/scaling.md runs it):
        ``read_store("/tmp/doc-read-store").take(3)[2]`` is
        ``{'p': array([2, 2], dtype=int8), 'x': 2}``.
    """
    source = TreeStoreDatasource(
        path,
        columns=columns,
        version=version,
        like=like,
        backend=backend,
        storage_options=storage_options,
    )
    return ray.data.read_datasource(source, override_num_blocks=override_num_blocks)


__all__ = ["TreeStoreDatasource", "chunk_ranges", "read_store"]
