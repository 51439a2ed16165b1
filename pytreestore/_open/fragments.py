"""``pytreestore.write_fragment``: opens the store's storage and writes records under it as
a fragment (:mod:`pytreestore._fragments.write`), for its writer to commit with
``store.commit_fragments`` (:mod:`pytreestore._fragments.commit`).

Example:
    >>> import numpy as np, pytreestore
    >>> pytreestore.create("memory://doc-write-fragment", {"x": np.float32(0)}).close()
    >>> f = write_fragment("memory://doc-write-fragment", [{"x": 1.5}, {"x": 2.5}])
    >>> f.records, len(pytreestore.open("memory://doc-write-fragment"))
    (2, 0)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pytreestore._commit.fragment import Fragment
from pytreestore._commit.record import Commit
from pytreestore._fragments.write import write
from pytreestore._location import Location
from pytreestore._open.reader import read_schema
from pytreestore.backends import Backend, default_backend
from pytreestore.backends._registry import backend_at


def write_fragment(
    path: str | os.PathLike[str],
    records_or_batch: Any,
    *,
    mask: Any = None,
    backend: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    like: Any = None,
) -> Fragment:
    """Writes records under the store at ``path`` without committing them; any process may,
    without the writer lock, while the store's writer appends.

    Readers never see a fragment; the store's writer appends it with
    :meth:`~pytreestore.TreeStore.commit_fragments`, in one commit with others. The returned
    :class:`Fragment` is small (no data), pickles, and travels as text with
    :meth:`Fragment.to_json` / :meth:`Fragment.from_json`.

    Args:
        path: the store (a local directory, ``memory://NAME``, ``s3://...``).
        records_or_batch: an iterable of records, or one batch: the schema's structure with
            leaves carrying a leading record axis (told apart by the schema's treedef). In
            a ragged or optional store, records, or the padded batch whose ``mask`` is given.
        mask: a ragged or optional store's padded batch's mask, as in
            :meth:`~pytreestore.TreeStore.extend_batch` (``write_fragment(path, batch,
            mask=mask)`` with the pair ``store.load()`` returns); None for records.
        backend: the storage engine, as in :func:`pytreestore.open` (by default the one
            the store was made with: ``"ocdbt"`` for an OCDBT database, else TensorStore).
        storage_options: for ``s3://`` and ``gs://`` stores, as in :func:`pytreestore.open`.
        like: an example record whose classes to use, as in :func:`pytreestore.open`.

    Returns:
        The fragment's description. A fragment of a multiple of ``chunk_records`` records
        (``store.schema.chunk_records``) commits without copying data after a store and
        fragments of such lengths.

    Raises:
        SchemaMismatchError: a record or the batch does not match the store's schema (the
            same checks and casts as :meth:`~pytreestore.TreeStore.extend` and
            ``extend_batch``); ``mask`` given for a store of one fixed structure. Nothing is
            written.
        StoreNotFoundError: no store at ``path``.

    A ragged or optional store's fragment holds the rows of every table (element arrays,
    offsets, presence). Records showing a structure the store has not learnt yet (an
    element of a list empty so far, a subtree None so far) are taken: the commit teaches
    the store that structure (docs/ragged.md).

    Example:
        >>> import numpy as np, pytreestore
        >>> pytreestore.create("memory://doc-write-fragment-fn", {"x": np.int8(0)}).close()
        >>> f = pytreestore.write_fragment("memory://doc-write-fragment-fn", {"x": np.arange(4)})
        >>> pytreestore.Fragment.from_json(f.to_json()).records
        4
    """
    location = Location.parse(path, storage_options)
    location.check_writable("write a fragment of a store")
    engine: Backend = backend_at(
        default_backend(location) if backend is None else backend, location
    )
    try:
        schema = read_schema(engine, location, like=like, generic=False)
        head = Commit.read(engine, str(location))
        return write(engine, schema, head, records_or_batch, mask, str(location))
    finally:
        engine.close()


__all__ = ["Fragment", "write_fragment"]
