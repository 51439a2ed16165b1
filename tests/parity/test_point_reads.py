"""``store[i]`` in a loop, ``load(i)`` and iteration on every kind of store and backend: each
record comes back exactly as appended, as numpy and as ``jax.Array`` leaves (issue 29).

A ragged store's ``store[i]`` loop takes each record from one device copy of its block's
rows by one compiled call (``pytreestore._read.placed``), as a fixed store's does; these
tests check that the records it builds are the records appended, leaf for leaf.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore._runtime import RUNTIME
from tests.conftest import diagonal, tiered
from tests.parity import kinds

N = 80  # past JIT_MIN (64): the loop's block is placed on the device
#: every kind on every backend (``make test-long``); ``make test`` runs each kind on one backend,
#: the backends in turn, a different one in each of the two tests of the grid (the reads of a
#: kind and the bytes of a backend meet in ten of the fifteen cells)
GRID = [(k, b) for k in kinds.KINDS for b in kinds.BACKENDS]


def _same(got: Any, want: Any, *, jax_leaves: bool) -> None:
    g, gdef = jax.tree_util.tree_flatten(got, is_leaf=lambda x: x is None)
    w, wdef = jax.tree_util.tree_flatten(want, is_leaf=lambda x: x is None)
    assert gdef == wdef
    for a, b in zip(g, w, strict=True):
        if b is None:
            assert a is None
            continue
        assert isinstance(a, jax.Array) == jax_leaves, type(a)
        a = np.asarray(a)
        assert a.dtype == np.asarray(b).dtype and a.shape == np.shape(b)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("kind", "backend"), tiered(GRID, diagonal(kinds.KINDS, kinds.BACKENDS)))
def test_loop_of_store_getitem_gives_each_record_exactly(tmp_path, kind, backend):
    recs = kinds.filled(tmp_path / "s", kind, backend, n=N)
    with pytreestore.open(tmp_path / "s") as store:
        for i in range(N):  # sequential: served from read-ahead blocks
            _same(store[i], recs[i], jax_leaves=True)
        for i in (N - 1, 3, 40):  # random: each read alone
            _same(store.load(i, as_numpy=True), recs[i], jax_leaves=False)
            _same(store[i], recs[i], jax_leaves=True)
        for got, want in zip(store.records(as_numpy=True), recs, strict=True):
            _same(got, want, jax_leaves=False)
        for got, want in zip(store, recs, strict=True):
            _same(got, want, jax_leaves=True)


@pytest.mark.parametrize("kind", ["ragged_list", "nested"])
def test_short_blocks_place_each_record_from_the_host(tmp_path, kind):
    """A block of under 64 records compiles nothing; its records are as exact."""
    recs = kinds.filled(tmp_path / "s", kind, "tensorstore", n=20)
    with pytreestore.open(tmp_path / "s") as store:
        for i in range(20):
            _same(store[i], recs[i], jax_leaves=True)
        for got, want in zip(store, recs, strict=True):
            _same(got, want, jax_leaves=True)


@pytest.mark.parametrize("kind", ["ragged_list", "nested", "ragged_axis"])
def test_loop_past_the_compiled_plans_places_from_the_host(tmp_path, kind, monkeypatch):
    """With no plan left to compile, each record is placed leaf by leaf, just as exactly."""
    from pytreestore._read import placed as _placed

    monkeypatch.setattr(_placed, "_plans", set())
    monkeypatch.setattr(RUNTIME.caches, "placement_plans", 0)
    recs = kinds.filled(tmp_path / "s", kind, "tensorstore", n=N)
    with pytreestore.open(tmp_path / "s") as store:
        for i in range(N):
            _same(store[i], recs[i], jax_leaves=True)


def test_placed_takes_scalar_and_array_leaves_by_their_tags():
    from pytreestore._read import placed as _placed

    host = [np.arange(10, 14, dtype=np.int32), np.arange(12, dtype=np.float32).reshape(6, 2)]
    tags = [[_placed.tag(0, 1), _placed.tag(1, np.array([2, 3, 4]))]]
    starts = np.array([[1, 2]])  # the record's first row in each column's table
    rows = _placed.Placed.of(
        host, [".a", ".b"], starts, lambda: tags, frozenset({0}), device=None, cast=False
    )
    assert rows is not None
    got = rows.record(0)
    assert got is not None
    assert int(got[0]) == 11 and got[0].shape == ()
    np.testing.assert_array_equal(np.asarray(got[1]), host[1][2:5])


def test_placed_takes_each_of_several_array_leaves_from_its_own_column():
    """Six array leaves (ragged leading axes) of one row each: each takes its own rows (the
    k-th leaf's output was looked up past the padded rows of the arrays before it)."""
    from pytreestore._read import placed as _placed

    host = [np.arange(c * 10, c * 10 + 3, dtype=np.int32) for c in range(6)]
    tags = [[_placed.tag(c, np.array([1])) for c in range(6)]]
    starts = np.zeros((1, 6), np.int64)
    rows = _placed.Placed.of(
        host,
        [f"[{c}]" for c in range(6)],
        starts,
        lambda: tags,
        frozenset(),
        device=None,
        cast=False,
    )
    assert rows is not None
    got = rows.record(0)
    assert got is not None
    assert [np.asarray(g).tolist() for g in got] == [[c * 10 + 1] for c in range(6)]


def test_point_read_of_a_record_with_an_empty_list_reads_no_rows(tmp_path, monkeypatch):
    """A table with no rows selected (an empty list) is not read at all: a read of no rows
    still cost a backend call (through TensorStore, a few hundred us) on every such load."""
    from pytreestore.backends._tensorstore.backend import TensorStoreBackend

    recs = kinds.filled(tmp_path / "s", "ragged_list", "tensorstore", n=N)
    empty = next(i for i, r in enumerate(recs) if not r.agents)
    calls: list[Any] = []
    read = TensorStoreBackend.read

    def counted(self: Any, keys: Any, index: Any, records: int) -> Any:
        calls.append(index)
        return read(self, keys, index, records)

    with pytreestore.open(tmp_path / "s") as store:
        _same(store.load(empty, as_numpy=True), recs[empty], jax_leaves=False)  # warms the cache
        monkeypatch.setattr(TensorStoreBackend, "read", counted)
        _same(store.load(empty, as_numpy=True), recs[empty], jax_leaves=False)
    # the record's offsets may be read (where the direct reader skips the cache), never a
    # table's empty selection
    assert not [index for index in calls if len(np.arange(N + 1)[index]) == 0], calls


@pytest.mark.parametrize("kind", ["ragged_list", "ragged_axis", "optional", "nested"])
def test_later_blocks_take_records_by_the_layouts_of_earlier_ones(tmp_path, kind, monkeypatch):
    """Records of a structure met in an earlier block are taken by the layout made then (no
    tags built again), and come back exactly, whatever their start rows in the new block."""
    from pytreestore._read import ahead as _load

    monkeypatch.setattr(RUNTIME.reads, "iter_block", 64)
    built: list[int] = []
    tags = _load._tags
    monkeypatch.setattr(_load, "_tags", lambda *a: built.append(1) or tags(*a))
    n = 4 * 64
    recs = kinds.filled(tmp_path / "s", kind, "tensorstore", n=n)
    with pytreestore.open(tmp_path / "s") as store:
        for i in range(n):
            _same(store[i], recs[i], jax_leaves=True)
        first = len(built)
        assert 1 <= first <= 4
        for i in range(n):  # the same blocks read again: every structure has its layout
            _same(store[i], recs[i], jax_leaves=True)
        assert len(built) == first


#: ragged leading axes added beside each kind's own leaves: one axis shared by two leaves
#: (``['nodes']``) and two axes of their own (``['edges']``, ``['senders']``)
AXES = ["['nodes']", "['edges']", "['senders']"]


def _with_axes(kind: str, i: int) -> dict[str, Any]:
    """Record ``i`` of ``kind`` beside several ragged leading axes: of 1 to 4 rows (one
    compiled plan serves them), none in every 7th record and one in the next."""
    rng = np.random.default_rng([7, i])
    n, m, k = (int(c) for c in rng.integers(1, 5, 3))
    if i % 7 < 2:
        n = m = k = i % 7
    return {
        "step": kinds.record(kind, i),
        "nodes": {
            "z": rng.integers(1, 9, n).astype(np.int32),
            "pos": rng.standard_normal((n, 3)).astype(np.float32),
        },
        "edges": rng.integers(-3, 3, m).astype(np.int8),
        "senders": rng.integers(0, 50, k).astype(np.int32),
    }


@pytest.mark.parametrize(
    ("kind", "backend"), tiered(GRID, diagonal(kinds.KINDS, kinds.BACKENDS, 1))
)
def test_several_ragged_axes_in_a_loop_and_iteration(tmp_path, kind, backend, monkeypatch):
    """Records with several ragged leading axes (issue 44, item 7): the k-th array leaf of a
    record's gather was looked up past the rows of the arrays before it, so ``store[i]`` in a
    loop and iteration raised IndexError. Blocks cross many chunks; every record comes back
    exactly."""
    from pytreestore._read import placed as _placed

    monkeypatch.setattr(_placed, "_plans", set())  # plans to compile, whatever ran before
    n = 64 + 2  # past JIT_MIN (64): the loop's block is placed on the device (66 failed unfixed)
    recs = [_with_axes(kind, i) for i in range(n)]
    ragged = [f"['step']{k}" for k in kinds.kind(kind).ragged] + AXES
    optional = [f"['step']{k}" for k in kinds.kind(kind).optional]
    like = {**_with_axes(kind, 2), "step": kinds.like(kind)}
    with pytreestore.create(
        tmp_path / "s", like, ragged=ragged, optional=optional, backend=backend, chunk_records=8
    ) as store:
        store.extend(recs[: n // 2])
        for r in recs[n // 2 :]:
            store.append(r)
    with pytreestore.open(tmp_path / "s", backend=backend) as store:
        for i in range(n):
            _same(store[i], recs[i], jax_leaves=True)
        assert _placed._plans  # the records were taken by compiled gathers
        for i in range(n):
            _same(store.load(i, as_numpy=True), recs[i], jax_leaves=False)
        for got, want in zip(store, recs, strict=True):
            _same(got, want, jax_leaves=True)
        for got, want in zip(store.records(as_numpy=True), recs, strict=True):
            _same(got, want, jax_leaves=False)


@pytest.mark.parametrize("kind", ["ragged_list", "ragged_axis", "optional", "nested"])
def test_iteration_as_numpy_builds_records_by_shared_layouts(tmp_path, kind, monkeypatch):
    """``records(as_numpy=True)`` builds each record by its structure's layout (views of its
    rows, one unflatten): exact records, and tags only for structures new to the read."""
    from pytreestore._read import ahead as _load

    monkeypatch.setattr(RUNTIME.reads, "iter_block", 64)
    built: list[int] = []
    tags = _load._tags
    monkeypatch.setattr(_load, "_tags", lambda *a: built.append(1) or tags(*a))
    n = 4 * 64
    recs = kinds.filled(tmp_path / "s", kind, "tensorstore", n=n)
    with pytreestore.open(tmp_path / "s") as store:
        for got, want in zip(store.records(as_numpy=True), recs, strict=True):
            _same(got, want, jax_leaves=False)
        first = len(built)
        assert first <= 4
        for got, want in zip(store.records(as_numpy=True), recs, strict=True):
            _same(got, want, jax_leaves=False)
        assert len(built) == first  # every structure has its layout now


def test_structure_keys_tell_records_apart_by_lengths_and_presence():
    from pytreestore._read import placed as _placed

    record_table = np.array([[2, 1], [2, 0], [2, 1]])  # per record: a length, a presence
    axis = np.array([[1], [3], [1], [3], [3], [1]])  # per element: an inner list's length
    bounds = np.array([0, 2, 4, 6])  # each record's elements
    keys = _placed.structure_keys([(record_table, None), (axis, bounds)])
    assert keys[0] != keys[1] and keys[0] != keys[2] and keys[1] != keys[2]
    same = _placed.structure_keys([(record_table[[0, 0]], None)])
    assert same[0] == same[1]
