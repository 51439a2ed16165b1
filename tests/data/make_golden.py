"""Writes the golden stores under ``tests/data/golden/format-<N>/``: small stores written by
the current code, checked in, so that any change to the on-disk format shows up as a failing
``tests/test_golden.py`` and a visible diff.

    .venv/bin/python tests/data/make_golden.py          # rewrite the current format's stores
    .venv/bin/python tests/data/make_golden.py --check  # compare only; exit 1 on a difference

Regenerate only for an intended format change, and then also bump ``FORMAT_VERSION`` (when
old readers must refuse the new stores) and add a ``CHANGELOG.md`` entry under **Format**.
Stores of older formats stay checked in: readers must keep reading them (or refuse them
clearly).

Every value is a deterministic function of the record index, so the test rebuilds the
expected records from the recipes below.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import filecmp
import itertools
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: the node classes must import as tests.trees
    sys.path.insert(0, str(ROOT))

import pytreestore  # noqa: E402
from pytreestore._format import dtypes as _dtypes  # noqa: E402
from pytreestore._log import commit_record as record_module  # noqa: E402
from pytreestore.testing import strategies as pts  # noqa: E402
from pytreestore.testing.conformance import dtype_values  # noqa: E402
from tests import static_trees, trees  # noqa: E402

GOLDEN = Path(__file__).resolve().parent / "golden"
CURRENT = GOLDEN / f"format-{pytreestore.FORMAT_VERSION}"
#: files a writer leaves that are not part of the format (the flock file holds a pid)
NOT_FORMAT = (".pytreestore/lock",)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one golden store is written: ``record(i)`` for ``i < n``, appended in sessions."""

    record: Callable[[int], Any]
    n: int
    chunk_records: int
    codec: str | None
    backend: str = "tensorstore"
    sessions: tuple[int, ...] = ()  # record counts after which the writer closes and reopens
    #: (record count, changes): after that many records, ``store.evolve(**changes)``; records
    #: before it are written as ``before(i)``, and ``record(i)`` is how they read back
    evolve: tuple[int, dict[str, Any]] | None = None
    before: Callable[[int], Any] | None = None
    #: format 3: ``create(ragged=, optional=)``; None for a fixed store
    ragged: list[str] | None = None
    optional: list[str] | None = None
    #: format 3: (record count, tag, kept): after that many records, ``store.tag(tag)`` and
    #: ``store.truncate(kept)``; the records from ``kept`` on are then appended again
    truncate: tuple[int, str, int] | None = None
    #: format 3 (issue 28): once every record is written, ``store.tag("all")``, then for each
    #: count ``store.truncate(count)`` and the records from it on appended again (a rerun);
    #: the commit record keeps at most ``history`` releases apart (``horizon`` past that)
    reruns: tuple[int, ...] = ()
    history: int | None = None
    #: format 3 (issue 31): ``create(inner_chunk_bytes=)``
    inner_chunk_bytes: Any = None
    #: format 3 (issue 46): (record count, kept): after that many records,
    #: ``store.keep_last(kept)``; once every record is written, ``vacuum()`` with
    #: ``keep_versions=1`` deletes the chunks of released rows
    keep_last: tuple[int, int] | None = None

    @property
    def dropped(self) -> int:
        """The records released from the front (``store.dropped``)."""
        return 0 if self.keep_last is None else self.keep_last[0] - self.keep_last[1]

    def records(self) -> list[Any]:
        """The records the store holds: the last ``n - dropped`` of those appended."""
        return [self.record(i) for i in range(self.dropped, self.n)]

    def written(self, i: int) -> Any:
        """Record ``i`` as it is appended."""
        if self.evolve is not None and self.before is not None and i < self.evolve[0]:
            return self.before(i)
        return self.record(i)


def seed_record(i: int) -> trees.AllParams:
    return trees.seed_records()[i]


_DTYPE_COLUMNS = {
    name: dtype_values(dtype, 2 * 6, seed=k).reshape(6, 2)
    for k, (name, dtype) in enumerate(_dtypes.SUPPORTED.items())
}


def dtypes_record(i: int) -> dict[str, np.ndarray]:
    return {name: column[i] for name, column in _DTYPE_COLUMNS.items()}


def tree_record(i: int) -> dict[str, Any]:
    """Odd dict keys (escaping), every node kind, static data, a custom node with keys."""
    return {
        "a/b": np.float32(i + 0.5),
        ".hidden": np.int16(-i),
        "é": np.arange(2, dtype=np.uint32) * i,
        "": np.bool_(i % 2),
        "zarr.json": np.float64(i / 3),
        "__dunder": np.int8(i),
        "100%": np.complex64(i - 1j),
        "nodes": [
            pts.Pair(np.full((2, 2), i, np.float32), None),
            (np.int64(2**40 + i), ()),
            collections.OrderedDict(z=np.uint8(i), a=np.uint8(255 - i)),
            pts.Tagged(np.full(3, i, ml_dtypes.bfloat16), label=("run/1", 2)),
            trees.Keyed(w=np.float16(i), b=[np.int32(i)]),
            trees.WithStatic(np.float32(-i), name="w", sizes=(3,)),
        ],
        "empty": {},
    }


