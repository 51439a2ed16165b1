"""A store's records in Ray blocks, both ways, and the names Ray workers see.

The Ray column of each leaf, the same for the datasink and the datasource.

Each leaf of the store's records is one Ray column, named by the leaf's keypath in JAX's
simple form (``jax.tree_util.keystr(path, simple=True, separator=".")``) with the ``[*]`` of
ragged lists left out: ``{"x": ..., "meta": {"lr": ...}}`` reads columns ``x`` and
``meta.lr``, a dataclass ``Params(w, b)`` reads ``w`` and ``b``, a list ``[a, b]`` reads ``0``
and ``1``, ``.p[*].x`` reads ``p.x``, and a store of bare arrays reads ``item`` (the column
``ray.data.from_items`` makes of non-dict items). The datasink's ``columns=`` renames any of
them: ``{"['meta']['lr']": "learning_rate"}``, keypaths as in ``store.schema.paths``.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-ray-columns", {"x": np.float32(0), "m": {"lr": 0.0}})
    >>> column_names(store.schema), column_names(store.schema, {"['m']['lr']": "lr"})
    (['m.lr', 'x'], ['lr', 'x'])

Where Ray's workers find a store: a path every worker reaches, the same in every process.

Example:
    >>> import os
    >>> worker_path("runs/a.store", None, "read") == os.path.abspath("runs/a.store")
    True
    >>> worker_path("s3://bucket/runs/a", {"endpoint": "http://127.0.0.1:9000"}, "read")
    's3://bucket/runs/a'

A store's records in Ray blocks, both ways: the one place that tells a fixed store's blocks
from a ragged or optional store's (:func:`blocks_of`).

* **Fixed.** A block's rows are one numpy batch (``to_batch_format("numpy")``), appended as
  stacked leaves; a range of records is read as stacked leaves (``store.load(index)``), one
  dense column per leaf.
* **Ragged or optional.** A block's rows are read exactly from its Arrow form (a null stays
  None, where Ray's numpy form would make it NaN) and appended as records; a range is read
  flat (``store.load(index, ragged="segments")``) and each leaf's values cut into records
  (:mod:`pytreestore._ray.arrow`).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ray-blocks", {"x": np.int32(0)})
    >>> s.extend({"x": np.int32(i)} for i in range(3))
    >>> found = blocks_of(s.schema).read(s, slice(1, 3), None)
    >>> found["['x']"].values.tolist()
    [1, 2]
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import jax
import numpy as np

from pytreestore._format.schema import TreeSchema
from pytreestore._location import Location
from pytreestore._ray.arrow import LeafColumn, dense_columns, leaf_columns
from pytreestore._tree import flatten as _rows
from pytreestore.errors import (
    ArgumentTypeError,
    BadLocationError,
    SchemaMismatchError,
    UnknownColumnError,
)


def column_names(schema: TreeSchema, columns: Mapping[str, str] | None = None) -> list[str]:
    """The Ray column of each of the store's columns, in column order (module docstring).

    Raises:
        UnknownColumnError: ``columns`` names a keypath the store has no column at.
        SchemaMismatchError: two leaves would read the same Ray column.
    """
    names = _rows.column_names(schema)
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


def worker_path(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None, verb: str
) -> str:
    """``path`` as Ray's workers (other processes, another working directory) open it: a
    local path made absolute, an ``s3://`` or ``gs://`` URL as it is.

    Raises:
        BadLocationError: ``path`` is a ``memory://`` store, which no worker can reach.
    """
    location = Location.parse(path, storage_options)
    if location.kind == "memory":
        raise BadLocationError(
            f"{path} is an in-memory store, which Ray's workers (other processes) cannot "
            f"{verb}; give a local path or an s3:// or gs:// URL"
        )
    return os.path.abspath(path) if location.kind == "file" else os.fspath(path)


class Blocks(Protocol):
    """Records to and from Ray blocks, for one kind of store."""

    def records(self, schema: TreeSchema, rows: Any, names: list[str], path: str) -> Any:
        """The records of a block (a Ray ``BlockAccessor``) whose columns are ``names``, as
        ``extend_batch`` (a fixed store) or ``extend`` (a ragged one) takes them.

        Raises:
            SchemaMismatchError: the block's columns are not ``names``.
        """
        ...

    def read(self, store: Any, index: slice, columns: Any) -> dict[str, LeafColumn]:
        """Each loaded leaf's column of records ``index`` of ``store`` (``columns``: as
        ``store.load`` takes them), by keypath in column order."""
        ...

    def joined(self, parts: list[Any]) -> Any:
        """The records of several blocks (each as :meth:`records` gave them) as one piece,
        in order: what one fragment holds."""
        ...


class FixedBlocks:
    """A fixed store's blocks: numpy batches of stacked leaves."""

    def records(self, schema: TreeSchema, rows: Any, names: list[str], path: str) -> Any:
        data = rows.to_batch_format("numpy")
        check_columns(names, data, path)
        return schema.unflatten([data[name] for name in names])

    def joined(self, parts: list[Any]) -> Any:
        if len(parts) == 1:
            return parts[0]
        return jax.tree.map(lambda *leaves: np.concatenate(leaves), *parts)

    def read(self, store: Any, index: slice, columns: Any) -> dict[str, LeafColumn]:
        schema = store.schema
        batch = store.load(index, columns=columns, as_numpy=True)
        return dense_columns(
            schema.paths, schema.column_leaves(schema.treedef.flatten_up_to(batch))
        )


