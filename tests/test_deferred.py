"""A reader parses its schema on first use (pytreestore/_spec.py, open()'s reader path).

``open(path)`` reads the root ``zarr.json`` and the commit record and checks the format
version; parsing, validating and binding the schema wait for the first read, ``schema`` or
``repr``. These tests pin down what moves (errors of the parse, on first use, every time until
it succeeds) and what does not (format version, commit record, writers, older versions).
"""

from __future__ import annotations

import json
import pickle
import re
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format import validate as _validate
from pytreestore._spec import Deferred
from tests import trees
from tests.test_misuse import run_in_child

LIKE = {"a": {"x": np.zeros(3, np.float32), "y": np.int32(0)}, "b": np.float32(0)}


def _record(i: int) -> dict:
    return {"a": {"x": np.full(3, i, np.float32), "y": np.int32(i)}, "b": np.float32(i / 2)}


def _store(path: Path, backend: str, n: int = 6, like=LIKE, record=_record) -> Path:
    with pytreestore.create(path, like, chunk_records=4, backend=backend) as store:
        store.extend(record(i) for i in range(n))
    _validate.forget_validated()
    return path


def _edit_root(path: Path, backend: str, edit) -> None:
    """Rewrites the root zarr.json through the store's backend (OCDBT keeps it inside)."""
    engine = pytreestore.backends.get_backend(backend)(
        pytreestore._location.Location.parse(path, None)
    )
    try:
        engine.write_bytes("zarr.json", edit(engine.read_bytes("zarr.json")))
    finally:
        engine.close()
    _validate.forget_validated()


def _parses(monkeypatch) -> list[int]:
    """Counts the schema parses of this process (each open of a reader that uses it)."""
    calls: list[int] = []
    real = _validate.load_schema

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_validate, "load_schema", counted)
    return calls


def test_deferred_makes_once_and_retries_after_a_failure():
    attempts = []

    def make():
        attempts.append(1)
        if len(attempts) == 1:
            raise errors.CorruptStoreError("first attempt fails")
        return ("schema", "backend")

    deferred = Deferred(make)
    assert not deferred.done
    with pytest.raises(errors.CorruptStoreError, match="first attempt fails"):
        deferred.get()
    assert deferred.get() == ("schema", "backend")
    assert deferred.get() == ("schema", "backend")
    assert len(attempts) == 2 and deferred.done
    assert Deferred.ready(1, 2).get() == (1, 2)


def test_open_parses_nothing_until_first_use(tmp_path, backend, monkeypatch):
    path = _store(tmp_path / "s", backend)
    calls = _parses(monkeypatch)
    store = pytreestore.open(path)
    assert len(store) == 6 and store.committed == 6 and calls == []
    np.testing.assert_array_equal(store.load(as_numpy=True)["a"]["y"], np.arange(6))
    assert calls == [1]
    assert store[5]["b"] == 2.5 and calls == [1]  # parsed once per store
    store.close()


def test_a_schema_error_comes_out_on_first_use_every_time(tmp_path, backend):
    path = tmp_path / "c"
    record = {"p": trees.Params(np.int32(1), [np.bool_(1), None])}
    with pytreestore.create(path, record, backend=backend) as store:
        store.append(record)
    _edit_root(path, backend, lambda raw: raw.replace(b"tests.trees:Params", b"tests.trees:Gone"))
    store = pytreestore.open(path)  # the format version and the commit record are fine
    assert len(store) == 1
    for read in (lambda: store[0], lambda: store.schema, lambda: store.load()):
        with pytest.raises(errors.ClassResolutionError, match=re.escape("tests.trees:Gone")):
            read()
    assert re.fullmatch(
        r"TreeStore\('.*', mode='r', records=1, schema unreadable: ClassResolutionError\)",
        repr(store),
    )
    assert store._repr_html_() is None
    trees.Gone = trees.Params  # the class importable again: the next use parses
    try:
        assert int(store[0]["p"].x) == 1
        assert "columns=2" in repr(store)
    finally:
        del trees.Gone
    store.close()


