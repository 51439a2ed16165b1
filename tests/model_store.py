"""The in-memory model of a store that :mod:`tests.test_model_based` drives a real one against.

A :class:`State` is what a store holds at one moment: its columns (a fixed store's leaves,
with dtype, shape and default) and its records, oldest first, buffered ones included. States
never change; an operation makes a new one. A :class:`VersionLog` keeps the state each
version of the store was committed with, and says from the versions' record counts alone
which ones a later append wrote over.

Records are functions of a counter (each appended record takes the next one), so a record
that reads back in the wrong place, or a default read where a value was written, shows.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

import pytreestore
from pytreestore.testing import assert_trees_equal

# ---- a fixed store: nested dicts of columns, evolved by add / drop / rename ---------------------

Path = tuple[str, ...]  # a leaf's keys from the root: ("m", "a") is ['m']['a']
KINDS = (("int16", ()), ("float32", (2,)), ("uint8", ()), ("bool", ()), ("float64", (2, 1)))
NAMES = ("b", "c", "d", "e")


@dataclasses.dataclass(frozen=True)
class Column:
    """One leaf of a fixed store: where it is, its dtype and shape, what older records read."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    default: Any = None

    @property
    def keypath(self) -> str:
        return keypath(self.path)


def keypath(path: Path) -> str:
    return "".join(f"[{k!r}]" for k in path)


def value(column: Column, i: int) -> np.ndarray:
    """Record ``i``'s value of ``column``: differs between records and between columns."""
    salt = zlib.crc32(repr(column.path).encode()) % 97
    if column.dtype == "bool":
        return np.full(column.shape, (i + salt) % 2 == 0, np.bool_)
    number = (i * 3 + salt) % 200 + (0.25 if column.dtype.startswith("float") else 0)
    return np.full(column.shape, number, column.dtype)


FIRST = (Column(("step",), "int32", ()), Column(("m", "a"), "float32", (2,)))


@dataclasses.dataclass(frozen=True)
class State:
    """A store's contents at one moment: columns (None in a ragged store), records, and the
    leaves a ragged store was evolved to hold (:class:`Extra`)."""

    columns: tuple[Column, ...] | None
    rows: tuple[Any, ...]
    extras: tuple[Extra, ...] = ()

    def with_rows(self, rows: Sequence[Any]) -> State:
        return dataclasses.replace(self, rows=tuple(rows))


def fixed_row(columns: Sequence[Column], i: int) -> dict[Path, np.ndarray]:
    return {c.path: value(c, i) for c in columns}


def nest(flat: dict[Path, Any]) -> dict[str, Any]:
    """``{("m", "a"): v}`` -> ``{"m": {"a": v}}``."""
    out: dict[str, Any] = {}
    for path, v in flat.items():
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return out


def fixed_record(columns: Sequence[Column], i: int) -> dict[str, Any]:
    return nest(fixed_row(columns, i))


def fixed_expected(state: State) -> dict[str, Any]:
    """What ``load(as_numpy=True)`` of a fixed store in ``state`` returns."""
    assert state.columns is not None
    flat = {}
    for c in state.columns:
        values = [row[c.path] for row in state.rows]
        flat[c.path] = np.stack(values) if values else np.zeros((0, *c.shape), c.dtype)
    return nest(flat)


def evolved_add(state: State, column: Column) -> State:
    assert state.columns is not None
    rows = [{**row, column.path: np.asarray(column.default)} for row in state.rows]
    return State((*state.columns, column), tuple(rows))


def evolved_drop(state: State, path: Path) -> State:
    assert state.columns is not None
    columns = tuple(c for c in state.columns if c.path != path)
    rows = [{k: v for k, v in row.items() if k != path} for row in state.rows]
    return State(columns, tuple(rows))


def evolved_rename(state: State, old: Path, new: Path) -> State:
    assert state.columns is not None
    columns = tuple(dataclasses.replace(c, path=new) if c.path == old else c for c in state.columns)
    rows = [{(new if k == old else k): v for k, v in row.items()} for row in state.rows]
    return State(columns, tuple(rows))


def droppable(columns: Sequence[Column]) -> list[Path]:
    """Leaves whose parent keeps another child (a dict node is never left empty)."""
    parents = [c.path[:-1] for c in columns]
    return [c.path for c in columns if parents.count(c.path[:-1]) > 1]


def free_names(columns: Sequence[Column], parent: Path) -> list[str]:
    taken = {c.path[-1] for c in columns if c.path[:-1] == parent}
    if parent == ():
        taken.add("m")
    return [n for n in NAMES if n not in taken]


