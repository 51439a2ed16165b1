"""What a version costs a commit (issue #16): every commit writes its version record first.

* **version record vs one small object**: writing the version record
  (``pytreestore._log.versions.publish``: a put of about 250 bytes, only if the key is
  absent) against a plain put of the same bytes through the same backend, each to a new key, on
  a local store. The issue's bound: a version costs at most one small object more than a commit
  did before. Ratio: slowdown, ours over the plain put.
* **commit**: ``store.append(record); store.flush()`` of one record of 20 and of 200 leaves
  (float32 scalars and float32[16] arrays; each commit resizes every array, writes a chunk of
  each, then the commit), against the same with the version record and the root's
  consolidated metadata left out (``publish`` and ``consolidated.write`` replaced by no-ops:
  the commit as it was before issue 16), both stores side by side. Ratio: slowdown, ours over
  the commit as before.

Both cases run on the TensorStore and the zarr backends, each store with its defaults.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from _common import Case, Result, Timed, at_most, measure_side_by_side

import pytreestore
from pytreestore._location import Location
from pytreestore._log import metadata as consolidated
from pytreestore._log import versions
from pytreestore._log.commit_record import Commit
from pytreestore.backends import get_backend

TITLE = "Versions: what a version costs a commit"
LEAVES = 20


def _record(i: int, leaves: int = LEAVES) -> dict[str, Any]:
    return {
        f"f{k:03d}": np.float32(i) if k % 2 else np.full(16, i, np.float32) for k in range(leaves)
    }


def _publish_rows(tmp: Path, backend: str, repeats: int) -> list[Result]:
    path = tmp / f"publish-{backend}"
    pytreestore.create(path, _record(0), backend=backend).close()
    engine = get_backend(backend)(Location.parse(path))
    head = Commit.read(engine, str(path))
    sample = head.next(1, schema=head.schema)
    count = iter(range(10**9))

    def put_version(_: Any) -> None:
        commit = Commit(sample.records, 10**6 + next(count), *_rest(sample))
        assert versions.publish(engine, commit)

    def put_plain(_: Any) -> None:
        engine.write_bytes(f".pytreestore/plain/{next(count)}.json", sample.to_bytes())

    ours, base = measure_side_by_side(
        Timed(put_version, repeats, warmup=3), Timed(put_plain, repeats, warmup=3)
    )
    engine.close()
    return [
        Result(
            f"version record vs one small object ({backend})",
            1,
            ours,
            base,
            at_most(1.5),
            False,
            "versions.publish (put if absent)",
            f"write_bytes of the same {len(sample.to_bytes())} bytes",
            notes=("each to a new key of a local store",),
        )
    ]


def _rest(commit: Commit) -> tuple[Any, ...]:
    return (
        commit.store,
        commit.tables,
        commit.schema,
        commit.time,
        commit.operation,
        commit.high,
        commit.cuts,
        commit.rewrites,
    )


def _commit_rows(tmp: Path, backend: str, repeats: int, leaves: int = LEAVES) -> list[Result]:
    stores = {
        name: pytreestore.create(
            tmp / f"{name}-{backend}-{leaves}", _record(0, leaves), backend=backend
        )
        for name in ("ours", "without")
    }
    state = {"i": 0}

    def commit(store: pytreestore.TreeStore) -> None:
        state["i"] += 1
        store.append(_record(state["i"], leaves))
        store.flush()

    def without(_: Any) -> None:
        with (
            mock.patch.object(versions, "publish", lambda engine, c: True),
            mock.patch.object(consolidated, "write", lambda *a: None),
        ):
            commit(stores["without"])

    ours, base = measure_side_by_side(
        Timed(lambda _: commit(stores["ours"]), repeats, warmup=3),
        Timed(without, repeats, warmup=3),
    )
    counts = {name: len(s) for name, s in stores.items()}
    for s in stores.values():
        s.close()
    path = tmp / f"ours-{backend}-{leaves}"
    listed = pytreestore.open(path).versions()
    assert len(listed) == counts["ours"] + 1, "a version per commit"
    root = (path / "zarr.json").read_bytes()
    assert b'"consolidated_metadata"' in root
    return [
        Result(
            f"commit of one record, {leaves} leaves ({backend})",
            repeats,
            ours,
            base,
            at_most(1.5),
            False,
            "append + flush (version record, commit record, root)",
            "the same without the version record and the root rewrite",
            notes=(
                f"{leaves} resizes and {leaves} chunk writes per commit; "
                f"the root zarr.json is {len(root) // 1024} KiB",
            ),
        )
    ]


def _case(backend: str, what: str, quick: bool) -> list[Result]:
    repeats = 15 if quick else 60
    tmp = Path(tempfile.mkdtemp(prefix="pytreestore-bench-versions-"))
    try:
        if what == "publish":
            return _publish_rows(tmp, backend, repeats)
        return _commit_rows(tmp, backend, repeats) + _commit_rows(
            tmp, backend, max(5, repeats // 4), leaves=200
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cases(quick: bool) -> list[Case]:
    return [
        Case(f"{what}-{backend}", lambda w=what, b=backend: _case(b, w, quick))
        for what in ("publish", "commit")
        for backend in ("tensorstore", "zarr")
    ]
