"""Makes an installed pytreestore teach every zarr-python process bfloat16 and float8.

This module is the target of pytreestore's ``zarr.buffer`` entry point (pyproject.toml).
zarr-python 3.1 collects the entry points of group ``zarr.data_type`` but never loads them
(``DataTypeRegistry._lazy_load`` has no caller), so data types declared there alone do
nothing. It does load every ``zarr.buffer`` entry point, the first time it looks up its buffer
class (``zarr.registry.get_buffer_class``, called by ``default_buffer_prototype()`` before any
``zarr.json`` is read), and registers each loaded class under its qualified name.

:data:`Buffer` is zarr-python's own CPU buffer, whose qualified name
``zarr.core.buffer.cpu.Buffer`` is already registered as that same class, so loading it
changes no buffer setting. Importing this module registers the data types of
:mod:`pytreestore_zarr_dtypes` with zarr-python: the one thing here done at import time, which
is what zarr-python imports it for. It imports neither pytreestore nor jax.
"""

from __future__ import annotations

import contextlib

from zarr.buffer.cpu import Buffer

# Silently, on any failure (ml_dtypes missing, a zarr-python whose data type internals moved):
# zarr-python imports this module before it reads any store, so raising here would make every
# store unreadable, and a warning would be an error for whoever runs with warnings as errors
# (``python -W error``, pytest's ``filterwarnings = error``). Without the types, only the
# bfloat16 and float8 arrays fail to open, with zarr-python's own "No Zarr data type found".
with contextlib.suppress(Exception):
    import pytreestore_zarr_dtypes

    pytreestore_zarr_dtypes.register()

__all__ = ["Buffer"]
