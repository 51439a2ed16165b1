"""A library whose I/O runs on threads that ``os.fork`` does not copy: a clear error in a
forked child, before the call that would abort or hang it.

A :class:`ForkGuard` notes that this process used the library (each :meth:`ForkGuard.check`
before its I/O does) and, in a child forked after that, raises
:class:`~pytreestore.errors.ForkedBackendError` instead. TensorStore aborts such a child
(:mod:`pytreestore.backends._tensorstore.fork`); obstore, which the zarr backend reaches S3
and web servers through, hangs it (:mod:`pytreestore.backends._zarr.forked`).

Example:
    >>> guard = ForkGuard("a library", "", "it would hang", "")
    >>> guard.check("memory://doc-fork")  # in the process that used it: nothing to say
"""

from __future__ import annotations

from pytreestore._platform import at_fork
from pytreestore.errors import ForkedBackendError


class ForkGuard:
    """Whether this process used ``library``, and whether its parent had before a fork.

    Args:
        library: the library's name, as the error gives it.
        used_for: what it is used for, appended to its name in the error (or "").
        fate: what the library would do in the child.
        instead: another way out, appended to the advice to start workers by ``spawn``.
    """

    def __init__(self, library: str, used_for: str, fate: str, instead: str) -> None:
        self._library, self._used_for, self._fate, self._instead = library, used_for, fate, instead
        self._used = False
        self._forked = False
        at_fork(self._after_fork_in_child)

    def check(self, where: object) -> None:
        """Raises :class:`ForkedBackendError` if this process was forked from one that had
        used the library; otherwise notes that this process uses it.

        Args:
            where: the store (its location) the call was for, named in the error.
        """
        if self._forked:
            raise ForkedBackendError(
                f"{where}: this process was forked (os.fork, or multiprocessing's 'fork' start "
                f"method) from one that had already used {self._library}{self._used_for}, and "
                f"{self._library} cannot run in such a child ({self._fate}). Start worker "
                "processes with the 'spawn' or 'forkserver' start method and pass them the "
                f"pickled reader{self._instead}"
            )
        self._used = True

    def _after_fork_in_child(self) -> None:
        self._forked = self._forked or self._used


__all__ = ["ForkGuard"]
