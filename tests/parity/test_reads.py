"""Reads on every kind of store and backend (issue 29's parity matrix): ``store[i]`` loops,
iteration, truncate with ``versions()`` and reads of old versions, and ``repr``.

Every value is compared exactly (structure, list lengths, ``None``, dtypes and values) with
the records that were appended.
"""

from __future__ import annotations

import numpy as np
import pytest

import pytreestore
from pytreestore.errors import VersionNotFoundError
from tests.parity import kinds

MATRIX = [(k, b) for k in kinds.KINDS for b in kinds.BACKENDS]


@pytest.fixture(scope="module", params=MATRIX, ids=[f"{k}-{b}" for k, b in MATRIX])
def filled(request, tmp_path_factory):
    """A closed store of each kind and backend holding 9 records, and those records."""
    name, backend = request.param
    path = tmp_path_factory.mktemp(f"{name}-{backend}") / "store"
    records = kinds.filled(path, name, backend)
    return path, name, backend, records


def test_point_reads(filled):
    path, _, backend, records = filled
    store = pytreestore.open(path, backend=backend)
    for i, want in enumerate(records):
        kinds.assert_same(store[i], want)
    kinds.assert_same(store[-1], records[-1])
    kinds.assert_same(store.load(np.int64(3)), records[3])


def test_iteration(filled):
    path, _, backend, records = filled
    store = pytreestore.open(path, backend=backend)
    kinds.assert_same(list(store), records)
    kinds.assert_same(list(store.records()), records)
    kinds.assert_same(list(store.records(as_numpy=True)), records)


def test_iteration_of_a_writer_sees_its_buffered_records(filled, tmp_path):
    _, name, backend, _ = filled
    store = kinds.create(tmp_path / "w", name, backend)
    records = kinds.records(name, 5)
    store.extend(records[:3])
    store.flush()
    store.append(records[3])
    store.append(records[4])
    kinds.assert_same(list(store), records)
    kinds.assert_same([store[i] for i in range(5)], records)
    store.close()


def test_truncate_versions_and_old_versions(filled, tmp_path):
    _, name, backend, _ = filled
    path = tmp_path / "t"
    records = kinds.filled(path, name, backend)
    store = pytreestore.open(path, "a", backend=backend)
    full = store.version
    store.truncate(5)
    cut = store.version
    kinds.assert_same(list(pytreestore.open(path, backend=backend)), records[:5])
    kinds.assert_same(list(pytreestore.open(path, backend=backend, version=full)), records)
    more = kinds.records(name, 2, seed=1, start=5)
    store.extend(more)
    store.flush()
    listed = {v.version: v for v in store.versions()}
    assert listed[full].records == 9 and not listed[full].readable
    assert listed[cut].records == 5 and listed[cut].readable
    assert listed[store.version].records == 7
    store.close()
    kinds.assert_same(list(pytreestore.open(path, backend=backend)), records[:5] + more)
    kinds.assert_same(list(pytreestore.open(path, backend=backend, version=cut)), records[:5])
    with pytest.raises(VersionNotFoundError, match=f"version {full} of .* is gone"):
        pytreestore.open(path, backend=backend, version=full)[8]


def test_repr(filled):
    path, _, backend, _ = filled
    store = pytreestore.open(path, backend=backend)
    text = repr(store)
    assert text.startswith(f"TreeStore({str(path)!r}, mode='r', records=9, columns=")
    store.close()
    assert "closed" in repr(store)
