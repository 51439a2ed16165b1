"""TensorStore kvstore specs for every kind of location: ``file``, ``memory``, ``s3``, ``gcs``,
``http`` (read-only: TensorStore's ``http`` driver reads and never lists or writes).

Example:
    >>> from pytreestore._location import Location
    >>> spec, cleanup = kvstore_spec(Location.parse("s3://my-bucket/runs", {"region": "eu-west-1"}))
    >>> spec["driver"], spec["bucket"], spec["path"], spec["aws_region"], spec["use_conditional_write"]
    ('s3', 'my-bucket', 'runs/', 'eu-west-1', True)
    >>> cleanup()
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from collections.abc import Callable
from typing import Any

from pytreestore._location import GCSOptions, HTTPOptions, Location, RemoteOptions, S3Options

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
