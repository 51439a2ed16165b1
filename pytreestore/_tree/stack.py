"""In-memory array-of-structs <-> struct-of-arrays, with the store's validation and dtypes.

Example:
    >>> import pytreestore
    >>> batch = pytreestore.stack([{"a": 1, "b": 2.0}, {"a": 3, "b": 4.0}])
    >>> batch["a"]
    Array([1, 3], dtype=int32)
    >>> pytreestore.unstack(batch)[1]["b"]
    Array(4., dtype=float32)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import tree_flatten

from pytreestore._format.schema import TreeSchema
from pytreestore._tree.convert import RowFiller, casters
from pytreestore.errors import SchemaMismatchError


def stack(records: Iterable[Any], *, like: Any = None, as_numpy: bool = False) -> Any:
    """Stacks records into one batched record, as a store would hold them.

    Args:
        records: records of one structure (a list, or any iterable).
        like: the example record that fixes the schema; by default the first record.
        as_numpy: return numpy leaves instead of ``jax.Array``.

    Raises:
        SchemaMismatchError: a record's structure, a shape or a dtype differs from ``like``.
        ValueError: no records and no ``like``.
    """
    records = list(records)
    if like is None:
        if not records:
            raise ValueError("stack() needs at least one record, or like= to fix the schema")
        like = records[0]
    schema = TreeSchema.from_example(like, chunk_records=1)
    buffers = [np.empty((len(records), *c.shape), c.dtype) for c in schema.columns]
    filler = RowFiller(casters(schema.columns), buffers)
    for i, record in enumerate(records):
        leaves, treedef = tree_flatten(record)
        if treedef != schema.treedef:
            raise SchemaMismatchError(schema.mismatch_message(record, what=f"record {i}"))
        try:
            filler.fill(schema.column_leaves(leaves), i)
        except SchemaMismatchError as err:
            raise SchemaMismatchError(f"stack() refused record {i}: {err}") from err
    return schema.unflatten(buffers if as_numpy else jax.device_put(buffers))


def unstack(batch: Any) -> list[Any]:
    """Splits a batched record into its records (the inverse of :func:`stack`).

    Leaves keep their kind: ``jax.Array`` leaves give ``jax.Array`` leaves, numpy gives numpy.
    A leaf that is not an array (a function: a constant leaf) is the same in every record.

    Raises:
        SchemaMismatchError: the leaves disagree on the leading (record) length.
    """
    leaves, treedef = tree_flatten(batch)
    arrays = [leaf for leaf in leaves if not is_constant(leaf)]
    lengths = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in arrays}
    if None in lengths or len(lengths) > 1:
        raise SchemaMismatchError(
            f"unstack() needs leaves with one common leading record axis; got lengths {sorted(lengths, key=str)}"
        )
    if not arrays:
        return []
    columns = [split_leaves(leaf) for leaf in leaves]
    return [treedef.unflatten(row) for row in zip(*columns)]


def batch_length(leaves: Sequence[Any], paths: Sequence[str]) -> int:
    """The common leading (record) length of a batch's leaves.

    Raises:
        SchemaMismatchError: a leaf has no leading axis, or the leaves disagree on its length.
    """
    lengths = []
    for leaf, path in zip(leaves, paths):
        shape = np.shape(leaf)
        if not shape:
            raise SchemaMismatchError(
                f"batch leaf at {path or 'the root'} has no leading record axis (shape ()); "
                "extend_batch takes leaves shaped (records, *leaf_shape); use append for one record"
            )
        lengths.append(shape[0])
    if len(set(lengths)) > 1:
        detail = ", ".join(f"{p or 'the root'}: {n}" for p, n in zip(paths, lengths))
        raise SchemaMismatchError(
            f"batch leaves disagree on the number of records ({detail}); every leaf of a batch "
            "needs the same leading length"
        )
    return lengths[0] if lengths else 0


def split_leaves(leaf: Any) -> list[Any]:
    """One leaf with a leading axis as a list of per-record leaves (None, and a constant leaf
    such as a function, stay as they are in every record)."""
    if leaf is None or is_constant(leaf):
        return _Repeat(leaf)
    if isinstance(leaf, jax.Array):
        return list(leaf)
    array = np.asarray(leaf)
    return [array[i, ...] for i in range(array.shape[0])]


_ARRAYS = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def is_constant(leaf: Any) -> bool:
    """Whether a leaf is a constant (a function, ...): neither an array nor a scalar."""
    return leaf is not None and not isinstance(leaf, _ARRAYS)


class _Repeat(list):
    """An endless run of one value (None for unselected columns, or a constant leaf), so
    ``zip`` stops at the real columns."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value

    def __iter__(self):  # type: ignore[override]
        while True:
            yield self.value
