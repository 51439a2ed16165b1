"""Counting a store's backend reads, for tests that check which reads are served from memory
(the read-ahead block, the decoded-chunk cache) and which go to storage."""

from __future__ import annotations

import threading
from typing import Any


def count_reads(store: Any) -> list[int]:
    """A list that grows by one for each ``read`` or ``read_many`` call ``store``'s backend
    gets from now on (a call the backend makes to the other from inside one counts once)."""
    calls: list[int] = []
    inside = threading.local()  # per thread: is a counted call running?
    backend = store._backend
    for name in ("read", "read_many"):
        original = getattr(backend, name, None)
        if original is None:
            continue

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if getattr(inside, "on", False):
                return _original(*args, **kwargs)
            calls.append(1)
            inside.on = True
            try:
                return _original(*args, **kwargs)
            finally:
                inside.on = False

        setattr(backend, name, counted)
    return calls
