"""Building records from gathered rows (:mod:`pytreestore._read.gather`): the records exactly
as appended, the padded form with its mask, or the flat segments form.

Each table's gathered rows have a *place* in the padded form: a tuple of index arrays, one per
padded axis (records, then one per enclosing ragged axis). The record table's rows are placed
at ``(record,)``; an axis's rows at their parent's place plus their position in the list. A
leaf is then one scatter: ``out[place] = values``; its mask, ``mask[place] = True``.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-build", {"p": [np.int32(0)]}, ragged=["['p']"])
    >>> s.extend([{"p": [np.int32(1), np.int32(2)]}, {"p": [np.int32(3)]}])
    >>> batch, mask = s.load(as_numpy=True)
    >>> batch["p"].tolist(), mask["p"].tolist()
    ([[1, 2], [3, 0]], [[True, True], [True, False]])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from pytreestore._format.ragged import LEAF, OFFSETS, PRESENCE
from pytreestore._format.schema import TreeSchema
from pytreestore._read.gather import Rows, record_of
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
from pytreestore._tree.pad import padded_length
from pytreestore.errors import RaggedLengthError


@dataclasses.dataclass
class Place:
    """Where a table's gathered rows go in the padded form: ``index`` (one array per padded
    axis, over every gathered row), the padded ``shape``, ``keep`` (rows within the padded
    lengths; None: all) and ``valid`` (rows inside an optional subtree: whether it is there)."""

    index: tuple[np.ndarray, ...]
    shape: tuple[int, ...]
    keep: np.ndarray | None = None
    valid: np.ndarray | None = None

    def kept(self) -> tuple[tuple[np.ndarray, ...], Any]:
        """The index of the rows kept, and their validity (True: all valid)."""
        valid: Any = True if self.valid is None else self.valid
        if self.keep is None:
            return self.index, valid
        index = tuple(i[self.keep] for i in self.index)
        return index, valid if self.valid is None else self.valid[self.keep]


class Padded:
    """Builds ``(batch, mask)`` of the padded form from gathered rows; ``lengths`` gives each
    axis's longest list (what ``pad_to`` pads from), ``zeros`` makes the zeroed arrays of the
    element tables' leaves and masks (by default fresh ones)."""

    def __init__(
        self,
        gathered: dict[str | None, Rows],
        lengths: dict[str, int],
        *,
        pad_to: Any,
        truncate: bool,
        chosen: set[str] | None,
        zeros: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.zeros,
    ) -> None:
        self.rows = gathered
        self.zeros = zeros  # where the padded arrays are made (a reused host buffer)
        self.longest = lengths
        self.pad_to = pad_to
        self.truncate = truncate
        self.chosen = chosen  # leaf paths to build (None: all)
        self.places: dict[str | None, Place] = {}

    def build(self, spec: LayoutNode) -> tuple[Any, Any]:
        n = self.rows[None].count
        return visit(spec, _PaddedNode(self), Place((np.arange(n),), (n,)), None)

    def leaf(self, spec: Leaf, place: Place, table: str | None) -> tuple[Any, Any]:
        if self.chosen is not None and spec.path not in self.chosen:
            return None, None
        if spec.axis is not None:
            table = spec.axis.path
            place = self.place(table, place)
        values = self.rows[table].values[(LEAF, spec.path)]
        if table is None:  # the record table: already in place
            if place.valid is not None and not place.valid.all():
                values = values.copy()
                values[~place.valid] = 0  # an absent subtree's rows: stored zeros, or the
            return values, self.mask(place)  # default of a column added later: padding
        out = self.zeros((*place.shape, *spec.shape), values.dtype)
        index, valid = place.kept()
        out[index] = values if place.keep is None else values[place.keep]
        if valid is not True and not valid.all():
            out[tuple(i[~valid] for i in index)] = 0
        return out, self.mask(place)

    def mask(self, place: Place) -> np.ndarray:
        if len(place.index) == 1 and place.valid is None:
            return np.ones(place.shape, bool)
        mask = self.zeros(place.shape, np.dtype(bool))
        index, valid = place.kept()
        mask[index] = valid
        return mask

    def place(self, axis: str, parent: Place) -> Place:
        """The place of ``axis``'s rows below rows placed at ``parent`` (cut to the padded
        length; RaggedLengthError for a length above an explicit ``pad_to``)."""
        if axis in self.places:
            return self.places[axis]
        rows = self.rows[axis]
        assert rows.parent is not None and rows.position is not None
        size = padded_length(self.pad_to, self.longest[axis])
        keep = rows.position < size
        if not keep.all() and not self.truncate:
            raise RaggedLengthError(
                f"a record has length {int(rows.position.max()) + 1} at {axis or 'the root'}, "
                f"above the limit {size} of pad_to={self.pad_to!r}; raise pad_to, or pass "
                "trim=True to cut longer lists and axes"
            )
        if parent.keep is not None:
            keep &= parent.keep[rows.parent]
        index = (*(i[rows.parent] for i in parent.index), rows.position)
        valid = None if parent.valid is None else parent.valid[rows.parent]
        place = Place(index, (*parent.shape, size), None if keep.all() else keep, valid)
        self.places[axis] = place
        return place


