"""Creating a local store's arrays as files: each column's ``zarr.json`` written as TensorStore
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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pytreestore._format.names import NO_VALUE, array_json
from pytreestore.backends._base import ColumnLayout
from pytreestore.backends._metadata import array_document, encode_document
from pytreestore.backends._tensorstore import futures as _futures
from pytreestore.errors import StorageError


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


__all__ = ["create_documents", "plain_fill"]