# ---- a ragged store: a ragged list of elements and an optional subtree, learnt later -----------
# Each element is a dict of a scalar ``x`` and a ragged leading axis ``trail`` (float32[n, 2]);
# the optional subtree a dict of ``w`` and a ragged leaf ``cells``. Evolve adds leaves
# (:class:`Extra`) to the record, to the optional subtree or to every element.

RAGGED_DECL: dict[str, Any] = {
    "ragged": ["['elems']", "['elems'][*]['trail']", "['opt']['cells']"],
    "optional": ["['opt']"],
}
PENDING_LIKE: dict[str, Any] = {"i": np.int64(0), "elems": [], "opt": None}
Shape = tuple[tuple[int, ...], int | None]  # trail lengths of each element; cells (None: no opt)

#: where an evolve adds a leaf: the record, the optional subtree, every element of the list
PLACES = ("top", "opt", "elem")
_PREFIX = {"top": "", "opt": "['opt']", "elem": "['elems'][*]"}
_OWN = {"top": {"i", "elems", "opt"}, "opt": {"w", "cells"}, "elem": {"x", "trail"}}
#: the structure that must have been shown (not pending) before a leaf is added at a place
NEEDS_SHOWN = {"opt": "['opt']", "elem": "['elems']"}


@dataclasses.dataclass(frozen=True)
class Extra:
    """A leaf an evolve added to a ragged store: where, its name, dtype, shape and default."""

    place: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    default: Any

    @property
    def keypath(self) -> str:
        return f"{_PREFIX[self.place]}[{self.name!r}]"

    def value(self, i: int) -> np.ndarray:
        return value(Column((self.place, self.name), self.dtype, self.shape), i)


def free_extra_names(extras: Sequence[Extra], place: str) -> list[str]:
    taken = _OWN[place] | {e.name for e in extras if e.place == place}
    return [n for n in NAMES if n not in taken]


def _with(node: dict[str, Any], extras: Sequence[Extra], place: str, i: int) -> dict[str, Any]:
    return {**node, **{e.name: e.value(i) for e in extras if e.place == place}}


def ragged_record(i: int, shape: Shape, extras: Sequence[Extra] = ()) -> dict[str, Any]:
    trails, cells = shape
    elems = [
        _with(
            {"x": np.float32(i + j / 4), "trail": np.full((n, 2), i * 10 + j, np.float32)},
            extras,
            "elem",
            i * 10 + j,
        )
        for j, n in enumerate(trails)
    ]
    opt = None
    if cells is not None:
        opt = _with(
            {"w": np.float32(-i), "cells": (np.arange(cells) + i).astype(np.int16)},
            extras,
            "opt",
            i,
        )
    return _with({"i": np.int64(i), "elems": elems, "opt": opt}, extras, "top", i)


def full_like(extras: Sequence[Extra]) -> dict[str, Any]:
    """A record showing every structure, with ``extras``: ``stack``'s ``like`` for the model."""
    return ragged_record(0, ((1,), 1), extras)


def _at(row: dict[str, Any], place: str, change: Any) -> dict[str, Any]:
    """``row`` with ``change`` applied to the dict(s) at ``place`` (a new row)."""
    if place == "top":
        return change(row)
    if place == "opt":
        return {**row, "opt": None if row["opt"] is None else change(row["opt"])}
    return {**row, "elems": [change(e) for e in row["elems"]]}


def ragged_added(state: State, extra: Extra) -> State:
    default = np.asarray(extra.default)
    rows = [_at(r, extra.place, lambda d: {**d, extra.name: default}) for r in state.rows]
    return State(None, tuple(rows), (*state.extras, extra))


def ragged_dropped(state: State, extra: Extra) -> State:
    def drop(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if k != extra.name}

    rows = [_at(r, extra.place, drop) for r in state.rows]
    return State(None, tuple(rows), tuple(e for e in state.extras if e != extra))


def ragged_renamed(state: State, extra: Extra, new: str) -> State:
    def rename(d: dict[str, Any]) -> dict[str, Any]:
        return {(new if k == extra.name else k): v for k, v in d.items()}

    rows = [_at(r, extra.place, rename) for r in state.rows]
    renamed = dataclasses.replace(extra, name=new)
    return State(None, tuple(rows), tuple(renamed if e == extra else e for e in state.extras))


def shown(rows: Sequence[dict[str, Any]]) -> set[str]:
    """The declared structures that some of ``rows`` show (an element, the optional subtree)."""
    out = set()
    if any(r["elems"] for r in rows):
        out.add("['elems']")
    if any(r["opt"] is not None for r in rows):
        out.add("['opt']")
    return out


