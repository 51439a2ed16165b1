"""The on-disk layout of a schema: what each array's ``zarr.json`` holds, and the groups
between the root and the arrays.

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> schema = TreeSchema.from_example({"a": {"x": np.zeros(3, np.float32)}}, chunk_records=64)
    >>> [(l.key, l.shape, l.chunks) for l in layouts(schema)], group_paths(schema)
    ([('a/x', (3,), (64, 3))], ['a'])
"""

from __future__ import annotations

from collections.abc import Sequence

from pytreestore._format import dtypes as _dtypes
from pytreestore._format.columns import inner_records
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore.backends import ColumnLayout


def layouts(schema: TreeSchema) -> list[ColumnLayout]:
    """The on-disk layout of every column of ``schema``."""
    return column_layouts(schema.storage_columns, schema.codec, schema.inner_chunk_bytes)


def column_layouts(
    columns: Sequence[ColumnSpec], codec: str | None, inner_chunk_bytes: int | None = None
) -> list[ColumnLayout]:
    """The on-disk layout of ``columns``, compressed with ``codec``, each chunk a shard of
    inner chunks of at most ``inner_chunk_bytes`` where :func:`inner_records` says."""
    return [
        ColumnLayout(
            key=c.key,
            dtype=c.dtype,
            shape=c.shape,
            chunks=c.chunks,
            codec=codec,
            dimension_names=tuple(c.dimension_names),
            fill_value=_dtypes.fill_value(c.dtype) if c.default is None else c.default,
            inner=inner_records(c, inner_chunk_bytes),
        )
        for c in columns
    ]


def group_paths(schema: TreeSchema) -> list[str]:
    """The paths of the groups between the root and ``schema``'s arrays, sorted: every
    proper prefix of a storage key."""
    groups: set[str] = set()
    for c in schema.storage_columns:
        parts = c.key.split("/")
        groups.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return sorted(groups)


def group_document(attributes: dict[str, object]) -> dict[str, object]:
    """A zarr v3 group's ``zarr.json`` document with ``attributes``."""
    return {"zarr_format": 3, "node_type": "group", "attributes": attributes}


__all__ = ["column_layouts", "group_document", "group_paths", "layouts"]
