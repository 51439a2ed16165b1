"""What pytreestore needs of the operating system, asked for where it is used, not at import.

* ``fcntl.flock`` (POSIX: Linux, macOS, the BSDs) for the writer lock of a local store and
  the zarr backend's commit lock. Where ``fcntl`` is missing (Windows), ``import
  pytreestore`` works, and so do reads of local stores and everything on ``memory://``,
  ``s3://`` and ``gs://`` stores; opening a local store for writing raises
  :class:`~pytreestore.errors.UnsupportedPlatformError`, which says so.
* ``os.register_at_fork`` (POSIX) for the hooks that reset a forked child's threads and
  locks; where there is no ``fork`` there is nothing to reset.
* ``/proc`` (Linux) only to tell that an object store's lock holder on this machine is gone
  (:func:`pytreestore._commit.lock.holder_is_dead`); without it no holder is provably gone,
  so no lock is taken over unasked (docs/reliability.md, "Platforms").

Example:
    >>> flock_module("/tmp/store", "taking the writer lock of").LOCK_EX > 0
    True
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from types import ModuleType

from pytreestore.errors import UnsupportedPlatformError


def flock_module(where: object, doing: str) -> ModuleType:
    """The ``fcntl`` module, for ``flock``.

    Args:
        where: the store (or file) that needs the lock, for the message.
        doing: what needs it, completed by ``where``: ``"taking the writer lock of"``.

    Raises:
        UnsupportedPlatformError: this platform has no ``fcntl`` (not POSIX).
    """
    try:
        return importlib.import_module("fcntl")
    except ImportError as err:
        raise UnsupportedPlatformError(
            f"{doing} {where} needs file locks (fcntl.flock), which this platform lacks: "
            "writing a local store needs a POSIX system (Linux, macOS, BSD). Here, local "
            "stores can be read, and memory://, s3:// and gs:// stores read and written."
        ) from err


def at_fork(after_in_child: Callable[[], object]) -> None:
    """Runs ``after_in_child`` in each child ``os.fork`` makes (nothing where there is no
    fork)."""
    register = getattr(os, "register_at_fork", None)
    if register is not None:
        register(after_in_child=after_in_child)


__all__ = ["at_fork", "flock_module"]
