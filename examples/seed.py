"""The motivating example: store a list of nested flax dataclasses, then vmap over it.

Run with ``.venv/bin/python examples/seed.py``. It prints the vmapped result and exits non-zero
if anything read back differs from what was appended.
"""

import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from flax.struct import dataclass

import pytreestore

# --- the motivating example, as it would be written without pytreestore ------------------


@dataclass
class Params:
    x: jax.Array
    y: jax.Array


@dataclass
class AllParams:
    p: list[Params]


params_list = [
    AllParams([Params(4, 2), Params(4, 3)]),
    AllParams([Params(3, 5), Params(2, 4)]),
    AllParams([Params(3, 2), Params(6, 3)]),
]


def some_func(params):
    a, b = params.p
    return a.x * b.y - b.x * a.y


# --- storing it ------------------------------------------------------------------------------


def same_record(got, expected) -> bool:
    """True when two records have the same treedef and equal leaves."""
    if jax.tree.structure(got) != jax.tree.structure(expected):
        return False
    pairs = zip(jax.tree.leaves(got), jax.tree.leaves(expected), strict=True)
    return all(np.array_equal(np.asarray(g), np.asarray(e)) for g, e in pairs)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/params.pytreestore"

        # The first record fixes the schema: one int32 column per leaf (Python ints are int32
        # while JAX's x64 mode is off). Its values are not stored.
        with pytreestore.create(path, like=params_list[0]) as store:
            store.append(params_list[0])  # one record at a time ...
            store.extend(params_list[1:])  # ... or many at once
        # Leaving the `with` block flushed and closed the store: the records are durable.

        store = pytreestore.open(path)
        print(f"{len(store)} records, columns: {[c.path for c in store.schema.columns]}")

        batch = store[:]  # an AllParams whose leaves have a leading record axis
        result = jax.vmap(some_func)(batch)
        print(repr(result))

        expected = jnp.array([4, 2, -3], dtype=jnp.int32)
        assert result.dtype == expected.dtype, result.dtype
        assert bool(jnp.array_equal(result, expected)), result

        record = store[1]
        print("store[1] =", record)
        assert same_record(record, AllParams([Params(3, 5), Params(2, 4)])), record
        store.close()
    print("seed example OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