def cast(record: Any) -> Any:
    """``record`` as a read with ``cast=True`` gives it: 64-bit leaves as JAX's 32-bit ones."""
    return jax.tree.map(lambda v: np.asarray(v, jax.dtypes.canonicalize_dtype(v.dtype)), record)


# ---- reading a store and comparing it with a state ------------------------------------------------


def check_contents(store: pytreestore.TreeStore, state: State, note: str, exact: bool) -> None:
    """``store`` holds exactly ``state``: its length, every value, dtype and class. A ragged
    store's records are compared one by one where ``exact`` (or where some structure is
    pending), else through the padded load (the lists' lengths are in its mask) and the
    last record."""
    assert len(store) == len(state.rows), f"{note}: len {len(store)}, want {len(state.rows)}"
    last = len(state.rows) - 1
    if state.columns is not None:
        assert set(store.schema.paths) == {c.keypath for c in state.columns}, note
        assert_trees_equal(store.load(as_numpy=True), fixed_expected(state), err_msg=note)
        if state.rows:
            want = nest(state.rows[last])
            assert_trees_equal(store.load(last, as_numpy=True), want, err_msg=f"{note} [{last}]")
            if exact:  # columns= as a mask shaped like a record: one column, as its keypath
                one = sorted(c.keypath for c in state.columns)[0]
                mask = {c.path: c.keypath == one for c in state.columns}
                assert_trees_equal(
                    store.load(columns=nest(mask), as_numpy=True),
                    store.load(columns=one, as_numpy=True),
                    err_msg=f"{note}, a mask selecting {one}",
                )
        return
    pending = set(store.schema.pending)
    assert not pending & shown(state.rows), f"{note}: {pending} pending, yet records show it"
    if state.rows and not pending:
        like = full_like(state.extras)
        want = pytreestore.stack(list(state.rows), like=like, as_numpy=True, **RAGGED_DECL)
        assert_trees_equal(store.load(as_numpy=True), want, err_msg=f"{note}, padded load")
        if exact:  # columns= as a mask shaped like the padded batch: every column
            mask = jax.tree.map(lambda _: True, want[0])
            got = store.load(columns=mask, as_numpy=True)
            assert_trees_equal(got, want, err_msg=f"{note}, a batch-shaped mask of every column")
    if state.rows and not exact:
        got = store.load(last, as_numpy=True)
        assert_trees_equal(got, state.rows[last], err_msg=f"{note}, record {last}")
    if exact or pending:
        got = list(store.records(as_numpy=True))
        assert len(got) == len(state.rows), f"{note}: iterated {len(got)} records"
        for i, (a, b) in enumerate(zip(got, state.rows)):
            assert_trees_equal(a, b, err_msg=f"{note}, record {i}")


# ---- the versions ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Logged:
    """A version as the model knows it: its record count and the state it was committed with."""

    records: int
    state: State
    operation: str | None = None
    checked_gone: bool = False  # its refusal was checked (it never reads again)
    dropped: int = 0  # records released from the front before it (keep_last)

    @property
    def end(self) -> int:
        """Its rows from the first record ever appended: the released ones, then its own."""
        return self.dropped + self.records


class VersionLog:
    """Every version the store ever listed, with the state each holds."""

    def __init__(self) -> None:
        self.versions: dict[int, Logged] = {}
        self.tags: dict[str, int] = {}

    def absorb(self, listed: Sequence[Any], before: State, after: State, main: str | None) -> None:
        """Logs the versions of ``listed`` not seen yet, made by one operation that took the
        store from ``before`` to ``after``: those before its own commit (``main``: the
        truncate's or evolve's; None: every commit is of ``after``) hold ``before``."""
        state = before if main is not None else after
        for v in listed:
            if v.version in self.versions:
                continue
            if v.operation == main:
                state = after
            held = state.with_rows(state.rows[: v.records])
            assert v.records <= len(state.rows), f"version {v.version} holds {v.records} records"
            self.versions[v.version] = Logged(v.records, held, v.operation, dropped=v.dropped)

    def gone(self, number: int) -> bool:
        """Whether a later commit gave up version ``number``'s records: after it the store
        went down to fewer records (a truncate), and a commit after that appended (went up
        again, or released the rows past the truncate: an empty fragment's commit does).
        Counted in rows from the first record ever appended: a ``keep_last`` releases the
        front, which writes over nothing."""
        records = self.versions[number].end
        later = [self.versions[n] for n in sorted(self.versions) if n > number]
        low = None
        for logged in later:
            r = logged.end
            if low is not None and (r > low or logged.operation == "release"):
                return True
            if r < records:
                low = r if low is None else min(low, r)
        return False
