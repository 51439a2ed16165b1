"""Fragments on every kind of store and backend (issue 29's parity matrix): written by
several processes, committed in one commit, read back exactly, and the fast path taken (a
fragment's chunks placed unchanged: chunk-row folders renamed on local disk, keys copied
inside an OCDBT database) on every table where its rows start at a chunk boundary."""

from __future__ import annotations

import os
from multiprocessing.pool import Pool
from pathlib import Path

import pytest

import pytreestore
from pytreestore._format.ragged import OFFSETS
from pytreestore._fragments import fastpath
from pytreestore._log.evolve_tables import table_schemas
from pytreestore.testing import assert_trees_equal
from tests.parity import kinds

CHUNK = 4
Spans = tuple[tuple[int, int], ...]
#: the fragments' records: (first, count) each; the first starts every table at row 0
SPANS: Spans = ((0, 8), (8, 5), (13, 4))


def _write(args: tuple[str, str, str, int, int]) -> str:
    """A child process's fragment of records ``first .. first + n`` of ``kind``, as JSON."""
    path, kind, backend, first, n = args
    records = kinds.records(kind, n, start=first)
    return pytreestore.write_fragment(path, records, backend=backend).to_json()


def _written(pool: Pool, path: str, kind: str, backend: str, spans: Spans) -> list:
    """The fragments of ``spans``, written by the other processes."""
    texts = pool.map(_write, [(path, kind, backend, a, n) for a, n in spans], chunksize=1)
    return [pytreestore.Fragment.from_json(t) for t in texts]


def _same(store: pytreestore.TreeStore, expected: list) -> None:
    assert len(store) == len(expected)
    for i, record in enumerate(expected):
        assert_trees_equal(store[i], record, err_msg=f"record {i}")
    assert_trees_equal(list(store), expected)


def _row_folders(store: pytreestore.TreeStore, fragment: pytreestore.Fragment) -> list[str]:
    """The keys of the first chunk-row folder of each array-leaf array of ``fragment`` (one
    placed at row 0 of every table), which the fast path renames into the store."""
    return [
        f"{c.key}/c/0"
        for table, sub in table_schemas(store.schema).items()
        for c in sub.columns
        if c.shape and 0 not in c.shape and c.role != OFFSETS and fragment.rows(table)
    ]


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_fragments_from_several_processes_take_the_fast_path(pool, tmp_path, kind, backend):
    path = str(tmp_path / "s")
    store = kinds.create(path, kind, backend, chunk_records=CHUNK)
    frags = _written(pool, path, kind, backend, SPANS)
    folders = _row_folders(store, frags[0])
    assert folders, "every kind has an array leaf the fast path renames"
    root = Path(path)
    local = backend != "ocdbt"
    before = {k: os.stat(root / frags[0].folder / k).st_ino for k in folders} if local else {}
    placed = fastpath.PLACED.copy()
    store.commit_fragments(frags)
    taken = fastpath.PLACED - placed
    if local:  # the same folder (inode): renamed, no chunk copied
        assert {k: os.stat(root / k).st_ino for k in folders} == before
        assert taken["renamed"] >= len(folders)
    else:  # the keys copied inside the database, no chunk decoded
        assert taken["copied"] >= len(folders)
    _same(store, kinds.records(kind, 17))
    assert store.versions()[-1].operation == "append"
    store.close()
    _same(pytreestore.open(path, backend=backend, like=kinds.like(kind)), kinds.records(kind, 17))


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_fragments_after_a_writers_records_are_exact(pool, tmp_path, kind, backend):
    """The store's records first (9: no table ends at a chunk boundary), then fragments,
    one misaligned everywhere: values exact, and the store verifies."""
    path = str(tmp_path / "s")
    expected = kinds.filled(path, kind, backend, n=9, chunk_records=CHUNK)
    store = pytreestore.open(path, "a", backend=backend, like=kinds.like(kind))
    store.append(kinds.record(kind, 9))
    frags = _written(pool, path, kind, backend, ((10, 3), (13, 6)))
    store.commit_fragments(frags)
    _same(store, [*expected, *kinds.records(kind, 10, start=9)])
    assert store.verify().ok
    store.close()
