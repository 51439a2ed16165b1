"""What a ``write_fragment`` killed early leaves, and vacuum (issue 28, defect 11).

A writer killed before its ``begun.json`` landed leaves, on local disk, an empty fragment
folder or one holding only a temporary file: TensorStore's ``begun.json.__lock``,
zarr-python's ``.begun.json.<hex>.partial``. No key listing shows such a folder, and
``vacuum(fragments_older_than=0)`` left it for ever. Vacuum now finds local fragment folders
on disk and ages one without a readable ``begun.json`` by the folder's modification time; a
fragment younger than the threshold (one being written now) is never removed. On OCDBT a
fragment is keys inside the database, each written whole: no folder is ever left.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore._format.keys import FRAGMENTS_DIR
from pytreestore._location import Location
from pytreestore.backends import OcdbtBackend
from tests import interpreters
from tests.conftest import child_env

HOUR = 3600.0
#: what a killed writer leaves in a local fragment folder, by kind
LEFTOVERS = {
    "empty": {},
    "tensorstore lock file": {"begun.json.__lock": b'{"time": "2026-'},
    "zarr temporary file": {f".begun.json.{'a' * 32}.partial": b'{"ti'},
    "cut begun.json": {"begun.json": b'{"time": "20'},
    "columns, no begun.json": {"x/zarr.json": b"{}", "x/c/0": b"chunk"},
}


def make(path: str, backend: str) -> pytreestore.TreeStore:
    store = pytreestore.create(path, {"x": np.int32(0)}, backend=backend, chunk_records=4)
    store.extend({"x": np.int32(i)} for i in range(4))
    store.flush()
    return store


def left_on_disk(path: str) -> list[str]:
    folder = Path(path) / FRAGMENTS_DIR
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def leave(path: str, files: dict[str, bytes], age: float) -> str:
    """A fragment folder holding ``files``, last changed ``age`` seconds ago; its id."""
    fid = uuid.uuid4().hex
    folder = Path(path) / FRAGMENTS_DIR / fid
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    then = time.time() - age
    for inner, _, names in sorted(os.walk(folder), reverse=True):  # deepest first
        for name in names:
            os.utime(Path(inner) / name, (then, then))
        os.utime(inner, (then, then))
    return fid


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_vacuum_removes_what_a_killed_writer_left_once_old(tmp_path, backend):
    path = str(tmp_path / "s")
    store = make(path, backend)
    old = {leave(path, files, 2 * HOUR): kind for kind, files in LEFTOVERS.items()}
    young = {leave(path, files, 0): kind for kind, files in LEFTOVERS.items()}
    live = pytreestore.write_fragment(path, {"x": np.arange(4, 8, dtype=np.int32)})

    assert store.vacuum(fragments_older_than=HOUR).fragments == len(old)
    kept = left_on_disk(path)
    assert sorted(old[f] for f in old if f in kept) == []  # every old leftover went
    assert kept == sorted([*young, live.id])  # what is younger stays, the live one whole

    store.commit_fragments([live])
    assert store.vacuum(fragments_older_than=0).fragments == len(young)
    assert left_on_disk(path) == []
    store.close()
    assert pytreestore.open(path).load(as_numpy=True)["x"].tolist() == list(range(8))


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_vacuum_never_removes_a_fragment_being_written(tmp_path, backend):
    path = str(tmp_path / "s")
    store = make(path, backend)
    written: list[pytreestore.Fragment] = []
    done = threading.Event()

    def writer() -> None:
        for k in range(8):
            batch = {"x": np.arange(4 + 4 * k, 8 + 4 * k, dtype=np.int32)}
            written.append(pytreestore.write_fragment(path, batch, backend=backend))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    while not done.is_set():  # a vacuum at every stage of the writes
        assert store.vacuum(fragments_older_than=HOUR).fragments == 0
    thread.join()
    store.commit_fragments(written)  # each one whole
    assert store.load(as_numpy=True)["x"].tolist() == list(range(36))


def test_ocdbt_fragments_are_keys_and_leave_no_folder(tmp_path):
    path = str(tmp_path / "s")
    store = make(path, "ocdbt")
    engine = OcdbtBackend(Location.parse(path))
    cut = f"{FRAGMENTS_DIR}/{'c' * 32}"
    engine.write_bytes(f"{cut}/x/zarr.json", b"{}")  # keys without a begun.json
    damaged = f"{FRAGMENTS_DIR}/{'d' * 32}"
    engine.write_bytes(f"{damaged}/begun.json", b'{"ti')  # one that does not parse
    engine.close()
    live = pytreestore.write_fragment(path, {"x": np.arange(4, 8, dtype=np.int32)})
    assert not (Path(path) / FRAGMENTS_DIR).exists()  # inside the database, no folder

    assert store.vacuum(fragments_older_than=HOUR).fragments == 2  # never begun: at once
    store.commit_fragments([live])
    assert store.vacuum(fragments_older_than=0).fragments == 0
    store.close()
    assert pytreestore.open(path).load(as_numpy=True)["x"].tolist() == list(range(8))


# ---- a real SIGKILL inside write_fragment ----------------------------------------------------

CHILD = """
import os, signal, sys, threading
import numpy as np, pytreestore
path, backend, watch = sys.argv[1:4]
before = set(os.listdir(watch))

