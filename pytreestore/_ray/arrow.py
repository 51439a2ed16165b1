"""A read of a range of records as Ray rows: each leaf's value per record, then an Arrow block.

Each leaf's value in each record, from a read of a range of records: the rows a Ray
dataset holds, one column per leaf (the form :mod:`pytreestore._tree.flatten` reads
back).

A leaf's column holds, for each record, the leaf's value in that record
(:class:`LeafColumn`, in one of three forms):

* ``"dense"``: a leaf outside every ragged list and optional subtree: the stacked leaves,
  ``(records, *shape)``, as a fixed store's ``load`` gives them;
* ``"ragged"``: a leaf with one ragged axis above its values (its own ragged leading axis, or
  one ragged list above it) and no optional subtree: one array per record, whose leading axis
  is that record's length there;
* ``"nested"``: anything deeper: per record, a list per ragged list (of arrays for the
  innermost axis), ``None`` where an optional subtree is absent.

A ragged store's reads come flat (``store.load(index, ragged="segments")``): each leaf's rows
along its table, and per ragged axis the parent row of each element. Rows of one parent are
consecutive, so each axis cuts its table's rows into one piece per parent row.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-ray-nesting", {"p": [np.int8(0)], "n": np.int8(0)},
    ...                        ragged=["['p']"])
    >>> s.extend([{"p": [np.int8(1), np.int8(2)], "n": np.int8(5)}, {"p": [], "n": np.int8(6)}])
    >>> values, segments = s.load(ragged="segments", as_numpy=True)
    >>> found = leaf_columns(s.schema, values, segments, 2)
    >>> found["['n']"].form, found["['n']"].values.tolist()
    ('dense', [5, 6])
    >>> found["['p'][*]"].form, [v.tolist() for v in found["['p'][*]"].per_record()]
    ('ragged', [[1, 2], []])

A block of Ray rows from each leaf's column of values (:mod:`pytreestore._ray.arrow`):
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
    >>> from pytreestore._ray.arrow import LeafColumn
    >>> t = block({"x": LeafColumn("dense", np.arange(2, dtype=np.int16)),
    ...            "p.y": LeafColumn("ragged", np.ones(2, np.float32), np.array([2, 0]))})
    >>> t.column_names, str(t.schema.field("x").type), t.column("p.y").to_pylist()[1].dtype
    (['x', 'p.y'], 'int16', dtype('float32'))
"""

from __future__ import annotations

import dataclasses
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
from pytreestore._read.tables import PRESENT
from pytreestore._tree.layout_nodes import (
    Fixed,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    visit,
)
from pytreestore.errors import UnsupportedDtypeError

DENSE, RAGGED, NESTED = "dense", "ragged", "nested"


_AXIS = "axis"  # a level: the rows of a ragged axis's table, cut per parent row


_PRESENT = "present"  # a level: an optional subtree, None in the rows where it is absent


@dataclasses.dataclass(frozen=True)
class LeafColumn:
    """One leaf's values, one per record (module docstring): ``values`` is an array
    ``(records, *shape)`` in the ``"dense"`` form; in the ``"ragged"`` form the rows of the
    leaf's table, ``(elements, *shape)``, of which record ``i`` holds the next
    ``counts[i]``; in the ``"nested"`` form a list of one value per record."""

    form: str
    values: Any
    counts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.values) if self.counts is None else len(self.counts)

    def per_record(self) -> list[Any]:
        """The values as a list of one value per record (a ragged column's arrays: views)."""
        if self.counts is None:
            return list(self.values)
        ends = np.cumsum(self.counts)
        return [self.values[e - n : e] for n, e in zip(self.counts.tolist(), ends.tolist())]


def dense_columns(paths: tuple[str, ...], leaves: list[Any]) -> dict[str, LeafColumn]:
    """A fixed store's stacked leaves (None: a column not loaded) by keypath."""
    return {p: LeafColumn(DENSE, v) for p, v in zip(paths, leaves) if v is not None}


def leaf_columns(
    schema: TreeSchema, values: Any, segments: Mapping[str, Any], count: int
) -> dict[str, LeafColumn]:
    """The column of each leaf loaded (by keypath, in column order) of ``count`` records read
    as ``(values, segments) = store.load(index, ragged="segments", as_numpy=True)``."""
    walk = _Walk(schema, segments, count)
    assert schema.layout is not None, schema
    walk.node(schema.layout.spec, values, ())
    return {p: walk.found[p] for p in schema.paths if p in walk.found}


class _Walk(Visitor):
    """The walk of a layout beside the values read, collecting each leaf's levels."""

    def __init__(self, schema: TreeSchema, segments: Mapping[str, Any], count: int) -> None:
        self.segments = segments
        self.parent_table = {a.path: a.table for a in schema.tables.axes}
        self.count = count
        self.found: dict[str, LeafColumn] = {}

    def node(self, spec: LayoutNode | None, value: Any, levels: tuple[Any, ...]) -> None:
        if value is not None:  # None: nothing loaded below
            visit(spec, self, value, levels)  # a pending structure, a Kept leaf: no column

    def leaf(self, node: Leaf, value: Any, levels: tuple[Any, ...]) -> None:
        if node.axis is not None:
            levels = (*levels, (_AXIS, node.axis.path))
        self.found[node.path] = self.column(value, levels)

    def ragged(self, node: RaggedList, value: Any, levels: tuple[Any, ...]) -> None:
        self.node(node.element, value, (*levels, (_AXIS, node.axis.path)))

    def optional(self, node: OptionalTree, value: Any, levels: tuple[Any, ...]) -> None:
        present = self.segments[PRESENT + node.path]
        self.node(node.inner, value, (*levels, (_PRESENT, present)))

    def fixed(self, node: Fixed, value: Any, levels: tuple[Any, ...]) -> None:
        for child, v in zip(node.children, node.treedef.flatten_up_to(value)):
            self.node(child, v, levels)

    def column(self, rows: np.ndarray, levels: tuple[Any, ...]) -> LeafColumn:
        """A leaf's rows (along its table) grouped up through its levels, innermost first."""
        if not levels:
            return LeafColumn(DENSE, rows)
        if len(levels) == 1 and levels[0][0] == _AXIS:
            return LeafColumn(RAGGED, rows, self.counts(levels[0][1]))
        current: Any = rows
        for kind, what in reversed(levels):
            if kind == _PRESENT:
                current = [row if keep else None for row, keep in zip(current, what)]
            else:
                current = self.cut(current, what)
        return LeafColumn(NESTED, current)

    def counts(self, axis: str) -> np.ndarray:
        """How many rows of the table of ``axis`` each row of its parent table holds."""
        parent = np.asarray(self.segments[axis].parent)
        table = self.parent_table[axis]
        parents = self.count if table is None else len(self.segments[table].parent)
        return np.bincount(parent, minlength=parents).astype(np.int64)

    def cut(self, rows: Any, axis: str) -> list[Any]:
        """``rows`` of the table of ``axis``, one piece per row of its parent table."""
        counts = self.counts(axis)
        ends = np.cumsum(counts)
        return [rows[e - n : e] for n, e in zip(counts.tolist(), ends.tolist())]


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


__all__ = [
    "DENSE",
    "NESTED",
    "RAGGED",
    "LeafColumn",
    "block",
    "check_dtypes",
    "dense_columns",
    "leaf_columns",
]
