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

from pytreestore.backends._forked import ForkGuard

#: raises ForkedBackendError in a child forked from a process that had used obstore
check = ForkGuard(
    "obstore",
    ", which the zarr backend reads s3:// and http(s):// stores with",
    "its requests would wait forever",
    "",
).check

__all__ = ["check"]
