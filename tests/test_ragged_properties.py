"""Property tests of ragged stores over random ragged structures (issue #14), on both
backends: ``store[i]`` is the appended record, padded loads are ``stack``, the segments form
flattens each table in order, ``lengths`` are the records' longest lengths, and appending in
pieces (append, extend, extend_batch of a loaded pair; closed and reopened between pieces)
equals appending once. Structures and records come from
:mod:`pytreestore.testing.ragged_strategies`."""

from __future__ import annotations

import collections
import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jax.tree_util import keystr, tree_flatten_with_path

import pytreestore
from pytreestore import errors
from pytreestore.testing import assert_trees_equal
from pytreestore.testing import ragged_strategies as prs
from tests.conftest import BACKENDS

EXAMPLES = settings(max_examples=25, deadline=None)


@contextlib.contextmanager
def _tmp() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="ragged-prop-"))
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _same(got: Any, want: Any) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    assert_trees_equal(got, want)


Decl = tuple[Any, Any, list[str]]  # like=, ragged=, optional=


def _decl(schema: prs.RaggedSchema) -> Decl:
    return schema.like, schema.ragged, schema.optional


def _create(path: Path, decl: Decl, backend: str, **kw: Any) -> Any:
    like, ragged, optional = decl
    return pytreestore.create(path, like, backend=backend, ragged=ragged, optional=optional, **kw)


def _stack(decl: Decl, records: list[Any], **kw: Any) -> Any:
    like, ragged, optional = decl
    return pytreestore.stack(
        records, like=like, ragged=ragged, optional=optional, as_numpy=True, **kw
    )


@st.composite
def _cases(draw: st.DrawFn, max_records: int = 6) -> tuple[prs.RaggedSchema, list[Any], str]:
    schema = draw(prs.ragged_schemas())
    return schema, draw(prs.ragged_records(schema, 1, max_records)), draw(st.sampled_from(BACKENDS))


# ---- what the records say each table holds -------------------------------------------------------


class _Tables:
    """The flat form of records, computed from the records and the drawn structure: each
    batch leaf's rows, each ragged axis's (record, parent, position) per element, each
    optional subtree's presence per row of its table, and each axis's longest length per
    record."""

    def __init__(self, schema: prs.RaggedSchema, records: list[Any]) -> None:
        self.rows: dict[str, list[Any]] = collections.defaultdict(list)
        self.kinds: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        self.segments: dict[str, tuple[list[int], ...]] = {}
        self.presence: dict[str, list[bool]] = {}
        self.longest: dict[str, list[int]] = {}
        self.counts: dict[str, int] = collections.defaultdict(int)
        self._declare(schema)
        for r, record in enumerate(records):
            for axis in self.longest:
                self.longest[axis].append(0)
            self.walk(schema.template, record, "", "", r, r, True, None)

    def _declare(self, schema: prs.RaggedSchema) -> None:
        for path, part in schema.parts():
            own = isinstance(part, prs.LeafPart) and part.leading == "own"
            if isinstance(part, prs.OptionalPart):
                self.presence[path] = []
            elif isinstance(part, prs.ListPart) or getattr(part, "shared", False) or own:
                self.segments[path] = ([], [], [])
            if isinstance(part, prs.LeafPart):  # the batch has the element where a list was
                self.kinds[path.replace("[*]", "")] = (part.dtype, part.shape)
        self.longest = {axis: [] for axis in self.segments}

    def element(self, axis: str, record: int, parent: int, position: int) -> int:
        for column, value in zip(self.segments[axis], (record, parent, position)):
            column.append(value)
        self.counts[axis] += 1
        return self.counts[axis] - 1

    def length(self, axis: str, record: int, n: int) -> None:
        self.longest[axis][record] = max(self.longest[axis][record], n)

    def walk(
        self, part: Any, value: Any, path: str, bpath: str, r: int, row: int, here: bool, n: Any
    ) -> None:
        """``here``: the subtree is present (else its record-level leaves read zeros);
        ``row``: the row of the table the part lies in; ``n``: a shared leading length."""
        if isinstance(part, prs.OptionalPart):
            self.presence[path].append(here and value is not None)
            self.walk(part.inner, value, path, bpath, r, row, here and value is not None, n)
        elif isinstance(part, prs.LeafPart):
            self.leaf(part, value, path, bpath, r, row, here)
        elif isinstance(part, prs.ListPart):
            items = value if here else []
            self.length(path, r, len(items))
            for j, item in enumerate(items):
                child = self.element(path, r, row, j)
                self.walk(part.element, item, path + "[*]", bpath, r, child, True, None)
        else:
            children = part.values(value) if here else [None] * len(part.children)
            if part.shared and here:
                n = _shared_length(part, value)
                self.length(path, r, n)
                for j in range(n):
                    self.element(path, r, row, j)
            for token, i in part.entries():
                self.walk(
                    part.children[i], children[i], path + token, bpath + token, r, row, here, n
                )

    def leaf(
        self, part: prs.LeafPart, value: Any, path: str, bpath: str, r: int, row: int, here: bool
    ) -> None:
        if part.leading is None:
            self.rows[bpath].append(value if here else np.zeros(part.shape, part.dtype))
            return
        if not here:
            return
        if part.leading == "own":
            self.length(path, r, len(value))
            for j in range(len(value)):
                self.element(path, r, row, j)
        self.rows[bpath].extend(value)

    def values(self, bpath: str) -> np.ndarray:
        dtype, shape = self.kinds[bpath]
        rows = self.rows[bpath]
        return (
            np.stack([np.asarray(x, dtype) for x in rows]) if rows else np.zeros((0, *shape), dtype)
        )


