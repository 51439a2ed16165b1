"""The motivating example: store a list of nested flax dataclasses, then vmap over it.

Then the case the first answer excluded: records whose lists differ in length (one of them
empty), kept in a ragged store and loaded padded, with a mask, for ``jax.vmap``.

Run with ``.venv/bin/python examples/seed.py``. It prints the vmapped results and exits non-zero
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

        ragged_lists(f"{tmp}/ragged.pytreestore")
    print("seed example OK")
    return 0


# --- when the lists differ in length: a ragged store -----------------------------------------

ragged_list = [
    AllParams([Params(4, 2), Params(4, 3)]),
    AllParams([]),  # an empty list is a record too
    AllParams([Params(3, 5), Params(2, 4), Params(1, 7)]),
    AllParams([Params(6, 3)]),
]


def weighted_sum(params, mask):
    """sum of x * y over the real elements of one record's list (padding masked out)."""
    return jnp.sum(jnp.where(mask.p.x, params.p.x * params.p.y, 0))


def ragged_lists(path: str) -> None:
    # ragged=[".p"]: the length of .p may differ from record to record. `like` still fixes the
    # structure and dtypes of one element (Params of two int32 leaves).
    with pytreestore.create(path, like=ragged_list[0], ragged=[".p"]) as store:
        for record in ragged_list:  # appended as produced, whatever their lengths
            store.append(record)

    store = pytreestore.open(path)
    # Padded to the longest list (3): batch.p is one Params whose leaves are [records, 3], and
    # mask has the batch's structure, True where an element is real.
    batch, mask = store.load(ragged="pad")
    print("padded:", batch.p.x.shape, "lengths:", store.lengths()[".p"].tolist())
    result = jax.jit(jax.vmap(weighted_sum))(batch, mask)
    print(repr(result))

    loop = [sum(q.x * q.y for q in record.p) for record in ragged_list]
    assert result.tolist() == loop, (result, loop)

    # One record comes back exactly as appended: its own list length, no padding.
    for i, record in enumerate(ragged_list):
        got = store[i]
        assert len(got.p) == len(record.p), (i, got)
        assert same_record(got, record), (i, got)
    print("store[1] =", store[1], "store[3] =", store[3])
    store.close()


if __name__ == "__main__":
    sys.exit(main())
