"""A record of another dataclass with the same fields is refused (JAX's treedef equality does
not compare a dataclass node's class; ``TreeSchema.holds`` does), on every path a fixed store
takes records by: append, extend (list and generator), extend_batch, stack, fragments; and a
ragged store's append."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import SchemaMismatchError


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Stored:
    x: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Other:
    x: Any


def _like(cls):
    return {"a": cls(np.int32(0)), "n": np.int32(0)}


def test_jax_compares_such_treedefs_equal():  # why the check exists; fails once JAX fixes it
    assert jax.tree.structure(Stored(1)) == jax.tree.structure(Other(1))


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.append(_like(Other)),
        lambda s: s.extend([_like(Stored), _like(Other)]),
        lambda s: s.extend(iter([_like(Stored), _like(Other)])),
        lambda s: s.extend_batch({"a": Other(np.zeros(2, np.int32)), "n": np.zeros(2, np.int32)}),
    ],
    ids=["append", "extend-list", "extend-iterator", "extend_batch"],
)
def test_a_record_of_another_class_is_refused(tmp_path, backend, call):
    store = pytreestore.create(tmp_path / "s", _like(Stored), backend=backend)
    store.append(_like(Stored))
    with pytest.raises(SchemaMismatchError, match=r"expected Stored with fields .* got Other"):
        call(store)
    store.close()
    got = pytreestore.open(tmp_path / "s", backend=backend)
    assert len(got) == 1 and type(got[0]["a"]) is Stored


def test_stack_with_like_refuses_another_class():
    with pytest.raises(SchemaMismatchError, match="got Other"):
        pytreestore.stack([_like(Stored), _like(Other)], like=_like(Stored))


def test_a_ragged_store_refuses_another_class(tmp_path):
    like = {"p": [Stored(np.int32(0))], "n": np.int32(0)}
    store = pytreestore.create(tmp_path / "s", like, ragged=["['p']"])
    store.append({"p": [Stored(np.int32(1))], "n": np.int32(1)})
    with pytest.raises(SchemaMismatchError, match=r"expected a Stored, got a Other"):
        store.append({"p": [Other(np.int32(2))], "n": np.int32(2)})
    with pytest.raises(SchemaMismatchError, match=r"expected a Stored, got a Other"):
        store.append({"p": [Stored(np.int32(3)), Other(np.int32(4))], "n": np.int32(3)})
    store.close()
    got = pytreestore.open(tmp_path / "s")
    assert len(got) == 1 and type(got[0]["p"][0]) is Stored
