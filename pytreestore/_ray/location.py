"""Where Ray's workers find a store: a path every worker reaches, the same in every process.

Example:
    >>> import os
    >>> worker_path("runs/a.store", None, "read") == os.path.abspath("runs/a.store")
    True
    >>> worker_path("s3://bucket/runs/a", {"endpoint": "http://127.0.0.1:9000"}, "read")
    's3://bucket/runs/a'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pytreestore._location import Location
from pytreestore.errors import BadLocationError


def worker_path(
    path: str | os.PathLike[str], storage_options: Mapping[str, Any] | None, verb: str
) -> str:
    """``path`` as Ray's workers (other processes, another working directory) open it: a
    local path made absolute, an ``s3://`` or ``gs://`` URL as it is.

    Raises:
        BadLocationError: ``path`` is a ``memory://`` store, which no worker can reach.
    """
    location = Location.parse(path, storage_options)
    if location.kind == "memory":
        raise BadLocationError(
            f"{path} is an in-memory store, which Ray's workers (other processes) cannot "
            f"{verb}; give a local path or an s3:// or gs:// URL"
        )
    return os.path.abspath(path) if location.kind == "file" else os.fspath(path)


__all__ = ["worker_path"]
