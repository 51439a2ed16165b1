"""Fuzzing the stored schema: random edits of a valid schema document that still pass the JSON
Schema, written into real stores, then opened and loaded in a subprocess.

Each store must either load with every column holding exactly the data stored under its key,
or raise a PyTreeStoreError: never another exception, never a crash (a crash kills the
subprocess, and the test names the store it was reading).
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

import pytreestore
from pytreestore._format import validate as _validate
from tests import interpreters, trees
from tests.conftest import child_env
from tests.data import make_golden

ROOT = Path(__file__).resolve().parents[1]
STORES_PER_RUN = 40
#: the seeds of the edits (fixed: a failure names its store, and replays)
SEEDS = (0, 1, 2)

_READER = """
import faulthandler, json, sys
faulthandler.enable()
import numpy as np
import jax
import pytreestore
from pytreestore._read.reader import load_leaves
from pytreestore._read.request import LoadRequest
from pytreestore.errors import PyTreeStoreError
base_path, paths = sys.argv[1], json.loads(sys.argv[2])

def columns(store):
    request = LoadRequest.build(store.schema, policy=False, as_numpy=True)
    return load_leaves(store.read_context(), request, slice(None))

base = pytreestore.open(base_path)
truth = {c.key: leaf for c, leaf in zip(base.schema.columns, columns(base))}
for path in paths:
    print("START", path, flush=True)
    try:
        store = pytreestore.open(path)
        jax.tree.leaves(store.load(as_numpy=True))
        list(store.records(as_numpy=True))
        for c, leaf in zip(store.schema.columns, columns(store)):
            want = truth[c.key]
            assert leaf.dtype == want.dtype and leaf.tobytes() == want.tobytes(), c.path
        outcome = "ok"
    except PyTreeStoreError as err:
        outcome = type(err).__name__
    except Exception as err:
        outcome = "BAD " + type(err).__name__ + ": " + str(err)[:300]
    print("RESULT", json.dumps([path, outcome]), flush=True)
"""


def base_store(tmp: Path) -> Path:
    path = tmp / "base"
    records = [make_golden.tree_record(i) for i in range(3)]
    records = [{**r, "s": trees.WithStatic(np.float32(i), name="n")} for i, r in enumerate(records)]
    with pytreestore.create(path, records[0], chunk_records=2) as store:
        store.extend(records)
    return path


def locations(node: Any, at: tuple = ()) -> list[tuple]:
    """Every JSON location below ``node``: a path of keys and indices."""
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += locations(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += locations(v, (*at, i))
    return out


def get(doc: Any, at: tuple) -> Any:
    for part in at:
        doc = doc[part]
    return doc


VALUES = [None, True, False, -1, 0, 1, 2, 3, 7, 2**33, 0.5, -2.5, 1e308, "", "x", "a/b", "leaf",
          "custom", "tests.trees:Keyed", "builtins:dict", "tests.trees:Pair", "int8", "bfloat16",
          "%", "NaN", ".x", "['a/b']", [], [0], [1, 2], [0, 0, 0], {}]  # fmt: skip
OPS = ["set", "reuse", "reuse", "delete", "swap", "dup"]


def edits(rng: random.Random) -> list[tuple[str, int, Any]]:
    """One to three random edits: (operation, seed of the location, value)."""
    return [
        (rng.choice(OPS), rng.getrandbits(31), copy.deepcopy(rng.choice(VALUES)))
        for _ in range(rng.randint(1, 3))
    ]


def mutate(info: dict, edits: list[tuple[str, int, Any]]) -> dict:
    doc = copy.deepcopy(info)
    doc.pop("digest", None)
    for op, seed, value in edits:
        rng = random.Random(seed)
        places = [p for p in locations(doc) if p]
        at = rng.choice(places)
        parent, last = get(doc, at[:-1]), at[-1]
        if op == "set":
            parent[last] = value
        elif op == "reuse":  # a value from elsewhere in the document: often still valid
            parent[last] = copy.deepcopy(get(doc, rng.choice(places)))
        elif op == "delete":
            del parent[last]
        elif isinstance(parent, list) and op == "swap":
            j = rng.randrange(len(parent))
            parent[last], parent[j] = parent[j], parent[last]
        elif isinstance(parent, list) and op == "dup":
            parent.insert(last, copy.deepcopy(parent[last]))
    return doc


def edited_stores(base: Path, tmp: Path, seed: int) -> list[str]:
    """Up to :data:`STORES_PER_RUN` copies of ``base`` whose schema has random edits that still
    pass the JSON Schema, made from ``seed``; their paths."""
    rng = random.Random(seed)
    document = json.loads((base / "zarr.json").read_text())
    info = document["attributes"]["pytreestore"]
    unedited = {k: v for k, v in info.items() if k != "digest"}
    paths = []
    for k in range(400):
        doc = mutate(info, edits(rng))
        whole = {**document, "attributes": {"pytreestore": doc}}
        if doc == unedited or not _validate.validator().is_valid(whole):
            continue
        if k % 2:  # half with a digest: readers then skip the JSON Schema
            doc["digest"] = _validate.digest(doc)
        path = tmp / f"s{seed}-m{k}"
        shutil.copytree(base, path, copy_function=os.link)  # the reader only reads the chunks
        (path / "zarr.json").unlink()  # not written through the link: base keeps its own
        (path / "zarr.json").write_text(json.dumps(whole))
        paths.append(str(path))
        if len(paths) == STORES_PER_RUN:
            break
    assert len(paths) >= 10, "too few edits still pass the JSON Schema"
    return paths


def test_mutated_schemas_load_exactly_or_raise(tmp_path):
    base = base_store(tmp_path)
    paths = [p for seed in SEEDS for p in edited_stores(base, tmp_path, seed)]
    proc = interpreters.run(  # one reader for every store, forked (tests/interpreters.py)
        [sys.executable, "-c", _READER, str(base), json.dumps(paths)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
        timeout=300,
    )
    started = [
        line.split(" ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("START")
    ]
    assert proc.returncode == 0, (
        f"the reader died ({proc.returncode}) on {started[-1] if started else None}: "
        f"{json.loads(Path(started[-1], 'zarr.json').read_text()) if started else ''}\n"
        f"{proc.stderr[-3000:]}"
    )
    results = [
        json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT")
    ]
    assert len(results) == len(paths)
    bad = [(p, o) for p, o in results if o.startswith("BAD")]
    assert not bad, bad
    assert any(o == "ok" for _, o in results)  # some edits are harmless (a swap of equals...)
