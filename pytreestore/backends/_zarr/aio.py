"""Running zarr-python's coroutines from the zarr backends' synchronous calls.

zarr-python's files and codecs work in its event loop's default executor
(``asyncio.to_thread``), a ``ThreadPoolExecutor``, which refuses new work once the interpreter
exits (``concurrent.futures`` shuts down before any ``atexit`` hook runs): the chunks a store
commits at the exit (its last flush, the chunks handed to the background writer) failed with
"cannot schedule new futures after shutdown". So the loop's default executor is an
:class:`ExitSafePool`, which then runs the work on the loop's own thread.

Example:
    >>> import asyncio
    >>> async def one(x): return x
    >>> run(gather(one(i) for i in range(3)), "counting")
    [0, 1, 2]
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import TypeVar

import zarr
from zarr.core.sync import sync

from pytreestore._runtime import RUNTIME, ExitSafePool
from pytreestore.backends._base import symlink_loop
from pytreestore.errors import PyTreeStoreError, StorageError

_T = TypeVar("_T")

#: the event loops whose default executor is an ExitSafePool
_SAFE: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


async def _exit_safe(coroutine: Awaitable[_T]) -> _T:
    """Awaits ``coroutine`` on a loop whose default executor is an :class:`ExitSafePool`."""
    loop = asyncio.get_running_loop()
    if loop not in _SAFE:
        workers = zarr.config.get("threading.max_workers", None)
        loop.set_default_executor(RUNTIME.loop_pool(workers))
        _SAFE.add(loop)
    return await coroutine


async def gather(aws: Iterable[Awaitable[_T]]) -> list[_T]:
    """Awaits every awaitable at once; their results in order."""
    return list(await asyncio.gather(*aws))


async def settle(aws: Iterable[Awaitable[_T]]) -> list[_T]:
    """Awaits every awaitable at once; their results in order, or, once every one has ended,
    the first error (what they hold may be released after this returns)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


async def collect(items: AsyncIterator[_T]) -> list[_T]:
    """Every item of an async iterator, in a list."""
    return [item async for item in items]


def run(
    coroutine: Awaitable[_T], doing: str, errors: tuple[type[Exception], ...] = (OSError,)
) -> _T:
    """Runs ``coroutine`` on zarr-python's event loop and waits for it.

    Raises:
        StorageError: storage refused a request (disk full, server down, ...): any of
            ``errors`` (``OSError``, and obstore's errors on S3).
    """
    try:
        return sync(_exit_safe(coroutine))
    except PyTreeStoreError:
        raise
    except errors as err:
        loop = symlink_loop(doing, err)
        if loop is not None:
            raise loop from err
        brief = str(err).split("\n\nDebug source:", 1)[0]  # obstore appends a Rust dump
        raise StorageError(
            f"{doing} failed: {brief}. Records committed before stay committed; once storage "
            "is reachable (or has space) again, retry the call (a failed flush() can be "
            "repeated)."
        ) from err


__all__ = ["ExitSafePool", "collect", "gather", "run", "settle"]
