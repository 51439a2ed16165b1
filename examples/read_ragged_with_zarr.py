"""Reading a ragged pytreestore store with zarr-python alone.

A ragged store keeps each ragged list as a table: one row per element, each element leaf a
flat column along the element axis (``p/-2A/x`` holds ``.p[*].x`` of every record, one after
the other), and an int64 offsets array (``p-offsets``) of cumulative END offsets, one per
record: record i's elements are rows ``[offsets[i-1], offsets[i])``, with ``offsets[-1]``
taken as 0. The committed record count and the committed rows of each table are in
``.pytreestore/commit.json``.

This script writes the seed case with lists of varying length (one empty) with pytreestore,
then cuts each record's list out of the flat columns with zarr-python only
(``read_record`` imports neither pytreestore nor the classes) and checks it against
``store[i]``.

Usage: ``python examples/read_ragged_with_zarr.py [DIRECTORY]``: the store is written to
``DIRECTORY/ragged.pytreestore``, or to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax.struct import dataclass

# --- writing, with pytreestore ---------------------------------------------------------------


@dataclass
class Params:
    x: jax.Array
    y: jax.Array


@dataclass
class AllParams:
    p: list[Params]


RECORDS = [
    AllParams([Params(4, 2), Params(4, 3)]),
    AllParams([]),
    AllParams([Params(3, 5), Params(2, 4), Params(1, 7)]),
    AllParams([Params(6, 3)]),
]


def write(path: Path) -> None:
    import pytreestore

    with pytreestore.create(path, like=RECORDS[0], ragged=[".p"], overwrite=True) as store:
        store.extend(RECORDS)


# --- reading, with zarr-python only ----------------------------------------------------------


def read_record(path: Path, i: int) -> dict[str, np.ndarray]:
    """Record ``i``'s list ``.p`` as one array per field, each of the list's length."""
    import zarr

    with open(path / ".pytreestore" / "commit.json") as f:
        commit = json.load(f)
    records = commit["records"]  # only committed records and rows may be trusted
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the root's consolidated metadata: no warning
        root = zarr.open_group(path, mode="r")
    schema: Any = root.attrs["pytreestore"]  # JSON: the tree, columns and ragged axes
    (axis,) = schema["ragged"]["axes"]  # one ragged axis here: .p
    assert axis["path"] == ".p" and axis["offsets"] == "p-offsets"

    offsets = np.asarray(root[axis["offsets"]][:records])  # cumulative end offsets, int64
    start = int(offsets[i - 1]) if i > 0 else 0
    end = int(offsets[i])
    assert end <= commit["tables"][".p"]
    fields = {}
    for column in schema["columns"]:  # the element columns: table ".p", keys p/-2A/<field>
        if column.get("table") == ".p":
            field = column["path"].removeprefix(".p[*].")
            fields[field] = np.asarray(root[column["key"]][start:end])
    return fields


def main(root: Path) -> None:
    import pytreestore

    path = root / "ragged.pytreestore"
    write(path)
    store = pytreestore.open(path)
    for i in range(len(store)):
        got = read_record(path, i)
        want = store[i]
        assert sorted(got) == ["x", "y"], got
        assert len(got["x"]) == len(want.p), (i, got, want)
        assert got["x"].tolist() == [int(q.x) for q in want.p], (i, got, want)
        assert got["y"].tolist() == [int(q.y) for q in want.p], (i, got, want)
        print(f"record {i}: {len(want.p)} elements, x={got['x'].tolist()} y={got['y'].tolist()}")
    store.close()
    print("read_ragged_with_zarr example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
