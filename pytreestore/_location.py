"""Where a store lives: a local directory (or its ``file://`` URL), ``memory://NAME``,
``s3://BUCKET/PREFIX``, ``gs://BUCKET/PREFIX`` or, read-only, ``http(s)://HOST/PATH``, with the
options that reach it.

Object-store options come from ``storage_options=`` (a dict) and, where it leaves them out,
from the usual environment variables: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``,
``AWS_REGION`` / ``AWS_DEFAULT_REGION``; credentials are found by TensorStore the way the AWS
CLI finds them (``AWS_ACCESS_KEY_ID``..., ``~/.aws/credentials``, instance metadata) and, for
GCS, by Google's application default credentials.

Example:
    >>> Location.parse("memory://runs").kind
    'memory'
    >>> loc = Location.parse("s3://my-bucket/runs/a", {"endpoint": "http://127.0.0.1:9000"})
    >>> loc.kind, loc.bucket, loc.prefix, str(loc)
    ('s3', 'my-bucket', 'runs/a', 's3://my-bucket/runs/a')
    >>> Location.parse("file:///tmp/runs/a%20b").root
    '/tmp/runs/a b'
    >>> web = Location.parse("https://example.org/stores/a/")
    >>> web.kind, str(web), web.read_only
    ('http', 'https://example.org/stores/a', True)
"""

from __future__ import annotations

import dataclasses
import os
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytreestore.errors import BadLocationError, ReadOnlyError

_SCHEMES = {"s3": "s3", "gs": "gcs", "gcs": "gcs"}
_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class S3Options:
    """Options of an ``s3://`` store; pass them as ``storage_options={...}``.

    Attributes:
        endpoint: the server's URL, for S3-compatible servers (MinIO, moto, ...); default
            ``$AWS_ENDPOINT_URL_S3`` or ``$AWS_ENDPOINT_URL``, else AWS.
        region: the bucket's region; default ``$AWS_REGION`` or ``$AWS_DEFAULT_REGION``, else
            looked up.
        profile: a profile of the AWS credentials file.
        credentials_file: a credentials file other than ``~/.aws/credentials``.
        anonymous: send unsigned requests (public buckets).
        access_key_id, secret_access_key, session_token: explicit credentials. TensorStore
            takes no literal keys, so they are written to a private (0600) credentials file
            that is removed when the store closes.
        requester_pays: send ``x-amz-request-payer``.
        host_header: a ``Host`` header other than the endpoint's (needs ``endpoint``).
        max_retries: attempts per request before an error (TensorStore's default: 32).
        retry_delay: seconds before the first retry (then doubling, up to ``retry_max_delay``).
        retry_max_delay: the longest wait between retries, in seconds.
        request_concurrency: the most requests in flight at once.
        conditional_write: commit with conditional PUTs (``If-Match``/``If-None-Match``), so
            two writers can never both commit; default True. Set False only for a server that
            does not support them, and then never open two writers.
        connect_timeout: seconds to wait for a connection to the server (default 10).
        request_timeout: seconds a request may go without a byte from the server before it
            is given up and retried (default 30); with ``backend="zarr"``, the longest one
            request may take.
        total_timeout: seconds one call to storage may take, retries included, before it
            raises :class:`~pytreestore.errors.StorageError` (default 45). None: no limit.

    With ``backend="tensorstore"``, ``connect_timeout`` and ``request_timeout`` are settings of
    TensorStore's HTTP transport, which is shared by the whole process: the first object store
    opened sets them (as ``TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS`` and
    ``TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS``, unless those are already in the environment).
    """

    endpoint: str | None = None
    region: str | None = None
    profile: str | None = None
    credentials_file: str | None = None
    anonymous: bool = False
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    requester_pays: bool = False
    host_header: str | None = None
    max_retries: int | None = None
    retry_delay: float | None = None
    retry_max_delay: float | None = None
    request_concurrency: int | None = None
    conditional_write: bool = True
    connect_timeout: float | None = 10.0
    request_timeout: float | None = 30.0
    total_timeout: float | None = 45.0

    def __repr__(self) -> str:  # never print secrets
        shown = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }
        for secret in ("secret_access_key", "session_token"):
            if secret in shown:
                shown[secret] = "***"
        return f"S3Options({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GCSOptions:
    """Options of a ``gs://`` store; pass them as ``storage_options={...}``.

    Credentials are Google's application default credentials
    (``$GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, or the
    metadata server).

    Attributes:
        user_project: the project billed for requester-pays buckets.
        max_retries, retry_delay, retry_max_delay, request_concurrency: as for S3.
        connect_timeout, request_timeout, total_timeout: as for S3.
    """

    user_project: str | None = None
    max_retries: int | None = None
    retry_delay: float | None = None
    retry_max_delay: float | None = None
    request_concurrency: int | None = None
    conditional_write: bool = True
    connect_timeout: float | None = 10.0
    request_timeout: float | None = 30.0
    total_timeout: float | None = 45.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class HTTPOptions:
    """Options of an ``http://`` or ``https://`` store (read-only); pass them as
    ``storage_options={...}``.

    Attributes:
        headers: HTTP headers sent with every request, such as ``{"Authorization": "Bearer
            ..."}``.
        max_retries, retry_delay, retry_max_delay: as for S3.
        connect_timeout, request_timeout, total_timeout: as for S3.
    """

    headers: Mapping[str, str] | None = None
    max_retries: int | None = None
    retry_delay: float | None = None
    retry_max_delay: float | None = None
    connect_timeout: float | None = 10.0
    request_timeout: float | None = 30.0
    total_timeout: float | None = 45.0

    def __repr__(self) -> str:  # never print header values (they may hold credentials)
        shown = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }
        if self.headers:
            shown["headers"] = {k: "***" for k in self.headers}
        return f"HTTPOptions({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


