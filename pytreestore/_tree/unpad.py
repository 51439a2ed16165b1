"""Records back from the padded form: what ``extend_batch(batch, mask=mask)`` of a ragged store
appends, so that a loaded selection can be appended to another store.

The mask says where values are real. A ragged list's length in each row is the count of True
along its axis in the mask of a leaf that lies directly in its elements (not below a further
ragged axis or optional subtree), and every such leaf must agree; an optional subtree is
present where such a leaf of it is True. The True entries of each row must come first.

Example:
    >>> import numpy as np
    >>> from pytreestore._tree.layout import build_layout
    >>> from pytreestore._tree.layout_nodes import Declarations
    >>> records = [{"p": [1.0, 2.0]}, {"p": []}]
    >>> spec = build_layout(records, None, Declarations.parse(True, None))
    >>> batch = {"p": np.array([[1.0, 2.0], [0.0, 0.0]], np.float32)}
    >>> mask = {"p": np.array([[True, True], [False, False]])}
    >>> [len(r["p"]) for r in unpad_records(spec, batch, mask)]
    [2, 0]

A padded batch back to its records, column by column: the fast path of
``unstack(batch, mask)`` for a batch that ``stack`` padded from gathered columns
(:mod:`pytreestore._tree.pad_columns`), using the lengths and present subtrees it kept.

Each leaf's real values are taken with one indexing per leaf (the positions that padding
gave them), split into one value per row, and the rows of a segment rebuilt with its treedef;
a ragged list is the run of its elements' rows. Leaves keep their kind: numpy gives numpy
(a scalar leaf of a record or of its optional subtree: a 0-d array, as ``array[i, ...]``
gives it; of a list element: a numpy scalar), ``jax.Array`` gives ``jax.Array``.

Example:
    >>> import numpy as np
    >>> from pytreestore._tree.pad_columns import Space
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

from pytreestore._format.dtypes import weaken
from pytreestore._tree.layout_nodes import (
    Fixed,
    Kept,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    visit,
)
from pytreestore._tree.pad_columns import LeafColumn, ListColumn, Segment, Space
from pytreestore.errors import SchemaMismatchError


def unpad_records(spec: LayoutNode, batch: Any, mask: Any) -> list[Any]:
    """The records of the padded ``batch`` whose real values ``mask`` marks.

    Raises:
        SchemaMismatchError: ``batch`` or ``mask`` does not have the padded structure of the
            store's records, a mask is not a run of True then False, or the leaves of one
            list disagree on its length.
    """
    rows = _rows(spec, batch)
    return _split(spec, batch, mask, rows)


def _rows(spec: LayoutNode, batch: Any) -> int:
    for leaf in [*_leaves(spec, batch), *jax.tree.leaves(batch)]:  # pending parts last
        shape = np.shape(leaf)
        if shape:
            return int(shape[0])
    raise SchemaMismatchError("extend_batch(batch, mask=) found no array leaf in the batch")


def _leaves(spec: LayoutNode | None, value: Any) -> list[Any]:
    return visit(spec, _Leaves(), value)


class _Leaves(Visitor):
    """The array leaves of a value of a node, in walk order."""

    def leaf(self, node: Leaf, value: Any) -> list[Any]:
        return [value]

    def ragged(self, node: RaggedList, value: Any) -> list[Any]:
        return visit(node.element, self, value)

    def optional(self, node: OptionalTree, value: Any) -> list[Any]:
        return visit(node.inner, self, value)

    def fixed(self, node: Fixed, value: Any) -> list[Any]:
        pairs = zip(node.children, _children(node, value))
        return [x for c, v in pairs for x in visit(c, self, v)]

    def other(self, node: LayoutNode, *args: Any) -> list[Any]:
        return []

    def unknown(self, *args: Any) -> list[Any]:
        return []


def _children(spec: Fixed, value: Any) -> list[Any]:
    try:
        return spec.treedef.flatten_up_to(value)
    except (ValueError, TypeError) as err:
        raise SchemaMismatchError(
            f"extend_batch(batch, mask=): at {spec.path or 'the root'} the batch (or mask) does "
            f"not have the padded structure of the store's records: {err}"
        ) from None


def _split(spec: LayoutNode | None, value: Any, mask: Any, rows: int) -> list[Any]:
    """One object per row of ``value`` and ``mask`` (leading axis: the rows)."""
    return visit(spec, _Split(), value, mask, rows)


class _Split(Visitor):
    """:func:`_split` of a node."""

    def leaf(self, node: Leaf, value: Any, mask: Any, rows: int) -> list[Any]:
        array = np.asarray(value)
        if node.axis is None:
            return [array[i, ...] for i in range(rows)]
        lengths = _lengths(np.asarray(mask), node.path, rows)
        return [array[i, : lengths[i]] for i in range(rows)]

    def kept(self, node: Kept, value: Any, mask: Any, rows: int) -> list[Any]:
        return [node.value] * rows

    def optional(self, node: OptionalTree, value: Any, mask: Any, rows: int) -> list[Any]:
        if node.inner is None:
            _check_nothing_real(node.path, mask, "a subtree")
            return [None] * rows
        present = _witness(node.inner, mask, node.path, rows, optional=True)
        inner = _split(
            node.inner,
            _take(value, present, node.path),
            _take(mask, present, node.path),
            int(present.sum()),
        )
        it = iter(inner)
        return [next(it) if p else None for p in present]

    def fixed(self, node: Fixed, value: Any, mask: Any, rows: int) -> list[Any]:
        parts = [
            _split(c, v, m, rows)
            for c, v, m in zip(node.children, _children(node, value), _children(node, mask))
        ]
        return (
            [node.treedef.unflatten(list(p)) for p in zip(*parts)]
            if parts
            else [node.treedef.unflatten([]) for _ in range(rows)]
        )

    def ragged(self, node: RaggedList, value: Any, mask: Any, rows: int) -> list[Any]:
        if node.element is None:
            _check_nothing_real(node.path, mask, "elements")
            return [[] for _ in range(rows)]
        real = _witness(node.element, mask, node.path, rows, optional=False)
        lengths = _lengths(real, node.path, rows)
        items = _split(
            node.element,
            _take(value, real, node.path),
            _take(mask, real, node.path),
            int(lengths.sum()),
        )
        cuts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        return [items[cuts[i] : cuts[i + 1]] for i in range(rows)]


def _check_nothing_real(path: str, mask: Any, what: str) -> None:
    """Refuses real values where the store's structure is still pending (its element or
    subtree unknown): they would be dropped.

    Raises:
        SchemaMismatchError: the mask there has a True entry.
    """
    if any(np.asarray(m).any() for m in jax.tree.leaves(mask)):
        raise SchemaMismatchError(
            f"extend_batch(batch, mask=): the mask at {path or 'the root'} shows {what}, whose "
            "structure the store has not learnt yet (store.schema.pending: no record had "
            f"{what} there so far). Append one record that has {what} there first "
            "(store.append(record)); then extend_batch. Nothing was appended."
        )


def _take(tree: Any, where: np.ndarray, path: str) -> Any:
    """Every array leaf of ``tree`` at the True entries of ``where`` (its leading axes).

    Raises:
        SchemaMismatchError: a leaf's leading axes are not the shape of ``where`` (a mask
            padded to another length than the batch, at ``path``).
    """

    def take(x: Any) -> Any:
        if not hasattr(x, "shape"):
            return x
        x = np.asarray(x)
        if x.shape[: where.ndim] != where.shape:
            raise SchemaMismatchError(
                f"extend_batch(batch, mask=): below {path or 'the root'} the mask says which "
                f"entries of shape {where.shape} are real, but a leaf (or mask) there has "
                f"shape {x.shape}; pad the batch and the mask to the same length. Nothing "
                "was appended."
            )
        return x[where]

    return jax.tree.map(take, tree)


def _witness(spec: LayoutNode, mask: Any, path: str, rows: int, *, optional: bool) -> np.ndarray:
    """Where the elements of a list (or an optional subtree) are real, from the masks of
    the leaves directly in it, which must agree."""
    found = [np.asarray(m) for m in _direct_masks(spec, mask)]
    if not found:
        what = "optional subtree" if optional else "ragged list's elements"
        raise SchemaMismatchError(
            f"extend_batch(batch, mask=) cannot tell at {path or 'the root'} which entries are "
            f"real: the {what} hold no leaf outside a further ragged axis or optional subtree; "
            "append the records instead"
        )
    first = found[0].astype(bool)
    if any(m.shape != first.shape or (m.astype(bool) != first).any() for m in found[1:]):
        raise SchemaMismatchError(
            f"extend_batch(batch, mask=): the masks below {path or 'the root'} disagree on "
            "which entries are real"
        )
    return first


def _direct_masks(spec: LayoutNode | None, mask: Any) -> list[Any]:
    return visit(spec, _DirectMasks(), mask)


class _DirectMasks(Visitor):
    """The masks of the leaves directly in a node: not below a further ragged axis (a
    list, a ragged leading axis) or optional subtree."""

    def leaf(self, node: Leaf, mask: Any) -> list[Any]:
        return [mask] if node.axis is None else []

    def kept(self, node: Kept, mask: Any) -> list[Any]:
        return [mask]

    def fixed(self, node: Fixed, mask: Any) -> list[Any]:
        pairs = zip(node.children, _children(node, mask))
        return [m for c, v in pairs for m in visit(c, self, v)]

    def other(self, node: LayoutNode, *args: Any) -> list[Any]:
        return []

    def unknown(self, *args: Any) -> list[Any]:
        return []


def _lengths(mask: np.ndarray, path: str, rows: int) -> np.ndarray:
    """Each row's count of True along the last axis of ``mask``, which must come first."""
    if mask.ndim != 2 or mask.shape[0] != rows:
        raise SchemaMismatchError(
            f"extend_batch(batch, mask=): the mask at {path or 'the root'} has shape "
            f"{mask.shape}, expected {rows} rows and a padded axis"
        )
    real = mask.astype(bool)
    lengths = real.sum(axis=1)
    prefix = np.arange(real.shape[1]) < lengths[:, None]
    if (real != prefix).any():
        bad = int(np.argmax((real != prefix).any(axis=1)))
        raise SchemaMismatchError(
            f"extend_batch(batch, mask=): row {bad} of the mask at {path or 'the root'} is not a "
            "run of True then False, so it gives no length"
        )
    return lengths


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


__all__ = ["on_device", "split", "unpad_records", "values"]
