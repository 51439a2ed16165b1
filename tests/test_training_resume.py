"""Resumable training in one store (issue 46): a data iterator's ``state()`` kept in a
checkpoint record as it is, and a training run SIGKILLed mid-run that resumes, in a fresh
process, to the very bytes of an uninterrupted run (examples/train_checkpoint.py).

Issue 46: appending ``{"params": ..., "data": it.state()}`` raised ``UnsupportedTreeError:
unsupported leaf at ['data']['shuffle']: str``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import pickle
import random
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import ArgumentTypeError, SchemaMismatchError, UnsupportedTreeError
from tests import interpreters
from tests.conftest import child_env, diagonal, tiered
from tests.parity import kinds

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_checkpoint.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("train_checkpoint", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example() -> Any:
    return _example()


def ids(batches: Any, name: str = "") -> list[list[int]]:
    """The record indices of each batch (of a kind's store when ``name`` is given, whose
    ragged or optional batches come padded)."""
    if not name:
        return [np.asarray(b["t"]).tolist() for b in batches]
    return [np.asarray((b if kinds.kind(name).is_fixed else b[0]).t).tolist() for b in batches]


def _numbers(path: Path, backend: str = "tensorstore", n: int = 20) -> pytreestore.TreeStore:
    with pytreestore.create(path, {"t": np.int32(0)}, chunk_records=4, backend=backend) as s:
        s.extend_batch({"t": np.arange(n, dtype=np.int32)})
    return pytreestore.open(path, backend=backend)


# ---- the state is a record ------------------------------------------------------------------


def test_state_is_a_json_able_dict_whose_position_is_its_leaves(tmp_path):
    it = _numbers(tmp_path / "d").batches(3, shuffle=True, seed=5)
    next(it)
    state = it.state()
    assert isinstance(state, pytreestore.BatchState) and isinstance(state, dict)
    assert json.loads(json.dumps(state)) == state == dict(state)
    assert jax.tree.leaves(state) == [0, 1]
    assert [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)] == [
        "['epoch']",
        "['batch']",
    ]
    assert type(pickle.loads(pickle.dumps(state))) is pytreestore.BatchState
    assert jax.tree.map(lambda x: x, state) == state
    it.close()


CELLS = [(k, b) for k in kinds.KINDS for b in kinds.BACKENDS]


@pytest.mark.parametrize(
    ("name", "backend"), tiered(CELLS, diagonal(kinds.KINDS, kinds.BACKENDS)), ids=str
)
def test_a_checkpoint_holds_the_state_on_every_kind_and_backend(tmp_path, name, backend):
    """A record of each kind with the state of an iterator over a store of that kind, in a
    store of that kind: loaded back (jax arrays or numpy), the state resumes as it is."""
    kinds.filled(tmp_path / "data", name, backend, n=9)
    data = pytreestore.open(tmp_path / "data", backend=backend)
    options = {"shuffle": "uniform", "seed": 3, "epochs": 2}
    it = data.batches(2, **options)
    declared: dict[str, Any] = {
        key: [f"['step']{p}" for p in paths] for key, paths in kinds.kind(name).declarations.items()
    }
    like = {"step": kinds.like(name), "data": it.state()}
    with pytreestore.create(tmp_path / "ckpt", like, backend=backend, **declared) as ckpt:
        for i in range(3):
            next(it)
            ckpt.append({"step": kinds.record(name, i), "data": it.state()})
        want = ids(it, name)
    store = pytreestore.open(tmp_path / "ckpt", backend=backend)
    for loaded in (store[-1]["data"], store.load(-1, as_numpy=True)["data"]):
        assert type(loaded) is pytreestore.BatchState
        assert (int(loaded["epoch"]), int(loaded["batch"])) == (0, 3)
        assert ids(data.batches(2, **options, state=loaded), name) == want
    kinds.assert_same(store[1]["step"], kinds.record(name, 1))


def test_a_state_of_other_settings_is_refused_by_the_append(tmp_path):
    data = _numbers(tmp_path / "d")
    record = {"w": np.zeros(2, np.float32), "data": data.batches(4, seed=1).state()}
    with pytreestore.create(tmp_path / "c", record) as ckpt:
        ckpt.append(record)
        other = {**record, "data": data.batches(4, seed=2).state()}
        with pytest.raises(SchemaMismatchError, match=re.escape("['data']: static data stored")):
            ckpt.append(other)
        assert len(ckpt) == 1


def test_a_dict_read_back_from_json_is_stored_as_a_batch_state(tmp_path):
    data = _numbers(tmp_path / "d")
    it = data.batches(4, shuffle=True, seed=1)
    next(it)
    saved = json.loads(json.dumps(it.state()))
    with pytreestore.create(tmp_path / "c", {"data": pytreestore.BatchState(saved)}) as ckpt:
        ckpt.append({"data": pytreestore.BatchState(saved)})
    loaded = pytreestore.open(tmp_path / "c")[0]["data"]
    assert ids(data.batches(4, shuffle=True, seed=1, state=loaded)) == ids(it)


def test_a_plain_dict_state_is_refused_with_what_to_do(tmp_path):
    state = dict(_numbers(tmp_path / "d").batches(4, shuffle="uniform").state())
    with pytest.raises(UnsupportedTreeError) as caught:
        pytreestore.create(tmp_path / "c", {"data": state})
    assert str(caught.value).startswith("unsupported leaf at ['data']['shuffle']: str.")
    assert str(caught.value).endswith("goes in as pytreestore.BatchState(d)).")


def test_a_plain_dict_state_stored_unshuffled_resumes(tmp_path):
    """An unshuffled state as a plain dict stores (its ``shuffle`` a bool column, its
    ``window`` None), and resumes from what is read back."""
    data = _numbers(tmp_path / "d")
    it = data.batches(4)
    next(it)
    with pytreestore.create(tmp_path / "c", {"data": dict(it.state())}) as ckpt:
        ckpt.append({"data": dict(it.state())})
    loaded = pytreestore.open(tmp_path / "c")[0]["data"]
    assert ids(data.batches(4, state=loaded)) == ids(it)


def test_the_states_of_many_checkpoints_are_not_one_state(tmp_path):
    data = _numbers(tmp_path / "d")
    it = data.batches(4)
    with pytreestore.create(tmp_path / "c", {"data": it.state()}) as ckpt:
        for _ in range(2):
            next(it)
            ckpt.append({"data": it.state()})
    states = pytreestore.open(tmp_path / "c")[:]["data"]
    assert np.asarray(states["batch"]).tolist() == [1, 2]
    with pytest.raises(ArgumentTypeError, match=re.escape("batches(state=...)['epoch'] must be")):
        data.batches(4, state=states)


# ---- a training run killed with SIGKILL resumes bit for bit ---------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """JAX's compilation cache of every run of the module: the step compiles once."""
    return tmp_path_factory.mktemp("jax-cache")


