"""``columns=`` that select no column are refused by name, by every read alike (one check, in
:class:`pytreestore._read.request.LoadRequest`), on every kind of store and every backend.

Issue 44, item 13: ``records()`` yielded ``[]``, ``batches`` batches, ``load`` a tree of None,
``map`` a raw ``ValueError`` from ``jax.vmap``, a Grain source's ``[0]`` ran without end,
``read_store`` 0 rows. A mask that keeps only a ragged list (an empty list) or only an
optional subtree's presence (None) selects no leaf either: lengths and presence come with
the leaves they shape (``store.lengths()`` reads the lengths alone), so it is refused alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import ArgumentError
from tests.parity import kinds

MESSAGE = "selects no column, and a read loads at least one. Select some of the store's columns: .t"


def _off(tree: Any) -> Any:
    return jax.tree.map(lambda _: False, tree)


def nothing(kind: str, record: Any) -> list[Any]:
    """Every way of selecting no column of a store of ``kind`` (``record``: one of its)."""
    ways: list[Any] = [[], (), _off(record)]
    if kind in ("ragged_list", "nested"):  # the list alone: its offsets, no element leaf
        ways.append(dataclasses.replace(_off(record), agents=[]))
    if kind == "optional":  # the subtree's presence alone
        ways.append(dataclasses.replace(_off(record), storm=None))
    return ways


def reads(store: Any, columns: Any) -> dict[str, Any]:
    """Each read that takes ``columns=``, as a function of no argument."""
    return {
        "load": lambda: store.load(columns=columns),
        "load one": lambda: store.load(0, columns=columns, as_numpy=True),
        "records": lambda: next(iter(store.records(columns=columns))),
        "batches": lambda: next(iter(store.batches(2, columns=columns))),
        "map": lambda: store.map(lambda *r: r[0].t, columns=columns, batch_size=2),
        "grain_source": lambda: store.grain_source(columns=columns)[0],
    }


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_a_selection_of_no_column_is_refused_by_every_read(tmp_path, backend, kind):
    records = kinds.filled(tmp_path / "s", kind, backend, n=6, chunk_records=4)
    store = pytreestore.open(tmp_path / "s", backend=backend)
    for columns in nothing(kind, records[1]):
        for name, read in reads(store, columns).items():
            with pytest.raises(ArgumentError, match=MESSAGE) as caught:
                read()
            assert f"columns={columns!r:.40}" in str(caught.value), (name, columns)
    # a selection of one column still reads it, and the kind's lists with it
    for name, read in reads(store, ".t").items():
        assert read() is not None, name
    got = store.load(columns=".t", as_numpy=True)
    t = got.t if kind == "fixed" else got[0].t
    np.testing.assert_array_equal(t, np.arange(6))


def test_a_writer_refuses_it_before_reading_its_buffer(tmp_path, backend):
    store = kinds.create(tmp_path / "s", "ragged_list", backend)
    store.extend(kinds.records("ragged_list", 3))  # buffered, not yet committed
    with pytest.raises(ArgumentError, match="columns=\\[\\] selects no column"):
        store.load(columns=[])
    assert store.committed == 0  # the refused read flushed nothing
    store.close()


def test_read_store_refuses_it_on_the_driver(tmp_path):
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'ray[data]')")
    from pytreestore.ray import read_store

    records = kinds.filled(tmp_path / "s", "optional", "tensorstore", n=4)
    for columns in nothing("optional", records[0]):
        with pytest.raises(ArgumentError, match=MESSAGE):
            read_store(str(tmp_path / "s"), columns=columns)
