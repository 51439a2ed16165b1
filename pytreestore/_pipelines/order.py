"""The order of a stream: a shuffled epoch's order, and a checked resume state.

The order of a shuffled epoch: an exact uniform shuffle, or a block shuffle.

A **uniform** shuffle visits the records of ``[start, stop)`` in a permutation drawn from
``numpy.random.default_rng((seed, epoch))``: every order equally likely, but each batch takes
its records from all over the store, so on a store larger than the decoded-chunk cache every
batch reads and decodes nearly every chunk of every column.

A **block** shuffle (MosaicML Streaming's ``py1b``, TFDS's file shuffle) cuts the range into
blocks at the store's chunk boundaries, visits the blocks in a random order, groups them, in
that order, into windows of ``window`` records (whole chunks), and permutes the records within
each window. Every record is still visited once per epoch and the order still depends only on
``(seed, epoch)``, but a batch's records come from one or two windows, so each chunk is read
and decoded once per epoch while its window is kept decoded (the iterator's own cache, see
:func:`cache_bytes`). The price: two records of one window are more likely to share a batch
than under a uniform shuffle, so neighbours in the store (steps of one simulation, say) are
correlated within a batch; a wider window weakens that, and the windows change every epoch.
When the whole range fits in one window the block order *is* the uniform one.

Example:
    >>> plan = resolve("block", 4, chunk=2, record_nbytes=8, start=0, count=10)
    >>> plan.mode, plan.window
    ('block', 4)
    >>> sorted(plan.order(seed=0, epoch=0, start=0, count=10).tolist()) == list(range(10))
    True

A resume state of ``batches(state=...)``: every field checked before anything is read.

:meth:`~pytreestore.BatchIterator.state` gives a small JSON-able dict: the position
(``epoch``, ``batch``) and the settings a resumed iterator must share (``records``,
``batch_size``, ``shuffle``, ``window``, ``seed``, ``drop_last``). A state comes back from
wherever the caller kept it (a JSON file, a checkpoint), so :func:`checked` takes nothing on
trust: each field's type and range, the fields that only go together (a block shuffle's
``window``), and no field it does not know. The position must be there; a setting may be
left out (then it is not compared). Numpy integers and bools are taken, as every count of
the public calls is (:mod:`pytreestore._arguments`); the checked state holds Python values.
Whether the state fits the store and the other arguments is the plan's to say
(:meth:`pytreestore._pipelines.batches.BatchIterator`): that needs the store's length.
The dict ``state()`` gives is a :class:`BatchState`, a pytree whose leaves are the position
and whose static data are the settings, so that a store keeps it in a record (a training
checkpoint) and a record read back resumes as it is (its position then 0-d arrays).

Example:
    >>> import numpy as np
    >>> checked({"epoch": np.int64(1), "batch": 0, "shuffle": "block", "window": 8})
    {'epoch': 1, 'batch': 0, 'shuffle': 'block', 'window': 8}
    >>> checked({"epoch": 0, "batch": 0, "shuffle": "block", "window": 0})
    Traceback (most recent call last):
    ...
    pytreestore.errors.ArgumentError: batches(state=...)['window'] must be None or an int >= 1 (records a block shuffle shuffles together), got 0; pass the dict BatchIterator.state() returned
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from jax.tree_util import DictKey, register_pytree_with_keys

from pytreestore import _arguments
from pytreestore._runtime import RUNTIME
from pytreestore.errors import ArgumentError, ArgumentTypeError

_MODES = ("block", "uniform")


@dataclasses.dataclass(frozen=True)
class Shuffle:
    """How an epoch's records are ordered.

    Attributes:
        mode: None (in order), ``"uniform"`` or ``"block"``.
        window: records per window of a block shuffle (whole chunks); None otherwise.
        chunk: records per block (the store's ``chunk_records``).
    """

    mode: str | None
    window: int | None = None
    chunk: int = 1

    @property
    def state(self) -> Any:
        """The ``shuffle`` of :meth:`BatchIterator.state`: False, "uniform" or "block"."""
        return self.mode or False

    def order(self, *, seed: int, epoch: int, start: int, count: int) -> np.ndarray | None:
        """The record indices of epoch ``epoch`` in visiting order (None: in order)."""
        if self.mode is None:
            return None
        rng = np.random.default_rng((seed, epoch))
        if self.mode == "uniform":
            return rng.permutation(count) + start
        assert self.window is not None
        return block_order(rng, start, count, self.chunk, self.window // self.chunk)


def block_order(
    rng: np.random.Generator, start: int, count: int, chunk: int, per_window: int
) -> np.ndarray:
    """Records ``[start, start + count)`` block-shuffled: blocks (cut at multiples of
    ``chunk``) in a random order, grouped ``per_window`` at a time, each group permuted."""
    edges: list[int] = _edges(start, count, chunk).tolist()
    blocks = rng.permutation(len(edges) - 1)
    out = np.empty(count, np.int64)
    at = 0
    for w in range(0, len(blocks), per_window):
        members = blocks[w : w + per_window]
        window = np.concatenate([np.arange(edges[b], edges[b + 1]) for b in members])
        out[at : at + len(window)] = window[rng.permutation(len(window))]
        at += len(window)
    return out


def resolve(
    shuffle: Any,
    window: Any,
    *,
    chunk: int,
    record_nbytes: float,
    start: int,
    count: int,
    resumed: dict[str, Any] | None = None,
) -> Shuffle:
    """``batches(shuffle=, shuffle_window=)`` checked and made concrete for records
    ``[start, start + count)``.

    ``True`` is a block shuffle. A block shuffle's window is ``window`` records rounded up to
    whole chunks, by default the whole chunks of about ``RUNTIME.pipelines.shuffle_window_bytes``
    of decoded records
    of ``record_nbytes`` (at least one chunk), or the window of the state being ``resumed``;
    a block shuffle whose range fits in one window is the uniform shuffle, and so is one
    resumed without ``window`` from the state of such a shuffle (the store's bytes per
    record, and with them the default window, may have changed since).

    Raises:
        ArgumentTypeError: ``shuffle`` is not a bool or a mode, ``window`` not an int.
        ArgumentError: an unknown mode, or ``window`` without a block shuffle.
    """
    mode = _mode(shuffle)
    rule = "shuffle_window must be None or an int >= 1 (records shuffled together)"
    window = _arguments.optional_count(window, rule, minimum=1)
    if window is not None and mode != "block":
        raise ArgumentError(
            f"shuffle_window applies to a block shuffle (shuffle=True or 'block'), "
            f"not to shuffle={shuffle!r}"
        )
    if mode != "block":
        return Shuffle(mode, chunk=chunk)
    if window is None and resumed is not None and isinstance(resumed.get("window"), int):
        window = resumed["window"]
    if window is None and _fitted_one_window(resumed):
        return Shuffle("uniform", chunk=chunk)  # the order it was saved in, whatever it weighs now
    if window is None:
        window = max(1, -(-RUNTIME.pipelines.shuffle_window_bytes // max(int(record_nbytes), 1)))
    window = -(-window // chunk) * chunk
    if len(_edges(start, count, chunk)) - 1 <= window // chunk:
        return Shuffle("uniform", chunk=chunk)
    return Shuffle("block", window, chunk)


def cache_bytes(plan: Shuffle, record_nbytes: float, batch_size: int, depth: int = 2) -> int:
    """The bound of the own cache of an iterator in order or block-shuffled:
    ``RUNTIME.caches.shuffle_windows`` windows (a chunk, in order) and ``depth + 2`` batches of
    decoded
    records of ``record_nbytes`` (``depth`` batches are read side by side ahead of the one
    handed out, and may reach into the next windows before the current one is done; a batch
    wider than a window spans several, and the cache serves a read whose missing chunks fill
    at most half of it)."""
    window = plan.window or plan.chunk
    return int(
        (RUNTIME.caches.shuffle_windows * window + (depth + 2) * batch_size) * max(record_nbytes, 1)
    )


def _fitted_one_window(resumed: dict[str, Any] | None) -> bool:
    """Whether ``resumed`` is the state of a block shuffle whose range fitted one window (so
    shuffled uniformly): it says ``"uniform"`` and has a ``"window"`` (None); a state saved
    before block shuffles has none."""
    return (
        resumed is not None
        and resumed.get("shuffle") == "uniform"
        and "window" in resumed
        and resumed["window"] is None
    )


def _edges(start: int, count: int, chunk: int) -> np.ndarray:
    """The block boundaries of records ``[start, start + count)``: its ends and every
    multiple of ``chunk`` between them."""
    inner = np.arange((start // chunk + 1) * chunk, start + count, chunk, dtype=np.int64)
    return np.concatenate([[start], inner, [start + count]]).astype(np.int64)


def _mode(shuffle: Any) -> str | None:
    if isinstance(shuffle, bool | np.bool_):
        return "block" if shuffle else None
    if isinstance(shuffle, str) and shuffle in _MODES:
        return shuffle
    if isinstance(shuffle, str):
        raise ArgumentError(
            f"shuffle must be True, False, 'block' or 'uniform', got {shuffle!r:.80}"
        )
    raise ArgumentTypeError(
        f"shuffle must be True, False, 'block' or 'uniform', got {shuffle!r:.80}"
    )


#: the position a state resumes from; a state without either is refused
POSITION = ("epoch", "batch")


#: the settings a state was taken with; each one given must match the resumed iterator's
SETTINGS = ("records", "batch_size", "shuffle", "window", "seed", "drop_last")


_FIX = "pass the dict BatchIterator.state() returned"


class BatchState(dict[str, Any]):
    """Where a :class:`~pytreestore.BatchIterator` stands: what its ``state()`` returns.

    A plain ``dict`` of Python values (``json.dumps`` takes it), and a pytree that a store
    keeps in a record beside the train state: the position (``epoch``, ``batch``) is its two
    leaves (int32 columns), the settings (``records``, ``batch_size``, ``shuffle``,
    ``window``, ``seed``, ``drop_last``) its static data, stored once in the schema. So the
    records of one store all hold states of one iterator's settings; a state of other
    settings is refused by the append, as a resume with other settings is. A record loaded
    back, with jax arrays or numpy leaves, is a ``BatchState`` again that
    ``batches(state=...)`` takes as it is; so is a dict read back from JSON.
    ``BatchState(d)`` makes a storable state of such a dict.

    Example:
        >>> import jax, json
        >>> state = BatchState(epoch=1, batch=2, records=10, batch_size=4, shuffle=False,
        ...                    window=None, seed=0, drop_last=False)
        >>> jax.tree.leaves(state), json.loads(json.dumps(state)) == state
        ([1, 2], True)
    """

    __slots__ = ()


def _flatten_state(state: BatchState) -> tuple[list[tuple[Any, Any]], tuple[Any, ...]]:
    """The position as children (by key), everything else, in order, as static data."""
    leaves = tuple(k for k in state if k in POSITION)
    settings = tuple((k, v) for k, v in state.items() if k not in POSITION)
    return [(DictKey(k), state[k]) for k in leaves], (leaves, settings)


def _flatten_state_fast(state: BatchState) -> tuple[list[Any], tuple[Any, ...]]:
    keyed, aux = _flatten_state(state)
    return [child for _, child in keyed], aux


def _unflatten_state(aux: tuple[Any, ...], children: Any) -> BatchState:
    leaves, settings = aux
    return BatchState([*zip(leaves, children, strict=True), *settings])


# bound by this name in a store's schema (``pytreestore:BatchState``), whichever module it is in
BatchState.__module__ = "pytreestore"
__test__ = {"BatchState": BatchState}  # doctest skips a class of another __module__
register_pytree_with_keys(BatchState, _flatten_state, _unflatten_state, _flatten_state_fast)


_SHUFFLES = "False, 'block' or 'uniform' (True: a state saved before block shuffles)"


def checked(state: Any) -> dict[str, Any]:
    """``state`` with every field checked (module docstring), as Python values.

    Raises:
        ArgumentTypeError: ``state`` is not a mapping, a key is not a str, or a field's
            value is of the wrong type (a bool or float for a count, ...).
        ArgumentError: a field out of range, an unknown field, a missing position, or a
            ``window`` that does not go with the ``shuffle``.
    """
    given = _arguments.mapping(state, "batches(state=...)", "what BatchIterator.state() returned")
    _check_keys(given)
    out = {name: _FIELDS[name](name, value) for name, value in given.items()}
    _check_window(out)
    return out


def _check_keys(state: Any) -> None:
    bad = [k for k in state if not isinstance(k, str)]
    if bad:
        raise ArgumentTypeError(
            f"batches(state=...) has the key {bad[0]!r:.80}, not a field name; {_FIX}"
        )
    unknown = [k for k in state if k not in POSITION + SETTINGS]
    if unknown:
        raise ArgumentError(
            f"batches(state=...) has the fields {', '.join(map(repr, unknown))}, which no "
            f"state has (its fields: {', '.join(POSITION + SETTINGS)}); {_FIX}"
        )
    missing = [k for k in POSITION if k not in state]
    if missing:
        raise ArgumentError(
            f"batches(state=...) lacks {' and '.join(map(repr, missing))}, the position to "
            f"resume from; {_FIX}"
        )


def _rule(name: str, what: str) -> str:
    return f"batches(state=...)[{name!r}] must be {what}"


def _count(what: str, minimum: int) -> Callable[[str, Any], int]:
    def check(name: str, value: Any) -> int:
        try:
            return _arguments.count(value, _rule(name, what), minimum=minimum)
        except ArgumentError as err:
            raise type(err)(f"{err}; {_FIX}") from None

    return check


def _window(name: str, value: Any) -> int | None:
    if value is None:
        return None
    return _count("None or an int >= 1 (records a block shuffle shuffles together)", 1)(name, value)


def _shuffle(name: str, value: Any) -> bool | str:
    if _is_bool(value):
        return bool(value)
    if isinstance(value, str) and value in ("block", "uniform"):
        return value
    error = ArgumentError if isinstance(value, str) else ArgumentTypeError
    raise error(f"{_rule(name, _SHUFFLES)}, got {value!r:.80}; {_FIX}")


def _flag(name: str, value: Any) -> bool:
    if _is_bool(value):
        return bool(value)
    raise ArgumentTypeError(f"{_rule(name, 'True or False')}, got {value!r:.80}; {_FIX}")


def _is_bool(value: Any) -> bool:
    """A bool, or a 0-d bool array (a state kept in a store or a checkpoint comes so)."""
    if isinstance(value, bool | np.bool_):
        return True
    return getattr(value, "shape", None) == () and getattr(value, "dtype", None) == np.bool_


_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "epoch": _count("an int >= 0 (the epoch to resume in)", 0),
    "batch": _count("an int >= 0 (the next batch of its epoch)", 0),
    "records": _count("an int >= 0 (the records iterated over)", 0),
    "batch_size": _count("an int >= 1", 1),
    "shuffle": _shuffle,
    "window": _window,
    "seed": _count("an int >= 0", 0),
    "drop_last": _flag,
}


def _check_window(state: dict[str, Any]) -> None:
    """Refuses a ``window`` that its ``shuffle`` does not have: only a block shuffle's state
    holds a window (an int); a uniform or unshuffled one holds None, and a state saved before
    block shuffles (``shuffle`` True) none at all."""
    if "shuffle" not in state or "window" not in state:
        return
    shuffle, window = state["shuffle"], state["window"]
    if shuffle is True:
        problem = "a state saved before block shuffles (shuffle True) has no window"
    elif shuffle == "block" and window is None:
        problem = "a block shuffle's state holds its window, an int"
    elif shuffle != "block" and window is not None:
        problem = f"only a block shuffle has a window, and its shuffle is {shuffle!r}"
    else:
        return
    raise ArgumentError(
        f"batches(state=...) has shuffle {shuffle!r} with window {window!r}: {problem}; {_FIX}"
    )


__all__ = [
    "POSITION",
    "SETTINGS",
    "BatchState",
    "Shuffle",
    "block_order",
    "cache_bytes",
    "checked",
    "resolve",
]
