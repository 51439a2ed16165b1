"""A script that ends with background reads still running (tests/test_exit.py runs it).

``python exit_child.py WHERE READER ENDING``: WHERE is ``memory`` or a folder for the stores,
one per backend. READER is ``batches`` (jax arrays, read ahead by pytreestore, in order and
shuffled) or ``grain`` (numpy records through a Grain loader). Each iterator is left after its
first batch, with prefetched batches waiting; ENDING says how: ``break`` out of a loop over it,
``exit`` (the iterators still live when the script ends), ``del`` (dropped), ``raise`` (an
exception inside a loop over it that ends the script) or ``caught`` (exceptions inside
loops over each, and inside ``map``, caught).
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np

import pytreestore
from tests.parity.kinds import BACKENDS


def make(where: str, backend: str) -> pytreestore.TreeStore:
    path = f"memory://exit-{backend}" if where == "memory" else f"{where}/{backend}"
    like = {"x": np.zeros(64, np.float32), "i": np.int32(0)}
    store = pytreestore.create(path, like, chunk_records=8, backend=backend)
    rows = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    store.extend_batch({"x": rows, "i": np.arange(256, dtype=np.int32)})
    store.flush()
    return store


def grain_loader(store: pytreestore.TreeStore, shuffle: bool):
    import grain  # an optional dependency

    source = store.grain_source()
    sampler = grain.samplers.IndexSampler(
        num_records=len(source),
        shuffle=shuffle,
        seed=1,
        num_epochs=1,
        shard_options=grain.sharding.NoSharding(),
    )
    operations = [grain.transforms.Batch(batch_size=8)]
    return iter(grain.DataLoader(data_source=source, sampler=sampler, operations=operations))


def iterators(stores: list[pytreestore.TreeStore], reader: str) -> list:
    if reader == "grain":
        return [grain_loader(s, shuffle) for s in stores for shuffle in (False, True)]
    return [s.batches(8, shuffle=shuffle, prefetch=4) for s in stores for shuffle in (False, True)]


def fail(record):
    raise RuntimeError("an error inside map")


def main(where: str, reader: str, ending: str) -> None:
    stores = [make(where, backend) for backend in BACKENDS]
    live = iterators(stores, reader)
    for it in live:
        assert np.asarray(next(it)["x"]).shape == (8, 64), "a batch of 8 records"
    if ending == "break":
        for it in live:
            for _ in it:
                break
        del it, live
    if ending == "del":
        del it, live
    if ending == "caught":
        for it in live:
            try:
                for _ in it:
                    raise RuntimeError("an error inside the loop")
            except RuntimeError:
                pass
        for store in stores:  # map's reads ahead end with it
            with contextlib.suppress(RuntimeError):
                store.map(fail, batch_size=8)
        del it, live
    if ending == "raise":
        for _ in live[0]:
            raise RuntimeError("an error inside the loop, left to end the script")


if __name__ == "__main__":
    main(*sys.argv[1:])
