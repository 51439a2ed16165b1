"""A block of Ray rows from each leaf's column of values (:mod:`pytreestore._ray.nesting`):
the Arrow table a read task gives Ray.

* a ``"dense"`` column: an Arrow array of the leaf's dtype for a scalar leaf, Ray's tensor
  column (``ArrowTensorArray``) for an array leaf;
* a ``"ragged"`` column: Ray's variable-shaped tensor column
  (``ArrowVariableShapedTensorArray``): one array per row, of the leaf's dtype, whose leading
  axis varies;
* a ``"nested"`` column: Ray's Python-object column (``ArrowPythonObjectArray``): per row, a
  list per ragged list of numpy arrays or scalars of the leaf's dtype, ``None`` where an
  optional subtree is absent (Arrow's numbers would turn a None into NaN in Ray's numpy
  batches).

Each is what the datasink reads back exactly, straight or after ``map_batches``.

Example:
    >>> import numpy as np
    >>> from pytreestore._ray.nesting import LeafColumn
    >>> t = block({"x": LeafColumn("dense", np.arange(2, dtype=np.int16)),
    ...            "p.y": LeafColumn("ragged", np.ones(2, np.float32), np.array([2, 0]))})
    >>> t.column_names, str(t.schema.field("x").type), t.column("p.y").to_pylist()[1].dtype
    (['x', 'p.y'], 'int16', dtype('float32'))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
from ray.data.extensions import (
    ArrowPythonObjectArray,
    ArrowTensorArray,
    ArrowVariableShapedTensorType,
)

from pytreestore._format.schema import TreeSchema
from pytreestore._ray.nesting import DENSE, RAGGED, LeafColumn
from pytreestore.errors import UnsupportedDtypeError


def block(columns: Mapping[str, LeafColumn]) -> pa.Table:
    """The Arrow table of ``columns`` (Ray column name -> the leaf's values), in that order."""
    return pa.table({name: _array(column) for name, column in columns.items()})


def _array(column: LeafColumn) -> Any:
    values = column.values
    if column.form == DENSE:
        return pa.array(values) if values.ndim == 1 else ArrowTensorArray.from_numpy(values)
    if column.form == RAGGED:
        assert column.counts is not None
        return variable_shaped(values, column.counts)
    return ArrowPythonObjectArray.from_objects(values)


def variable_shaped(rows: np.ndarray, counts: np.ndarray) -> Any:
    """Ray's variable-shaped tensor column whose row ``i`` is the next ``counts[i]`` of
    ``rows`` (``(elements, *shape)``): the storage ``ArrowVariableShapedTensorArray.from_numpy``
    builds (a struct of the raveled values, ``large_list``, and each row's shape,
    ``list<int64>``), built from the flat rows at once instead of row by row."""
    inner = rows.shape[1:]
    ends = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts * int(np.prod(inner)), out=ends[1:])
    flat = pa.array(np.ascontiguousarray(rows).reshape(-1))
    data = pa.LargeListArray.from_arrays(pa.array(ends), flat)
    shapes = np.empty((len(counts), 1 + len(inner)), np.int64)
    shapes[:, 0] = counts
    shapes[:, 1:] = inner
    starts = pa.array(np.arange(len(counts) + 1, dtype=np.int32) * shapes.shape[1])
    shape = pa.ListArray.from_arrays(starts, pa.array(shapes.reshape(-1)))
    storage = pa.StructArray.from_arrays([data, shape], ["data", "shape"])
    return ArrowVariableShapedTensorType(flat.type, shapes.shape[1]).wrap_array(storage)


def check_dtypes(schema: TreeSchema, paths: Iterable[str]) -> None:
    """Refuses leaves (at keypaths ``paths``) whose dtype no Arrow column holds.

    Raises:
        UnsupportedDtypeError: naming every such leaf and its dtype.
    """
    wanted = set(paths)
    refused = [
        f"{c.path} ({np.dtype(c.dtype).name})"
        for c in schema.columns
        if c.path in wanted and not _arrow_holds(np.dtype(c.dtype))
    ]
    if refused:
        raise UnsupportedDtypeError(
            f"Ray's Arrow columns cannot hold the dtypes of the leaves at {', '.join(refused)} "
            "(Arrow has no bfloat16, float8, int4 or complex type); leave them out with "
            "read_store(..., columns=[...]) naming the other columns"
        )


def _arrow_holds(dtype: np.dtype) -> bool:
    try:
        pa.from_numpy_dtype(dtype)
    except (pa.ArrowNotImplementedError, NotImplementedError, TypeError):
        return False
    return dtype.kind in "biuf"


__all__ = ["block", "check_dtypes"]
