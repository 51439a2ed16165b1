"""The zarr backend on a web server (``http://``, ``https://``), read-only: zarr-python's
``ObjectStore`` over obstore's ``HTTPStore``, opened read-only.

It reads what :class:`~pytreestore.backends._zarr.backend.ZarrBackend` reads, by GET; the
store's writes and listings never reach it (``backend="zarr"`` wraps it in
:class:`~pytreestore.backends._readonly.ReadOnly`, which refuses them by name).

Example:
    >>> from pytreestore._location import Location
    >>> loc = Location.parse("http://127.0.0.1:9/s", {"headers": {"X-Token": "t"}})
    >>> settings = http_settings(loc)
    >>> settings["url"], settings["client_options"]["default_headers"]
    ('http://127.0.0.1:9/s', {'X-Token': 't'})
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from zarr.abc.store import Store
from zarr.storage import ObjectStore

from pytreestore._location import HTTPOptions, Location
from pytreestore.backends._zarr.backend import ZarrBackend
from pytreestore.backends._zarr.s3 import import_obstore


def http_settings(location: Location) -> dict[str, Any]:
    """Keyword arguments of ``obstore.store.HTTPStore.from_url`` for ``location``."""
    opts = location.options
    assert isinstance(opts, HTTPOptions)
    client: dict[str, Any] = {"allow_http": location.root.startswith("http://")}
    if opts.headers:
        client["default_headers"] = dict(opts.headers)
    if opts.connect_timeout is not None:
        client["connect_timeout"] = timedelta(seconds=opts.connect_timeout)
    if opts.request_timeout is not None:
        client["timeout"] = timedelta(seconds=opts.request_timeout)
    retry: dict[str, Any] = {}
    backoff: dict[str, Any] = {}
    if opts.retry_delay is not None:
        backoff["init_backoff"] = timedelta(seconds=opts.retry_delay)
    if opts.retry_max_delay is not None:
        backoff["max_backoff"] = timedelta(seconds=opts.retry_max_delay)
    if backoff:
        retry["backoff"] = backoff
    if opts.max_retries is not None:
        retry["max_retries"] = opts.max_retries
    if opts.total_timeout is not None:  # no retry starts after this long
        retry["retry_timeout"] = timedelta(seconds=opts.total_timeout)
    return {"url": location.root, "client_options": client, "retry_config": retry or None}


class ZarrHttpBackend(ZarrBackend):
    """:class:`ZarrBackend` reading a store from a web server (see the module)."""

    _obstore_io = True

    def __init__(self, location: Location) -> None:
        super().__init__(location)
        self._errors = (OSError, import_obstore(location).exceptions.BaseError)

    def _open_store(self, location: Location) -> Store:
        obstore = import_obstore(location)
        return ObjectStore(
            obstore.store.HTTPStore.from_url(**http_settings(location)), read_only=True
        )


__all__ = ["ZarrHttpBackend", "http_settings"]
