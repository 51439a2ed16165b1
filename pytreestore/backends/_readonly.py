"""Backends at read-only locations (``http://`` and ``https://``): any backend, with its reads
only.

A web server serves files: it answers GET (and HEAD) for a key and nothing else, so a store
there can be read, never written, and its keys cannot be listed. :class:`ReadOnly` wraps the
backend a store is opened with there and keeps the :class:`~pytreestore.backends.Backend`
contract: every read goes to the wrapped backend; every write raises
:class:`~pytreestore.errors.ReadOnlyError` before anything is sent; ``is_empty`` looks for the
objects that make a store (no listing). Of the optional capabilities it keeps only the reads
(``BatchedReads``, ``PartialReads``, ``ReadsInto``, ``ManyReads``, ``CheckedReads`` where the
wrapped backend has them); the others (listing, conditional writes, local files, ...) it does not even name, so
the package's fallbacks apply: ``verify`` reads every chunk and cannot name chunks that lie
past the commit, ``versions()`` reads the version records one by one up to the latest commit
(tags are found by name only), and operations that only a writer runs never start
(``Location.check_writable`` refuses them first).

Example:
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import KeyListing, TensorStoreBackend, capable
    >>> backend = read_only(TensorStoreBackend, Location.parse("http://127.0.0.1:9/s"))
    >>> capable(backend, KeyListing)
    False
    >>> backend.write_bytes("x", b"1")
    Traceback (most recent call last):
    ...
    pytreestore.errors.ReadOnlyError: cannot write x at http://127.0.0.1:9/s: ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import numpy as np

from pytreestore._format.names import COMMIT_KEY, INCOMPLETE_KEY, ROOT_KEY
from pytreestore._location import Location
from pytreestore.backends._base import Backend, ColumnLayout, ColumnShape

#: the optional read capabilities a wrapped backend keeps, by method name
_READS = ("read_many", "read_parts", "read_into", "read_many_bytes", "read_checked")


class ReadOnly:
    """``inner``'s reads at a read-only ``location``; its writes refused (see the module).

    Args:
        inner: the backend that reads the store (made for ``location``).
        location: where the store is (``http``).
    """

    def __init__(self, inner: Backend, location: Location) -> None:
        self._inner = inner
        self._location = location

    @property
    def inner(self) -> Backend:
        """The wrapped backend (what :func:`~pytreestore.backends.capable` also asks)."""
        return self._inner

    def __getattr__(self, name: str) -> Any:  # the read capabilities the inner has, no other
        if name in _READS:
            return getattr(self._inner, name)
        raise AttributeError(name)

    # ---- reads ---------------------------------------------------------------------------------

    def read_bytes(self, key: str) -> bytes | None:
        return self._inner.read_bytes(key)

    def open_columns(self, columns: Sequence[ColumnShape]) -> None:
        self._inner.open_columns(columns)

    def column_shapes(self, keys: Sequence[str]) -> list[tuple[int, ...]]:
        return self._inner.column_shapes(keys)

    def read(self, keys: Sequence[str], index: Any, records: int) -> list[np.ndarray]:
        return self._inner.read(keys, index, records)

    def is_empty(self) -> bool:
        """Whether none of the objects that make a store (or a store being made) is there:
        the root ``zarr.json``, the commit record, the incomplete marker. A web server lists
        no folders, so other files there are not seen."""
        return all(
            self._inner.read_bytes(k) is None for k in (ROOT_KEY, COMMIT_KEY, INCOMPLETE_KEY)
        )

    def close(self) -> None:
        self._inner.close()

    # ---- writes: refused -------------------------------------------------------------------------

    def write_bytes(self, key: str, data: bytes) -> NoReturn:
        self._refuse(f"write {key}")

    def write_many_bytes(self, items: dict[str, bytes]) -> NoReturn:
        self._refuse(f"write {', '.join(items)}")

    def delete_keys(self, keys: Sequence[str]) -> NoReturn:
        self._refuse(f"delete {', '.join(keys)}")

    def delete_all(self) -> NoReturn:
        self._refuse("delete a store")

    def create_columns(self, layouts: Sequence[ColumnLayout]) -> NoReturn:
        self._refuse("create columns")

    def resize(self, keys: Sequence[str], records: int) -> NoReturn:
        self._refuse("resize columns")

    def write(self, keys: Sequence[str], start: int, blocks: Sequence[np.ndarray]) -> NoReturn:
        self._refuse("write columns")

    def _refuse(self, doing: str) -> NoReturn:
        self._location.check_writable(doing)
        raise AssertionError(f"{self._location} is not read-only")  # only made for read-only


def read_only(factory: Callable[..., Backend], location: Location) -> Backend:
    """The backend ``factory`` makes for ``location``, wrapped in :class:`ReadOnly` where the
    location is read-only (``http(s)://``)."""
    engine = factory(location)
    return ReadOnly(engine, location) if location.read_only else engine  # type: ignore[return-value]


__all__ = ["ReadOnly", "read_only"]
