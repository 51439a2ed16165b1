"""pytreestore.testing's exactness helpers: what :func:`assert_trees_equal` tells apart."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pytreestore.testing import assert_trees_equal, weak_type


def test_equal_trees_pass() -> None:
    tree = {"a": jnp.asarray(0.5), "b": np.arange(3, dtype=np.int16), "c": jnp.float32(1)}
    assert_trees_equal(tree, jax.tree.map(lambda x: x, tree))


def test_weak_type_is_compared() -> None:
    weak, strong = jnp.asarray(0.5), jnp.float32(0.5)
    assert (weak.dtype, weak.shape) == (strong.dtype, strong.shape)
    with pytest.raises(AssertionError, match=r"\['t'\].*got weak_type=False, want weak_type=True"):
        assert_trees_equal({"t": strong}, {"t": weak})
    with pytest.raises(AssertionError, match="got weak_type=True, want weak_type=False"):
        assert_trees_equal({"t": weak}, {"t": np.float32(0.5)})


def test_weak_type_of_leaves() -> None:
    assert weak_type(jnp.asarray(1)) and weak_type(jnp.zeros(2) * 0 + jnp.asarray(2.0)) is False
    assert not weak_type(np.float32(1)) and not weak_type(np.asarray(1.0))
    assert weak_type(jax.jit(lambda t: t + 1)(jnp.asarray(3)))


def test_static_data_and_dtypes_are_compared() -> None:
    with pytest.raises(AssertionError, match="treedefs differ"):
        assert_trees_equal((np.float32(1),), [np.float32(1)])
    with pytest.raises(AssertionError, match=r"got int16\[3\], want int32\[3\]"):
        assert_trees_equal(np.zeros(3, np.int16), np.zeros(3, np.int32))
    with pytest.raises(AssertionError, match="leaf at the root"):
        assert_trees_equal(np.array([1.0, np.nan]), np.array([2.0, np.nan]))
