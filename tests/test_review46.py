"""Regressions found by the adversarial review of issue 46's features (keep_last, reads
through a writer, replay buffers, recorders): each test fails on the code it was found in."""

from __future__ import annotations

import threading

import numpy as np

import pytreestore


def test_a_read_after_len_sees_the_records_len_counted_while_another_thread_appends(path, backend):
    """``store[len(store) - 1]`` while another thread is inside an append: ``len`` counts the
    writer's buffered records, so the read after it must see them too (it waits for the
    append), not only the committed ones (it raised ``StoreIndexError``: "record index 5 is
    out of range for a store of 4 records")."""
    store = pytreestore.create(path, {"x": np.int32(0)}, chunk_records=4, backend=backend)
    store.extend({"x": np.int32(i)} for i in range(6))
    held, go = threading.Event(), threading.Event()

    def appending() -> None:  # another thread between an append's steps: the mutex held
        with store._core._mutex:
            held.set()
            go.wait(10)

    other = threading.Thread(target=appending)
    other.start()
    held.wait(10)
    counted, got = len(store), {}
    reading = threading.Thread(target=lambda: got.update(last=store[counted - 1]["x"]))
    reading.start()
    reading.join(0.2)
    go.set()
    other.join()
    reading.join()
    assert counted == 6
    assert int(got["last"]) == 5
    store.close()
