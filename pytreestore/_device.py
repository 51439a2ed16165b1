"""Host arrays to ``jax.Array``: dtype policy for 64-bit columns, and placement.

Example:
    >>> import numpy as np
    >>> [a.dtype.name for a in to_jax([np.zeros(2, np.float32)], [".x"], device=None, cast=False)]
    ['float32']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from pytreestore import _dtypes
from pytreestore.errors import X64DisabledError


def to_jax(
    arrays: Sequence[np.ndarray | None],
    paths: Sequence[str],
    *,
    device: Any,
    cast: bool,
) -> list[jax.Array | None]:
    """Places host arrays on ``device`` (default device if None), casting 64-bit ones if asked.

    ``None`` entries (unselected columns) stay None.
    """
    ready = [_jax_dtype(a, p, cast) if a is not None else None for a, p in zip(arrays, paths)]
    present = [a for a in ready if a is not None]
    placed = iter(jax.device_put(present, device) if present else [])
    return [next(placed) if a is not None else None for a in ready]


def _jax_dtype(array: np.ndarray, path: str, cast: bool) -> np.ndarray:
    if _dtypes.jax_holds(array.dtype):
        return array
    target = np.dtype(jax.dtypes.canonicalize_dtype(array.dtype))
    if not cast:
        raise X64DisabledError(
            f"column {path} is {array.dtype}, which JAX holds only with x64 enabled. "
            f"Load it with as_numpy=True for the exact values, enable x64 "
            f"(jax.config.update('jax_enable_x64', True)), or pass cast=True to load it as "
            f"{target}."
        )
    if target.kind in "iu" and not _dtypes.fits(array, target):
        raise X64DisabledError(
            f"column {path} holds values outside {target}, so cast=True cannot load it "
            "exactly; load it with as_numpy=True or enable x64"
        )
    return array.astype(target)
