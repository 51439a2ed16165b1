"""Checking the plain arguments of public calls (counts, sizes, ages, flags, mappings), one
way everywhere, before anything is read or written.

A count takes any integer (``int``, ``np.int64``: what ``operator.index`` takes) and never a
bool or a float; a wrong type raises :class:`~pytreestore.errors.ArgumentTypeError`, a value
out of range :class:`~pytreestore.errors.ArgumentError` (both also ``ValueError``).

Example:
    >>> import numpy as np
    >>> count(np.int64(3), "batch_size must be a positive int", minimum=1)
    3
    >>> count(True, "batch_size must be a positive int", minimum=1)
    Traceback (most recent call last):
    ...
    pytreestore.errors.ArgumentTypeError: batch_size must be a positive int, got True
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from pytreestore.errors import ArgumentError, ArgumentTypeError


def count(value: Any, rule: str, *, minimum: int | None = 0, maximum: int | None = None) -> int:
    """``value`` as a Python int, checked against ``rule`` (what the message says is wanted).

    Raises:
        ArgumentTypeError: ``value`` is not an integer (a bool, a float, a str, None...).
        ArgumentError: it is below ``minimum`` or above ``maximum`` (None: no bound).
    """
    if isinstance(value, bool | np.bool_):
        raise ArgumentTypeError(f"{rule}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ArgumentTypeError(f"{rule}, got {value!r:.80}") from None
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise ArgumentError(f"{rule}, got {value!r}")
    return number


def optional_count(
    value: Any, rule: str, *, minimum: int | None = 0, maximum: int | None = None
) -> int | None:
    """:func:`count`, or None where ``value`` is None."""
    return None if value is None else count(value, rule, minimum=minimum, maximum=maximum)


def seconds(value: Any, rule: str) -> float:
    """A duration: an int or float >= 0 (infinity allowed), never a bool or NaN.

    Raises:
        ArgumentTypeError: ``value`` is not a real number.
        ArgumentError: it is negative or NaN.
    """
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        raise ArgumentTypeError(f"{rule}, got {value!r:.80}")
    if isinstance(value, np.complexfloating):
        raise ArgumentTypeError(f"{rule}, got {value!r}")
    number = float(value)
    if math.isnan(number) or number < 0:
        raise ArgumentError(f"{rule}, got {value!r}")
    return number


def flag(value: Any, name: str) -> bool:
    """A bool argument (``np.bool_`` too).

    Raises:
        ArgumentTypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool | np.bool_):
        raise ArgumentTypeError(f"{name} must be True or False, got {value!r:.80}")
    return bool(value)


def trimmed(trim: Any, truncate: Any) -> Any:
    """A padded read's ``trim=`` (cut lists longer than ``pad_to``), or the same flag by its
    old name, ``truncate=``, kept as an alias (``truncate`` is what ``store.truncate(n)``
    does to a store; the read option was renamed so that the word has one meaning).

    Raises:
        ArgumentError: both given, and they differ.
    """
    if truncate is None:
        return trim
    if trim is not False and trim != truncate:
        raise ArgumentError(
            f"trim={trim!r} and truncate={truncate!r} disagree; truncate= is the old name of "
            "trim=: pass trim= alone"
        )
    return truncate


def mapping(value: Any, name: str, what: str) -> Mapping[Any, Any]:
    """A mapping argument (None: empty), such as ``evolve(add=...)``.

    Raises:
        ArgumentTypeError: ``value`` is not a mapping.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ArgumentTypeError(
            f"{name} takes a mapping of {what}, got {type(value).__name__} {value!r:.80}"
        )
    return value


def strings(value: Any, name: str, what: str) -> list[str]:
    """A sequence of str (a single str is one), such as ``evolve(drop=...)``.

    Raises:
        ArgumentTypeError: ``value`` is neither a str nor an iterable of str.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, Iterable) or isinstance(value, Mapping | bytes):
        raise ArgumentTypeError(
            f"{name} takes a list of {what}, got {type(value).__name__} {value!r:.80}"
        )
    items = list(value)
    bad = [v for v in items if not isinstance(v, str)]
    if bad:
        raise ArgumentTypeError(f"{name} takes a list of {what}, got {bad[0]!r:.80} in it")
    return items


def iterable(value: Any, name: str, what: str) -> Iterable[Any]:
    """An iterable argument, such as ``extend(records)``; not iterated here. As for
    ``iter()``, a sequence that has only ``__getitem__`` (indices from 0 until IndexError)
    is one.

    Raises:
        ArgumentTypeError: ``value`` cannot be iterated.
    """
    if isinstance(value, str | bytes) or not (isinstance(value, Iterable) or _indexed(value)):
        raise ArgumentTypeError(
            f"{name} takes an iterable of {what}, got {type(value).__name__} {value!r:.80}"
        )
    return value


def _indexed(value: Any) -> bool:
    """Whether ``iter(value)`` takes ``value`` by its ``__getitem__`` (it has no ``__iter__``:
    so iter() calls nothing of it here)."""
    try:
        iter(value)
    except TypeError:
        return False
    return True


def backend_name(backend: Any) -> None:
    """Refuses a ``backend=`` that is neither a backend's name nor None."""
    if backend is not None and not isinstance(backend, str):
        raise ArgumentTypeError(
            f"backend= takes a backend's name (a str such as 'tensorstore', 'zarr' or "
            f"'ocdbt') or None, got {type(backend).__name__} {backend!r:.80}"
        )


__all__ = [
    "backend_name",
    "count",
    "flag",
    "iterable",
    "mapping",
    "optional_count",
    "seconds",
    "strings",
]
