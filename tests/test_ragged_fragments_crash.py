"""Crash trials of a ragged store's fragments: a process killed with SIGKILL while writing a
fragment, between its fragments and the commit, after the commit learnt the structures the
fragments show, while placing their rows (after one write), and around the commit record, leaves a store that
opens with every committed record, where each fragment is committed whole or not at all,
and every fragment not committed can still be committed; ``vacuum()`` removes what is left.

The store starts from a pending ``like`` (:func:`tests.trial_harness.ragged_like`), so the
commit of fragments A (4 records) and B (5 records) learns the element structure, the
nested ragged list and the optional subtree. The writer is a child forked by
the zygote (:mod:`tests.trial_harness`) running :func:`child`; it kills itself at the named point, reached through the real code with a
wrapper around one internal step. On every backend fragments run on: tensorstore, zarr, ocdbt.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

import pytreestore
from pytreestore import errors
from pytreestore.testing import assert_trees_equal
from tests.conftest import BACKENDS, tiered
from tests.test_ragged_fragments import fragments_left
from tests.trial_harness import RAGGED_DECL, Zygote, ragged_like, ragged_record, read_log

pytest_plugins = ("tests.fixtures",)
POINTS = ["writing", "before_commit", "learning", "placing", "before_record", "after_record"]
SIZES = (4, 5)  # fragment A, fragment B
CHUNK = 4


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_at(point: str) -> None:
    """Makes the child kill itself at ``point`` of its next fragment step."""
    from pytreestore._fragments import commit as _fragmenting
    from pytreestore._fragments import write as fragments
    from pytreestore._fragments import write as placing
    from pytreestore._log import committer
    from pytreestore._write import records as writer

    if point == "writing":  # the arrays and schema are written, the description is not
        fragments.manifest_key = lambda fid: _die()  # type: ignore[assignment]
    elif point == "learning":  # the store learnt the fragments' structures, nothing placed
        learn = writer.RecordWriter.use_schema

        def learn_then_die(self: Any, grown: Any) -> None:
            learn(self, grown)
            _die()

        writer.RecordWriter.use_schema = learn_then_die  # type: ignore[method-assign]
    elif point == "placing":  # chunks placed, one table's rows written, the others not
        write = placing._write_rows

        def write_one(engine: Any, keys: Any, start: int, parts: Any) -> None:
            write(engine, keys, start, parts)
            if keys and parts:
                _die()

        placing._write_rows = write_one  # type: ignore[assignment]
    elif point == "before_record":
        committer.Committer.advance = lambda *a, **k: _die()  # type: ignore[assignment]
    elif point == "after_record":
        _fragmenting.Fragmenting._retire = lambda self, ids: _die()  # type: ignore[assignment]


def child(path: str, backend: str, point: str, out: str) -> None:
    """Writes fragments A and B (their JSON to ``out``), then commits them; dies at ``point``."""
    store = pytreestore.open(path, "a", backend=backend)
    start = len(store)
    texts = []
    for k, n in enumerate(SIZES):
        if point == "writing" and k == 1:
            _kill_at(point)
        records = [ragged_record(i) for i in range(start, start + n)]
        fragment = pytreestore.write_fragment(path, records, backend=backend)
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


def _run(
    zygote: Zygote, path: Path, backend: str, point: str, *, kill_after: float | None = None
) -> int:
    """Runs :func:`child` in a child forked by the zygote; its returncode (``-9``: killed)."""
    log, out = str(path.parent / f"child-{point}.log"), str(path.parent / "fragments.json")
    target = "tests.test_ragged_fragments_crash:child"
    code = zygote.call(target, str(path), backend, point, out, log=log, kill_after=kill_after)
    assert code in (-signal.SIGKILL, 0), (code, read_log(log)[-3:], read_log(log + ".stderr")[-20:])
    return code


def _fragments(path: Path) -> list[pytreestore.Fragment]:
    out = path.parent / "fragments.json"
    texts = json.loads(out.read_text()) if out.exists() else []
    return [pytreestore.Fragment.from_json(t) for t in texts]


def _check_records(store: pytreestore.TreeStore, n: int) -> None:
    assert len(store) == n
    for i in range(n):
        assert_trees_equal(store.load(i, as_numpy=True), ragged_record(i), err_msg=f"record {i}")


def _check_recovered(path: Path, backend: str, start: int) -> None:
    """Opens the killed writer's store: a committed prefix in whole fragments; then commits
    every fragment left whole and checks the store holds every record once, in order."""
    store = pytreestore.open(path, "a", backend=backend)
    found = _fragments(path)
    committed = len(store)
    assert committed in (start, start + sum(SIZES)), committed  # all of them or none
    _check_records(store, committed)
    assert store.verify().ok
    if committed == start:
        store.commit_fragments(found)
        _check_records(store, start + sum(f.records for f in found))
    else:
        with pytest.raises(errors.FragmentError, match="committed already"):
            store.commit_fragments(found)
    store.vacuum(fragments_older_than=0)
    assert fragments_left(str(path), backend) == []
    n = len(store)
    store.extend(ragged_record(i) for i in range(n, n + 3))
    store.close()
    reader = pytreestore.open(path, backend=backend)
    _check_records(reader, n + 3)
    assert reader.verify().ok


def _make(path: Path, backend: str, start: int) -> None:
    with pytreestore.create(
        path, ragged_like(True), backend=backend, chunk_records=CHUNK, **RAGGED_DECL
    ) as store:
        store.extend(ragged_record(i) for i in range(start))


#: every point, start and backend (``make test-long``); ``make test`` runs half: each point on
#: every backend, aligned and misaligned in turn, so every pair of the three meets
CELLS = [(p, s, b) for p in POINTS for s in (4, 3) for b in BACKENDS]
DEFAULT_CELLS = [
    (p, s, b)
    for i, p in enumerate(POINTS)
    for j, s in enumerate((4, 3))
    for k, b in enumerate(BACKENDS)
    if (i + j + k) % 2 == 0
]


@pytest.mark.parametrize(
    ("point", "start", "backend"),
    tiered(CELLS, DEFAULT_CELLS),
    ids=[f"{p}-{'aligned' if s == 4 else 'misaligned'}-{b}" for p, s, b in CELLS],
)
def test_a_writer_killed_at_each_point_loses_nothing(zygote, tmp_path, backend, start, point):
    path = tmp_path / "s"
    _make(path, backend, start)
    assert _run(zygote, path, backend, point) == -signal.SIGKILL
    assert len(_fragments(path)) == (1 if point == "writing" else 2)
    if point == "learning":  # no commit names the learnt schema: readers read the committed
        assert pytreestore.open(path, backend=backend).schema.pending  # one (issue 28)
    _check_recovered(path, backend, start)


@pytest.mark.parametrize("trial", range(3))
def test_a_writer_killed_at_a_random_moment_loses_nothing(zygote, tmp_path, trial):
    rng = random.Random(trial)
    backend = BACKENDS[trial % 3]
    start = rng.choice([3, 4, 8])
    path = tmp_path / "s"
    _make(path, backend, start)
    _run(zygote, path, backend, "random", kill_after=rng.uniform(0.0, 0.8))
    _check_recovered(path, backend, start)
