"""Placing fragments on local disk (pytreestore/_log/placing.py): chunk-row folders of
array leaves renamed into the store under an intent record, chunk files of scalar leaves
hard-linked, and the intent settled after a failure: folders moved back while the store is
still at the version the commit followed, never after."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import FRAGMENTS_DIR, PLACING_KEY
from pytreestore._log import committer, placing, versions
from pytreestore._runtime import RUNTIME
from pytreestore.backends import _links
from tests.test_fragments import CHUNK, batch, make, same_records

pytestmark = pytest.mark.plain_files


def _rows(path: str, fragment: pytreestore.Fragment) -> dict[str, int]:
    """The inode of every chunk-row folder (array leaves) and chunk file (scalar leaves) of a
    fragment, by its key below the fragment's folder."""
    root = Path(path) / fragment.folder
    found = {}
    for c in (root / "p" / "v" / "c", root / "v" / "c", root / "x" / "c", root / "p" / "x" / "c"):
        for entry in c.iterdir():
            found[str(entry.relative_to(root))] = entry.stat().st_ino
    return found


def _in_store(key: str, first_row: int) -> str:
    column, _, row = key.partition("/c/")
    return f"{column}/c/{int(row) + first_row}"


def test_array_rows_are_moved_and_scalar_chunks_linked(path, tmp_path, backend):
    store = make(path, backend, 4)
    frags = [
        pytreestore.write_fragment(path, batch(s, n), backend=backend) for s, n in ((4, 4), (8, 6))
    ]
    before = [_rows(path, f) for f in frags]
    assert len(before[1]) == 8  # 4 columns, 2 chunk rows
    store.commit_fragments(frags)
    for found, first in zip(before, (1, 2)):
        for key, inode in found.items():
            placed = Path(path) / _in_store(key, first)
            assert placed.stat().st_ino == inode, key  # the same folder or file: no byte copied
            assert placed.is_dir() == ("/v/" in f"/{key}")  # v and p.v are array leaves
    assert not (Path(path) / PLACING_KEY).exists()
    same_records(store, make(str(tmp_path / "e"), backend, 14))
    store.close()
    assert pytreestore.open(path, backend=backend).verify().ok


def test_a_failed_commit_moves_the_rows_back(path, tmp_path, backend, monkeypatch):
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, batch(4, 8), backend=backend)
    before = _rows(path, f)

    def fail(self, *args, **kwargs):
        assert (Path(path) / PLACING_KEY).exists()  # the intent, while the rows are moved
        raise errors.StorageError("disk full (injected)")

    with monkeypatch.context() as patched:
        patched.setattr(committer.Committer, "advance", fail)
        with pytest.raises(errors.StorageError, match="injected"):
            store.commit_fragments([f])
    assert _rows(path, f) == before  # every row folder back in its fragment
    assert not (Path(path) / PLACING_KEY).exists() and len(store) == 4
    store.commit_fragments([f])
    same_records(store, make(str(tmp_path / "e"), backend, 12))


@pytest.mark.parametrize("damage", ["row folder gone", "chunk gone", "row is a file"])
def test_a_damaged_chunk_row_refuses_the_commit_and_moves_nothing(path, backend, damage):
    store = make(path, backend, 4)
    whole = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    broken = pytreestore.write_fragment(path, batch(8, 4), backend=backend)
    before = _rows(path, whole)
    row = Path(path) / broken.folder / "p" / "v" / "c" / "0"
    for chunk in row.rglob("*"):
        if chunk.is_file():
            chunk.unlink()
    if damage != "chunk gone":
        for folder in sorted(row.rglob("*"), reverse=True):
            folder.rmdir()
        row.rmdir()
    if damage == "row is a file":
        row.write_bytes(b"not a folder")
    with pytest.raises(errors.FragmentError, match=f"fragment {broken.id} is incomplete"):
        store.commit_fragments([whole, broken])
    assert _rows(path, whole) == before and len(store) == 4
    assert not (Path(path) / PLACING_KEY).exists()
    store.commit_fragments([whole])
    assert store.load(as_numpy=True)["x"].tolist() == list(range(8))
    store.close()
    assert pytreestore.open(path, backend=backend).verify().ok


