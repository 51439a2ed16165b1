"""Pipelines on every kind of store and backend (issue 29's parity matrix): shuffled
``batches`` (padded with a mask where ragged), ``map``, and ``grain_source`` batched by
Grain's default batch function.

A padded batch is compared exactly with ``pytreestore.stack`` of the same records (found by
their ``t``, the record's index) with the kind's declarations: the padded form is one.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pytreestore
from tests.parity import kinds

MATRIX = [(k, b) for k in kinds.KINDS for b in kinds.BACKENDS]


@pytest.fixture(scope="module", params=MATRIX, ids=[f"{k}-{b}" for k, b in MATRIX])
def filled(request, tmp_path_factory):
    """A closed store of each kind and backend holding 9 records, and those records."""
    name, backend = request.param
    path = tmp_path_factory.mktemp(f"{name}-{backend}") / "store"
    records = kinds.filled(path, name, backend)
    return path, name, backend, records


def stacked(name: str, records: list, pad_to=None):
    """What a padded load of ``records`` gives: ``(batch, mask)``, or the batch of a fixed
    store."""
    kind = kinds.kind(name)
    if kind.is_fixed:
        return pytreestore.stack(records)
    return pytreestore.stack(records, **kind.declarations, like=kinds.like(name), pad_to=pad_to)


def _order(batch, name: str) -> list[int]:
    values = batch if kinds.kind(name).is_fixed else batch[0]
    return np.asarray(values.t).tolist()


@pytest.mark.parametrize("pad_to", [None, [2, 4]])
def test_shuffled_batches(filled, pad_to):
    path, name, backend, records = filled
    store = pytreestore.open(path, backend=backend)
    fixed = kinds.kind(name).is_fixed
    options = {} if fixed or pad_to is None else {"pad_to": pad_to}
    seen = []
    for batch in store.batches(4, shuffle=True, seed=3, **options):
        order = _order(batch, name)
        seen += order
        kinds.assert_same(batch, stacked(name, [records[i] for i in order], options.get("pad_to")))
    assert sorted(seen) == list(range(9)) and seen != list(range(9))
    again = [_order(b, name) for b in store.batches(4, shuffle=True, seed=3, **options)]
    assert [i for order in again for i in order] == seen


@pytest.fixture(scope="module", params=MATRIX, ids=[f"{k}-{b}" for k, b in MATRIX])
def chunked(request, tmp_path_factory):
    """A closed store of each kind and backend holding 20 records in chunks of 2."""
    name, backend = request.param
    path = tmp_path_factory.mktemp(f"chunked-{name}-{backend}") / "store"
    records = kinds.filled(path, name, backend, n=20, chunk_records=2)
    return path, name, backend, records


def test_block_shuffled_batches_resume(chunked):
    """A block shuffle (windows of 4 records: two chunks) on every kind: exact batches, each
    of at most two windows' chunks, and a resumed iterator yields exactly the rest."""
    path, name, backend, records = chunked
    store = pytreestore.open(path, backend=backend)
    options = {"shuffle": True, "seed": 1, "shuffle_window": 4, "epochs": 2}
    if not kinds.kind(name).is_fixed:
        options["pad_to"] = [2, 4]
    every = []
    for batch in store.batches(3, **options):
        order = _order(batch, name)
        every.append(order)
        assert len({i // 2 for i in order}) <= 4
        kinds.assert_same(batch, stacked(name, [records[i] for i in order], options.get("pad_to")))
    assert (
        sorted(list(itertools.chain.from_iterable(every[:7])))
        == list(range(20))
        == sorted(list(itertools.chain.from_iterable(every[7:])))
    )
    it = store.batches(3, **options)
    for _ in range(9):
        next(it)
    state = it.state()
    it.close()
    assert state["shuffle"] == "block"
    assert [_order(b, name) for b in store.batches(3, **options, state=state)] == every[9:]


def _masked_sums(record, mask):
    """Per record: the sum of every real value, and how many real values it has."""
    total, real = jnp.float32(0), jnp.int32(0)
    for leaf, m in zip(jax.tree.leaves(record), jax.tree.leaves(mask)):
        m = jnp.asarray(m)
        m = jnp.broadcast_to(m.reshape(m.shape + (1,) * (leaf.ndim - m.ndim)), leaf.shape)
        total += jnp.sum(jnp.where(m, leaf, 0).astype(jnp.float32))
        real += jnp.sum(m.astype(jnp.int32))
    return {"t": record.t, "total": total, "real": real}


def _python_sums(record) -> tuple[float, int]:
    leaves = [np.asarray(v) for v in jax.tree.leaves(record)]
    return sum(float(v.astype(np.float64).sum()) for v in leaves), sum(v.size for v in leaves)


def test_map(filled):
    path, name, backend, records = filled
    store = pytreestore.open(path, backend=backend)
    if kinds.kind(name).is_fixed:
        got = store.map(lambda r: _masked_sums(r, jax.tree.map(lambda _: True, r)), batch_size=4)
    else:
        got = store.map(_masked_sums, batch_size=4, pad_to=4)
    assert np.asarray(got["t"]).tolist() == list(range(9))
    want = [_python_sums(r) for r in records]
    assert np.asarray(got["real"]).tolist() == [n for _, n in want]
    np.testing.assert_allclose(np.asarray(got["total"]), [s for s, _ in want], rtol=1e-5)


def test_grain_default_batching(filled):
    grain = pytest.importorskip("grain")
    path, name, backend, records = filled
    source = pytreestore.open(path, backend=backend).grain_source()
    pad_to = None
    if not kinds.kind(name).is_fixed:
        lengths = pytreestore.open(path, backend=backend).lengths().values()
        pad_to = max((int(n.max()) for n in lengths), default=None)
    dataset = grain.MapDataset.source(source).shuffle(seed=5).batch(4)
    seen = []
    for batch in dataset:
        order = _order(batch, name)
        seen += order
        kinds.assert_same(batch, stacked(name, [records[i] for i in order], pad_to))
    assert sorted(seen) == list(range(9))
