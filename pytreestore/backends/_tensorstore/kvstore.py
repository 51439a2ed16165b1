"""TensorStore kvstores: a spec for every kind of location, and the files of local stores.

TensorStore kvstore specs for every kind of location: ``file``, ``memory``, ``s3``, ``gcs``,
``http`` (read-only: TensorStore's ``http`` driver reads and never lists or writes).

Example:
    >>> from pytreestore._location import Location
    >>> spec, cleanup = kvstore_spec(Location.parse("s3://my-bucket/runs", {"region": "eu-west-1"}))
    >>> spec["driver"], spec["bucket"], spec["path"], spec["aws_region"], spec["use_conditional_write"]
    ('s3', 'my-bucket', 'runs/', 'eu-west-1', True)
    >>> cleanup()

Creating a local store's arrays as files: each column's ``zarr.json`` written as TensorStore
writes it, all at once, created only where none exists.

On the file kvstore, ``ts.open(create=True)`` of an array reads its ``zarr.json`` (to find it
absent) and then writes it; writing the document directly, conditionally on its absence, does
the same in one round of writes and no reads. The document is
:func:`~pytreestore.backends._metadata.array_document`, byte for byte what TensorStore (and the
zarr backend) writes, so TensorStore opens the array as one it made; that holds for a column
whose fill value is its dtype's zero (:func:`plain_fill`), which the caller checks.

Example:
    >>> import numpy as np, tempfile
    >>> import tensorstore as ts
    >>> from pytreestore.backends import ColumnLayout
    >>> root = tempfile.mkdtemp()
    >>> kv = ts.KvStore.open({"driver": "file", "path": root + "/"}).result()
    >>> create_documents(kv, [ColumnLayout("x", np.dtype("int32"), (), (4,), None, ("record",), 0)],
    ...                  "doc", None)
    >>> ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": root + "/x/"}}).result().shape
    (0,)

The partial writes a killed writer leaves on TensorStore's file kvstore.

TensorStore's file kvstore writes a key through ``<key>.__lock`` and renames it over the key;
a writer killed in between leaves that file (a partial chunk's bytes). Repair on open for
append deletes them (step 4 of :mod:`pytreestore._log.protocol`), through the backends'
``remove_partial_writes``.

Such a file is also the lock of a write in flight: TensorStore's rule (its
``file_key_value_store.cc``) is that only the holder of an exclusive lock on the file, while
the file still has its path, may remove or rename it. A process writing beside the writer
holds one (``write_fragment``, which writes into the same OCDBT database and its shared
``manifest.ocdbt.__lock``): deleting its file made its rename fail. So
:func:`remove_abandoned` takes each file's lock without waiting first (the open file
description lock TensorStore takes on Linux, ``flock`` elsewhere) and deletes only files
whose lock it got, whose path still names them: files no live process is writing.

Example:
    >>> from pathlib import Path
    >>> partial_writes(Path("/nonexistent-store"), [], 0)[0].name
    'commit.json.__lock'
"""

from __future__ import annotations

import atexit
import contextlib
import os
import struct
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from pytreestore._format.keys import (
    COMMIT_KEY,
    NO_VALUE,
    ROOT_KEY,
    SCHEMAS_DIR,
    TAGS_DIR,
    VERSIONS_DIR,
    array_json,
)
from pytreestore._location import GCSOptions, HTTPOptions, Location, RemoteOptions, S3Options
from pytreestore._runtime import flock_module
from pytreestore.backends._base import ColumnLayout
from pytreestore.backends._metadata import array_document, encode_document
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.errors import StorageError

_PROFILE = "pytreestore"


def kvstore_spec(location: Location) -> tuple[dict[str, Any], Callable[[], None]]:
    """The kvstore spec of ``location``'s root, and a function that removes what it made.

    Every spec's ``path`` ends with ``/`` (or is empty, for a bucket's root), so keys append.
    """
    if location.kind == "memory":
        return {"driver": "memory", "path": location.root + "/"}, _nothing
    if location.kind == "file":
        return {"driver": "file", "path": location.root + "/"}, _nothing
    if isinstance(location.options, S3Options | GCSOptions | HTTPOptions):
        _set_http_timeouts(location.options)
    if location.kind == "http":
        assert isinstance(location.options, HTTPOptions)
        return _http_spec(location.root, location.options), _nothing
    path = location.prefix + "/" if location.prefix else ""
    if location.kind == "s3":
        assert isinstance(location.options, S3Options)
        return _s3_spec(location.bucket, path, location.options)
    if location.kind == "gcs":
        assert isinstance(location.options, GCSOptions)
        return _gcs_spec(location.bucket, path, location.options), _nothing
    raise ValueError(f"no TensorStore kvstore for location kind {location.kind!r}")