def root_leaf_record(i: int) -> np.ndarray:
    return (np.arange(6, dtype=np.float16).reshape(3, 2) + i) / 4


def evolved_before(i: int) -> dict[str, Any]:
    return {"x": np.float32(i), "old": np.int8(i), "s": trees.WithStatic(np.float32(i), name="a")}


def evolved_record(i: int) -> dict[str, Any]:
    """Format 2: a column added (default -3 for the first 3 records), one dropped, one renamed."""
    y = np.int16(-3) if i < 3 else np.int16(10 * i)
    return {"w": np.float32(i), "y": y, "s": trees.WithStatic(np.float32(i), name="a")}


def ragged_record(i: int) -> trees.Event:
    """Format 3: a ragged list of dataclasses whose elements hold a ragged leading axis, a
    leaf and a node with ragged leading axes, an optional subtree; record 0 has every part."""
    hits = [
        trees.Hit(
            pos=np.arange(3, dtype=np.float32) + 10 * i + j,
            samples=np.arange((i + j) % 3 + 1, dtype=np.int16) - 5 * i,
        )
        for j in range((2, 0, 3, 1, 0)[i])
    ]
    steps, points = (3, 1, 0, 4, 2)[i], (2, 0, 1, 3, 0)[i]
    return trees.Event(
        hits=hits,
        trace=(np.arange(2 * steps, dtype=np.float16).reshape(steps, 2) - i) / 4,
        track={
            "t": np.arange(points, dtype=np.float32) * (i + 1),
            "q": np.full((points, 2), i - 2, np.int8),
        },
        calib=None if i in (1, 4) else trees.Calib(np.float32(i / 3), np.int8(-i)),
        run=np.int32(100 + i),
    )


def static_arrays_record(i: int) -> static_trees.World:
    """Format 3: static arrays in a codec's wrapper (int32, empty bfloat16, 0-d bool) and
    int-keyed dicts, at the root, in a ragged list's elements and in an optional subtree."""
    return static_trees.record("golden", i)


def weak_record(i: int) -> dict[str, Any]:
    """Format 3: weakly typed leaves (``weak_type``: Python int and float, a weak
    ``jax.Array``) beside strongly typed ones of the same dtypes."""
    return {
        "time": i,
        "scale": i / 4,
        "gain": jnp.asarray(0.5) * i,
        "x": np.full(2, i, np.float32),
        "n": np.int32(i),
    }


EVOLVED = {
    "add": {"['y']": np.int16(-3)},
    "drop": ["['old']"],
    "rename": {"['x']": "['w']"},
}

RECIPES: dict[str, Recipe] = {
    "seed": Recipe(seed_record, 3, chunk_records=2, codec="zstd"),
    "dtypes": Recipe(dtypes_record, 6, chunk_records=4, codec=None, sessions=(3,)),
    "tree": Recipe(tree_record, 5, chunk_records=3, codec="blosc", sessions=(2,)),
    "root-leaf": Recipe(root_leaf_record, 3, chunk_records=2, codec="gzip"),
    "seed-zarr": Recipe(seed_record, 3, chunk_records=2, codec="zstd", backend="zarr"),
    "evolved": Recipe(
        evolved_record, 5, chunk_records=2, codec=None, evolve=(3, EVOLVED), before=evolved_before
    ),
    "versions": Recipe(
        evolved_record, 6, chunk_records=2, codec=None, truncate=(5, "five", 3), sessions=(2, 5)
    ),
    "horizon": Recipe(
        dtypes_record, 6, chunk_records=2, codec=None, reruns=(1, 2, 3, 4), history=2
    ),
    "weak": Recipe(weak_record, 3, chunk_records=2, codec="zstd"),
    "ragged": Recipe(
        ragged_record,
        5,
        chunk_records=2,
        codec="zstd",
        sessions=(2,),
        ragged=trees.EVENT_RAGGED,
        optional=trees.EVENT_OPTIONAL,
    ),
    "static-arrays": Recipe(
        static_arrays_record,
        4,
        chunk_records=2,
        codec="zstd",
        ragged=static_trees.DECLARATIONS["golden"]["ragged"],
        optional=static_trees.DECLARATIONS["golden"]["optional"],
    ),
    "int-keys": Recipe(static_trees.layers_record, 3, chunk_records=2, codec=None),
    # issue 31: chunks as shards of inner chunks (4 bytes: one float32 or int32 per inner
    # chunk of a scalar leaf, a wider leaf's chunks stay plain), written in two sessions
    "inner-chunks": Recipe(
        seed_record, 3, chunk_records=2, codec="zstd", sessions=(1,), inner_chunk_bytes=4
    ),
    "inner-chunks-zarr": Recipe(
        seed_record,
        3,
        chunk_records=2,
        codec="zstd",
        backend="zarr",
        sessions=(1,),
        inner_chunk_bytes=4,
    ),
    "inner-ragged": Recipe(
        ragged_record,
        5,
        chunk_records=4,
        codec=None,
        sessions=(2,),
        ragged=trees.EVENT_RAGGED,
        optional=trees.EVENT_OPTIONAL,
        inner_chunk_bytes=8,
    ),
    # issue 46: the front released (commit record member "first", operation "keep_last"),
    # a record appended after it, and the chunks of released rows vacuumed
    "keep-last": Recipe(
        ragged_record,
        5,
        chunk_records=2,
        codec=None,
        ragged=trees.EVENT_RAGGED,
        optional=trees.EVENT_OPTIONAL,
        keep_last=(4, 1),
    ),
}


