"""The record blocks of a ragged store's ``store[i]`` loops and iteration: a block's
gathered rows seen as leaf columns, each record's structure told by its offsets and presence
rows, and its records built by the layout of their structure, on the host
(:func:`host_block`) or placed on the device once (:func:`on_device`).

A block's records share a few structures (list lengths, optional subtrees held); the
layouts of :mod:`pytreestore._read.placed` are made once per structure and reused by every
block of the read, so a record costs what a fixed record costs: views of its rows (or one
compiled take on the device) and one unflatten.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from pytreestore._format.ragged import LEAF, OFFSETS, PRESENCE
from pytreestore._format.schema import TreeSchema
from pytreestore._read.build import exact
from pytreestore._read.gather import Rows, record_of
from pytreestore._read.placed import Placed, host_records, layouts_of, structure_keys, tags
from pytreestore._read.request import LoadRequest
from pytreestore._tree.layout import LayoutNode


@dataclasses.dataclass(frozen=True)
class BlockRows:
    """A block's leaf columns (each table's rows of each leaf, numbered as the tags number
    them), where each record's rows start in each, and each record's structure key."""

    host: list[np.ndarray]
    paths: list[str]
    tables: list[str | None]
    starts: np.ndarray
    keys: list[Any]

    @classmethod
    def of(cls, schema: TreeSchema, gathered: dict[str | None, Rows], count: int) -> BlockRows:
        host, paths, tables = [], [], []
        for table, table_rows in gathered.items():
            for key, array in table_rows.values.items():
                if key[0] == LEAF:
                    host.append(array)
                    paths.append(key[1])
                    tables.append(table)
        first = _first_rows(schema, gathered, count)
        starts = np.stack([first[t] for t in tables], axis=1) if tables else np.zeros((count, 0))
        parts = _structure(gathered, first, count)
        keys = structure_keys(parts) if parts else [()] * count
        return cls(host, paths, tables, starts, keys)

    @property
    def single(self) -> frozenset[int]:
        """The columns of the record table (a record holds one row of each)."""
        return frozenset(c for c, t in enumerate(self.tables) if t is None)

    def layouts(self, schema: TreeSchema, use: str) -> dict[Any, Any]:
        """The layouts the read's blocks share for ``use`` ("device" or "host")."""
        return layouts_of(schema, (use, tuple(self.paths), tuple(self.tables)))


def host_block(
    request: LoadRequest,
    spec: LayoutNode,
    gathered: dict[str | None, Rows],
    count: int,
    fallback: Callable[[], list[Any]],
) -> list[Any]:
    """The block's records exactly, as numpy trees whose leaves are views of the gathered
    rows, each built by its structure's layout (:func:`~pytreestore._read.placed.host_records`)."""
    rows = BlockRows.of(request.schema, gathered, count)
    if not rows.host:
        return fallback()
    return host_records(
        rows.host,
        rows.starts,
        rows.keys,
        lambda: _tags(spec, gathered, count),
        rows.single,
        rows.layouts(request.schema, "host"),
        fallback,
    )


def on_device(
    request: LoadRequest, spec: LayoutNode, gathered: dict[str | None, Rows], count: int
) -> Placed | None:
    """The gathered leaf columns on the device, with where each record's rows start in
    them, and each record's tags (its structure, with each leaf's column and rows for
    values), built only when a record's structure is new to the read."""
    rows = BlockRows.of(request.schema, gathered, count)
    if not rows.host:
        return None
    weak = {c.path for c in request.schema.columns if c.weak_type}
    return Placed.of(
        rows.host,
        rows.paths,
        rows.starts,
        lambda: _tags(spec, gathered, count),
        rows.single,
        device=request.device,
        cast=request.cast,
        layouts=rows.layouts(request.schema, "device"),
        weak=[p in weak for p in rows.paths] if weak else None,
        keys=rows.keys,
    )


def _structure(
    gathered: dict[str | None, Rows], first: dict[str | None, np.ndarray], count: int
) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Per table with offsets or presence arrays, each row's lengths and presence flags,
    and the bounds of each record's rows there (None: the record table): what
    :func:`~pytreestore._read.placed.structure_keys` tells records' structures by."""
    parts = []
    for table, table_rows in gathered.items():
        codes = []
        for key, array in table_rows.values.items():
            if key[0] == OFFSETS:
                codes.append(array[1] - array[0])  # (starts, ends): each row's length
            elif key[0] == PRESENCE:
                codes.append(array)
        if codes:
            bounds = None if table is None else np.append(first[table], table_rows.count)
            parts.append((np.stack(codes, axis=1).astype(np.int64), bounds))
    return parts


def _first_rows(
    schema: TreeSchema, gathered: dict[str | None, Rows], count: int
) -> dict[str | None, np.ndarray]:
    """Per table, the row where each record's rows start (a record's rows are consecutive:
    gathered in record order)."""
    records = np.arange(count)
    return {t: np.searchsorted(r, records) for t, r in record_of(schema, gathered).items()}


def _tags(spec: LayoutNode, gathered: dict[str | None, Rows], count: int) -> list[Any]:
    """Each record built with each leaf's values replaced by their tags (column, row)."""
    column = 0
    tagged: dict[str | None, Rows] = {}
    for table, table_rows in gathered.items():
        values = dict(table_rows.values)
        for key, array in table_rows.values.items():
            if key[0] == LEAF:
                values[key] = tags(column, len(array))
                column += 1
        tagged[table] = dataclasses.replace(table_rows, values=values)
    return exact(spec, tagged, None, count)


__all__ = ["BlockRows", "host_block", "on_device"]
