"""Ray Data and pytreestore, both ways (the face is :mod:`pytreestore.ray`): a datasink that
writes a store (:mod:`~pytreestore._ray.sink`), a datasource that reads one
(:mod:`~pytreestore._ray.source`), and what both share: the column of each leaf
(:mod:`~pytreestore._ray.blocks`), the storage every worker reaches
(:mod:`~pytreestore._ray.blocks`) and the one place that tells a fixed store's blocks from a
ragged one's (:mod:`~pytreestore._ray.blocks`).

Every module here imports Ray; this package refuses to import without it, naming the extra.
"""

from __future__ import annotations

from pytreestore.errors import OptionalDependencyError

try:
    import ray.data  # noqa: F401
except ImportError as err:  # the ray extra is not installed
    raise OptionalDependencyError(
        "pytreestore.ray needs Ray Data, which is not installed; install it with "
        "pip install 'pytreestore[ray]' (or pip install 'ray[data]')"
    ) from err
