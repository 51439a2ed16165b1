"""Removing fragments' folders: committed ones after their commit (locally on a thread of
the writer's, :func:`purge`), abandoned ones by vacuum, one whose writing failed at once
(:func:`remove`). The description goes first, so that a removal cut short leaves a folder
that is never committed (vacuum removes it).

Example:
    >>> import numpy as np, pytreestore
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import get_backend
    >>> s = pytreestore.create("memory://doc-remove", {"x": np.int8(0)})
    >>> f = pytreestore.write_fragment("memory://doc-remove", [{"x": 1}])
    >>> engine = get_backend("tensorstore")(Location.parse("memory://doc-remove"))
    >>> remove(engine, [f.id]); engine.read_bytes(f"{f.folder}/fragment.json") is None
    True
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Sequence

from pytreestore._commit.fragment import MANIFEST, begun_key, manifest_key
from pytreestore._commit.placing import local_root
from pytreestore._format.names import fragment_folder
from pytreestore._runtime import RUNTIME
from pytreestore.backends import Backend, FolderDeletes, KeyListing


def purge(root: str, ids: Sequence[str]) -> int:
    """Deletes the folders of the committed fragments ``ids`` of the local store at
    ``root`` (a thread's work after the commit); how many were there."""
    folders = [os.path.join(root, fragment_folder(i)) for i in ids]
    try:
        with RUNTIME.call_pool(RUNTIME.threads.fragment_deletes) as pool:
            return sum(pool.map(_delete_folder, folders))
    except RuntimeError:  # the interpreter is exiting: it starts no new threads
        return sum(map(_delete_folder, folders))


def _delete_folder(folder: str) -> bool:
    """Deletes ``folder``: its description first, so that a deletion cut short leaves a
    folder that is never committed (vacuum removes it); whether it was there."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, MANIFEST))
    if not os.path.isdir(folder):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True


def remove(engine: Backend, ids: Iterable[str]) -> None:
    """Deletes the folders of the fragments ``ids`` (locally with one tree removal each;
    inside a :class:`~pytreestore.backends.Transactions` block, as part of it)."""
    ids = list(ids)
    folders = [fragment_folder(i) for i in ids]
    root = local_root(engine)
    if root is not None:
        purge(root, ids)
        return
    if isinstance(engine, FolderDeletes):
        engine.delete_folders(folders)
        return
    if not isinstance(engine, KeyListing):
        engine.delete_keys([manifest_key(i) for i in ids] + [begun_key(i) for i in ids])
        return
    keys = [k for folder in folders for k in engine.list_keys(folder + "/")]
    # the description first: a deletion cut short leaves a folder vacuum removes
    engine.delete_keys(sorted(keys, key=lambda k: not k.endswith("/fragment.json")))


__all__ = ["purge", "remove"]
