"""jraph ``GraphsTuple``s of molecules of different sizes, stored with ``ragged=``.

Node and edge counts vary per record: ``.nodes`` (a dict whose leaves share one ragged axis),
``.edges``, ``.senders`` and ``.receivers`` are declared ragged; ``n_node``, ``n_edge`` and
``.globals`` keep their shapes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import SchemaMismatchError
from pytreestore.testing import assert_trees_equal
from tests.libraries.harness import BACKENDS, Case, Results, write_and_read
from tests.trial_harness import Zygote

jraph = pytest.importorskip("jraph")

pytest_plugins = ("tests.fixtures",)

RAGGED = [".nodes", ".edges", ".senders", ".receivers"]
SIZES = [(3, 4), (5, 8), (2, 1), (4, 6)]  # (atoms, bonds) of each molecule


def molecule(atoms: int, bonds: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    return jraph.GraphsTuple(
        nodes={
            "z": rng.integers(1, 9, atoms).astype(np.int32),
            "pos": rng.normal(size=(atoms, 3)).astype(np.float32),
        },
        edges={"order": rng.integers(1, 3, bonds).astype(np.int8)},
        senders=rng.integers(0, atoms, bonds).astype(np.int32),
        receivers=rng.integers(0, atoms, bonds).astype(np.int32),
        n_node=np.array([atoms], np.int32),
        n_edge=np.array([bonds], np.int32),
        globals={"energy": rng.normal(size=1).astype(np.float32)},
    )


def molecules() -> list[Any]:
    return [molecule(a, b, seed) for seed, (a, b) in enumerate(SIZES)]


def molecule_like() -> Any:
    return molecule(1, 1, 0)


CASES = {"molecules": Case(molecules, "molecule_like", {"ragged": RAGGED})}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, zygote: Zygote) -> Iterator[Results]:
    yield write_and_read(__name__, CASES, tmp_path_factory.mktemp("jraph"), zygote)


@pytest.mark.parametrize("backend", BACKENDS)
def test_molecules_of_different_sizes(results: Results, backend: str) -> None:
    results.check("molecules", backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_padded_batch_matches_stack(results: Results, backend: str) -> None:
    store = results.open("molecules", backend)
    batch, mask = store.load(ragged="pad")
    want, want_mask = pytreestore.stack(molecules(), ragged=RAGGED)
    assert type(batch) is jraph.GraphsTuple
    assert batch.nodes["pos"].shape == (len(SIZES), max(a for a, _ in SIZES), 3)
    np.testing.assert_array_equal(mask.senders, want_mask.senders)
    np.testing.assert_array_equal(batch.nodes["pos"], want.nodes["pos"])


@pytest.mark.parametrize("call", ["append", "extend"])
def test_without_ragged_the_error_suggests_it(tmp_path: Any, call: str) -> None:
    """A molecule of another size, in a store created without ``ragged=``: the error names
    the entry that would accept it."""
    first, other = molecules()[:2]
    store = pytreestore.create(str(tmp_path / "s"), first)
    with pytest.raises(SchemaMismatchError, match=r"ragged=\[.*\.nodes") as caught:
        if call == "append":
            store.append(other)
        else:
            store.extend([other])
    assert "float32[3,3]" in str(caught.value) and "float32[5,3]" in str(caught.value)
    assert len(store) == 0


def without_globals(atoms: int, bonds: int, seed: int) -> Any:
    """A molecule as jraph's own examples build one: ``globals=None``."""
    return molecule(atoms, bonds, seed)._replace(globals=None)


def test_molecules_read_record_by_record(
    tmp_path: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Molecules of their own node and edge counts, a one-atom molecule without bonds among
    them, ``globals=None``: ``store[i]`` in a loop and iteration (blocks placed on the device,
    each molecule gathered by one compiled call) give each molecule exactly (issue 44, item 7:
    both raised IndexError)."""
    from pytreestore._read import placed

    monkeypatch.setattr(placed, "_plans", set())  # plans to compile, whatever ran before
    rng = np.random.default_rng(44)
    sizes = [(int(rng.integers(2, 9)), int(rng.integers(1, 12))) for _ in range(100)]
    sizes[3] = (1, 0)  # one atom, no bond
    sizes[50] = (1, 1)  # one atom bonded to itself
    want = [without_globals(a, b, seed) for seed, (a, b) in enumerate(sizes)]
    with pytreestore.create(
        tmp_path / "s", want[0], ragged=RAGGED, backend=backend, chunk_records=16
    ) as store:
        store.extend(want)
    with pytreestore.open(tmp_path / "s", backend=backend) as store:
        by_index = [store[i] for i in range(len(want))]
        iterated = list(store)
        as_numpy = list(store.records(as_numpy=True))
    for got, leaf_type in ((by_index, jax.Array), (iterated, jax.Array), (as_numpy, np.ndarray)):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert type(g) is jraph.GraphsTuple and g.globals is None
            assert isinstance(g.nodes["pos"], leaf_type) and isinstance(g.senders, leaf_type)
            assert_trees_equal(g, w)