def die_at_the_first_new_file():
    while True:
        if set(os.listdir(watch)) - before:
            os.kill(os.getpid(), signal.SIGKILL)

threading.Thread(target=die_at_the_first_new_file, daemon=True).start()
pytreestore.write_fragment(path, {"x": np.arange(64, dtype=np.int32)}, backend=backend)
print("written")  # only if the write beat the watcher
"""


def _kill_inside_write_fragment(path: str, backend: str) -> int:
    """Runs a process that calls write_fragment and SIGKILLs itself as soon as its first
    file or folder appears (the fragment folder; on OCDBT a data file); its exit status."""
    watch = Path(path) / ("d" if backend == "ocdbt" else FRAGMENTS_DIR)
    watch.mkdir(parents=True, exist_ok=True)
    env = child_env()
    args = [sys.executable, "-c", CHILD, path, backend, str(watch)]
    done = interpreters.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode in (-signal.SIGKILL, 0), done.stderr
    return done.returncode


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_vacuum_removes_what_a_sigkilled_write_fragment_left(tmp_path, backend):
    path = str(tmp_path / "s")
    make(path, backend).close()
    code = _kill_inside_write_fragment(path, backend)
    store = pytreestore.open(path, "a", backend=backend)
    if backend != "ocdbt" and code == -signal.SIGKILL:
        assert len(left_on_disk(path)) == 1, "the killed writer's fragment folder"
        assert store.vacuum(fragments_older_than=HOUR).fragments == 0  # young: kept
    store.vacuum(fragments_older_than=0)
    assert left_on_disk(path) == []
    if backend == "ocdbt":
        engine = OcdbtBackend(Location.parse(path))
        assert engine.list_keys(FRAGMENTS_DIR + "/") == []
        engine.close()
    assert store.load(as_numpy=True)["x"].tolist() == [0, 1, 2, 3]
    store.close()


def _stamp(seconds_ago: float) -> bytes:
    then = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return json.dumps({"time": then.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}).encode()


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_readable_begun_json_is_the_age_not_the_folder_time(tmp_path, backend):
    path = str(tmp_path / "s")
    store = make(path, backend)
    fresh = leave(path, {"begun.json": _stamp(0)}, 2 * HOUR)  # begun now, folder time old
    stale = leave(path, {"begun.json": _stamp(2 * HOUR)}, 0)  # begun long ago
    assert store.vacuum(fragments_older_than=HOUR).fragments == 1
    assert left_on_disk(path) == [fresh] and stale not in left_on_disk(path)
    store.close()