def _place_by_hand(path: str, store: pytreestore.TreeStore, fragment, base: int) -> None:
    """What a commit of ``fragment`` does before its commit record, as a crash leaves it."""
    start = len(store) // CHUNK
    moves = [(f"{fragment.folder}/{key}/c/0", f"{key}/c/{start}") for key in ("v", "p/v")]
    placing.place_local(path, base, moves, [], [("0",), ("0/0",)])


def test_settle_moves_back_only_while_the_store_is_at_its_base(path, backend):
    store = make(path, backend, 4)
    f = pytreestore.write_fragment(path, batch(4, 4), backend=backend)
    before = _rows(path, f)
    _place_by_hand(path, store, f, store.version)
    assert not (Path(path) / f.folder / "v" / "c" / "0").exists()
    store.close()
    again = pytreestore.open(path, "a", backend=backend)  # the writer after a crash
    assert _rows(path, f) == before and not (Path(path) / PLACING_KEY).exists()
    again.commit_fragments([f])
    assert again.load(as_numpy=True)["x"].tolist() == list(range(8))
    g = pytreestore.write_fragment(path, batch(8, 4), backend=backend)
    _place_by_hand(path, again, g, again.version - 1)  # a commit came after its base
    again.close()
    last = pytreestore.open(path, "a", backend=backend)
    assert not (Path(path) / PLACING_KEY).exists()
    assert not (Path(path) / g.folder / "v" / "c" / "0").exists()  # never moved back
    with pytest.raises(errors.FragmentError, match="is incomplete"):
        last.commit_fragments([g])
    assert len(last) == 8 and last.verify().ok


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"base": "one", "moves": []}', "base is not an integer"),
        ('{"base": 1}', "'moves'"),
        ('{"base": 1, "moves": [["../../etc", "v/c/0"]]}', "leaves a fragment's"),
        ('{"base": 1, "moves": [[".pytreestore/fragments/a/v/c/0", "/tmp/x"]]}', "leaves"),
        ('{"base": 1, "moves": [[".pytreestore/fragments/a/v/c/0", ".pytreestore/x"]]}', "leaves"),
        ('{"base": 1, "moves": [[".pytreestore/fragments/a/v/c/0", "v"]]}', "leaves"),
        ('{"base": 1, "moves": [[".pytreestore/fragments/a/v/c/0", "x/c/0"]]}', "leaves"),
        ('{"base": 1, "moves": [[".pytreestore/fragments/a/v", "v"]]}', "leaves"),
        ('{"base": 1, "moves": [[".pytreestore/fragments/a/v/c/x", "v/c/1"]]}', "leaves"),
        ("[1", "Expecting"),
    ],
)
def test_a_damaged_intent_record_is_refused(path, backend, text, why):
    make(path, backend, 4).close()
    (Path(path) / PLACING_KEY).write_text(text)
    with pytest.raises(errors.CorruptStoreError, match=re.escape("delete it to open the store")):
        pytreestore.open(path, "a", backend=backend)
    with pytest.raises(errors.CorruptStoreError, match=re.escape(why)):
        pytreestore.open(path, "a", backend=backend)
    assert len(pytreestore.open(path, backend=backend)) == 4  # readers never look at it
    (Path(path) / PLACING_KEY).unlink()
    assert len(pytreestore.open(path, "a", backend=backend)) == 4


def test_a_forged_intent_never_moves_committed_columns_away(path, backend):
    """An intent record edited to move a whole column (whose fragment folder was made to
    look like a move's source) is refused as damaged, not undone: every record stays."""
    store = make(path, backend, 4)
    base = store.version
    store.close()
    source = f"{FRAGMENTS_DIR}/a/v/c/0"
    (Path(path) / source).parent.mkdir(parents=True)
    (Path(path) / PLACING_KEY).write_text(json.dumps({"base": base, "moves": [[source, "v"]]}))
    with pytest.raises(errors.CorruptStoreError, match="leaves a fragment's or a column's"):
        pytreestore.open(path, "a", backend=backend)
    assert (Path(path) / "v" / "zarr.json").exists()
    (Path(path) / PLACING_KEY).unlink()
    with pytreestore.open(path, "a", backend=backend) as again:
        np.testing.assert_array_equal(again.load(as_numpy=True)["v"], batch(0, 4)["v"])
        assert again.verify().ok


