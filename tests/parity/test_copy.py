"""``pytreestore.copy`` on every kind of store (issue 29's parity matrix): across backends,
and with ``pack=`` (each table's leaves packed within the table), loads exactly equal."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore._runtime import RUNTIME
from tests.parity import kinds

PAIRS = list(itertools.permutations(kinds.BACKENDS, 2))


def assert_same(got: Any, want: Any) -> None:
    """``got`` (a loaded record) equals ``want`` exactly: structure, dtypes, shapes, values."""
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    pairs = zip(jax.tree_util.tree_leaves_with_path(got), jax.tree_util.tree_leaves(want))
    for (path, x), y in pairs:
        x, y = np.asarray(x), np.asarray(y)
        assert (x.dtype, x.shape) == (y.dtype, y.shape), jax.tree_util.keystr(path)
        assert np.array_equal(x, y), jax.tree_util.keystr(path)


def assert_holds(path: Path, records: list[Any], backend: str | None = None) -> None:
    """The store at ``path`` holds exactly ``records``: iterated and read by index."""
    store = pytreestore.open(path, backend=backend)
    got = list(store.records(as_numpy=True))
    assert len(got) == len(records)
    for g, r in zip(got, records):
        assert_same(g, r)
    for i in (0, len(records) // 2, len(records) - 1):
        assert_same(jax.tree.map(np.asarray, store[i]), records[i])
    assert store.verify().problems == ()


@pytest.mark.parametrize("src,dst", PAIRS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_copy_across_backends(tmp_path: Path, kind: str, src: str, dst: str) -> None:
    records = kinds.filled(tmp_path / "src", kind, src)
    assert pytreestore.copy(tmp_path / "src", tmp_path / "dst", backend=dst) == len(records)
    assert_holds(tmp_path / "dst", records, backend=dst)
    assert pytreestore.open(tmp_path / "dst").schema.packs == ()


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_copy_packs_every_table(tmp_path: Path, kind: str, backend: str) -> None:
    """pack=True packs the record table's leaves, and each axis table's leaves within that
    table; the copy truncates, appends, and copies back unpacked (and kept packed), exactly."""
    records = kinds.filled(tmp_path / "src", kind, backend, n=21)
    pytreestore.copy(tmp_path / "src", tmp_path / "p", backend=backend, pack=True, chunk_records=4)
    schema = pytreestore.open(tmp_path / "p", backend=backend).schema
    tables = {c.key: c.table for c in schema.columns}
    packed = {p.key: {tables[k] for k, _, _ in p.members} for p in schema.packs}
    assert all(len(t) == 1 for t in packed.values())  # a pack holds one table's leaves
    want = {None} | ({".agents"} if kind in ("ragged_list", "nested") else set())
    assert set().union(*packed.values()) == want
    for p in schema.packs:  # a pack's rows per chunk are its table's
        table = next(iter(packed[p.key]))
        rows = 4 if schema.ragged is None else schema.ragged.chunk_rows(table, 4)
        assert p.chunks[0] == rows
    assert_holds(tmp_path / "p", records, backend=backend)

    more = kinds.records(kind, 6, start=len(records))
    with pytreestore.open(tmp_path / "p", mode="a", backend=backend) as store:
        store.truncate(len(records) - 4)  # cuts a chunk of the packs, then writes over it
        store.extend(more)
    now = records[:-4] + more
    assert_holds(tmp_path / "p", now, backend=backend)

    pytreestore.copy(tmp_path / "p", tmp_path / "u", backend=backend, pack=False)
    assert pytreestore.open(tmp_path / "u", backend=backend).schema.packs == ()
    assert_holds(tmp_path / "u", now, backend=backend)
    pytreestore.copy(tmp_path / "p", tmp_path / "k", backend=backend)  # pack="keep"
    assert pytreestore.open(tmp_path / "k", backend=backend).schema.packs == schema.packs
    assert_holds(tmp_path / "k", now, backend=backend)


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_copy_packs_and_moves_backend_at_once(tmp_path: Path, kind: str) -> None:
    records = kinds.filled(tmp_path / "src", kind, "zarr")
    pytreestore.copy(tmp_path / "src", tmp_path / "p", backend="ocdbt", pack=True)
    assert pytreestore.open(tmp_path / "p").schema.packs != ()
    assert_holds(tmp_path / "p", records)


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_copy_in_many_steps_appends_every_table(
    tmp_path: Path, kind: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy in steps of a few records appends each step's rows of every table (the
    element rows of its records, offsets kept) to the copy, exactly, on every kind."""
    monkeypatch.setattr(RUNTIME.reads, "copy_slice_bytes", 1)  # one source chunk per step
    records = kinds.filled(tmp_path / "src", kind, backend, n=23, chunk_records=3)
    got = pytreestore.copy(tmp_path / "src", tmp_path / "dst", backend=backend, chunk_records=2)
    assert got == 23
    assert_holds(tmp_path / "dst", records, backend=backend)
    assert pytreestore.open(tmp_path / "dst").schema.chunk_records == 2