def _shared_length(part: prs.NodePart, value: Any) -> int:
    for leaf, _ in zip(jax.tree.leaves(value), range(1)):
        return int(np.shape(leaf)[0])
    return 0


# ---- store[i] and padded loads -----------------------------------------------------------------


@EXAMPLES
@given(case=prs.ragged_cases(), backend=st.sampled_from(BACKENDS), data=st.data())
def test_records_come_back_and_padded_loads_are_stack(
    case: Any, backend: str, data: st.DataObject
) -> None:
    like, records, ragged, optional = case
    decl = (like, ragged, optional)
    with _tmp() as where:
        with _create(where / "s", decl, backend, chunk_records=2) as store:
            store.extend(records)
        store = pytreestore.open(where / "s", backend=backend)
        assert len(store) == len(records)
        for i, want in enumerate(records):
            _same(store.load(i, as_numpy=True), want)
        for got, want in zip(store.records(as_numpy=True), records):
            _same(got, want)
        _same(store.load(ragged="pad", as_numpy=True), _stack(decl, records))
        index = data.draw(st.lists(st.integers(0, len(records) - 1), min_size=1, max_size=5))
        chosen = [records[i] for i in index]
        _same(store.load(index, as_numpy=True), _stack(decl, chosen))
        got = store.load(index, ragged="pad", pad_to="pow2", as_numpy=True)
        _same(got, _stack(decl, chosen, pad_to="pow2"))


# ---- segments and lengths ---------------------------------------------------------------------


@EXAMPLES
@given(case=_cases(), data=st.data())
def test_segments_flatten_each_table_and_lengths_are_the_longest(
    case: Any, data: st.DataObject
) -> None:
    schema, records, backend = case
    index = data.draw(st.lists(st.integers(0, len(records) - 1), min_size=1, max_size=5))
    chosen = [records[i] for i in index]
    want = _Tables(schema, chosen)
    with _tmp() as where:
        with _create(where / "s", _decl(schema), backend, chunk_records=3) as store:
            for record in records:
                store.append(record)
        store = pytreestore.open(where / "s", backend=backend)
        values, segments = store.load(index, ragged="segments", as_numpy=True)
        lengths = store.lengths(index)
    flat = {keystr(p): leaf for p, leaf in tree_flatten_with_path(values)[0]}
    assert sorted(flat) == sorted(want.kinds)
    for bpath, leaf in flat.items():
        assert_trees_equal(leaf, want.values(bpath), err_msg=f"values at {bpath}")
    assert set(segments) == set(want.segments) | {"present" + p for p in want.presence}
    for axis, (record, parent, position) in want.segments.items():
        seg = segments[axis]
        np.testing.assert_array_equal(seg.record, np.array(record, np.int64), err_msg=axis)
        np.testing.assert_array_equal(seg.parent, np.array(parent, np.int64), err_msg=axis)
        np.testing.assert_array_equal(seg.position, np.array(position, np.int64), err_msg=axis)
        assert np.asarray(seg.valid).all() and len(seg.valid) == len(record)
    for path, present in want.presence.items():
        got = segments["present" + path]
        np.testing.assert_array_equal(got, np.array(present, bool), err_msg=path)
    assert set(lengths) == set(want.longest)
    for axis, longest in want.longest.items():
        assert lengths[axis].dtype == np.int64
        np.testing.assert_array_equal(lengths[axis], np.array(longest, np.int64), err_msg=axis)


# ---- appending in pieces ----------------------------------------------------------------------


