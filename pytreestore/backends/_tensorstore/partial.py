"""The partial writes a killed writer leaves on TensorStore's file kvstore.

TensorStore's file kvstore writes a key through ``<key>.__lock`` and renames it over the key;
a writer killed in between leaves that file, and the next write of the key would reuse it
without truncating it. Repair on open for append deletes them (step 4 of
:mod:`pytreestore._commit.protocol`), through the backends' ``remove_partial_writes``.

Example:
    >>> from pathlib import Path
    >>> partial_writes(Path("/nonexistent-store"), [], 0)[0].name
    'commit.json.__lock'
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

from pytreestore._format.names import (
    COMMIT_KEY,
    ROOT_KEY,
    SCHEMAS_DIR,
    TAGS_DIR,
    VERSIONS_DIR,
    array_json,
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


def unlink_all(paths: Sequence[Path]) -> list[str]:
    """Deletes each of ``paths`` that is there (lock files); the ones deleted."""
    removed = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(str(path))
    return removed
