"""Where a store lives: a local directory or ``memory://NAME``.

Example:
    >>> Location.parse("memory://runs").kind
    'memory'
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from pytreestore.errors import BadLocationError


@dataclasses.dataclass(frozen=True)
class Location:
    """A parsed store location.

    Attributes:
        kind: ``"file"`` or ``"memory"``.
        root: an absolute directory for ``file``, the store's name for ``memory``.
    """

    kind: str
    root: str

    @classmethod
    def parse(cls, path: str | os.PathLike[str]) -> Location:
        """Parses a store path; raises :class:`BadLocationError` for anything else."""
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise BadLocationError(
                f"a store path must be a str or os.PathLike, got {type(path).__name__}"
            )
        if not path:
            raise BadLocationError("a store path must not be empty")
        if path.startswith("memory://"):
            name = path[len("memory://") :].strip("/")
            if not name:
                raise BadLocationError(f"{path!r} names no store: use memory://NAME")
            return cls("memory", name)
        if "://" in path:
            scheme = path.split("://", 1)[0]
            raise BadLocationError(
                f"unsupported URL scheme {scheme!r} in {path!r}; "
                "use a local directory or memory://NAME"
            )
        return cls("file", str(Path(path).expanduser().resolve()))

    def __str__(self) -> str:
        return self.root if self.kind == "file" else f"memory://{self.root}"