#: what every remote location's options have in common (timeouts and retries)
RemoteOptions = S3Options | GCSOptions | HTTPOptions

_OPTION_TYPES: dict[str, type] = {"s3": S3Options, "gcs": GCSOptions, "http": HTTPOptions}


@dataclasses.dataclass(frozen=True)
class Location:
    """A parsed store location.

    Attributes:
        kind: ``"file"``, ``"memory"``, ``"s3"``, ``"gcs"`` or ``"http"`` (``http://`` and
            ``https://``, read-only).
        root: an absolute directory for ``file``, the store's name for ``memory``,
            ``BUCKET/PREFIX`` (or ``BUCKET``) for ``s3`` and ``gcs``, the store's URL without
            a trailing slash for ``http``.
        options: :class:`S3Options`, :class:`GCSOptions` or :class:`HTTPOptions` for remote
            stores, else None.
    """

    kind: str
    root: str
    options: RemoteOptions | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def parse(
        cls, path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
    ) -> Location:
        """Parses a store path; raises :class:`BadLocationError` for anything else."""
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise BadLocationError(
                f"a store path must be a str or os.PathLike, got {type(path).__name__}"
            )
        if not path:
            raise BadLocationError("a store path must not be empty")
        if "\x00" in path:
            raise BadLocationError(f"a store path must not contain NUL bytes: {path!r}")
        scheme = path.split("://", 1)[0] if "://" in path else None
        if scheme is not None and scheme.lower() in _SCHEMES:
            return _parse_bucket_url(path, scheme, storage_options)
        if scheme is not None and scheme.lower() in ("http", "https"):
            return _parse_http_url(path, scheme, storage_options)
        if storage_options is not None and not (
            isinstance(storage_options, Mapping) and not storage_options
        ):
            raise BadLocationError(
                f"storage_options are for s3://, gs:// and http(s):// stores; {path!r} takes none"
            )
        if path[:5].lower() == "file:":
            path = _file_url_path(path)
            scheme = None
        if scheme == "memory":
            name = path[len("memory://") :].strip("/")
            if not name:
                raise BadLocationError(f"{path!r} names no store: use memory://NAME")
            return cls("memory", name)
        if scheme is not None:
            raise BadLocationError(
                f"unsupported URL scheme {scheme!r} in {path!r}; use a local directory (or "
                "file:///PATH), memory://NAME, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or, to "
                "read, http(s)://HOST/PATH"
            )
        try:
            root = Path(path).expanduser().resolve()
        except (RuntimeError, OSError) as err:  # a symlink loop
            raise BadLocationError(
                f"{path!r} cannot be resolved to a directory: {err}. Remove the symlink loop "
                "or give the store's real directory."
            ) from err
        _check_directory(path, root)
        return cls("file", str(root))

    def overlaps(self, other: Location) -> bool:
        """Whether the two locations are the same place or one lies inside the other."""
        if self.kind != other.kind or self._server() != other._server():
            return False
        a, b = self.root.rstrip("/"), other.root.rstrip("/")
        return a == b or a.startswith(b + "/") or b.startswith(a + "/") or not a or not b

    def _server(self) -> str | None:
        return self.options.endpoint if isinstance(self.options, S3Options) else None

    @property
    def read_only(self) -> bool:
        """Whether stores here can only be read (``http://`` and ``https://``: a web server
        serves files, it takes no writes and lists no folders)."""
        return self.kind == "http"

    def check_writable(self, doing: str) -> None:
        """Raises :class:`ReadOnlyError` if ``doing`` (``"create a store"``...) would write
        to a read-only location: the one refusal of every write to a store on a web server.

        Example:
            >>> Location.parse("http://example.org/a").check_writable("append to a store")
            Traceback (most recent call last):
            ...
            pytreestore.errors.ReadOnlyError: cannot append to a store at http://example.org/a: ...
        """
        if self.read_only:
            raise ReadOnlyError(
                f"cannot {doing} at {self}: stores on a web server (http:// and https://) are "
                "read-only; open them with mode='r'. To publish a store, write it locally "
                "(pytreestore.create, or pytreestore.copy(SRC, '/var/www/stores/NAME')) and "
                "copy its folder into the web server's directory whole (docs/interop.md, "
                '"Stores on a web server")'
            )

    @property
    def bucket(self) -> str:
        """The bucket of an object store (empty for local stores)."""
        return self.root.split("/", 1)[0] if self.kind in ("s3", "gcs") else ""

    @property
    def prefix(self) -> str:
        """The key prefix below the bucket, without slashes at either end (may be empty)."""
        if self.kind not in ("s3", "gcs") or "/" not in self.root:
            return ""
        return self.root.split("/", 1)[1]

    @property
    def is_object_store(self) -> bool:
        """Whether the store lives in S3 or GCS (no local lock, conditional commits)."""
        return self.kind in ("s3", "gcs")

    def __str__(self) -> str:
        if self.kind == "file":
            return self.root
        if self.kind == "http":
            return self.root
        scheme = {"memory": "memory", "s3": "s3", "gcs": "gs"}.get(self.kind, self.kind)
        return f"{scheme}://{self.root}"


