"""The typed store (``pytreestore._core.StoreCore`` and the faces of ``TreeStore``) and the one
commit sequence (``pytreestore._log.transaction``)."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import ROOT_KEY
from pytreestore._log.commit_record import Commit
from pytreestore._log.transaction import Tag, Transaction, commit

ROOT = Path(pytreestore.__file__).parent

#: TreeStore's public names when its mixins became faces of one core: none may go
PUBLIC = {
    "append", "batches", "close", "closed", "commit_fragments", "commit_now", "committed",
    "evolve", "extend", "extend_batch", "flush", "grain_source", "lengths", "load", "map",
    "mode", "path", "read_context", "records", "refresh", "reopen_options", "schema", "tag",
    "truncate", "vacuum", "verify", "version", "versions",
}  # fmt: skip

FACES = ["_faces.py", "_pipelines/methods.py"]


def test_tree_store_keeps_every_public_name():
    store = pytreestore.create("memory://core-public", {"a": np.int8(0)})
    assert {n for n in dir(pytreestore.TreeStore) if not n.startswith("_")} >= PUBLIC
    assert {n for n in dir(store) if not n.startswith("_")} >= PUBLIC


@pytest.mark.parametrize("face", FACES)
def test_a_face_uses_only_the_public_interface_of_the_core(face):
    source = (ROOT / face).read_text()
    assert "type: ignore" not in source
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__"):
            continue
        owner = ast.unparse(node.value)
        if owner == "self" and node.attr == "_core":
            continue  # the one thing a face holds
        if owner in {"self", "core", "self._core"}:
            found.append(f"{owner}.{node.attr} (line {node.lineno})")
    assert found == []


def test_truncate_past_the_records_commits_nothing_buffered():
    store = pytreestore.create("memory://core-truncate-refused", {"x": np.int8(0)})
    store.append({"x": np.int8(1)})
    with pytest.raises(errors.StoreIndexError, match="holds 1"):
        store.truncate(2)
    assert store.committed == 0 and len(store) == 1  # refused before the flush
    store.flush()
    assert store.load(as_numpy=True)["x"].tolist() == [1]


def test_a_transaction_planned_on_an_older_version_is_refused():
    store = pytreestore.create("memory://core-stale", {"x": np.int8(0)})
    store.append({"x": np.int8(1)})
    store.flush()
    core = store._core
    with core.writing() as writer:
        stale = Transaction(writer.commit.generation - 1, Tag("late", None, store.path))
        with pytest.raises(errors.CommitConflictError, match="planned on version 0"):
            commit(core.backend, writer, stale)
    assert [v.tags for v in store.versions()] == [(), ()]


class _Failing:
    """An operation whose writes fail midway: abort sees the error, nothing commits."""

    name, commits, releases = "truncate", True, False

    def __init__(self) -> None:
        self.aborted: list[BaseException] = []

    def check(self, engine: Any, writer: Any) -> None:
        pass

    def prepare(self, engine: Any, writer: Any) -> None:
        pass

    def apply(self, engine: Any, head: Commit, schema: Any) -> Any:
        raise errors.StorageError("disk full")

    def abort(self, engine: Any, head: Commit, error: BaseException) -> None:
        self.aborted.append(error)


def test_a_failed_step_commits_nothing_and_keeps_the_writer():
    store = pytreestore.create("memory://core-failed", {"x": np.int8(0)})
    store.extend({"x": np.int8(i)} for i in range(3))
    operation = _Failing()
    with pytest.raises(errors.StorageError, match="disk full"):
        store._core.commit(operation)
    assert [type(e) for e in operation.aborted] == [errors.StorageError]
    assert store.version == 1 and store.committed == 3  # the flush, and nothing after it
    store.append({"x": np.int8(3)})
    store.truncate(2)
    assert store.load(as_numpy=True)["x"].tolist() == [0, 1]


def test_evolve_after_another_writer_committed_writes_nothing(tmp_path):
    path = str(tmp_path / "s")
    with pytreestore.create(path, {"n": np.int32(0)}) as s:
        s.append({"n": np.int32(0)})
    first = pytreestore.open(path, "a")
    (Path(path) / ".pytreestore" / "lock").unlink()  # the lock broken behind its back
    second = pytreestore.open(path, "a")
    second.append({"n": np.int32(2)})
    second.flush()
    root = (Path(path) / ROOT_KEY).read_bytes()
    with pytest.raises(errors.CommitConflictError, match="another writer"):
        first.evolve(add={"['age']": np.int8(7)})
    assert (Path(path) / ROOT_KEY).read_bytes() == root  # checked before the root is written
    assert not (Path(path) / "age").exists()
    second.close()
    first.close()
    reader = pytreestore.open(path)
    assert reader.load(as_numpy=True)["n"].tolist() == [0, 2]
    assert "['age']" not in json.dumps(json.loads(root))
