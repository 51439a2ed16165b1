"""TensorStore in a forked child: a clear error before any call that would abort the process.

TensorStore does its I/O on thread pools that ``os.fork`` does not copy. A child process that
issues a TensorStore read or write after its parent used TensorStore is aborted by TensorStore
itself (``fork() use detected``, signal 6), with no exception to catch. Every call of this
backend that issues I/O first asks :func:`check`, which raises :class:`ForkedBackendError`
in such a child instead. What needs no TensorStore thread still works there: rows held in the
decoded-chunk cache, and uncompressed local chunks, which this backend reads as plain files.

Example:
    >>> check("memory://doc-fork")  # in the process that used TensorStore: nothing to say
"""

from __future__ import annotations

from pytreestore._platform import at_fork
from pytreestore.errors import ForkedBackendError

#: whether this process has issued TensorStore I/O, and whether its parent had before a fork
_state = {"used": False, "forked": False}


def check(where: object) -> None:
    """Raises :class:`ForkedBackendError` if this process was forked from one that had used
    TensorStore; otherwise notes that this process uses it.

    Args:
        where: the store (its location) the call was for, named in the error.
    """
    if _state["forked"]:
        raise ForkedBackendError(
            f"{where}: this process was forked (os.fork, or multiprocessing's 'fork' start "
            "method) from one that had already used TensorStore, and TensorStore cannot run in "
            "such a child (it would abort the process). Start worker processes with the "
            "'spawn' or 'forkserver' start method and pass them the pickled reader, or open "
            "the store in the child with backend='zarr' (file and S3 stores)"
        )
    _state["used"] = True


def _after_fork_in_child() -> None:
    _state["forked"] = _state["forked"] or _state["used"]


at_fork(_after_fork_in_child)