def _check_directory(path: str, root: Path) -> None:
    """Raises :class:`BadLocationError` if ``root``, or the nearest of its parents that
    exists, is not a directory (a store is a directory)."""
    for folder in (root, *root.parents):
        try:
            exists = folder.exists()
        except OSError as err:  # a name too long for the file system, a path it refuses
            raise BadLocationError(
                f"{path!r} cannot be a store's directory: {err.strerror or err} "
                f"(errno {err.errno}). Choose a shorter path, or one the file system takes."
            ) from err
        if exists:
            if not folder.is_dir():
                what = "is a file" if folder == root else f"is below {folder}, which is a file"
                raise BadLocationError(
                    f"{path!r} {what}, not a directory; a store is a directory. Choose a "
                    "path that is a directory or does not exist yet."
                )
            return


def _parse_bucket_url(
    path: str, scheme: str, storage_options: Mapping[str, Any] | None
) -> Location:
    if scheme not in _SCHEMES:
        raise BadLocationError(f"write the URL scheme in lower case: {scheme.lower()}://... ")
    kind = _SCHEMES[scheme]
    rest = path[len(scheme) + 3 :]
    if any(c in rest for c in "?#\\"):
        raise BadLocationError(
            f"{path!r} holds a query, fragment or backslash; give {scheme}://BUCKET/PREFIX "
            "and pass endpoint and credentials in storage_options"
        )
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if not bucket:
        raise BadLocationError(f"{path!r} names no bucket: use {scheme}://BUCKET/PREFIX")
    pattern = _S3_BUCKET if kind == "s3" else _GCS_BUCKET
    if not pattern.match(bucket) or ".." in bucket:
        raise BadLocationError(
            f"{bucket!r} in {path!r} is not a valid bucket name: 3-63 lower-case letters, "
            "digits, dots and hyphens, starting and ending with a letter or digit"
        )
    parts = prefix.split("/") if prefix else []
    bad = [p for p in parts if p in ("", ".", "..")]
    if bad:
        raise BadLocationError(
            f"the prefix of {path!r} has an empty, '.' or '..' component; give a plain "
            "key prefix such as runs/a"
        )
    options = _parse_options(kind, path, {} if storage_options is None else storage_options)
    return Location(kind, "/".join([bucket, *parts]), options)


def _file_url_path(url: str) -> str:
    """The absolute local path of ``file:///PATH`` or ``file://localhost/PATH``,
    percent-decoded (RFC 8089)."""
    parts = urllib.parse.urlsplit(url)
    advice = "give file:///ABSOLUTE/PATH (or the plain path)"
    if not url.lower().startswith("file://"):
        raise BadLocationError(f"{url!r} is a relative file: URL; {advice}")
    if parts.netloc.lower() not in ("", "localhost"):
        raise BadLocationError(
            f"{url!r} names the host {parts.netloc!r}; file:// URLs name files of this "
            f"machine only: {advice}"
        )
    if parts.query or parts.fragment or not parts.path.startswith("/"):
        raise BadLocationError(f"{url!r} is not a plain file:// URL of a folder; {advice}")
    path = urllib.parse.unquote(parts.path)
    if "\x00" in path:
        raise BadLocationError(f"a store path must not contain NUL bytes: {url!r}")
    return path


