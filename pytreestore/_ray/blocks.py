"""A store's records in Ray blocks, both ways: the one place that tells a fixed store's blocks
from a ragged or optional store's (:func:`blocks_of`).

* **Fixed.** A block's rows are one numpy batch (``to_batch_format("numpy")``), appended as
  stacked leaves; a range of records is read as stacked leaves (``store.load(index)``), one
  dense column per leaf.
* **Ragged or optional.** A block's rows are read exactly from its Arrow form (a null stays
  None, where Ray's numpy form would make it NaN) and appended as records; a range is read
  flat (``store.load(index, ragged="segments")``) and each leaf's values cut into records
  (:mod:`pytreestore._ray.nesting`).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ray-blocks", {"x": np.int32(0)})
    >>> s.extend({"x": np.int32(i)} for i in range(3))
    >>> found = blocks_of(s.schema).read(s, slice(1, 3), None)
    >>> found["['x']"].values.tolist()
    [1, 2]
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from pytreestore._format.schema import TreeSchema
from pytreestore._ray.columns import check_columns
from pytreestore._ray.nesting import LeafColumn, dense_columns, leaf_columns
from pytreestore._tree import leaf_columns as _rows


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


class FixedBlocks:
    """A fixed store's blocks: numpy batches of stacked leaves."""

    def records(self, schema: TreeSchema, rows: Any, names: list[str], path: str) -> Any:
        data = rows.to_batch_format("numpy")
        check_columns(names, data, path)
        return schema.unflatten([data[name] for name in names])

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


FIXED_BLOCKS = FixedBlocks()
TABLE_BLOCKS = TableBlocks()


def blocks_of(schema: TreeSchema) -> Blocks:
    """The Ray blocks of a store of ``schema`` (module docstring)."""
    return FIXED_BLOCKS if schema.ragged is None else TABLE_BLOCKS  # Ray blocks: numpy or Arrow


__all__ = ["FIXED_BLOCKS", "TABLE_BLOCKS", "Blocks", "FixedBlocks", "TableBlocks", "blocks_of"]
