"""The writers still open at the interpreter's exit: each is held, then commits what was
appended, as ``close()`` would (issue 44).

A store still open at the exit loses nothing it acknowledged. At the exit (the ``atexit`` hook of
:mod:`pytreestore._threads`: once the program's non-daemon threads have ended, after the
program's own hooks registered since the store was opened, before JAX's) an ``extend``
still running on another thread stops at its next chunk, appending none of its records
(:data:`STOPPING`); every writer still open is then taken for good, so that a daemon thread
still appending waits there (and ends with the process) instead of refilling the background
writer or being inside TensorStore as Python finalizes (an abort); then each commits its
buffered records and the chunks it handed to the background writer. A store that cannot
commit says so on standard error, with what stays committed.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-exiting", {"x": np.int32(0)})
    >>> store._core in tracked()
    True
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Protocol

from pytreestore import _threads as background
from pytreestore._runtime import RUNTIME
from pytreestore.errors import ClosedStoreError

#: set as the exit begins: an ``extend`` still running stops (it appends none of its records)
STOPPING = threading.Event()


class Writing(Protocol):
    """What the exit asks of a store object holding a writer
    (:class:`~pytreestore._core.StoreCore`)."""

    @property
    def path(self) -> str: ...

    def committed_records(self) -> int: ...

    def hold_at_exit(self, wait: float) -> bool | None: ...

    def flush_at_exit(self) -> str | None: ...


_WRITERS: weakref.WeakSet[Writing] = weakref.WeakSet()


def track(core: Writing) -> None:
    """Counts ``core`` among the writers the exit commits (while it lives)."""
    _WRITERS.add(core)
    background.at_exit(end_writers)


def tracked() -> list[Writing]:
    """The store objects holding a writer, alive now."""
    return list(_WRITERS)


def end_writers() -> None:
    """The exit hook: every writer still open is held (no thread appends any more), then
    commits what was appended; what could not be is said on standard error."""
    STOPPING.set()
    held = {core: core.hold_at_exit(RUNTIME.waits.exit_wait_s) for core in tracked()}
    for core, hold in held.items():
        if hold is None:
            continue  # closed, or another process's
        busy = f"another thread held it {RUNTIME.waits.exit_wait_s:g} s: an extend still running?"
        problem = core.flush_at_exit() if hold else busy
        if problem is not None:
            print(
                f"pytreestore: at the interpreter's exit, store {core.path} (never closed) "
                f"could not commit the records appended since its last commit ({problem}); "
                f"they are lost, {core.committed_records()} stay committed. close() a store "
                "(or flush() it) before the program ends to see such a failure where it "
                "happens.",
                file=sys.stderr,
            )


def stopped(i: int) -> ClosedStoreError:
    """The error of an ``extend`` that the exit stopped at its record ``i``."""
    return ClosedStoreError(
        f"the interpreter is exiting: extend() stopped at its record {i} and appended none of "
        "its records (those appended before it are committed by the exit). Let an extend end "
        "before the program does (join its thread), or close the store."
    )


__all__ = ["STOPPING", "Writing", "end_writers", "stopped", "track", "tracked"]
