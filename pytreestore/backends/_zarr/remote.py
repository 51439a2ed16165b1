"""The zarr backend on remote stores: S3 through obstore, and web servers (read-only).

The zarr backend on S3: zarr-python's ``ObjectStore`` over obstore's ``S3Store``.

The same arrays and protocol as on local disk (see :mod:`pytreestore.backends._zarr.backend`), plus
what object stores need: conditional writes (``If-None-Match``/``If-Match`` on the ETag) for
the commit record, the writer lock and every ``zarr.json`` a resize rewrites, so that two
writers can never both commit the same rows. obstore is imported on first use.

Example:
    >>> from pytreestore._location import Location
    >>> opts = {"endpoint": "http://127.0.0.1:9000", "region": "us-east-1", "anonymous": True}
    >>> s3_settings(Location.parse("s3://bucket/run", opts))["client_options"]["allow_http"]
    True

The zarr backend on a web server (``http://``, ``https://``), read-only: zarr-python's
``ObjectStore`` over obstore's ``HTTPStore``, opened read-only.

It reads what :class:`~pytreestore.backends._zarr.backend.ZarrBackend` reads, by GET; the
store's writes and listings never reach it (``backend="zarr"`` wraps it in
:class:`~pytreestore.backends._registry.ReadOnly`, which refuses them by name).

Example:
    >>> from pytreestore._location import Location
    >>> loc = Location.parse("http://127.0.0.1:9/s", {"headers": {"X-Token": "t"}})
    >>> settings = http_settings(loc)
    >>> settings["url"], settings["client_options"]["default_headers"]
    ('http://127.0.0.1:9/s', {'X-Token': 't'})
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection
from datetime import timedelta
from types import ModuleType
from typing import Any

from zarr.abc.store import Store
from zarr.core.buffer import Buffer
from zarr.storage import ObjectStore

from pytreestore._format import validate as _validate
from pytreestore._format.keys import NO_VALUE, array_json
from pytreestore._location import HTTPOptions, Location, S3Options
from pytreestore._runtime import RUNTIME
from pytreestore.backends._metadata import encode_document
from pytreestore.backends._zarr.backend import ZarrBackend
from pytreestore.backends._zarr.stores import gather
from pytreestore.errors import BadLocationError, CommitConflictError, StorageError

#: S3Options obstore cannot honour, and why
_NOT_ON_OBSTORE = {
    "profile": "obstore reads no profiles of the AWS credentials file",
    "credentials_file": "obstore reads no AWS credentials file",
    "host_header": "obstore sends the endpoint's own Host header",
}


def import_obstore(location: Location) -> ModuleType:
    """The ``obstore`` module, imported on first use of an ``s3://`` zarr store.

    Raises:
        BadLocationError: obstore is not installed.

    Example:
        >>> import_obstore(Location.parse("s3://my-bucket/runs")).__name__
        'obstore'
    """
    try:
        import obstore
        import obstore.store
    except ImportError as err:
        raise BadLocationError(
            f"backend='zarr' reaches {location} through obstore, which is not installed "
            f"({err}). Run `pip install obstore`, or use backend='tensorstore'."
        ) from err
    return obstore


def s3_settings(location: Location) -> dict[str, Any]:
    """Keyword arguments of ``obstore.store.S3Store`` for ``location``'s :class:`S3Options`,
    plus ``request_concurrency`` (a limit this backend enforces itself, or None).

    Raises:
        BadLocationError: an option obstore cannot honour was given.

    Example:
        >>> opts = {"endpoint": "http://127.0.0.1:9000", "region": "eu-west-1", "anonymous": True}
        >>> settings = s3_settings(Location.parse("s3://my-bucket/runs", opts))
        >>> settings["bucket"], settings["prefix"], settings["client_options"]["allow_http"]
        ('my-bucket', 'runs', True)
        >>> settings["client_options"]["connect_timeout"], settings["retry_config"]["retry_timeout"]
        (datetime.timedelta(seconds=10), datetime.timedelta(seconds=45))
        >>> settings["config"]
        {'endpoint': 'http://127.0.0.1:9000', 'region': 'eu-west-1', 'skip_signature': True}
    """
    opts = location.options
    assert isinstance(opts, S3Options)
    for name, why in _NOT_ON_OBSTORE.items():
        if getattr(opts, name):
            raise BadLocationError(
                f"storage option {name!r} of {location} is not supported by backend='zarr': "
                f"{why}. Give access_key_id and secret_access_key (or set AWS_ACCESS_KEY_ID "
                "and AWS_SECRET_ACCESS_KEY), or use backend='tensorstore', which supports it."
            )
    if opts.request_concurrency == 0:
        raise BadLocationError(
            f"storage option 'request_concurrency' of {location} must be at least 1 for "
            "backend='zarr', got 0; leave it out for no limit"
        )
    return {
        "bucket": location.bucket,
        "prefix": location.prefix or None,
        "config": _s3_config(opts),
        "client_options": _client_options(opts),
        "retry_config": _retry_config(opts),
        "request_concurrency": opts.request_concurrency,
    }


def _client_options(opts: S3Options) -> dict[str, Any]:
    client: dict[str, Any] = {"allow_http": True} if _is_http(opts.endpoint) else {}
    if opts.connect_timeout is not None:
        client["connect_timeout"] = timedelta(seconds=opts.connect_timeout)
    if opts.request_timeout is not None:
        client["timeout"] = timedelta(seconds=opts.request_timeout)
    return client


def _is_http(endpoint: str | None) -> bool:
    return endpoint is not None and endpoint.lower().startswith("http://")


def _s3_config(opts: S3Options) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if opts.endpoint:
        config["endpoint"] = opts.endpoint.rstrip("/")
    if opts.region:
        config["region"] = opts.region
    if opts.anonymous:
        config["skip_signature"] = True
    if opts.access_key_id:
        config["access_key_id"] = opts.access_key_id
        config["secret_access_key"] = opts.secret_access_key
        if opts.session_token:
            config["session_token"] = opts.session_token
    if opts.requester_pays:
        config["request_payer"] = True
    return config


def _retry_config(opts: S3Options) -> dict[str, Any] | None:
    backoff: dict[str, Any] = {}
    if opts.retry_delay is not None:
        backoff["init_backoff"] = timedelta(seconds=opts.retry_delay)
    if opts.retry_max_delay is not None:
        backoff["max_backoff"] = timedelta(seconds=opts.retry_max_delay)
    retry: dict[str, Any] = {"backoff": backoff} if backoff else {}
    if opts.max_retries is not None:
        retry["max_retries"] = opts.max_retries
    if opts.total_timeout is not None:  # no retry starts after this long
        retry["retry_timeout"] = timedelta(seconds=opts.total_timeout)
    return retry or None


def _records(raw: bytes, file: str) -> int:
    """The length of the record axis in an array's ``zarr.json``."""
    return _validate.array_facts(_validate.parse_array_json(raw, file), file)[1][0]