#: the store id written into every golden commit record (``create`` draws a random one)
GOLDEN_STORE_ID = "90de0000000000000000000000000000"


def write(name: str, path: Path) -> None:
    """Writes golden store ``name`` at ``path`` (which must not exist)."""
    recipe = RECIPES[name]
    records = [recipe.written(i) for i in range(recipe.n)]
    at = recipe.evolve[0] if recipe.evolve else None
    release = recipe.keep_last[0] if recipe.keep_last else None
    cuts = sorted({0, *recipe.sessions, *(c for c in (at, release) if c), recipe.n})
    for k, (start, stop) in enumerate(itertools.pairwise(cuts)):
        if k == 0:
            store = pytreestore.create(
                path,
                records[0],
                chunk_records=recipe.chunk_records,
                codec=recipe.codec,
                backend=recipe.backend,
                ragged=recipe.ragged,
                optional=recipe.optional,
                inner_chunk_bytes=recipe.inner_chunk_bytes,
            )
        else:
            store = pytreestore.open(path, "a", backend=recipe.backend)
        with store:
            for record in records[start:stop]:
                store.append(record)
            if recipe.evolve is not None and stop == at:
                store.evolve(**recipe.evolve[1])
            if recipe.truncate is not None and stop == recipe.truncate[0]:
                _, tag, kept = recipe.truncate
                store.tag(tag)
                store.truncate(kept)
                store.extend(records[kept:stop])
            if recipe.keep_last is not None and stop == recipe.keep_last[0]:
                store.keep_last(recipe.keep_last[1])
    if recipe.keep_last is not None:
        with pytreestore.open(path, "a", backend=recipe.backend, keep_versions=1) as store:
            store.vacuum()
    if recipe.reruns:
        _rerun(path, recipe, records)
    for extra in NOT_FORMAT:
        (path / extra).unlink(missing_ok=True)
    _fix_random(path)


def _rerun(path: Path, recipe: Recipe, records: list[Any]) -> None:
    """``recipe.reruns``, with the commit record's bound of releases set to ``history``."""
    bound = record_module._HISTORY
    record_module._HISTORY = recipe.history or bound
    try:
        with pytreestore.open(path, "a", backend=recipe.backend) as store:
            store.tag("all")
            for count in recipe.reruns:
                store.truncate(count)
                store.extend(records[count:])
                store.flush()
    finally:
        record_module._HISTORY = bound


#: the time written into every golden commit, version and tag record
GOLDEN_TIME = "2026-01-01T00:00:00.000000Z"


def _fix_random(path: Path) -> None:
    """Makes what ``create`` draws (the store id) and the commit times the golden ones."""
    meta = path / ".pytreestore"
    for record in [meta / "commit.json", *sorted((meta / "versions").glob("*.json"))]:
        obj = json.loads(record.read_bytes())
        record.write_bytes(json.dumps(dict(obj, store=GOLDEN_STORE_ID, time=GOLDEN_TIME)).encode())
    for tag in sorted((meta / "tags").glob("*.json")):
        tag.write_bytes(json.dumps(dict(json.loads(tag.read_bytes()), time=GOLDEN_TIME)).encode())


def files(path: Path) -> list[str]:
    """Every file below ``path``, relative, sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def differences(name: str, golden: Path, fresh: Path) -> list[str]:
    """How the store ``fresh`` (just written) differs from its golden copy.

    Metadata (every ``.json``) must match byte for byte, and so must the chunks of
    uncompressed stores; compressed chunks are compared by the test through their values.
    """
    found = []
    want, got = files(golden), files(fresh)
    if want != got:
        found.append(
            f"{name}: files differ: only golden {sorted(set(want) - set(got))}, "
            f"only new {sorted(set(got) - set(want))}"
        )
    exact = RECIPES[name].codec is None
    for rel in sorted(set(want) & set(got)):
        if (rel.endswith(".json") or exact) and not filecmp.cmp(golden / rel, fresh / rel, False):
            found.append(f"{name}: {rel} differs from the golden copy")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; rewrite nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        problems = []
        for name in RECIPES:
            fresh = Path(tmp) / name
            write(name, fresh)
            if args.check:
                problems += differences(name, CURRENT / name, fresh)
            else:
                shutil.rmtree(CURRENT / name, ignore_errors=True)
                shutil.copytree(fresh, CURRENT / name)
                print(f"wrote {CURRENT / name} ({len(files(fresh))} files)")
    print("\n".join(problems) or ("golden stores match" if args.check else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
