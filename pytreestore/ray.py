"""Ray Data and pytreestore: read a store into a dataset (:func:`read_store`), write a dataset
into a store (:class:`TreeStoreDatasink`), with one column per leaf, named the same both ways
(:func:`column_names`). Install the extra: ``pip install 'pytreestore[ray]'``.

``read_store(a).map_batches(f).write_datasink(TreeStoreDatasink(b))`` runs ``f`` over store
``a`` on a cluster and writes its rows into store ``b`` (created from the first block if
absent), in one commit.
See docs/scaling.md ("Ray Data").

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("/tmp/doc-ray-store", {"x": np.float32(0), "m": {"lr": 0.0}}, overwrite=True)
    >>> column_names(store.schema)
    ['m.lr', 'x']
    >>> sink = TreeStoreDatasink("/tmp/doc-ray-store")  # ds.write_datasink(sink) appends ds
    >>> store.close()
"""

from __future__ import annotations

from pytreestore._ray.blocks import check_columns, column_names
from pytreestore._ray.sink import TreeStoreDatasink
from pytreestore._ray.source import TreeStoreDatasource, read_store

__all__ = [
    "TreeStoreDatasink",
    "TreeStoreDatasource",
    "check_columns",
    "column_names",
    "read_store",
]
