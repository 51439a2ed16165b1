"""Progress bars for long jobs: records done, and megabytes per second, on a tqdm bar.

Every long operation (``extend(..., progress=True)``, :func:`pytreestore.copy`, ``verify``,
``map``) reports through :func:`progress_bar`, so they all look alike. A disabled bar costs
nothing and prints nothing.

Example:
    >>> with progress_bar(total=10, desc="copy", record_nbytes=8, enabled=False) as bar:
    ...     bar.advance(4); bar.advance(6)
    >>> bar.records
    10
    >>> list(track(iter("abc"), desc="extend", record_nbytes=1, enabled=False))
    ['a', 'b', 'c']
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, TextIO, TypeVar

from tqdm.auto import tqdm

from pytreestore import _arguments

T = TypeVar("T")

_TRACK_EVERY = 256  # records between bar updates when tracking an iterable one record at a time


class ProgressBar:
    """Counts records (and their bytes) through a tqdm bar; use it as a context manager.

    Args:
        total: records expected, or None when unknown (a generator).
        desc: the label on the left of the bar, e.g. ``"copy"``.
        record_nbytes: bytes one record takes, for the MB/s figure.
        enabled: draw the bar; when false nothing is drawn.
        file: where to draw it (default: standard error).
        unit: what is counted, e.g. ``" chunks"`` (default ``" records"``).
    """

    def __init__(
        self,
        *,
        total: int | None,
        desc: str,
        record_nbytes: int,
        enabled: bool = True,
        file: TextIO | None = None,
        unit: str = " records",
    ) -> None:
        self.records = 0
        self.nbytes = 0
        self._record_nbytes = record_nbytes
        self._start = time.perf_counter()
        self._bar: Any = None
        if wanted(enabled):
            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                dynamic_ncols=True,
                file=file if file is not None else sys.stderr,
                leave=True,
            )

    def advance(self, records: int, nbytes: int | None = None) -> None:
        """Counts ``records`` more items as done, of ``nbytes`` bytes (default: records times
        ``record_nbytes``)."""
        self.records += records
        self.nbytes += records * self._record_nbytes if nbytes is None else nbytes
        if self._bar is not None:
            self._bar.set_postfix_str(self._rate(), refresh=False)
            self._bar.update(records)

    def close(self) -> None:
        """Draws the final state of the bar and releases the terminal line."""
        if self._bar is not None:
            self._bar.set_postfix_str(self._rate(), refresh=False)
            self._bar.close()
            self._bar = None

    def _rate(self) -> str:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        return f"{self.nbytes / elapsed / 1e6:.1f} MB/s"

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def progress_bar(
    *,
    total: int | None,
    desc: str,
    record_nbytes: int,
    enabled: bool = True,
    file: TextIO | None = None,
    unit: str = " records",
) -> ProgressBar:
    """A :class:`ProgressBar` over ``total`` records of ``record_nbytes`` bytes each."""
    return ProgressBar(
        total=total, desc=desc, record_nbytes=record_nbytes, enabled=enabled, file=file, unit=unit
    )


def track(
    items: Iterable[T],
    *,
    desc: str,
    record_nbytes: int,
    total: int | None = None,
    enabled: bool = True,
    file: TextIO | None = None,
) -> Iterator[T]:
    """Yields ``items`` unchanged, counting them on a bar (total from ``len`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress_bar(
        total=total, desc=desc, record_nbytes=record_nbytes, enabled=enabled, file=file
    ) as bar:
        pending = 0
        for item in items:
            yield item
            pending += 1
            if pending == _TRACK_EVERY:
                bar.advance(pending)
                pending = 0
        bar.advance(pending)


def wanted(progress: Any) -> bool:
    """``progress=`` of a public call, checked: True or False (a ``np.bool_`` too).

    Raises:
        ArgumentTypeError: it is not a bool.
    """
    return _arguments.flag(progress, "progress")


def default_enabled(stream: TextIO | None = None) -> bool:
    """Whether to draw bars by default: when ``stream`` (standard error) is a terminal."""
    target = sys.stderr if stream is None else stream
    try:
        return target is not None and target.isatty()
    except (AttributeError, ValueError):
        return False


__all__ = ["ProgressBar", "default_enabled", "progress_bar", "track", "wanted"]
