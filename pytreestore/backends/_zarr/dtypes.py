"""zarr-python data types for the ml_dtypes floats: bfloat16 and the float8 family.

They live in the top-level module :mod:`pytreestore_zarr_dtypes` of the same distribution,
which zarr-python loads from an entry point without importing pytreestore (docs/interop.md);
this module is their name inside the package. pytreestore's zarr backend calls
:func:`register`; an installed pytreestore also registers them in every zarr-python process.

Example:
    >>> from zarr.core.dtype import data_type_registry
    >>> register()
    >>> data_type_registry.get("bfloat16") is DTYPES["bfloat16"], NAMES[0]
    (True, 'bfloat16')
"""

from __future__ import annotations

from pytreestore_zarr_dtypes import DTYPES, NAMES, MLFloat, register

__all__ = ["DTYPES", "NAMES", "MLFloat", "register"]