def _nothing() -> None:
    return None


def _set_http_timeouts(opts: RemoteOptions) -> None:
    """Sets TensorStore's (process-wide) HTTP timeouts from ``opts``, unless already set."""
    env = os.environ
    if opts.connect_timeout is not None:
        env.setdefault(
            "TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS", str(_whole(opts.connect_timeout))
        )
    if opts.request_timeout is not None:  # a request that receives nothing this long fails
        env.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", str(_whole(opts.request_timeout)))
        env.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")


def _whole(seconds: float) -> int:
    return max(1, round(seconds))


def _retries(opts: RemoteOptions) -> dict[str, Any] | None:
    if opts.max_retries is None and opts.retry_delay is None and opts.retry_max_delay is None:
        return None
    out: dict[str, Any] = {}
    if opts.max_retries is not None:
        out["max_retries"] = opts.max_retries
    if opts.retry_delay is not None:
        out["initial_delay"] = f"{opts.retry_delay}s"
    if opts.retry_max_delay is not None:
        out["max_delay"] = f"{opts.retry_max_delay}s"
    return out


def _s3_spec(bucket: str, path: str, opts: S3Options) -> tuple[dict[str, Any], Callable[[], None]]:
    spec: dict[str, Any] = {
        "driver": "s3",
        "bucket": bucket,
        "path": path,
        "use_conditional_write": opts.conditional_write,
    }
    if opts.endpoint:
        spec["endpoint"] = opts.endpoint.rstrip("/")
    if opts.region:
        spec["aws_region"] = opts.region
    if opts.requester_pays:
        spec["requester_pays"] = True
    if opts.host_header:
        spec["host_header"] = opts.host_header
    if (retries := _retries(opts)) is not None:
        spec["s3_request_retries"] = retries
    if opts.request_concurrency is not None:
        spec["s3_request_concurrency"] = {"limit": opts.request_concurrency}
    cleanup = _nothing
    if opts.anonymous:
        spec["aws_credentials"] = {"type": "anonymous"}
    elif opts.access_key_id:
        filename = _credentials_file(opts)
        spec["aws_credentials"] = {
            "type": "profile",
            "profile": _PROFILE,
            "credentials_file": filename,
            "config_file": os.devnull,
        }
        cleanup = _remover(filename)
    elif opts.profile or opts.credentials_file:
        creds: dict[str, Any] = {"type": "profile", "profile": opts.profile or "default"}
        if opts.credentials_file:
            creds["credentials_file"] = os.path.expanduser(opts.credentials_file)
        if not os.path.exists(_config_file()):
            creds["config_file"] = os.devnull  # the profile provider fails without one
        spec["aws_credentials"] = creds
    return spec, cleanup


def _config_file() -> str:
    return os.path.expanduser(os.environ.get("AWS_CONFIG_FILE", "~/.aws/config"))


def _gcs_spec(bucket: str, path: str, opts: GCSOptions) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": "gcs", "bucket": bucket, "path": path}
    if opts.user_project:
        spec["gcs_user_project"] = {"project_id": opts.user_project}
    if (retries := _retries(opts)) is not None:
        spec["gcs_request_retries"] = retries
    if opts.request_concurrency is not None:
        spec["gcs_request_concurrency"] = {"limit": opts.request_concurrency}
    return spec


def _http_spec(url: str, opts: HTTPOptions) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": "http", "base_url": url + "/", "path": ""}
    if opts.headers:
        spec["headers"] = [f"{name}: {value}" for name, value in opts.headers.items()]
    if (retries := _retries(opts)) is not None:
        spec["http_request_retries"] = retries
    return spec


