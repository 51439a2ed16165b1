"""The on-disk layout of a schema's columns: what each array's ``zarr.json`` holds.

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> schema = TreeSchema.from_example({"x": np.zeros(3, np.float32)}, chunk_records=64)
    >>> [(l.key, l.shape, l.chunks) for l in layouts(schema)]
    [('x', (3,), (64, 3))]
"""

from __future__ import annotations

from collections.abc import Sequence

from pytreestore._format import dtypes as _dtypes
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore.backends import ColumnLayout


def layouts(schema: TreeSchema) -> list[ColumnLayout]:
    """The on-disk layout of every column of ``schema``."""
    return column_layouts(schema.storage_columns, schema.codec)


def column_layouts(columns: Sequence[ColumnSpec], codec: str | None) -> list[ColumnLayout]:
    """The on-disk layout of ``columns``, compressed with ``codec``."""
    return [
        ColumnLayout(
            key=c.key,
            dtype=c.dtype,
            shape=c.shape,
            chunks=c.chunks,
            codec=codec,
            dimension_names=tuple(c.dimension_names),
            fill_value=_dtypes.fill_value(c.dtype) if c.default is None else c.default,
        )
        for c in columns
    ]


__all__ = ["column_layouts", "layouts"]