class _PaddedNode(Visitor):
    """``(batch, mask)`` of a node whose rows are placed at ``place`` in ``table``, for a
    :class:`Padded`."""

    def __init__(self, padded: Padded) -> None:
        self.padded = padded

    def leaf(self, node: Leaf, place: Place, table: str | None) -> tuple[Any, Any]:
        return self.padded.leaf(node, place, table)

    def kept(self, node: Kept, place: Place, table: str | None) -> tuple[Any, Any]:
        return node.value, self.padded.mask(place)

    def ragged(self, node: RaggedList, place: Place, table: str | None) -> tuple[Any, Any]:
        if node.element is None:
            return None, None
        axis = node.axis.path
        return node.element.visit(self, self.padded.place(axis, place), axis)

    def optional(self, node: OptionalTree, place: Place, table: str | None) -> tuple[Any, Any]:
        if node.inner is None:
            return None, None
        present = self.padded.rows[table].values[(PRESENCE, node.path)]
        valid = present if place.valid is None else place.valid & present
        return visit(node.inner, self, dataclasses.replace(place, valid=valid), table)

    def fixed(self, node: Fixed, place: Place, table: str | None) -> tuple[Any, Any]:
        parts = [c.visit(self, place, table) for c in node.children]
        return tuple(node.treedef.unflatten([p[i] for p in parts]) for i in (0, 1))  # type: ignore[return-value]


# ---- the segments form ---------------------------------------------------------------------

#: the key of an optional subtree's presence in the segments form: ``"present" + keypath``
#: (an axis's keypath never starts with a letter, so the two never meet)
PRESENT = "present"


class Segments(NamedTuple):
    """The elements of one ragged axis in the flat form, one entry per element.

    Attributes:
        record: the record (index into the selection) each element belongs to: the
            ``segment_ids`` of ``jax.ops.segment_sum(values, record, num_segments=records)``.
        parent: the row of the parent table (the element of the enclosing ragged list, or the
            record for a top-level axis) each element belongs to.
        position: each element's position in its list.
        valid: True for real elements, False for the padding that ``size=`` adds (whose
            ``record`` is the record count, out of range, so ``segment_sum`` drops them).
    """

    record: Any
    parent: Any
    position: Any
    valid: Any


class Flat:
    """Builds ``(values, segments)``: each leaf's gathered rows as they are, per ragged axis
    the record, parent and position of each element (padded to ``size``), and per optional
    subtree its presence in each row of its table, under ``"present" + keypath``."""

    def __init__(self, gathered: dict[str | None, Rows], schema: TreeSchema, size: int | None):
        self.rows = gathered
        self.size = size
        self.segments: dict[str, Any] = {}
        n = gathered[None].count
        records = record_of(schema, gathered)
        for a in schema.tables.axes:
            rows = gathered[a.path]
            assert rows.parent is not None and rows.position is not None
            self.segments[a.path] = Segments(  # int32: JAX's index type without x64
                self._pad(records[a.path].astype(np.int32), n, a.path),
                self._pad(rows.parent.astype(np.int32), gathered[a.table].count, a.path),
                self._pad(rows.position.astype(np.int32), 0, a.path),
                self._pad(np.ones(rows.count, bool), False, a.path),
            )

    def _pad(self, values: np.ndarray, fill: Any, axis: str) -> np.ndarray:
        if self.size is None:
            return values
        if len(values) > self.size:
            raise RaggedLengthError(
                f"the selection holds {len(values)} elements at {axis or 'the root'}, more "
                f"than size={self.size}; raise size, or load fewer records"
            )
        out = np.full((self.size, *values.shape[1:]), fill, values.dtype)
        out[: len(values)] = values
        return out

    def build(self, spec: LayoutNode) -> tuple[Any, dict[str, Any]]:
        return visit(spec, _FlatNode(self), None), self.segments