def train(example: Any, root: Path, backend: str, cache: Path, run: str) -> str:
    """Runs ``--train run`` in a fresh process; returns what it printed."""
    command = [*example.command(root, backend, cache), "--train", run]
    done = interpreters.run(command, capture_output=True, text=True, env=child_env())
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def uninterrupted(example, cache, tmp_path_factory) -> tuple[Any, list[bytes]]:
    """The last checkpoint of the example's run trained without interruption: its structure
    and the bytes of every leaf."""
    root = tmp_path_factory.mktemp("uninterrupted")
    example.write_data(root / "data", "tensorstore")
    train(example, root, "tensorstore", cache, "run")
    return example.leaf_bytes(root / "run", "tensorstore")


@pytest.mark.parametrize("backend", tiered(kinds.BACKENDS, ("tensorstore", "zarr")))
def test_a_run_killed_with_sigkill_resumes_to_the_same_bytes(
    example, cache, uninterrupted, tmp_path, backend
):
    """The example's run, in a child process SIGKILLed at a random step after its first
    checkpoint, resumed in another fresh process, ends with the bytes of every leaf of the
    uninterrupted run (parameters, optimizer state, iterator state, RNG key)."""
    seed = random.randrange(2**32)
    example.write_data(tmp_path / "data", backend)
    popen = functools.partial(interpreters.popen, env=child_env())
    at = example.kill_at_random_step(tmp_path, backend, seed=seed, cache=cache, popen=popen)
    last = int(pytreestore.open(tmp_path / "killed", backend=backend)[-1]["step"])
    assert last % example.EVERY == 0 and example.EVERY <= last < example.STEPS, (seed, at, last)
    printed = train(example, tmp_path, backend, cache, "killed")
    assert printed.split()[:2] == ["step", str(last + 1)], (seed, printed[:80])
    assert example.leaf_bytes(tmp_path / "killed", backend) == uninterrupted, (seed, at, last)
