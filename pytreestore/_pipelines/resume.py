"""A resume state of ``batches(state=...)``: every field checked before anything is read.

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

from collections.abc import Callable
from typing import Any

import numpy as np

from pytreestore import _arguments
from pytreestore.errors import ArgumentError, ArgumentTypeError

#: the position a state resumes from; a state without either is refused
POSITION = ("epoch", "batch")
#: the settings a state was taken with; each one given must match the resumed iterator's
SETTINGS = ("records", "batch_size", "shuffle", "window", "seed", "drop_last")

_FIX = "pass the dict BatchIterator.state() returned"
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
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, str) and value in ("block", "uniform"):
        return value
    error = ArgumentError if isinstance(value, str) else ArgumentTypeError
    raise error(f"{_rule(name, _SHUFFLES)}, got {value!r:.80}; {_FIX}")


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if getattr(value, "shape", None) == () and getattr(value, "dtype", None) == np.bool_:
        return bool(value)  # a 0-d array: a state kept in a store or a checkpoint comes so
    raise ArgumentTypeError(f"{_rule(name, 'True or False')}, got {value!r:.80}; {_FIX}")


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


__all__ = ["POSITION", "SETTINGS", "checked"]
