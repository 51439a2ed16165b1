"""Crash trials of fragments: a process killed with SIGKILL while writing a fragment, between
its fragments and the commit, and at each step of ``commit_fragments`` leaves a store that
opens with every committed record, where each fragment is committed whole or not at all, and
every fragment not committed can still be committed.

The writer is a child forked by the zygote (:mod:`tests.trial_harness`, pytreestore imported
once) running :func:`child`; it kills itself (SIGKILL, no cleanup) at the named point, reached
through the real code with a wrapper around one internal step.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import FRAGMENTS_DIR, PLACING_KEY
from tests.conftest import FILE_BACKENDS, trials
from tests.test_fragments import CHUNK, batch, rec
from tests.trial_harness import Zygote, read_log

pytest_plugins = ("tests.fixtures",)
POINTS = ["writing", "before_commit", "placing", "linking", "before_record", "after_record"]
SIZES = (4, 5)  # fragment A, fragment B


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_at(point: str) -> None:
    """Makes the child kill itself at ``point`` of its next fragment step."""
    from pytreestore._fragments import commit as _fragmenting
    from pytreestore._fragments import write as fragments
    from pytreestore._log import committer
    from pytreestore.backends import _links

    if point == "writing":  # the arrays are written, the fragment's description is not
        fragments.manifest_key = lambda fid: _die()  # type: ignore[assignment]
    elif point in ("placing", "linking"):
        # placing: half of the chunk-row folders moved; linking: all of them moved and half
        # of the chunk files linked; misaligned: before the rewrites
        name = "move_folders" if point == "placing" else "link_all"
        setattr(_links, name, _half_then_die(getattr(_links, name)))
        aligned = fragments._place_aligned

        def then_die(*args: Any) -> None:
            aligned(*args)
            _die()

        fragments._place_aligned = then_die  # type: ignore[assignment]
    elif point == "before_record":
        committer.Committer.advance = lambda *a, **k: _die()  # type: ignore[assignment]
    elif point == "after_record":
        _fragmenting.Fragmenting._retire = lambda self, ids: _die()  # type: ignore[assignment]


def _half_then_die(fn: Any) -> Any:
    def half(root: str, items: Any, folders: set[str]) -> None:
        items = list(items)
        if not items:
            return
        fn(root, items[: len(items) // 2], folders)
        _die()

    return half


def child(path: str, backend: str, point: str, out: str) -> None:
    """Writes fragments A and B (their JSON to ``out``), then commits them; dies at ``point``."""
    store = pytreestore.open(path, "a", backend=backend)
    start = len(store)
    texts = []
    for k, n in enumerate(SIZES):
        if point == "writing" and k == 1:
            _kill_at(point)
        fragment = pytreestore.write_fragment(path, batch(start, n), backend=backend)
        texts.append(fragment.to_json())
        Path(out + ".tmp").write_text(json.dumps(texts))
        os.replace(out + ".tmp", out)  # a kill mid-write leaves the last whole list
        start += n
    if point == "before_commit":
        _die()
    _kill_at(point)
    store.commit_fragments([pytreestore.Fragment.from_json(t) for t in texts])
    if point == "random":
        print("COMMITTED", flush=True)
    store.close()


def reopen_child(path: str, backend: str) -> None:
    """Opens the store for appending and dies halfway through moving a killed commit's
    chunk rows back into their fragments."""
    from pytreestore._log import placing

    undo = placing.undo

    def half_undo(root: str, moves: Any) -> None:
        undo(root, moves[len(moves) // 2 :])  # undo goes from the last move back
        _die()

    placing.undo = half_undo  # type: ignore[assignment]
    pytreestore.open(path, "a", backend=backend)


def _run(
    zygote: Zygote, path: Path, backend: str, point: str, *, kill_after: float | None = None
) -> int:
    """Runs :func:`child` (or :func:`reopen_child`) in a child forked by the zygote; its
    returncode (``-9``: killed)."""
    log = str(path.parent / f"child-{point}.log")
    if point == "reopening":
        args: tuple[Any, ...] = ("tests.test_fragments_crash:reopen_child", str(path), backend)
    else:
        out = str(path.parent / "fragments.json")
        args = ("tests.test_fragments_crash:child", str(path), backend, point, out)
    code = zygote.call(*args, log=log, kill_after=kill_after)
    assert code in (-signal.SIGKILL, 0), (code, read_log(log)[-3:], read_log(log + ".stderr")[-20:])
    return code


def _fragments(path: Path) -> list[pytreestore.Fragment]:
    out = path.parent / "fragments.json"
    texts = json.loads(out.read_text()) if out.exists() else []
    return [pytreestore.Fragment.from_json(t) for t in texts]


def _x(store: pytreestore.TreeStore) -> list[float]:
    return store.load(as_numpy=True)["x"].tolist() if len(store) else []


def _check_recovered(path: Path, backend: str, start: int) -> None:
    """Opens the killed writer's store: a committed prefix in whole fragments; then commits
    every fragment left whole and checks the store holds every record once, in order."""
    store = pytreestore.open(path, "a", backend=backend)
    found = _fragments(path)
    total = start + sum(f.records for f in found)
    committed = len(store)
    assert committed in (start, start + sum(SIZES)), committed  # all of them or none
    assert _x(store) == [float(i) for i in range(committed)]
    assert store.verify().ok
    if committed == start:
        store.commit_fragments(found)
        assert _x(store) == [float(i) for i in range(total)]
    else:
        with pytest.raises(errors.FragmentError, match="committed already"):
            store.commit_fragments(found)
    store.vacuum(fragments_older_than=0)
    assert not (path / FRAGMENTS_DIR).exists() or not os.listdir(path / FRAGMENTS_DIR)
    store.extend(rec(i) for i in range(len(store), len(store) + 3))
    store.close()
    reader = pytreestore.open(path, backend=backend)
    assert _x(reader) == [float(i) for i in range(len(reader))]
    np.testing.assert_array_equal(reader.load(as_numpy=True)["p"].v, batch(0, len(reader))["p"].v)


@pytest.mark.plain_files
@pytest.mark.parametrize("start", [4, 3], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("point", POINTS)
def test_a_writer_killed_at_each_point_loses_nothing(zygote, tmp_path, backend, start, point):
    path = tmp_path / "s"
    with pytreestore.create(path, rec(0), backend=backend, chunk_records=CHUNK) as store:
        store.extend(rec(i) for i in range(start))
    assert _run(zygote, path, backend, point) == -signal.SIGKILL
    written = _fragments(path)
    assert len(written) == (1 if point == "writing" else 2)
    _check_recovered(path, backend, start)


@pytest.mark.plain_files
def test_a_writer_killed_while_moving_rows_back_loses_nothing(zygote, tmp_path, backend):
    path = tmp_path / "s"
    with pytreestore.create(path, rec(0), backend=backend, chunk_records=CHUNK) as store:
        store.extend(rec(i) for i in range(4))
    assert _run(zygote, path, backend, "placing") == -signal.SIGKILL
    assert (path / PLACING_KEY).exists()  # a commit cut off with chunk rows moved
    assert _run(zygote, path, backend, "reopening") == -signal.SIGKILL
    assert (path / PLACING_KEY).exists()  # the next writer moves the rest back
    _check_recovered(path, backend, 4)
    assert not (path / PLACING_KEY).exists()


@pytest.mark.parametrize("trial", trials(2, 4))
def test_a_writer_killed_at_a_random_moment_loses_nothing(zygote, tmp_path, trial):
    rng = random.Random(trial)
    backend = FILE_BACKENDS[trial % 2]
    start = rng.choice([3, 4, 8])
    path = tmp_path / "s"
    with pytreestore.create(path, rec(0), backend=backend, chunk_records=CHUNK) as store:
        store.extend(rec(i) for i in range(start))
    _run(zygote, path, backend, "random", kill_after=rng.uniform(0.0, 0.8))
    _check_recovered(path, backend, start)
