"""Epoch orders (pytreestore/_pipelines/order.py): block and uniform shuffles, resolved from
``batches(shuffle=, shuffle_window=)``."""

from __future__ import annotations

import numpy as np
import pytest

from pytreestore._pipelines import order as shuffle
from pytreestore.errors import ArgumentError, ArgumentTypeError


def _block(start=0, count=100, chunk=8, window=24, seed=0, epoch=0):
    plan = shuffle.resolve("block", window, chunk=chunk, record_nbytes=4, start=start, count=count)
    assert plan.mode == "block"
    return plan, plan.order(seed=seed, epoch=epoch, start=start, count=count)


@pytest.mark.parametrize("start", [0, 3, 8])
@pytest.mark.parametrize("count", [50, 101, 300])
def test_a_block_shuffle_visits_every_record_once(start, count):
    _, order = _block(start=start, count=count, window=16)
    assert sorted(order.tolist()) == list(range(start, start + count))
    assert order.tolist() != list(range(start, start + count))


@pytest.mark.parametrize("start", [0, 5])
def test_each_window_is_whole_blocks_shuffled_together(start):
    """The property that makes a block shuffle read sequentially: the order is a run of
    windows, each the records of at most ``window // chunk`` whole blocks (cut at multiples
    of ``chunk``) in some order, so a batch touches the chunks of at most two windows."""
    chunk, window, count = 8, 24, 200
    _, order = _block(start=start, count=count, chunk=chunk, window=window)
    edges = shuffle._edges(start, count, chunk)  # the range's blocks
    block_of = np.searchsorted(edges, order, side="right") - 1
    sizes = np.diff(edges)
    blocks: set[int] = set()
    seen = windows = 0
    for block in block_of.tolist():
        blocks.add(block)
        seen += 1
        assert len(blocks) <= window // chunk
        if seen == sizes[sorted(blocks)].sum() and len(blocks) == window // chunk:
            blocks, seen, windows = set(), 0, windows + 1
    assert seen == sizes[sorted(blocks)].sum()  # the last window is whole too
    assert windows == len(sizes) // (window // chunk)


def test_the_order_depends_only_on_seed_and_epoch():
    _, a = _block(seed=1, epoch=0)
    _, again = _block(seed=1, epoch=0)
    _, other_epoch = _block(seed=1, epoch=1)
    _, other_seed = _block(seed=2, epoch=0)
    assert a.tolist() == again.tolist()
    assert a.tolist() != other_epoch.tolist() and a.tolist() != other_seed.tolist()


def test_a_range_in_one_window_is_shuffled_uniformly():
    plan = shuffle.resolve(True, 64, chunk=8, record_nbytes=4, start=0, count=60)
    assert (plan.mode, plan.window, plan.state) == ("uniform", None, "uniform")
    uniform = shuffle.resolve("uniform", None, chunk=8, record_nbytes=4, start=0, count=60)
    assert plan.order(seed=3, epoch=2, start=0, count=60).tolist() == (
        uniform.order(seed=3, epoch=2, start=0, count=60).tolist()
    )
    expected = np.random.default_rng((3, 2)).permutation(60)
    assert uniform.order(seed=3, epoch=2, start=0, count=60).tolist() == expected.tolist()


def test_the_window_is_whole_chunks_and_by_default_at_least_64_mib():
    rounded = shuffle.resolve(True, 17, chunk=8, record_nbytes=4, start=0, count=1000)
    assert rounded.window == 24
    default = shuffle.resolve(True, None, chunk=1000, record_nbytes=1024, start=0, count=10**6)
    assert default.window == 66_000  # 64 MiB of 1 KiB records is 65,536: 66 whole chunks
    assert shuffle.cache_bytes(default, 1024, 100) == int((2.5 * 66_000 + 400) * 1024)
    assert shuffle.cache_bytes(default, 1024, 100, 8) == int((2.5 * 66_000 + 1000) * 1024)
    in_order = shuffle.resolve(False, None, chunk=1000, record_nbytes=1024, start=0, count=9)
    assert shuffle.cache_bytes(in_order, 1024, 100) == int((2.5 * 1000 + 400) * 1024)
    huge = shuffle.resolve(True, None, chunk=4, record_nbytes=1 << 30, start=0, count=100)
    assert huge.window == 4  # at least one chunk


def test_a_resumed_state_keeps_its_window():
    plan = shuffle.resolve(
        True, None, chunk=8, record_nbytes=4, start=0, count=10**6, resumed={"window": 40}
    )
    assert plan.window == 40
    given = shuffle.resolve(
        True, 16, chunk=8, record_nbytes=4, start=0, count=10**6, resumed={"window": 40}
    )
    assert given.window == 16  # what the caller asks wins (and the state check reports it)


def test_a_resumed_state_of_one_window_stays_uniform():
    options = {"chunk": 8, "record_nbytes": 1024, "start": 0, "count": 10**6}
    fitted = {"shuffle": "uniform", "window": None}  # a range that fitted one window
    assert shuffle.resolve(True, None, resumed=fitted, **options).mode == "uniform"
    assert shuffle.resolve(True, 16, resumed=fitted, **options).mode == "block"  # asked
    before = {"shuffle": True}  # saved before block shuffles: no window, not resumed as one
    assert shuffle.resolve(True, None, resumed=before, **options).mode == "block"


def test_in_order_is_no_order():
    plan = shuffle.resolve(False, None, chunk=8, record_nbytes=4, start=0, count=10)
    assert plan.order(seed=0, epoch=0, start=0, count=10) is None and plan.state is False


@pytest.mark.parametrize(
    ("value", "window", "error", "message"),
    [
        ("random", None, ArgumentError, "shuffle must be True, False, 'block' or 'uniform'"),
        (1, None, ArgumentTypeError, "shuffle must be True, False, 'block' or 'uniform'"),
        (None, None, ArgumentTypeError, "got None"),
        (False, 8, ArgumentError, "shuffle_window applies to a block shuffle"),
        ("uniform", 8, ArgumentError, "not to shuffle='uniform'"),
        (True, 0, ArgumentError, "shuffle_window must be None or an int >= 1"),
        (True, 2.5, ArgumentTypeError, "shuffle_window must be None or an int >= 1"),
        (True, True, ArgumentTypeError, "shuffle_window must be None or an int >= 1"),
    ],
)
def test_bad_arguments_are_refused(value, window, error, message):
    with pytest.raises(error, match=message):
        shuffle.resolve(value, window, chunk=8, record_nbytes=4, start=0, count=100)
