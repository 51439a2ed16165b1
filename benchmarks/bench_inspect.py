"""Showing a store in a notebook (issue 33): the cost of ``store._repr_html_()`` on a store of
20,000 chunk files (100 leaves of float32[4], 3,200 records, 16 records per chunk) on local
disk, opened for reading.

* **notebook view**: ``_repr_html_()`` (the column tree, the first and last records' values,
  the ragged axes, versions and tags; sizes from the commit record) against reading and
  parsing the root ``zarr.json`` (the store's metadata, every column's consolidated) with
  ``json.loads``. Ratio: slowdown, ours over the metadata read.
* **against measuring sizes**: the same view against ``describe(store)`` with the bytes on
  disk measured (a stat of every chunk file), as the view did before issue 33 (besides
  showing no values) and ``pytreestore info`` still does. Ratio: ours over it.

Both on the TensorStore and the zarr backends.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _common import Case, Result, Timed, at_most, measure_side_by_side

import pytreestore
from pytreestore._format.keys import ROOT_KEY
from pytreestore._inspect import repr as _repr

TITLE = "Inspect: the notebook view of a store of 20,000 chunk files"
LEAVES = 100
CHUNK = 16


def _write(path: Path, backend: str, chunks: int) -> None:
    like = {f"leaf{i:03d}": np.zeros(4, np.float32) for i in range(LEAVES)}
    records = chunks * CHUNK
    batch = {
        k: np.arange(records * 4, dtype=np.float32).reshape(records, 4) + i
        for i, k in enumerate(like)
    }
    with pytreestore.create(path, like, chunk_records=CHUNK, backend=backend) as store:
        store.extend_batch(batch)


def _metadata(path: Path) -> dict[str, Any]:
    return json.loads((path / ROOT_KEY).read_bytes())


def _view(store: pytreestore.TreeStore) -> str:
    page = store._repr_html_()
    if page is None or "record 0" not in page:
        raise RuntimeError("the notebook view shows no values")
    return page


def _case(backend: str, quick: bool) -> list[Result]:
    chunks = 20 if quick else 200
    repeats = 2 if quick else 7
    with tempfile.TemporaryDirectory(prefix="pytreestore-bench-inspect-") as tmp:
        path = Path(tmp) / "s"
        _write(path, backend, chunks)
        files = sum(1 for p in path.rglob("*") if p.is_file() and "/c/" in str(p))
        store = pytreestore.open(path, backend=backend)
        try:
            view, measured, floor = measure_side_by_side(
                Timed(lambda _: _view(store), repeats, warmup=1),
                Timed(lambda _: _repr.describe(store), repeats, warmup=1),
                Timed(lambda _: _metadata(path), repeats, warmup=1),
            )
        finally:
            store.close()
            shutil.rmtree(tmp, ignore_errors=True)
    base = "read + `json.loads` of the root `zarr.json`"
    return [
        Result(
            case=f"notebook view ({backend}), {files:,} chunk files",
            n=files,
            ours=view,
            baseline=floor,
            goal=at_most(50.0),
            higher_is_better=False,
            ours_label="`store._repr_html_()`",
            baseline_label=base,
            notes=(f"ours {view.median * 1e3:.1f} ms; the metadata {floor.median * 1e3:.2f} ms.",),
        ),
        Result(
            case=f"notebook view against measuring sizes ({backend}), {files:,} chunk files",
            n=files,
            ours=view,
            baseline=measured,
            goal=at_most(1.0),
            higher_is_better=False,
            ours_label="`store._repr_html_()`",
            baseline_label=(
                "`describe(store)` measuring the bytes on disk (what the view paid before "
                "issue 33, values aside; `pytreestore info` still does)"
            ),
            notes=(f"the measuring describe {measured.median * 1e3:.1f} ms.",),
        ),
    ]


def cases(quick: bool) -> list[Case]:
    return [Case(f"view-{b}", lambda b=b: _case(b, quick)) for b in ("tensorstore", "zarr")]
