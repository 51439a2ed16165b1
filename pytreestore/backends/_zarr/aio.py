"""Running zarr-python's coroutines from the zarr backends' synchronous calls.

Example:
    >>> import asyncio
    >>> async def one(x): return x
    >>> run(gather(one(i) for i in range(3)), "counting")
    [0, 1, 2]
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import TypeVar

from zarr.core.sync import sync

from pytreestore.backends._base import symlink_loop
from pytreestore.errors import PyTreeStoreError, StorageError

_T = TypeVar("_T")


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
        return sync(coroutine)  # type: ignore[arg-type]
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


__all__ = ["collect", "gather", "run", "settle"]