class LimitedObjectStore(ObjectStore):
    """zarr-python's ``ObjectStore`` with at most ``limit`` reads and writes in flight."""

    def __init__(self, store: Any, limit: int | None = None) -> None:
        super().__init__(store)
        self._limit = asyncio.Semaphore(limit) if limit else None

    def slot(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """``async with store.slot():`` waits for a free request slot."""
        return self._limit or contextlib.nullcontext()

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Buffer | None:
        async with self.slot():
            return await super().get(key, prototype, byte_range)

    async def set(self, key: str, value: Buffer) -> None:
        async with self.slot():
            await super().set(key, value)


class ZarrS3Backend(ZarrBackend):
    """:class:`ZarrBackend` on S3, with the conditional writes of the lock and the commit.

    A token is an object's ETag (UTF-8), or :data:`NO_VALUE` for a missing object. Writes
    are ``If-Match``/``If-None-Match`` PUTs, atomic on servers that honour them (AWS, MinIO,
    moto). With ``storage_options={"conditional_write": False}`` they are emulated with a
    HEAD before the PUT, which is not atomic: then only one writer may ever run.

    Example (not run as a doctest: it needs a server)::

        backend = ZarrS3Backend(Location.parse("s3://my-bucket/runs", {"endpoint": url}))
        token = backend.write_bytes_if("note", b"one", NO_VALUE)  # create only: an ETag
        backend.write_bytes_if("note", b"two", NO_VALUE)  # None: it exists now
        backend.write_bytes_if("note", b"two", token)  # the new ETag

    Capabilities (those of :class:`ZarrBackend`): ConditionalWrites, KeyListing, BatchedReads.
    """

    _obstore_io = True

    def __init__(self, location: Location) -> None:
        super().__init__(location)
        self._obstore = import_obstore(location)
        self._errors = (OSError, self._obstore.exceptions.BaseError)
        assert isinstance(self._store, LimitedObjectStore)
        self._s3: LimitedObjectStore = self._store
        self._conditional = getattr(location.options, "conditional_write", True)
        self._document_tokens: dict[str, bytes] = {}

    def _open_store(self, location: Location) -> Store:
        return s3_store(location)

    def read_bytes_versioned(self, key: str) -> tuple[bytes | None, bytes]:
        """The value at ``key`` (None when absent) and its token (:data:`NO_VALUE` if absent)."""
        return self._call(self._get_versioned(key), f"reading {self._location}/{key}")

    def write_bytes_if(self, key: str, data: bytes | None, token: bytes) -> bytes | None:
        """Writes (or with None deletes) ``key`` only if its token is still ``token``.

        Pass :data:`NO_VALUE` to create only. A delete is a HEAD, a comparison and a
        DELETE (S3 has no conditional delete), so it is **not atomic**: a write landing in
        between is deleted. The lock only deletes its own lock object this way.

        Returns:
            The new token (:data:`NO_VALUE` after a delete), or None when the key had
            changed and nothing was written.
        """
        doing = f"writing {self._location}/{key}"
        if data is None:
            return self._call(self._delete_if(key, token), doing)
        return self._call(self._put_if(key, data, token), doing)

    def list_keys(self, prefix: str) -> list[str]:
        """Every key below the root that starts with ``prefix``.

        obstore lists whole path segments (``a/b`` is no prefix of ``a/bc``), so the folder
        of ``prefix`` is listed and filtered.
        """
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        keys = self._call(self._list(folder), f"listing {self._location}/{prefix}")
        return sorted(k for k in keys if k.startswith(prefix))

    def delete_all(self) -> None:
        self.close()
        self._call(self._delete_everything(), f"deleting {self._location}")

    def is_empty(self) -> bool:
        return not self._call(self._list("", first=True), f"listing {self._location}")

    def close(self) -> None:
        super().close()
        self._document_tokens.clear()

    def _write_documents(self, documents: dict[str, Any], grown: Collection[str] = ()) -> None:
        """Writes each ``zarr.json`` with a conditional PUT on the token this writer last saw
        (read again if unknown), as TensorStore's ``expand_only`` resize does: a column in
        ``grown`` that another writer grew past the new length raises
        :class:`CommitConflictError`, and nothing is shrunk under it."""
        puts = (self._put_document(k, d, k in grown) for k, d in documents.items())
        self._call(gather(puts), f"writing column metadata of {self._location}")

    # ---- requests --------------------------------------------------------------------------

    async def _get_versioned(self, key: str) -> tuple[bytes | None, bytes]:
        async with self._s3.slot():
            try:
                result = await self._obstore.get_async(self._s3.store, key)
            except FileNotFoundError:
                return None, NO_VALUE
            return bytes(await result.bytes_async()), self._token(result.meta, key)

    async def _head(self, key: str) -> bytes:
        async with self._s3.slot():
            try:
                return self._token(await self._obstore.head_async(self._s3.store, key), key)
            except FileNotFoundError:
                return NO_VALUE

    async def _put_if(self, key: str, data: bytes, token: bytes) -> bytes | None:
        obstore = self._obstore
        mode: Any = "create" if token == NO_VALUE else {"e_tag": token.decode()}
        if not self._conditional:
            if await self._head(key) != token:
                return None
            mode = "overwrite"
        async with self._s3.slot():
            try:
                result = await obstore.put_async(self._s3.store, key, data, mode=mode)
            except (obstore.exceptions.AlreadyExistsError, obstore.exceptions.PreconditionError):
                return None
        return self._token(result, key)

    async def _delete_if(self, key: str, token: bytes) -> bytes | None:
        if await self._head(key) != token:
            return None
        if token != NO_VALUE:
            async with self._s3.slot():
                await self._obstore.delete_async(self._s3.store, key)
        return NO_VALUE

    async def _put_document(self, key: str, document: dict[str, Any], grow: bool) -> None:
        name, data = array_json(key), encode_document(document)
        token = self._document_tokens.pop(key, None)
        for _ in range(RUNTIME.waits.document_attempts):
            if token is None:
                raw, token = await self._get_versioned(name)
                if grow and raw is not None and _records(raw, name) > document["shape"][0]:
                    break
            new = await self._put_if(name, data, token)
            if new is not None:
                self._document_tokens[key] = new
                return
            token = None  # changed since: look again
        raise CommitConflictError(
            f"column {key} has grown since this writer last resized it: another writer is "
            "appending to this store. Nothing more was written; reopen the store."
        )

    async def _list(self, folder: str, first: bool = False) -> list[str]:
        stream = self._obstore.list(self._s3.store, folder or None, chunk_size=1 if first else 1000)
        keys: list[str] = []
        async for batch in stream:
            keys += [meta["path"] for meta in batch]
            if first and keys:
                break
        return keys

    async def _delete_everything(self) -> None:
        keys = await self._list("")
        if keys:  # one DeleteObjects request per 1,000 keys
            await self._obstore.delete_async(self._s3.store, keys)

    def _token(self, meta: Any, key: str) -> bytes:
        if not meta.get("e_tag"):
            raise StorageError(
                f"the server of {self._location} returned no ETag for {key}: without one no "
                "conditional write can be made. Use a server that returns ETags (AWS S3, "
                "MinIO, ...)."
            )
        return str(meta["e_tag"]).encode()


def s3_store(location: Location) -> ObjectStore:
    """The zarr store of an ``s3://`` location (its requests limited as its options say)."""
    obstore = import_obstore(location)
    settings = s3_settings(location)
    limit = settings.pop("request_concurrency", None)
    return LimitedObjectStore(obstore.store.S3Store(**settings), limit)


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


__all__ = [
    "LimitedObjectStore",
    "ZarrHttpBackend",
    "ZarrS3Backend",
    "http_settings",
    "import_obstore",
    "s3_settings",
    "s3_store",
]
