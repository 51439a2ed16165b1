"""Gathered columns (:mod:`pytreestore._tree.gather`) to one padded batch and its mask: each
leaf's values converted with one numpy call (the store's casting rule, value by value only
where a column is not all of one exact type) and assigned into zeros at positions computed
from the lengths (``np.repeat``/``cumsum`` index arithmetic), never record by record.

A *space* is the rows of one segment: the records, the elements of a ragged list (all
records' elements, in order), or the present rows of an optional subtree; ``index`` gives
each row's flat position in the padded leading axes ``prefix`` (-1: cut by ``trim``).

Example:
    >>> import numpy as np
    >>> top = Space.records(2)
    >>> elements = top.child(np.array([2, 1]), 3, trim=False)
    >>> elements.index.tolist(), elements.prefix
    ([0, 1, 3], (2, 3))
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from pytreestore._format import dtypes as _dtypes
from pytreestore._tree.convert import LeafCaster
from pytreestore._tree.gather import Departs, LeafColumn, ListColumn, Segment
from pytreestore.errors import SchemaMismatchError

#: a padded length for the longest length of an axis (pad.padded_length with its pad_to)
Limit = Callable[[int], int]


@dataclasses.dataclass(frozen=True)
class Space:
    """The rows of one segment and where they go in the padded leading axes ``prefix``."""

    rows: int
    prefix: tuple[int, ...]
    #: flat positions in ``prefix``; -1 for a row that ``trim`` cut; None: the records
    index: np.ndarray | None = None

    @classmethod
    def records(cls, n: int) -> Space:
        return cls(n, (n,))

    def positions(self) -> np.ndarray:
        return np.arange(self.rows) if self.index is None else self.index

    @functools.cached_property
    def keep(self) -> np.ndarray | None:
        """Which rows were kept (None: all)."""
        if self.index is None or self.index.size == 0 or self.index.min() >= 0:
            return None
        return self.index >= 0

    @functools.cached_property
    def mask(self) -> np.ndarray:
        """True at the kept rows' positions in ``prefix``."""
        mask = np.zeros(self.prefix, bool)
        index = self.positions() if self.keep is None else self.positions()[self.keep]
        mask.reshape(mask.size)[index] = True
        return mask

    def child(self, lengths: np.ndarray, size: int, *, trim: bool) -> Space:
        """The space of ``lengths[i]`` sub-rows per row, padded to ``size``."""
        total = int(lengths.sum())
        starts = np.cumsum(lengths) - lengths
        within = np.arange(total) - np.repeat(starts, lengths)
        parent = np.repeat(self.positions(), lengths)
        index = parent * size + within
        if trim or self.keep is not None:
            index[(within >= size) | (parent < 0)] = -1
        return Space(total, (*self.prefix, size), index)

    def subset(self, present: np.ndarray) -> Space:
        """The space of the rows where ``present`` is True."""
        return Space(int(present.sum()), self.prefix, self.positions()[present])


def pad(seg: Segment, space: Space, limit: Limit, trim: bool) -> tuple[Any, Any]:
    """The padded batch and mask of ``seg``'s gathered rows, laid out in ``space``.

    Raises:
        Departs: a value is refused (a dtype, a shape, a length above ``pad_to``) or the
            leaves of a node that shares one leading axis disagree: the checked path says so.
    """
    for group in seg.shared:
        lengths = [_axis_lengths(c) for c in group]
        if any(not np.array_equal(x, lengths[0]) for x in lengths[1:]):
            raise Departs("the leaves of a node disagree on their shared leading axis")
    parts = [_pad_column(c, space, limit, trim) for c in seg.columns]
    if seg.bare:
        return parts[0]
    return tuple(seg.treedef.unflatten([p[i] for p in parts]) for i in (0, 1))  # type: ignore[return-value]


def _pad_column(column: Any, space: Space, limit: Limit, trim: bool) -> tuple[Any, Any]:
    kept = space.keep
    if isinstance(column, LeafColumn):
        return _pad_leaf(column, space, limit, trim)
    if isinstance(column, ListColumn):
        lengths = column.lengths
        size = _size(lengths, limit, trim)
        column.spec.axis.longest = int(lengths.max(initial=0))
        column.kept, column.size = _kept(np.minimum(lengths, size), kept), size
        return pad(column.element, space.child(lengths, size, trim=trim), limit, trim)
    column.kept = _kept(column.present, kept)
    return pad(column.inner, space.subset(column.present), limit, trim)


def _kept(counts: np.ndarray, kept: np.ndarray | None) -> np.ndarray:
    return counts if kept is None else counts[kept]


def _size(lengths: np.ndarray, limit: Limit, trim: bool) -> int:
    size = limit(int(lengths.max(initial=0)))
    if not trim and lengths.size and int(lengths.max()) > size:
        raise Departs("a length above pad_to")
    return size


