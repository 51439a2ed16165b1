"""Padding ragged loads to buckets bounds recompilation: one trace per bucket (issue #14)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import pytreestore

BUCKETS = [4, 8, 16]
LENGTHS = [1, 2, 3, 4, 5, 6, 7, 8]  # record i holds a list of LENGTHS[i] elements


@struct.dataclass
class Point:
    x: Any  # float32[]
    k: Any  # int32[]


@struct.dataclass
class Record:
    step: Any  # int32[]
    v: Any  # float32[3]
    p: Any  # list of Point


def _record(i: int) -> Record:
    points = [Point(np.float32(10 * i + j), np.int32(j)) for j in range(LENGTHS[i])]
    return Record(np.int32(i), np.full(3, i, np.float32), points)


@pytest.fixture(params=["tensorstore", "zarr"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    path = str(tmp_path / "ragged")
    with pytreestore.create(path, _record(0), ragged=[".p"], backend=request.param) as s:
        s.extend(_record(i) for i in range(len(LENGTHS)))
    with pytreestore.open(path, backend=request.param) as s:
        yield s


def test_jit_vmap_traces_once_per_bucket(store: Any) -> None:
    traces = []

    def f(record: Record, mask: Record) -> jax.Array:
        traces.append(record.p.x.shape)  # runs only while tracing
        return jnp.sum(jnp.where(mask.p.x, record.p.x, 0.0)) + record.v.sum()

    step = jax.jit(jax.vmap(f))
    # longest lists 3, 4, 4, 3 (bucket 4) and 5, 8, 6 (bucket 8); three records each
    selections = [[0, 1, 2], [3, 0, 1], [1, 3, 2], [2, 2, 0], [4, 0, 1], [7, 6, 5], [5, 1, 0]]
    for index in selections:
        batch, mask = store.load(index, pad_to=BUCKETS)
        longest = max(LENGTHS[i] for i in index)
        assert batch.p.x.shape == (3, 4 if longest <= 4 else 8)
        got = np.asarray(step(batch, mask))
        want = [sum(10 * i + j for j in range(LENGTHS[i])) + 3 * i for i in index]
        np.testing.assert_allclose(got, want)
    assert traces == [(4,), (8,)]
