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
from pytreestore._tree.layout import Fixed, Kept, LayoutNode, Leaf, OptionalTree, RaggedList
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
        return self.node(spec, Place((np.arange(n),), (n,)), None)

    def node(self, spec: LayoutNode | None, place: Place, table: str | None) -> tuple[Any, Any]:
        if isinstance(spec, Leaf):
            return self.leaf(spec, place, table)
        if isinstance(spec, Kept):
            return spec.value, self.mask(place)
        if isinstance(spec, RaggedList):
            if spec.element is None:
                return None, None
            return self.node(spec.element, self.place(spec.axis.path, place), spec.axis.path)
        if isinstance(spec, OptionalTree):
            if spec.inner is None:
                return None, None
            present = self.rows[table].values[(PRESENCE, spec.path)]
            valid = present if place.valid is None else place.valid & present
            return self.node(spec.inner, dataclasses.replace(place, valid=valid), table)
        assert isinstance(spec, Fixed), spec
        parts = [self.node(c, place, table) for c in spec.children]
        return tuple(spec.treedef.unflatten([p[i] for p in parts]) for i in (0, 1))  # type: ignore[return-value]

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
        return self.node(spec, None), self.segments

    def node(self, spec: LayoutNode | None, table: str | None) -> Any:
        if isinstance(spec, Leaf):
            table = table if spec.axis is None else spec.axis.path
            values = self.rows[table].values.get((LEAF, spec.path))
            if values is None or table is None:
                return values
            return self._pad(values, 0, table)
        if isinstance(spec, Kept):
            return spec.value
        if isinstance(spec, RaggedList):
            return None if spec.element is None else self.node(spec.element, spec.axis.path)
        if isinstance(spec, OptionalTree):
            present = self.rows[table].values[(PRESENCE, spec.path)]
            self.segments[PRESENT + spec.path] = (
                present if table is None else self._pad(present, False, table)
            )
            return None if spec.inner is None else self.node(spec.inner, table)
        assert isinstance(spec, Fixed), spec
        return spec.treedef.unflatten([self.node(c, table) for c in spec.children])


# ---- exact records ------------------------------------------------------------------------------


def exact(
    spec: LayoutNode | None, rows: dict[str | None, Rows], table: str | None, count: int
) -> list:
    """The objects of ``spec`` for each of ``count`` gathered rows of ``table``."""
    if isinstance(spec, Leaf):
        here = table if spec.axis is None else spec.axis.path
        values = rows[here].values.get((LEAF, spec.path))
        if values is None:
            return [None] * count  # a column not chosen
        if spec.axis is None:
            return [values[i, ...] for i in range(count)]
        return _split(rows, spec.axis.path, table, values, count)
    if isinstance(spec, Kept):
        return [spec.value] * count
    if isinstance(spec, RaggedList):
        axis = spec.axis.path
        items = exact(spec.element, rows, axis, rows[axis].count) if spec.element else []
        return _split(rows, axis, table, items, count)
    if isinstance(spec, OptionalTree):
        present = rows[table].values[(PRESENCE, spec.path)]
        inner = exact(spec.inner, rows, table, count) if spec.inner else [None] * count
        return [v if p else None for v, p in zip(inner, present)]
    assert isinstance(spec, Fixed), spec
    children = [exact(c, rows, table, count) for c in spec.children]
    treedef = spec.treedef
    return (
        [treedef.unflatten(list(c)) for c in zip(*children)]
        if children
        else [treedef.unflatten([]) for _ in range(count)]
    )


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