def _credentials_file(opts: S3Options) -> str:
    """Writes explicit keys to a 0600 credentials file in a fresh 0700 folder."""
    folder = tempfile.mkdtemp(prefix="pytreestore-aws-")
    filename = os.path.join(folder, "credentials")
    lines = [
        f"[{_PROFILE}]",
        f"aws_access_key_id = {opts.access_key_id}",
        f"aws_secret_access_key = {opts.secret_access_key}",
    ]
    if opts.session_token:
        lines.append(f"aws_session_token = {opts.session_token}")
    fd = os.open(filename, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")
    atexit.register(_remove, filename)
    return filename


def _remover(filename: str) -> Callable[[], None]:
    return lambda: _remove(filename)


def _remove(filename: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(filename)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(filename))


def plain_fill(layout: ColumnLayout) -> bool:
    """Whether ``layout``'s fill value is its dtype's zero in the JSON form TensorStore writes
    it (``0.0`` for a float, ``0``, ``false``, ``[0.0, 0.0]``): every column but one added by
    evolve with a default, whose value TensorStore rounds to the dtype as it writes it.

    Example:
        >>> import dataclasses, numpy as np
        >>> lay = ColumnLayout("x", np.dtype("float32"), (), (4,), None, ("record",), 0.0)
        >>> plain_fill(lay), plain_fill(dataclasses.replace(lay, fill_value=0))
        (True, False)
    """
    zero = np.zeros((), layout.dtype).item()
    fill = layout.fill_value
    if isinstance(zero, complex):
        return fill == [0.0, 0.0] and all(type(x) is float for x in fill)
    return fill == zero and type(fill) is type(zero)


def create_documents(
    kvstore: Any, layouts: Sequence[ColumnLayout], where: str, timeout: float | None
) -> None:
    """Writes the empty array of every layout (its ``zarr.json``, record axis of length 0)
    where no array is, all at once.

    Raises:
        StorageError: storage failed, or an array already exists at a layout's key (nothing
            is written over it).
    """
    keys = [lay.key for lay in layouts]
    writes = [
        kvstore.write(
            array_json(lay.key), encode_document(array_document(lay, 0)), if_equal=NO_VALUE
        )
        for lay in layouts
    ]
    stamps = _futures.wait(writes, keys, f"{where}: creating column", timeout=timeout)
    taken = [key for key, stamp in zip(keys, stamps) if stamp.generation == b""]
    if taken:
        raise StorageError(
            f"{where}: creating column {taken[0]} failed: an array already exists at "
            f"{array_json(taken[0])} (nothing was written over it)"
        )


def partial_writes(root: Path, keys: Sequence[str], tail_chunk: int) -> list[Path]:
    """The ``.__lock`` files that may lie in the store at ``root``: of the commit record, the
    root, the version log's objects, the columns' metadata and their chunks from chunk
    ``tail_chunk`` on (on the record axis; chunks below it are never written again)."""
    found = [root / f"{COMMIT_KEY}.__lock", root / f"{ROOT_KEY}.__lock"]
    for folder in (VERSIONS_DIR, TAGS_DIR, SCHEMAS_DIR):  # the version log's objects
        found.extend((root / folder).glob("*.__lock"))
    for key in keys:
        found.append(root / f"{array_json(key)}.__lock")
        chunks = root / key / "c"
        if not chunks.is_dir():
            continue
        with os.scandir(chunks) as entries:
            for entry in entries:
                index = entry.name.split(".", 1)[0]
                if entry.name.endswith(".__lock"):
                    found.append(Path(entry.path))
                elif entry.is_dir() and index.isdigit() and int(index) >= tail_chunk:
                    found.extend(Path(entry.path).rglob("*.__lock"))
    return found


def remove_abandoned(paths: Sequence[Path]) -> list[str]:
    """Deletes each of ``paths`` (lock files) that is there and that no live process is
    writing (see the module); the ones deleted."""
    removed = []
    for path in paths:
        if _remove_if_unlocked(str(path)):
            removed.append(str(path))
    return removed


def _remove_if_unlocked(path: str) -> bool:
    """Deletes ``path`` if its lock is free, as TensorStore's rule allows; whether it did."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        if not _try_lock(fd, flock_module(path, "removing the partial write")):
            return False  # a live writer holds it: its write is in flight
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):  # still the canonical file
                os.unlink(path)
                return True
        return False
    finally:
        os.close(fd)  # releases the lock


def _try_lock(fd: int, fcntl: ModuleType) -> bool:
    """Takes the exclusive lock TensorStore's file kvstore takes on a lock file, without
    waiting; False if another holds it."""
    try:
        if hasattr(fcntl, "F_OFD_SETLK"):  # Linux: an open file description lock, whole file
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        else:  # macOS and the BSDs: flock
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (BlockingIOError, PermissionError):
        return False
    return True


__all__ = ["create_documents", "plain_fill"]