def test_a_truncated_root_is_reported_on_first_use(tmp_path, backend):
    path = _store(tmp_path / "s", backend)
    _edit_root(path, backend, lambda raw: raw[: len(raw) // 3])
    store = pytreestore.open(path)
    with pytest.raises(errors.NotAStoreError, match="is not valid JSON"):
        store.load()
    store.close()  # closing a store that never parsed its schema
    assert store.closed


def test_a_newer_format_is_refused_by_open(tmp_path, backend):
    path = _store(tmp_path / "s", backend)
    _edit_root(
        path, backend, lambda raw: raw.replace(b'"format_version": 3', b'"format_version": 99', 1)
    )
    with pytest.raises(errors.FormatVersionError, match="format 99, newer than the 3"):
        pytreestore.open(path)


def test_a_damaged_commit_record_is_refused_by_open(tmp_path, backend):
    path = _store(tmp_path / "s", backend)
    engine = pytreestore.backends.get_backend(backend)(
        pytreestore._location.Location.parse(path, None)
    )
    engine.write_bytes(".pytreestore/commit.json", b"{not json")
    engine.close()
    with pytest.raises(errors.CorruptStoreError, match="commit"):
        pytreestore.open(path)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_root_another_program_wrote_is_parsed_at_open(tmp_path, backend, monkeypatch):
    """Key order or layout other than pytreestore's: parsed at once, errors from open."""
    path = _store(tmp_path / "s", backend)
    root = path / "zarr.json"
    doc = json.loads(root.read_bytes())
    doc = {"attributes": doc["attributes"], "zarr_format": 3, "node_type": "group"}
    root.write_text(json.dumps(doc))
    calls = _parses(monkeypatch)
    store = pytreestore.open(path)
    assert calls == [1]
    np.testing.assert_array_equal(store.load(as_numpy=True)["b"], np.arange(6) / 2)
    text = json.dumps(doc).replace("float32", "float33")
    root.write_text(text)
    _validate.forget_validated()
    with pytest.raises(errors.CorruptStoreError, match="float33"):
        pytreestore.open(path)


def test_a_schema_the_commit_record_contradicts_is_reported_on_first_use(tmp_path):
    path = _store(tmp_path / "s", "tensorstore")
    root = path / "zarr.json"
    doc = json.loads(root.read_bytes())
    info = doc["attributes"]["pytreestore"]
    info["columns"][0].update(start=99, default=0.0)  # a column added past the commit
    info.pop("digest")
    root.write_text(json.dumps(doc, indent=1))
    store = pytreestore.open(path)
    with pytest.raises(errors.CorruptStoreError, match="starts at record 99"):
        store[0]


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_writers_and_older_versions_parse_at_open(tmp_path, backend, monkeypatch):
    path = _store(tmp_path / "s", backend)
    with pytreestore.open(path, "a") as store:
        store.append(_record(6))
    calls = _parses(monkeypatch)
    writer = pytreestore.open(path, "a")
    assert calls == [1]
    writer.close()
    number = next(v.version for v in pytreestore.open(path).versions() if v.records == 6)
    calls.clear()
    old = pytreestore.open(path, version=number)
    assert calls == [1] and len(old) == 6
    _edit_root(path, backend, lambda raw: raw.replace(b'"float32"', b'"float33"', 1))
    with pytest.raises(errors.CorruptStoreError, match="float33"):
        pytreestore.open(path, "a")


def test_threads_share_one_parse(tmp_path, monkeypatch):
    path = _store(tmp_path / "s", "tensorstore", n=40)
    calls = _parses(monkeypatch)
    store = pytreestore.open(path)
    barrier = threading.Barrier(8)
    got: list = [None] * 8

    def read(i: int) -> None:
        barrier.wait()
        got[i] = store.load(i, as_numpy=True)["a"]["y"]

    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1]
    assert [int(v) for v in got] == list(range(8))


def test_a_reader_pickled_before_first_use_reads_after(tmp_path):
    path = _store(tmp_path / "s", "tensorstore")
    store = pytreestore.open(path)
    copy = pickle.loads(pickle.dumps(store))
    np.testing.assert_array_equal(copy.load(as_numpy=True)["a"]["x"][:, 0], np.arange(6))
    np.testing.assert_array_equal(store.load(as_numpy=True)["b"], np.arange(6) / 2)


def test_a_reader_forked_before_first_use_parses_in_the_child(tmp_path):
    """The child parses with a lock of its own (TensorStore itself aborts a forked child's
    reads, docs/reliability.md; the parse needs none)."""
    store = pytreestore.open(_store(tmp_path / "s", "tensorstore"))
    store._opened._lock.acquire()  # as if another thread were parsing when the fork came

    def child() -> int:
        return 7 if store.schema.paths == ("['a']['x']", "['a']['y']", "['b']") else 1

    try:
        assert run_in_child(child) == 7
    finally:
        store._opened._lock.release()
    assert store.load(as_numpy=True)["a"]["y"].tolist() == list(range(6))


def test_the_schema_read_at_open_goes_with_the_commit_read_at_open(tmp_path):
    """A writer evolves the store between a reader's open and its first read: the reader
    reads the records it saw with the schema they were committed under."""
    path = _store(tmp_path / "s", "tensorstore")
    reader = pytreestore.open(path)
    with pytreestore.open(path, "a") as writer:
        writer.evolve(rename={"['b']": "['c']"})
    assert reader.schema.paths[-1] == "['b']"
    np.testing.assert_array_equal(reader.load(as_numpy=True)["b"], np.arange(6) / 2)
    assert pytreestore.open(path).schema.paths[-1] == "['c']"


def test_open_any_finds_a_ragged_store_that_has_no_generic_view(tmp_path):
    from pytreestore._open.open import open_any

    like = {"xs": [np.float32(0)]}
    with pytreestore.create(tmp_path / "r", like, ragged=["['xs']"]) as store:
        store.extend([{"xs": [np.float32(1), np.float32(2)]}, {"xs": []}])
    store = open_any(tmp_path / "r")
    assert store.schema.treedef is not None
    assert [len(r["xs"]) for r in store.records(as_numpy=True)] == [2, 0]


def test_a_module_for_the_classes_can_arrive_after_open(tmp_path):
    """The schema names a class whose module is imported only after open."""
    path = tmp_path / "late"
    record = {"p": trees.Params(np.int32(3), [np.bool_(0), None])}
    with pytreestore.create(path, record) as store:
        store.append(record)
    raw = (path / "zarr.json").read_bytes().replace(b"tests.trees:Params", b"late_mod:Params")
    (path / "zarr.json").write_bytes(raw)
    _validate.forget_validated()
    store = pytreestore.open(path)
    with pytest.raises(errors.ClassResolutionError, match="late_mod"):
        store[0]
    module = types.ModuleType("late_mod")
    module.Params = trees.Params  # type: ignore[attr-defined]
    sys.modules["late_mod"] = module
    try:
        assert int(store[0]["p"].x) == 3
    finally:
        del sys.modules["late_mod"]