class _FlatNode(Visitor):
    """The values of a node whose rows are in ``table``, for a :class:`Flat` (which gathers
    the optional subtrees' presence on the way)."""

    def __init__(self, flat: Flat) -> None:
        self.flat = flat

    def leaf(self, node: Leaf, table: str | None) -> Any:
        table = table if node.axis is None else node.axis.path
        values = self.flat.rows[table].values.get((LEAF, node.path))
        if values is None or table is None:
            return values
        return self.flat._pad(values, 0, table)

    def kept(self, node: Kept, table: str | None) -> Any:
        return node.value

    def ragged(self, node: RaggedList, table: str | None) -> Any:
        return None if node.element is None else node.element.visit(self, node.axis.path)

    def optional(self, node: OptionalTree, table: str | None) -> Any:
        present = self.flat.rows[table].values[(PRESENCE, node.path)]
        self.flat.segments[PRESENT + node.path] = (
            present if table is None else self.flat._pad(present, False, table)
        )
        return None if node.inner is None else visit(node.inner, self, table)

    def fixed(self, node: Fixed, table: str | None) -> Any:
        return node.treedef.unflatten([c.visit(self, table) for c in node.children])


# ---- exact records ------------------------------------------------------------------------------


def exact(
    spec: LayoutNode | None, rows: dict[str | None, Rows], table: str | None, count: int
) -> list:
    """The objects of ``spec`` for each of ``count`` gathered rows of ``table``."""
    return visit(spec, _Exact(rows), table, count)


class _Exact(Visitor):
    """The objects of a node for each of ``count`` gathered rows of ``table``, for
    :func:`exact`."""

    def __init__(self, rows: dict[str | None, Rows]) -> None:
        self.rows = rows

    def leaf(self, node: Leaf, table: str | None, count: int) -> list:
        here = table if node.axis is None else node.axis.path
        values = self.rows[here].values.get((LEAF, node.path))
        if values is None:
            return [None] * count  # a column not chosen
        if node.axis is None:
            return [values[i, ...] for i in range(count)]
        return _split(self.rows, node.axis.path, table, values, count)

    def kept(self, node: Kept, table: str | None, count: int) -> list:
        return [node.value] * count

    def ragged(self, node: RaggedList, table: str | None, count: int) -> list:
        axis = node.axis.path
        items = node.element.visit(self, axis, self.rows[axis].count) if node.element else []
        return _split(self.rows, axis, table, items, count)

    def optional(self, node: OptionalTree, table: str | None, count: int) -> list:
        present = self.rows[table].values[(PRESENCE, node.path)]
        inner = visit(node.inner, self, table, count)
        return [v if p else None for v, p in zip(inner, present)]

    def fixed(self, node: Fixed, table: str | None, count: int) -> list:
        children = [c.visit(self, table, count) for c in node.children]
        treedef = node.treedef
        return (
            [treedef.unflatten(list(c)) for c in zip(*children)]
            if children
            else [treedef.unflatten([]) for _ in range(count)]
        )

    def unknown(self, table: str | None, count: int) -> list:
        return [None] * count  # an optional subtree no record has shown


def _split(
    rows: dict[str | None, Rows], axis: str, table: str | None, items: Any, count: int
) -> list:
    """``items`` (one per row of ``axis``'s table) cut into one run per row of ``table``."""
    starts, ends = rows[table].values[(OFFSETS, axis)]
    bounds = np.cumsum(ends - starts)
    cuts = np.concatenate([[0], bounds]).tolist()
    if isinstance(items, np.ndarray):
        return [items[cuts[i] : cuts[i + 1]] for i in range(count)]
    return [list(items[cuts[i] : cuts[i + 1]]) for i in range(count)]


__all__ = ["PRESENT", "Flat", "Padded", "Place", "Segments", "exact"]
