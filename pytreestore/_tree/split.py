"""A padded batch back to its records, column by column: the fast path of
``unstack(batch, mask)`` for a batch that ``stack`` padded from gathered columns
(:mod:`pytreestore._tree.scatter`), using the lengths and present subtrees it kept.

Each leaf's real values are taken with one indexing per leaf (the positions that padding
gave them), split into one value per row, and the rows of a segment rebuilt with its treedef;
a ragged list is the run of its elements' rows. Leaves keep their kind: numpy gives numpy
(a scalar leaf of a record or of its optional subtree: a 0-d array, as ``array[i, ...]``
gives it; of a list element: a numpy scalar), ``jax.Array`` gives ``jax.Array``.

Example:
    >>> import numpy as np
    >>> from pytreestore._tree.scatter import Space
    >>> elements = Space.records(2).child(np.array([2, 1]), 3, trim=False)
    >>> values(np.array([[1, 2, 0], [3, 0, 0]]), elements, ())
    [np.int64(1), np.int64(2), np.int64(3)]
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pytreestore._format.weak import weaken
from pytreestore._tree.gather import LeafColumn, ListColumn, Segment
from pytreestore._tree.scatter import Space


def split(seg: Segment, space: Space, batch: Any) -> list[Any]:
    """One object per row of ``space``, from ``batch``, the padded subtree of ``seg``."""
    if seg.bare:
        return _split_column(seg.columns[0], space, batch)
    parts = seg.treedef.flatten_up_to(batch)
    columns = [_split_column(c, space, p) for c, p in zip(seg.columns, parts)]
    unflatten = seg.treedef.unflatten
    if not columns:
        return [unflatten([]) for _ in range(space.rows)]
    return [unflatten(row) for row in zip(*columns)]


def _split_column(column: Any, space: Space, batch: Any) -> list[Any]:
    if isinstance(column, LeafColumn):
        if column.spec.axis is None:
            return values(batch, space, column.spec.shape)
        return _axis_rows(batch, space, column)
    if isinstance(column, ListColumn):
        lengths = column.kept
        items = split(column.element, space.child(lengths, column.size, trim=False), batch)
        cuts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        return [items[a:b] for a, b in itertools.pairwise(cuts)]
    present = column.kept
    inner = iter(split(column.inner, space.subset(present), batch))
    return [next(inner) if p else None for p in present.tolist()]


def values(leaf: Any, space: Space, shape: tuple[int, ...]) -> list[Any]:
    """One value per row of ``space`` of a leaf without a ragged axis."""
    if isinstance(leaf, jax.Array):
        return on_device(values(np.asarray(leaf), space, shape), leaf)
    if len(space.prefix) == 1:  # a record's own leaf (or its optional subtree's)
        return [leaf[i, ...] for i in space.positions().tolist()]
    return list(leaf.reshape(math.prod(space.prefix), *shape)[space.index])


def _axis_rows(leaf: Any, space: Space, column: LeafColumn) -> list[Any]:
    """Each row's values of a leaf with a ragged leading axis, cut to its length."""
    if isinstance(leaf, jax.Array):
        return on_device(_axis_rows(np.asarray(leaf), space, column), leaf)
    lengths, size = column.kept, column.size
    rows = leaf.reshape(math.prod(space.prefix), size, *column.spec.shape)
    return [rows[p, :n] for p, n in zip(space.positions().tolist(), lengths.tolist())]


def on_device(arrays: list[Any], like: jax.Array) -> list[Any]:
    """``arrays`` (numpy) as ``jax.Array``s where ``like`` lies, weakly typed as ``like`` is,
    put in one call (splitting a ``jax.Array`` row by row costs a dispatch per row)."""
    if not arrays:
        return []
    devices = like.devices()
    if len(devices) != 1:
        return [jnp.asarray(a) for a in arrays]
    out = jax.device_put([np.asarray(a) for a in arrays], next(iter(devices)))
    return weaken(out, [True] * len(out)) if like.weak_type else out


__all__ = ["on_device", "split", "values"]
