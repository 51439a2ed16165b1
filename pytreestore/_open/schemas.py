"""The schema of a new store, from an example record: its columns, codec and packs.

Example:
    >>> new_schema({"x": 0.0, "y": [1, 2]}, chunk_records=8, codec="zstd").paths
    ("['x']", "['y'][0]", "['y'][1]")
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax.tree_util import tree_flatten

from pytreestore import _arguments
from pytreestore._format import compression as _packs
from pytreestore._format.columns import INNER_CHUNK_BYTES, default_chunk_records
from pytreestore._format.schema import TreeSchema
from pytreestore.errors import SchemaMismatchError, UnsupportedTreeError


def new_schema(like: Any, *, chunk_records: int | None, codec: str | None) -> TreeSchema:
    """The schema of a new store of records like ``like`` (refused: no leaves)."""
    schema = schema_of(like, chunk_records=chunk_records, codec=codec)
    if not schema.columns:
        raise SchemaMismatchError(
            "the example record has no leaves, so a store would have no columns; "
            "give like= at least one array or scalar"
        )
    return schema


def packed_schema(schema: TreeSchema, limit: int, chunk_records: int | None) -> TreeSchema:
    """``schema`` with the packs of its leaves of at most ``limit`` bytes per record; by
    default with as many records per chunk as the packs' widths call for."""
    packs = _packs.plan(schema.columns, limit)
    if packs and chunk_records is None:
        inside = _packs.packed_keys(packs)
        widths = [
            (None, None, c.dtype, c.shape, None) for c in schema.columns if c.key not in inside
        ]
        widths += [(None, None, p.dtype, (p.elements,), None) for p in packs]
        schema = _packs.rechunked(schema, default_chunk_records(widths))
        packs = _packs.plan(schema.columns, limit)
    _packs.check_keys(schema.columns, packs)
    return dataclasses.replace(schema, packs=packs)


#: ``inner_chunk_bytes="auto"``: inner chunks of this many bytes where compressed
DEFAULT_INNER = "auto"


def inner_chunk_bytes(value: Any, codec: str | None) -> int | None:
    """``create(inner_chunk_bytes=)`` checked: ``"auto"`` is
    :data:`~pytreestore._format.columns.INNER_CHUNK_BYTES` for a compressed store and None
    (plain chunks) for an uncompressed one (the default); 0 or None: plain chunks.

    Raises:
        ArgumentTypeError: not an int, None or ``"auto"``.
        ArgumentError: a negative int.
    """
    if isinstance(value, str) and value == DEFAULT_INNER:
        return None if codec is None else INNER_CHUNK_BYTES
    rule = "inner_chunk_bytes must be 'auto', None or an int >= 0 (bytes; 0: plain chunks)"
    return _arguments.optional_count(value, rule) or None


def schema_of(like: Any, **options: Any) -> TreeSchema:
    """``TreeSchema.from_example``, with JAX's flattening errors said in our words."""
    try:
        tree_flatten(like)
    except ValueError as err:  # JAX cannot flatten it (dict keys of mixed types, ...)
        raise UnsupportedTreeError(
            f"the example record cannot be flattened by JAX: {err} A dict's keys must be "
            "sortable against each other (all str, or all int); use one key type per dict."
        ) from err
    return TreeSchema.from_example(like, **options)


__all__ = [
    "DEFAULT_INNER",
    "inner_chunk_bytes",
    "new_schema",
    "packed_schema",
    "schema_of",
]
