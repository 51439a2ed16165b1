"""Ragged stores on S3 (``moto_server`` on 127.0.0.1), both backends: records, padded loads,
reopening to append, each backend reading the other's store, and a pending structure learnt."""

from __future__ import annotations

import numpy as np
import pytest

import pytreestore
from pytreestore.testing import assert_trees_equal

pytestmark = pytest.mark.s3
pytest_plugins = ("tests.fixtures",)

DECL = {"ragged": ["['p']", "['p'][*]['q']"], "optional": ["['o']"]}


def _record(i: int) -> dict:
    p = [{"x": np.float32(i + j), "q": [np.int16(k) for k in range(j % 3)]} for j in range(i % 4)]
    return {"t": np.int32(i), "p": p, "o": None if i % 2 else {"s": np.float64(i / 3)}}


@pytest.mark.parametrize(("writer", "reader"), [("tensorstore", "zarr"), ("zarr", "tensorstore")])
def test_a_ragged_store_on_s3(s3_server, bucket, writer, reader):
    url, opts = f"s3://{bucket}/ragged-{writer}", s3_server.options
    like = {"t": np.int32(0), "p": [], "o": None}  # structures pending until a record shows them
    store = pytreestore.create(
        url, like, backend=writer, chunk_records=4, storage_options=opts, **DECL
    )
    store.extend(_record(i) for i in range(6))
    store.close()
    with pytreestore.open(url, mode="a", backend=reader, storage_options=opts) as more:
        for i in range(6, 11):
            more.append(_record(i))
    back = pytreestore.open(url, backend=writer, storage_options=opts)
    records = [_record(i) for i in range(11)]
    for i, want in enumerate(records):
        assert_trees_equal(back.load(i, as_numpy=True), want)
    full = {
        "t": np.int32(0),
        "p": [{"x": np.float32(0), "q": [np.int16(0)]}],
        "o": {"s": np.float64(0)},
    }
    want = pytreestore.stack(records, like=full, as_numpy=True, **DECL)
    assert_trees_equal(back.load(as_numpy=True), want)
    assert back.lengths()["['p']"].tolist() == [i % 4 for i in range(11)]
    assert back.verify().ok
