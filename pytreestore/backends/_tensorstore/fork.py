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

from pytreestore.backends._forked import ForkGuard

#: raises ForkedBackendError in a child forked from a process that had used TensorStore
check = ForkGuard(
    "TensorStore",
    "",
    "it would abort the process",
    ", or open the store in the child with backend='zarr' (file and S3 stores)",
).check

__all__ = ["check"]
