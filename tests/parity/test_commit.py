"""The one commit sequence (``pytreestore._log.transaction``) on every kind of store and
backend: tag, truncate and a refused truncate, each through ``StoreCore.commit``; exact values
read back after reopening, at the latest version and at a tag."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from tests.parity import kinds

pytestmark = pytest.mark.parametrize("backend", kinds.BACKENDS)


def _same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert jax.tree.structure(g) == jax.tree.structure(w)
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(w), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            assert np.asarray(a).dtype == np.asarray(b).dtype


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_tag_and_truncate_commit_through_the_one_sequence(tmp_path, kind, backend):
    path = tmp_path / "s"
    recs = kinds.filled(path, kind, backend, n=6)
    more = kinds.records(kind, 2, start=6)
    with pytreestore.open(path, "a") as store:
        store.extend(more)
        with pytest.raises(errors.StoreIndexError, match="holds 8"):
            store.truncate(9)
        assert (store.committed, len(store)) == (6, 8)  # refused before the flush
        store.tag("eight")  # flushes, then names the version
        assert store.committed == 8
        store.truncate(3)
        assert [v.operation for v in store.versions()][-1] == "truncate"
        assert isinstance(store[2], kinds.Step)
        _same(list(store.records(as_numpy=True)), recs[:3])
    _same(list(pytreestore.open(path).records(as_numpy=True)), recs[:3])
    _same(list(pytreestore.open(path, version="eight").records(as_numpy=True)), recs + more)


class _Failing:
    """An operation whose writes fail: nothing commits, and the store goes on."""

    name, commits, releases = "truncate", True, False

    def check(self, engine: Any, writer: Any) -> None:
        pass

    def prepare(self, engine: Any, writer: Any) -> None:
        pass

    def apply(self, engine: Any, head: Any, schema: Any) -> Any:
        raise errors.StorageError("disk full")

    def abort(self, engine: Any, head: Any, error: BaseException) -> None:
        pass


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_a_failed_commit_leaves_the_store_as_it_was(tmp_path, kind, backend):
    path = tmp_path / "s"
    recs = kinds.filled(path, kind, backend, n=4)
    with pytreestore.open(path, "a") as store:
        version = store.version
        with pytest.raises(errors.StorageError, match="disk full"):
            store._core.commit(_Failing())
        assert store.version == version and store.committed == 4
        extra = kinds.records(kind, 1, start=4)
        store.extend(extra)
    _same(list(pytreestore.open(path).records(as_numpy=True)), recs + extra)