def _pad_leaf(column: LeafColumn, space: Space, limit: Limit, trim: bool) -> tuple[Any, Any]:
    """The padded leaf and its mask; the column lets go of the values it gathered."""
    spec = column.spec
    if spec.axis is None:
        values = leaf_values(column)
        column.values = []
        if space.index is None:
            return values, np.ones(space.rows, bool)
        return _scatter(values, space, spec.shape)
    lengths = _axis_lengths(column)
    size = _size(lengths, limit, trim)
    spec.axis.longest = int(lengths.max(initial=0))  # type: ignore[union-attr]
    column.kept, column.size = _kept(np.minimum(lengths, size), space.keep), size
    values = axis_values(column)
    column.values = []
    return _scatter(values, space.child(lengths, size, trim=trim), spec.shape)


def _scatter(values: np.ndarray, space: Space, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """``values`` (one per row of ``space``) at their positions in zeros, and the mask.

    The positions of a space's rows ascend (records, then each record's elements), so a
    boolean mask assignment puts the rows in order.
    """
    out = np.zeros((*space.prefix, *shape), values.dtype)
    out[space.mask] = values if space.keep is None else values[space.keep]
    return out, space.mask.copy()


# ---- values: the casting rule, column by column ----------------------------------------------


def leaf_values(column: LeafColumn) -> np.ndarray:
    """The values of a leaf without a ragged axis as one array ``(rows, *shape)``.

    Raises:
        Departs: a value is no leaf of the leaf's shape, or the casting rule refuses it.
    """
    spec, values = column.spec, column.values
    dtype, shape = spec.dtype, spec.shape
    if not shape:
        types = set(map(type, values))
        if types <= _exact(dtype):
            out = _scalars(values, dtype, types)
            if out is not None:
                return out
    if not all(type(v) is np.ndarray and v.dtype == dtype and v.shape == shape for v in values):
        values = [_coerce(spec, v, _shape_of(v, spec, ragged=False)) for v in values]
    if not values:
        return np.zeros((0, *shape), dtype)
    return np.concatenate(values).reshape(len(values), *shape) if shape else np.stack(values)


def axis_values(column: LeafColumn) -> np.ndarray:
    """The values of a leaf with a ragged leading axis, concatenated along it.

    Raises:
        Departs: a value is no leaf of the leaf's shape, or the casting rule refuses it.
    """
    spec, values = column.spec, column.values
    dtype, shape = spec.dtype, spec.shape
    if not all(
        type(v) is np.ndarray and v.dtype == dtype and v.ndim and v.shape[1:] == shape
        for v in values
    ):
        values = [_coerce(spec, v, _shape_of(v, spec, ragged=True)) for v in values]
    return np.concatenate(values) if values else np.zeros((0, *shape), dtype)


def _axis_lengths(column: LeafColumn) -> np.ndarray:
    """Each value's leading length (its shape is checked with its values)."""
    values, spec = column.values, column.spec
    if all(type(v) is np.ndarray and v.ndim for v in values):
        lengths = (v.shape[0] for v in values)
    else:
        lengths = (_shape_of(v, spec, ragged=True)[0] for v in values)
    return np.fromiter(lengths, np.intp, len(values))


def _exact(dtype: np.dtype) -> frozenset[type]:
    return _dtypes.python_kinds_accepted(dtype) | {dtype.type}


def _scalars(values: list[Any], dtype: np.dtype, types: set[type]) -> np.ndarray | None:
    """Scalars of exact types in one array; None when a Python scalar may not fit (the
    value by value rule then refuses it, or takes an infinity that was one already)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.array(values, dtype)
    except (OverflowError, ValueError, TypeError):
        return None
    python = types - {dtype.type}
    if python and _dtypes.kind(dtype) in "fc" and not np.isfinite(out).all():
        return None
    return out


def _shape_of(value: Any, spec: Any, *, ragged: bool) -> tuple[int, ...]:
    """The shape of a value at an array leaf; Departs when it is a node, or the shape
    departs from the leaf's."""
    if not isinstance(value, np.ndarray | np.generic | jax.Array) and (
        jax.tree_util.tree_structure(value).num_leaves != 1
        or jax.tree_util.tree_structure(value).num_nodes != 1
    ):
        raise Departs(f"a node at the leaf {spec.path}")
    shape = tuple(np.shape(value))
    if (shape[1:] != spec.shape or not shape) if ragged else shape != spec.shape:
        raise Departs(f"shape {shape} at {spec.path}")
    return shape


def _coerce(spec: Any, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    try:
        return LeafCaster(spec.path, spec.dtype, shape).coerce(value)
    except SchemaMismatchError as err:
        raise Departs(str(err)) from err


__all__ = ["Space", "axis_values", "leaf_values", "pad"]
