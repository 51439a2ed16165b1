"""Writing a store from Ray Data: ``ds.write_datasink(TreeStoreDatasink(path))``.

A two-phase commit on an existing store. The driver opens the store for appending when the
write starts (:meth:`TreeStoreDatasink.on_write_start`), holding its writer lock for the whole
write; each write task turns its blocks into batches of the store's schema and writes each as
a fragment (:func:`pytreestore.write_fragment`, uncommitted, no lock); the driver commits
every task's fragments in task order, in one atomic commit, once all tasks are done
(:meth:`~TreeStoreDatasink.on_write_complete`). A write that fails commits nothing: readers
never see any of its rows, and ``store.vacuum()`` removes the fragments its tasks wrote.

**Rows to leaves.** Each leaf of the store's records is one Ray column, named by the leaf's
keypath in JAX's simple form (``jax.tree_util.keystr(path, simple=True, separator=".")``):
``{"x": ..., "meta": {"lr": ...}}`` reads columns ``x`` and ``meta.lr``, a dataclass
``Params(w, b)`` reads ``w`` and ``b``, a list ``[a, b]`` reads ``0`` and ``1``, and a store
of bare arrays reads ``item`` (the column ``ray.data.from_items`` makes of non-dict items).
``columns=`` renames any of them: ``{"['meta']['lr']": "learning_rate"}``, keypaths as in
``store.schema.paths``. A column holds one leaf per row: a scalar, or a fixed-shape array
(Ray's tensor columns), cast to the column's dtype by the store's rule (a value that does not
fit is refused). Every leaf needs its column and every column its leaf; select or rename
columns first (``ds.select_columns``, ``ds.rename_columns``).

**Ragged and optional stores.** Still one column per leaf, named the same way with the
``[*]`` of ragged lists left out (``.p[*].x`` reads ``p.x``). A row holds the leaf's value in
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
    >>> store = pytreestore.create("/tmp/doc-ray-store", {"x": np.float32(0), "m": {"lr": 0.0}}, overwrite=True)
    >>> column_names(store.schema)
    ['m.lr', 'x']
    >>> sink = TreeStoreDatasink("/tmp/doc-ray-store")  # ds.write_datasink(sink) appends ds
    >>> store.close()
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

import pytreestore
from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._tree import leaf_columns as _columns
from pytreestore.errors import (
    ArgumentTypeError,
    OptionalDependencyError,
    SchemaMismatchError,
    UnknownColumnError,
)

try:
    from ray.data import Datasink
    from ray.data.block import BlockAccessor
except ImportError as err:  # the ray extra is not installed
    raise OptionalDependencyError(
        "pytreestore.ray needs Ray Data, which is not installed; install it with "
        "pip install 'pytreestore[ray]' (or pip install 'ray[data]')"
    ) from err

TaskResult = dict[str, Any]  # {"task": task_idx, "fragments": [Fragment JSON, ...]}


def column_names(schema: TreeSchema, columns: Mapping[str, str] | None = None) -> list[str]:
    """The Ray column of each of the store's columns, in column order (module docstring).

    Raises:
        UnknownColumnError: ``columns`` names a keypath the store has no column at.
        SchemaMismatchError: two leaves would read the same Ray column.
    """
    names = _default_names(schema)
    paths = schema.paths
    for keypath, name in (columns or {}).items():
        if keypath not in paths:
            raise UnknownColumnError(
                f"columns= names {keypath!r}, which is no column of the store; its columns are "
                f"{', '.join(paths)}"
            )
        if not isinstance(name, str):
            raise ArgumentTypeError(
                f"columns= maps keypaths to Ray column names (str), got {name!r}"
            )
        names[paths.index(keypath)] = name
    seen: dict[str, str] = {}
    for path, name in zip(paths, names):
        if name in seen:
            raise SchemaMismatchError(
                f"the leaves at {seen[name]} and {path} would both read the Ray column "
                f"{name!r}; give one of them its own column with columns={{{path!r}: 'name'}}"
            )
        seen[name] = path
    return names


def _default_names(schema: TreeSchema) -> list[str]:
    """Each leaf's column by the default rule (module docstring), from its keypath."""
    return _columns.column_names(schema)


def check_columns(
    names: list[str], got: Iterable[str], path: str, pending: Iterable[str] = ()
) -> None:
    """Refuses a block (or a dataset schema) whose columns are not exactly ``names``
    (``pending``: a ragged store's structures still unknown, named in the message).

    Raises:
        SchemaMismatchError: columns are missing or left over; the message lists them.
    """
    got = list(got)
    missing = [n for n in names if n not in got]
    extra = [n for n in got if n not in names]
    if not missing and not extra:
        return
    problems = []
    if missing:
        problems.append(f"missing the columns {missing}")
    if extra:
        problems.append(f"with columns no leaf reads: {extra} (drop them: ds.drop_columns)")
    pending = list(pending)
    if extra and pending:
        problems.append(
            f"the store has not learnt the structures at {pending} yet (no record showed an "
            "element or a subtree there), so no column reads them: append one record that "
            "shows them first (store.append)"
        )
    raise SchemaMismatchError(
        f"the dataset does not match store {path}: {'; '.join(problems)}. The store's leaves "
        f"read the Ray columns {names} (rename with ds.rename_columns, or map keypaths to "
        "columns with TreeStoreDatasink(..., columns={keypath: column}))"
    )


def _records(schema: TreeSchema, rows: Any, names: list[str], path: str) -> Any:
    """A block's rows as a batch of the store's structure (a fixed store), or as records (a
    ragged store: each row's values read exactly from the block's Arrow form, where a null
    stays None; Ray's numpy form would make it NaN)."""
    if schema.ragged is None:  # Ray blocks: a fixed store's rows as one numpy batch
        data = rows.to_batch_format("numpy")
        check_columns(names, data, path)
        return schema.unflatten([data[name] for name in names])
    table = rows.to_arrow()
    check_columns(names, table.column_names, path, schema.pending)
    values = {p: table.column(n).to_pylist() for p, n in zip(schema.paths, names)}
    dtypes = {p: _element_dtype(table.column(n).type) for p, n in zip(schema.paths, names)}
    return _columns.records_from_columns(schema, values, dtypes)


def _element_dtype(arrow_type: Any) -> Any:
    """The numpy dtype of the numbers in an Arrow column of (nested lists of) numbers, which
    ``to_pylist`` makes Python numbers; None for any other column (tensors come back as
    arrays of their own dtype)."""
    import pyarrow as pa

    while (
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    ):
        arrow_type = arrow_type.value_type
    if pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type):
        return np.dtype(arrow_type.to_pandas_dtype())
    if pa.types.is_boolean(arrow_type):
        return np.dtype(bool)
    return None


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
        location = Location.parse(path, storage_options)
        if location.kind == "memory":
            raise pytreestore.errors.BadLocationError(
                f"{path} is an in-memory store, which Ray's workers (other processes) cannot "
                "write to; give the datasink a local path or an s3:// or gs:// URL"
            )
        # the workers run elsewhere (another working directory): a local path, made absolute
        self.path = os.path.abspath(path) if location.kind == "file" else os.fspath(path)
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
        fragments = []
        for block in blocks:
            rows = BlockAccessor.for_block(block)
            if rows.num_rows() == 0:
                continue
            data = _records(schema, rows, names, self.path)
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


__all__ = ["TreeStoreDatasink", "check_columns", "column_names"]
