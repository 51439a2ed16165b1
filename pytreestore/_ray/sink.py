"""Writing a store from Ray Data: ``ds.write_datasink(TreeStoreDatasink(path))``.

A two-phase commit on an existing store. The driver opens the store for appending when the
write starts (:meth:`TreeStoreDatasink.on_write_start`), holding its writer lock for the whole
write; each write task turns its blocks into batches of the store's schema and writes each as
a fragment (:func:`pytreestore.write_fragment`, uncommitted, no lock); the driver commits
every task's fragments in task order, in one atomic commit, once all tasks are done
(:meth:`~TreeStoreDatasink.on_write_complete`). A write that fails commits nothing: readers
never see any of its rows, and ``store.vacuum()`` removes the fragments its tasks wrote.

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

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ray.data import Datasink
from ray.data.block import BlockAccessor

import pytreestore
from pytreestore._ray.blocks import blocks_of, column_names, worker_path

TaskResult = dict[str, Any]  # {"task": task_idx, "fragments": [Fragment JSON, ...]}


class TreeStoreDatasink(Datasink[TaskResult]):
    """A Ray Data datasink appending a dataset's rows to an existing store.

    ``ds.write_datasink(TreeStoreDatasink(path))`` appends every row of ``ds`` as a record,
    all or none (see the module docstring for how columns map to leaves, in a ragged or
    optional store too, and the order).

    Args:
        path: the store's location; it must exist (``pytreestore.create(path, example)``),
            on storage every Ray worker reaches.
        like: an example record whose classes to use (as in :func:`pytreestore.open`), for
            classes the workers cannot import by name.
        columns: keypath -> Ray column name, for leaves whose column is not named by the
            default rule.
        backend: the store's storage engine, as in :func:`pytreestore.open`.
        storage_options: for ``s3://`` and ``gs://`` stores, as in :func:`pytreestore.open`.

    Raises:
        BadLocationError: ``path`` is a ``memory://`` store, which workers cannot reach.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        like: Any = None,
        columns: Mapping[str, str] | None = None,
        backend: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = worker_path(path, storage_options, "write to")
        self._like = like
        self._columns = dict(columns) if columns else None
        self._options: dict[str, Any] = {"backend": backend, "storage_options": storage_options}
        self._store: pytreestore.TreeStore | None = None  # the driver's writer, while writing

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

        Raises:
            SchemaMismatchError: two leaves would read one column.
            UnknownColumnError: ``columns=`` names no column of the store.
        """
        store = self._open("a")
        try:
            column_names(store.schema, self._columns)  # a bad columns= fails before any task
        except BaseException:
            store.close()
            raise
        self._store = store

    def write(self, blocks: Iterable[Any], ctx: Any) -> TaskResult:
        """In a write task: each non-empty block becomes one fragment of the store.

        Raises:
            SchemaMismatchError: a block's columns are not the store's leaves' columns, or a
                value does not fit its column; that block writes nothing, and the whole
                write commits nothing.

        Returns:
            ``{"task": ctx.task_idx, "fragments": [JSON of each Fragment]}``.
        """
        with self._open("r") as reader:
            schema = reader.schema
        names = column_names(schema, self._columns)
        kind = blocks_of(schema)
        fragments = []
        for block in blocks:
            rows = BlockAccessor.for_block(block)
            if rows.num_rows() == 0:
                continue
            data = kind.records(schema, rows, names, self.path)
            fragment = pytreestore.write_fragment(self.path, data, like=self._like, **self._options)
            fragments.append(fragment.to_json())
        return {"task": int(ctx.task_idx), "fragments": fragments}

    def on_write_complete(self, write_result: Any) -> None:
        """On the driver, once every task succeeded: commits all fragments in task order,
        in one atomic commit, and closes the store."""
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

    def on_write_failed(self, error: Exception) -> None:
        """On the driver, after a task failed (or the commit did): closes the store with
        nothing committed; its tasks' fragments are left for ``vacuum()``."""
        store, self._store = self._store, None
        if store is not None:
            store.close()


__all__ = ["TaskResult", "TreeStoreDatasink"]