@EXAMPLES
@given(case=_cases(max_records=8), data=st.data())
def test_appending_in_pieces_equals_appending_once(case: Any, data: st.DataObject) -> None:
    schema, records, backend = case
    n = len(records)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    bounds = list(zip([0, *cuts], [*cuts, n]))
    with _tmp() as where:
        with _create(where / "once", _decl(schema), backend, chunk_records=2) as once:
            once.extend(records)
        once = pytreestore.open(where / "once", backend=backend)
        _create(where / "pieces", _decl(schema), backend, chunk_records=2).close()
        for start, stop in bounds:
            how = data.draw(st.sampled_from(["append", "extend", "extend_batch", "extend_batch"]))
            with pytreestore.open(where / "pieces", mode="a", backend=backend) as pieces:
                if how == "append":
                    for record in records[start:stop]:
                        pieces.append(record)
                elif how == "extend" or start == stop:
                    pieces.extend(records[start:stop])
                else:
                    pad_to = data.draw(st.sampled_from([None, "pow2", 8]))
                    batch, mask = once.load(list(range(start, stop)), pad_to=pad_to, as_numpy=True)
                    _extend_batch(pieces, batch, mask, records[start:stop])
        pieces = pytreestore.open(where / "pieces", backend=backend)
        assert len(pieces) == n
        for i, want in enumerate(records):
            _same(pieces.load(i, as_numpy=True), want)
        _same(pieces.load(as_numpy=True), once.load(as_numpy=True))
        _same(pieces.load(as_numpy=True), _stack(_decl(schema), records))
        _same(pieces.lengths(), once.lengths())


def _extend_batch(store: Any, batch: Any, mask: Any, records: list[Any]) -> None:
    """``store.extend_batch(batch, mask=mask)``; where the mask cannot tell an optional
    subtree's presence or a list's length (no leaf outside a further ragged axis or optional
    subtree, a documented refusal), nothing is appended and the records are, one by one."""
    before = len(store)
    try:
        store.extend_batch(batch, mask=mask)
    except errors.SchemaMismatchError as err:
        assert "cannot tell at" in str(err) and len(store) == before, err
        store.extend(records)


# ---- declarations a store refuses -------------------------------------------------------------


def _below(schema: prs.RaggedSchema, node: str) -> list[str]:
    """The keypaths strictly below ``node``."""
    return [
        p for p, _ in schema.parts() if p != node and p.startswith(node) and p[len(node)] in ".["
    ]


@settings(max_examples=20, deadline=None)
@given(schema=prs.ragged_schemas(ragged_all=False), data=st.data())
def test_an_optional_subtree_below_a_shared_node_is_refused(
    schema: prs.RaggedSchema, data: st.DataObject
) -> None:
    shared = [p for p, part in schema.parts() if getattr(part, "shared", False)]
    below = [p for s in shared for p in _below(schema, s)]
    assume(below)
    with pytest.raises(errors.RaggedDeclarationError, match="below a node declared ragged"):
        pytreestore.create(
            f"memory://ragged-prop-{uuid.uuid4().hex}",
            schema.like,
            ragged=schema.ragged,
            optional=[*schema.optional, data.draw(st.sampled_from(below))],
        )


@settings(max_examples=10, deadline=None)
@given(schema=prs.ragged_schemas(), empty=st.sampled_from([{}, None, ()]))
def test_a_ragged_list_without_an_array_leaf_is_refused(
    schema: prs.RaggedSchema, empty: Any
) -> None:
    like = (schema.like, [empty])
    ragged = True if schema.ragged_all else [f"[0]{p}" for p in schema.ragged] + ["[1]"]
    optional = [f"[0]{p}" for p in schema.optional]
    with pytest.raises(errors.RaggedDeclarationError, match=r"axis at \[1\] has no array leaf"):
        pytreestore.create(
            f"memory://ragged-prop-{uuid.uuid4().hex}", like, ragged=ragged, optional=optional
        )


def test_segments_of_an_optional_ragged_list_keep_both_entries() -> None:
    store = pytreestore.create(
        "memory://ragged-prop-optional-list",
        {"a": [np.float32(0)]},
        ragged=["['a']"],
        optional=["['a']"],
    )
    store.extend([{"a": [np.float32(1), np.float32(2)]}, {"a": None}])
    _, segments = store.load(ragged="segments", as_numpy=True)
    seg = segments["['a']"]
    assert isinstance(seg, pytreestore.Segments)
    assert seg.record.tolist() == [0, 0]
    assert segments["present['a']"].tolist() == [True, False]
