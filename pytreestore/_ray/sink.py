"""Writing a store from Ray Data: ``ds.write_datasink(TreeStoreDatasink(path))``.

A two-phase commit. The driver opens the store for appending when the write starts
(:meth:`TreeStoreDatasink.on_write_start`), holding its writer lock for the whole write; each
write task turns its blocks into records of the store's schema and writes them as one
fragment (:func:`pytreestore.write_fragment`, uncommitted, no lock); the driver commits every
task's fragment in task order, in one atomic commit, once all tasks are done
(:meth:`~TreeStoreDatasink.on_write_complete`). A write that fails commits nothing: readers
never see any of its rows, and ``store.vacuum()`` removes the fragments its tasks wrote.

**A new store.** Where no store is at ``path`` when the write starts, the first write task to
run creates it from its first block, as ``store.map(fn, out=path)`` does from its first
result: from ``like=`` when given, else from the block's first row (nested dicts by the dots
of the column names), with ``backend=``, ``storage_options=`` and ``create_options=``
(:func:`pytreestore.create`'s other options: ``chunk_records``, ``codec``, ``ragged``,
``optional``, ...). The other tasks wait for it and open it; the driver opens it to commit. A
ragged or optional store cannot be guessed from rows: give ``like=`` and its declarations in
``create_options``. Nothing is created by a dataset without rows.

**Blocks to fragments.** Ray bundles the dataset's blocks into write tasks of at least
:data:`BYTES_PER_WRITE` (Ray's in-memory size; the datasink's ``min_bytes_per_write``), and
each task writes all its blocks as one fragment. So Ray's default of many small blocks (200
for ``from_items``) costs about what 2 blocks cost, where a fragment per block did not (12-20 s
against 0.3 s for 1,000 rows); a large dataset still spreads over many tasks, each a fragment
of at least that size.

**Rows to leaves.** Each leaf of the store's records is one Ray column, named as
:mod:`pytreestore._ray.blocks` says (``columns=`` renames any of them). A column holds one
leaf per row: a scalar, or a fixed-shape array (Ray's tensor columns), cast to the column's
dtype by the store's rule (a value that does not fit is refused). Every leaf needs its column
and every column its leaf; select or rename columns first (``ds.select_columns``,
``ds.rename_columns``).

**Ragged and optional stores.** Still one column per leaf. A row holds the leaf's value in
its record: below a ragged list, the list of the leaf's values in the list's elements (a
Python list, or an array whose leading axis is the list's: Ray's variable-shaped tensor
columns), nested once more per ragged list above; ``None`` (a null) in every column of an
optional subtree that is absent. Each row is read exactly from the block's Arrow form (a
null stays None, where Ray's numpy form would make it NaN) and appended as a record, with
the checks of ``store.extend``. A structure the store has not learnt yet
(``store.schema.pending``) has no column: append one record showing it first.

**Order.** Records land in the order of the write tasks (Ray's ``task_idx``), each task's
blocks in order. Ray Data keeps the dataset's order only with
``ray.data.DataContext.get_current().execution_options.preserve_order = True``.

**Where.** Every worker writes under the store's path: a local path on one machine, or a
path every node reaches (a shared filesystem, ``s3://``, ``gs://``); not ``memory://``.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("/tmp/doc-ray-store", {"x": np.float32(0)}, overwrite=True)
    >>> sink = TreeStoreDatasink("/tmp/doc-ray-store")  # ds.write_datasink(sink) appends ds
    >>> sink.path
    '/tmp/doc-ray-store'
    >>> store.close()
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ray.data import Datasink
from ray.data.block import BlockAccessor

import pytreestore
from pytreestore._ray.blocks import blocks_of, column_names, example_of, worker_path
from pytreestore.errors import (
    ArgumentTypeError,
    NotAStoreError,
    StoreExistsError,
    StoreLockedError,
    StoreNotFoundError,
)

TaskResult = dict[str, Any]  # {"task": task_idx, "fragments": [Fragment JSON, ...]}

#: the least Ray bundles into one write task (its in-memory size), each task one fragment
BYTES_PER_WRITE = 64 * 2**20
#: how long a write task waits for the task creating a new store to finish it
CREATE_WAIT_S = 120.0


class TreeStoreDatasink(Datasink[TaskResult]):
    """A Ray Data datasink appending a dataset's rows to a store, which it creates if absent.

    ``ds.write_datasink(TreeStoreDatasink(path))`` appends every row of ``ds`` as a record,
    all or none (see the module docstring for how columns map to leaves, in a ragged or
    optional store too, and the order).

    Args:
        path: the store's location, on storage every Ray worker reaches; where no store is
            there, the write creates one from its first block (module docstring).
        like: an example record whose classes to use (as in :func:`pytreestore.open`), for
            classes the workers cannot import by name; and the example a new store is
            created from.
        columns: keypath -> Ray column name, for leaves whose column is not named by the
            default rule.
        backend: the store's storage engine, as in :func:`pytreestore.open`.
        storage_options: for ``s3://`` and ``gs://`` stores, as in :func:`pytreestore.open`.
        create_options: for a new store, :func:`pytreestore.create`'s other keyword arguments
            (``chunk_records``, ``codec``, ``ragged``, ``optional``, ...).

    Raises:
        BadLocationError: ``path`` is a ``memory://`` store, which workers cannot reach.
        ArgumentTypeError: ``create_options`` is not a mapping of option names.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        like: Any = None,
        columns: Mapping[str, str] | None = None,
        backend: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        create_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = worker_path(path, storage_options, "write to")
        self._like = like
        self._columns = dict(columns) if columns else None
        self._options: dict[str, Any] = {"backend": backend, "storage_options": storage_options}
        self._create = _create_options(create_options, backend, storage_options)
        self._store: pytreestore.TreeStore | None = None  # the driver's writer, while writing
        self._absent = False  # no store at path when the write started: a task creates it

    @property
    def min_bytes_per_write(self) -> int:
        """Ray bundles blocks into write tasks of at least this many bytes: one fragment each."""
        return BYTES_PER_WRITE

    def __getstate__(self) -> dict[str, Any]:
        """What a write task receives: everything but the driver's open store."""
        return {**self.__dict__, "_store": None}

    def _open(self, mode: str) -> pytreestore.TreeStore:
        return pytreestore.open(self.path, mode, like=self._like, **self._options)  # type: ignore[arg-type]

    def on_write_start(self, schema: Any = None) -> None:
        """On the driver, before any task: opens the store for appending (its writer lock is
        held until the write completes or fails) and checks ``columns=``. (Each task checks
        its blocks' columns: the schema Ray passes here is that of the input of the write's
        fused operators, not of the rows the tasks write.)

        Where no store is at ``path``, nothing is opened: the first task creates it.

        Raises:
            SchemaMismatchError: two leaves would read one column.
            UnknownColumnError: ``columns=`` names no column of the store.
        """
        try:
            store = self._open("a")
        except StoreNotFoundError:
            self._absent = True
            return
        self._absent = False
        try:
            column_names(store.schema, self._columns)  # a bad columns= fails before any task
        except BaseException:
            store.close()
            raise
        self._store = store

    def write(self, blocks: Iterable[Any], ctx: Any) -> TaskResult:
        """In a write task: the task's non-empty blocks become one fragment of the store
        (creating the store first, from the first block, where the write found none).

        Raises:
            SchemaMismatchError: a block's columns are not the store's leaves' columns, or a
                value does not fit its column; the task writes nothing, and the whole write
                commits nothing.

        Returns:
            ``{"task": ctx.task_idx, "fragments": [JSON of the Fragment]}`` (none for a task
            without rows).
        """
        rows = [r for r in map(BlockAccessor.for_block, blocks) if r.num_rows() > 0]
        if not rows:
            return {"task": int(ctx.task_idx), "fragments": []}
        schema = self._schema(rows[0])
        names = column_names(schema, self._columns)
        kind = blocks_of(schema)
        data = kind.joined([kind.records(schema, r, names, self.path) for r in rows])
        fragment = pytreestore.write_fragment(self.path, data, like=self._like, **self._options)
        return {"task": int(ctx.task_idx), "fragments": [fragment.to_json()]}

    def _schema(self, first: Any) -> Any:
        """The store's schema; where the write found no store, the store is created from
        block ``first`` by the first task to try, and the others wait for it."""
        if self._absent:
            like = self._like if self._like is not None else example_of(first, self.path)
            with contextlib.suppress(StoreExistsError, StoreLockedError):  # another task's
                pytreestore.create(self.path, like, **self._create).close()
        deadline = time.monotonic() + CREATE_WAIT_S
        while True:
            try:
                with self._open("r") as reader:
                    return reader.schema
            except (StoreNotFoundError, NotAStoreError):
                if not self._absent or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def on_write_complete(self, write_result: Any) -> None:
        """On the driver, once every task succeeded: commits all fragments in task order,
        in one atomic commit, and closes the store (opened now where a task created it)."""
        if self._absent:
            self._store = self._new_store()
        store = self._store
        if store is None:
            raise pytreestore.errors.ClosedStoreError(
                f"TreeStoreDatasink for {self.path} completed a write it never started "
                "(on_write_start was not called); use it through ds.write_datasink(...)"
            )
        results = sorted(write_result.write_returns, key=lambda r: r["task"])
        fragments = [pytreestore.Fragment.from_json(t) for r in results for t in r["fragments"]]
        try:
            if fragments:
                store.commit_fragments(fragments)
        finally:
            self._store = None
            store.close()

    def _new_store(self) -> pytreestore.TreeStore | None:
        """The store a write task created, opened for appending; an error where no task
        had a row to create it from."""
        try:
            return self._open("a")
        except StoreNotFoundError as err:
            raise StoreNotFoundError(
                f"TreeStoreDatasink found no store at {self.path} and the dataset had no row "
                "to create it from; create it first (pytreestore.create(path, example))"
            ) from err

    def on_write_failed(self, error: Exception) -> None:
        """On the driver, after a task failed (or the commit did): closes the store with
        nothing committed; its tasks' fragments are left for ``vacuum()``."""
        store, self._store = self._store, None
        if store is not None:
            store.close()


def _create_options(
    given: Mapping[str, Any] | None, backend: str | None, storage: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The keyword arguments of :func:`pytreestore.create` for a new store: ``given`` and the
    sink's ``backend`` and ``storage_options``.

    Raises:
        ArgumentTypeError: ``given`` is not a mapping of names, or names ``like``,
            ``backend``, ``storage_options`` or ``overwrite`` (the sink's own, or unsafe).
    """
    if given is not None and not isinstance(given, Mapping):
        raise ArgumentTypeError(
            f"create_options= takes a dict of pytreestore.create's keyword arguments, got "
            f"{type(given).__name__}"
        )
    given = dict(given or {})
    clash = sorted(set(given) & {"like", "backend", "storage_options", "overwrite", "path"})
    if clash:
        raise ArgumentTypeError(
            f"create_options= cannot set {clash}: give like=, backend= and storage_options= "
            "to TreeStoreDatasink itself (a write never overwrites a store)"
        )
    if backend is not None:
        given["backend"] = backend
    return {**given, "storage_options": storage}


__all__ = ["BYTES_PER_WRITE", "TaskResult", "TreeStoreDatasink"]