class TableBlocks:
    """A ragged or optional store's blocks: records from Arrow rows, records read flat."""

    def records(self, schema: TreeSchema, rows: Any, names: list[str], path: str) -> Any:
        table = rows.to_arrow()
        check_columns(names, table.column_names, path, schema.pending)
        values = {p: table.column(n).to_pylist() for p, n in zip(schema.paths, names)}
        dtypes = {p: _element_dtype(table.column(n).type) for p, n in zip(schema.paths, names)}
        return _rows.records_from_columns(schema, values, dtypes)

    def joined(self, parts: list[Any]) -> Any:
        return [record for part in parts for record in part]

    def read(self, store: Any, index: slice, columns: Any) -> dict[str, LeafColumn]:
        values, segments = store.load(index, columns=columns, as_numpy=True, ragged="segments")
        count = len(range(*index.indices(len(store))))
        return leaf_columns(store.schema, values, segments, count)


def _element_dtype(arrow_type: Any) -> Any:
    """The numpy dtype of the numbers in an Arrow column of (nested lists of) numbers, which
    ``to_pylist`` makes Python numbers; None for any other column (tensors and Python
    objects come back as arrays of their own dtype)."""
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


def example_of(rows: Any, path: str) -> dict[str, Any]:
    """The example record of a store made from a Ray block (a ``BlockAccessor``): its first
    row, as nested dicts by the dots of the column names (``meta.lr`` is
    ``{"meta": {"lr": ...}}``, a column without dots a top-level leaf), each value a numpy
    scalar or array of its column's dtype.

    Raises:
        SchemaMismatchError: a column holds lists of varying length or None (a ragged or
            optional store, which needs declarations), or two columns nest into one leaf.

    Example:
        >>> import pyarrow as pa
        >>> from ray.data.block import BlockAccessor
        >>> block = BlockAccessor.for_block(pa.table({"x": [1.5, 2.5], "m.lr": [2, 3]}))
        >>> example_of(block, "a.store")
        {'m': {'lr': np.int64(2)}, 'x': np.float64(1.5)}
    """
    data = rows.to_batch_format("numpy")
    record: dict[str, Any] = {}
    for name in sorted(data):
        column = np.asarray(data[name])
        if column.dtype == object:
            raise SchemaMismatchError(
                f"the Ray column {name!r} holds lists of varying length or None, so store "
                f"{path} cannot be made from the rows alone: create it first (with ragged= "
                "or optional=), or give TreeStoreDatasink(like=example, "
                "create_options={'ragged': [...]}) to create it"
            )
        _put(record, name.split("."), column[0], name, path)
    return record


def _put(record: dict[str, Any], keys: list[str], value: Any, name: str, path: str) -> None:
    node = record
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            break
    else:
        if keys[-1] not in node:
            node[keys[-1]] = value
            return
    raise SchemaMismatchError(
        f"the Ray column {name!r} nests into another column's leaf, so store {path} cannot "
        "be made from the rows alone: create it first, or give TreeStoreDatasink(like=example)"
    )


FIXED_BLOCKS = FixedBlocks()


TABLE_BLOCKS = TableBlocks()


def blocks_of(schema: TreeSchema) -> Blocks:
    """The Ray blocks of a store of ``schema`` (module docstring)."""
    return FIXED_BLOCKS if schema.ragged is None else TABLE_BLOCKS  # Ray blocks: numpy or Arrow


__all__ = [
    "FIXED_BLOCKS",
    "TABLE_BLOCKS",
    "Blocks",
    "FixedBlocks",
    "TableBlocks",
    "blocks_of",
    "check_columns",
    "column_names",
    "example_of",
    "worker_path",
]
