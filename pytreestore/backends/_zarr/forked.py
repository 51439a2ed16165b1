"""obstore in a forked child: a clear error before a call that would hang.

The zarr backend reaches ``s3://`` and ``http(s)://`` stores through obstore, whose requests
run on a tokio runtime: threads that ``os.fork`` does not copy. A child forked from a process
that had used obstore waits forever on its first request (obstore's maintainers: "obstore is
not fork safe"). Every call of those backends that issues I/O first asks :func:`check`, which
raises :class:`~pytreestore.errors.ForkedBackendError` in such a child instead. A child whose
parent never used obstore starts its own runtime and works.

Example:
    >>> check("s3://my-bucket/doc-fork")  # in the process that used obstore: nothing to say
"""

from __future__ import annotations

from pytreestore._platform import at_fork
from pytreestore.errors import ForkedBackendError

#: whether this process has issued obstore I/O, and whether its parent had before a fork
_state = {"used": False, "forked": False}


def check(where: object) -> None:
    """Raises :class:`ForkedBackendError` if this process was forked from one that had used
    obstore; otherwise notes that this process uses it.

    Args:
        where: the store (its location) the call was for, named in the error.
    """
    if _state["forked"]:
        raise ForkedBackendError(
            f"{where}: this process was forked (os.fork, or multiprocessing's 'fork' start "
            "method) from one that had already used obstore, which the zarr backend reads "
            "s3:// and http(s):// stores with, and obstore cannot run in such a child (its "
            "requests would wait forever). Start worker processes with the 'spawn' or "
            "'forkserver' start method and pass them the pickled reader"
        )
    _state["used"] = True


def _after_fork_in_child() -> None:
    _state["forked"] = _state["forked"] or _state["used"]


at_fork(_after_fork_in_child)

__all__ = ["check"]