def test_a_destination_already_there_gets_the_files_linked(tmp_path):
    root = tmp_path
    for name in ("f/x/c/0", "f/x/c/1", "x/c/5", "x/c/6"):
        (root / name).mkdir(parents=True)
    (root / "f/x/c/0/0").write_bytes(b"row0")
    (root / "f/x/c/1/0").write_bytes(b"row1")
    (root / "x/c/6/9").write_bytes(b"left past a commit")
    moves = [("f/x/c/0", "x/c/5"), ("f/x/c/1", "x/c/6")]
    placing.place_local(str(root), 3, moves, [], [("0",), ("0",)])
    assert not (root / "f/x/c/0").exists()  # moved onto an empty folder
    assert (root / "x/c/5/0").read_bytes() == b"row0"
    assert (root / "f/x/c/1/0").read_bytes() == b"row1"  # linked: the fragment keeps it
    assert (root / "x/c/6/0").stat().st_ino == (root / "f/x/c/1/0").stat().st_ino
    intent = json.loads((root / PLACING_KEY).read_text())
    assert intent == {"base": 3, "moves": [list(m) for m in moves]}
    schema = json.loads((Path(pytreestore.__file__).parent / "schema.json").read_text())
    jsonschema.validate(intent, {**schema["$defs"]["placing"], "$defs": schema["$defs"]})
    placing.undo(str(root), intent["moves"])
    assert (root / "f/x/c/0/0").read_bytes() == b"row0" and not (root / "x/c/5").exists()
    assert (root / "x/c/6/0").read_bytes() == b"row1"  # a linked folder is left as it is


def test_many_folders_are_synced_in_one_call(tmp_path):
    folders = set()
    pairs = []
    for i in range(RUNTIME.writes.few_folders + 8):
        (tmp_path / "f" / str(i)).mkdir(parents=True)
        (tmp_path / "f" / str(i) / "0").write_bytes(b"x")
        pairs.append((f"f/{i}/0", f"x/{i}/0"))
    _links.link_all(str(tmp_path), pairs, folders)
    assert len(folders) > RUNTIME.writes.few_folders
    _links.sync_folders(folders)  # one syncfs on Linux, else each folder
    assert os.listdir(tmp_path / "x" / "3") == ["0"]


def test_ocdbt_removes_fragments_in_the_commit(path, monkeypatch):
    store = make(path, "ocdbt", 4)
    f = pytreestore.write_fragment(path, batch(4, 4))
    prefix = ".pytreestore/fragments/"
    with monkeypatch.context() as patched:
        patched.setattr(versions, "trim", _raise_injected)  # after the commit record
        with pytest.raises(errors.StorageError, match="injected"):
            store.commit_fragments([f])  # the transaction commits nothing
    assert len(store._backend.list_keys(prefix)) > 2 and len(store) == 4
    store.commit_fragments([f])
    assert store._backend.list_keys(prefix) == []
    np.testing.assert_array_equal(store.load(as_numpy=True)["v"], batch(0, 8)["v"])


@pytest.mark.parametrize("sizes", [(5, 3), (5, 3, 6), (2, 5, 4)])
def test_ocdbt_commits_a_fragment_written_into_a_copied_chunk(path, sizes):
    """An aligned fragment whose last chunk is partly filled (its key copied into the store)
    followed by one whose rows are rewritten into that chunk, in one OCDBT transaction: the
    commit completes (it spun forever with TensorStore's key copy) and reads back exactly."""
    store = make(path, "ocdbt", 4)
    frags, at = [], 4
    for n in sizes:
        frags.append(pytreestore.write_fragment(path, batch(at, n)))
        at += n
    done: list[BaseException | None] = []

    def commit() -> None:
        try:
            store.commit_fragments(frags)
            done.append(None)
        except BaseException as err:  # handed to the test's thread
            done.append(err)

    worker = threading.Thread(target=commit, daemon=True)
    worker.start()
    worker.join(300)  # a guard against the hang, not a timing
    assert done == [None], done or "commit_fragments did not return"
    np.testing.assert_array_equal(store.load(as_numpy=True)["v"], batch(0, at)["v"])
    assert store.load(as_numpy=True)["x"].tolist() == list(range(at))
    assert store.verify().ok
    store.close()
    assert pytreestore.open(path).load(as_numpy=True)["x"].tolist() == list(range(at))


def _raise_injected(*args: object) -> None:
    raise errors.StorageError("storage failed (injected)")