def _parse_http_url(path: str, scheme: str, storage_options: Mapping[str, Any] | None) -> Location:
    if scheme not in ("http", "https"):
        raise BadLocationError(f"write the URL scheme in lower case: {scheme.lower()}://... ")
    parts = urllib.parse.urlsplit(path)
    if not parts.hostname:
        raise BadLocationError(f"{path!r} names no host: use {scheme}://HOST[:PORT]/PATH")
    if parts.query or parts.fragment or "\\" in path:
        raise BadLocationError(
            f"{path!r} holds a query, fragment or backslash; give {scheme}://HOST/PATH of "
            "the store's folder and pass headers in storage_options"
        )
    if parts.username or parts.password:
        raise BadLocationError(
            f"{scheme}:// URLs must not hold credentials; pass them as a header, "
            "storage_options={'headers': {'Authorization': ...}}"
        )
    try:
        parts.port  # noqa: B018 (a bad port raises)
    except ValueError as err:
        raise BadLocationError(f"{path!r} has a bad port: {err}") from err
    steps = [p for p in parts.path.split("/") if p]
    if any(p in (".", "..") for p in steps):
        raise BadLocationError(f"the path of {path!r} has a '.' or '..' component")
    options = _parse_options("http", path, {} if storage_options is None else storage_options)
    root = f"{scheme}://{parts.netloc}" + "".join("/" + p for p in steps)
    return Location("http", root, options)


def _parse_options(kind: str, path: str, given: Mapping[str, Any]) -> RemoteOptions:
    if not isinstance(given, Mapping):
        raise BadLocationError(
            f"storage_options must be a dict, got {type(given).__name__} for {path!r}"
        )
    cls = _OPTION_TYPES[kind]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in given if k not in fields)
    if unknown:
        raise BadLocationError(
            f"unknown storage option(s) {', '.join(map(repr, unknown))} for {path!r}; "
            f"{kind} stores take {', '.join(sorted(fields))}"
        )
    values = dict(given)
    if kind == "s3":
        env = os.environ
        values.setdefault("endpoint", env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"))
        values.setdefault("region", env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"))
    for name, value in values.items():
        _check_option(path, name, value, fields[name])
    if kind == "s3":
        _check_s3(path, values)
    return cls(**values)


def _check_option(path: str, name: str, value: Any, field: dataclasses.Field) -> None:
    if value is None and (field.default is None or name.endswith("_timeout")):
        return
    if name.endswith("_timeout"):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        want = "a number of seconds > 0, or None for no limit"
    elif name == "headers":
        ok = isinstance(value, Mapping) and all(
            isinstance(k, str)
            and isinstance(v, str)
            and _HEADER.match(k)
            and not {"\r", "\n"} & set(v)
            for k, v in value.items()
        )
        want = "a dict of header names to str values"
    elif isinstance(field.default, bool):
        ok = isinstance(value, bool)
        want = "a bool"
    elif name in ("max_retries", "request_concurrency"):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        want = "an int >= 0"
    elif name in ("retry_delay", "retry_max_delay"):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
        want = "a number of seconds >= 0"
    else:
        ok = isinstance(value, str) and bool(value)
        want = "a non-empty str"
    if not ok:
        raise BadLocationError(
            f"storage option {name!r} for {path!r} must be {want}, got {value!r:.60}"
        )


def _check_s3(path: str, values: dict[str, Any]) -> None:
    endpoint = values.get("endpoint")
    if endpoint is not None and not re.match(r"^https?://[^/\s]+/?$", endpoint):
        raise BadLocationError(
            f"storage option 'endpoint' for {path!r} must look like http(s)://HOST[:PORT], "
            f"got {endpoint!r}"
        )
    keys = [values.get("access_key_id"), values.get("secret_access_key")]
    if any(keys) and not all(keys):
        raise BadLocationError(
            f"storage options for {path!r}: give access_key_id and secret_access_key together"
        )
    chosen = [
        n
        for n, v in (
            ("anonymous", values.get("anonymous")),
            ("profile/credentials_file", values.get("profile") or values.get("credentials_file")),
            ("access_key_id", values.get("access_key_id")),
        )
        if v
    ]
    if len(chosen) > 1:
        raise BadLocationError(
            f"storage options for {path!r} choose credentials more than one way "
            f"({', '.join(chosen)}); give one"
        )
    if values.get("host_header") and not endpoint:
        raise BadLocationError(
            f"storage option 'host_header' for {path!r} needs 'endpoint' as well"
        )
