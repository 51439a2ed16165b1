"""Host arrays to ``jax.Array``: dtype policy for 64-bit columns, placement, and shardings.

``sharding=`` arguments come in three forms, all resolved here into one sharding per column:
one :class:`jax.sharding.Sharding` for every column, a pytree of shardings shaped like the
schema (a sharding at a node applies to every column below it; None replicates), or a callable
from a column's tree path (as :func:`jax.tree_util.keystr` prints it) to a sharding or None.

Example:
    >>> import numpy as np
    >>> [a.dtype.name for a in to_jax([np.zeros(2, np.float32)], [".x"], device=None, cast=False)]
    ['float32']
    >>> import jax
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((1,), ("data",))
    >>> column_shardings({"x": NamedSharding(mesh, P("data"))}, ["['x']"])[0].spec
    P('data',)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding
from jax.tree_util import keystr, tree_flatten_with_path

from pytreestore._format import dtypes as _dtypes
from pytreestore._format import keys as _keys
from pytreestore._format.weak import weaken
from pytreestore._read import packed as _packed
from pytreestore.errors import ArgumentError, ArgumentTypeError, X64DisabledError

PMAP_AXIS = "pmap"

#: what ``sharding=`` takes: a Sharding, a pytree of them, or ``Callable[[str], Sharding | None]``
ShardingSpec = Any


def to_jax(
    arrays: Sequence[np.ndarray | None],
    paths: Sequence[str],
    *,
    device: Any,
    cast: bool,
    weak: Sequence[bool] | None = None,
) -> list[jax.Array | None]:
    """Places host arrays on ``device`` (default device if None), casting 64-bit ones if asked.

    ``None`` entries (unselected columns) stay None; entries that ``weak`` marks come back
    weakly typed (see :func:`pytreestore._format.weak.weaken`).
    """
    ready = [jax_ready(a, p, cast) if a is not None else None for a, p in zip(arrays, paths)]
    if weak is not None:  # a weak scalar goes as a Python scalar: device_put keeps it weak
        ready = [_scalar(a) if w and a is not None else a for a, w in zip(ready, weak)]
    present = [a for a in ready if a is not None]
    placed = iter(_packed.device_put(present, device) if present else [])
    out = [next(placed) if a is not None else None for a in ready]
    return out if weak is None else weaken(out, weak)


def _scalar(array: Any) -> Any:
    """A 0-d array of the dtype JAX gives its Python scalar as that scalar (which JAX
    places weakly typed, at no extra cost); any other array (and NaN, whose payload bits
    must stay) as it is, for :func:`~pytreestore._format.weak.weaken`."""
    if np.ndim(array) or not isinstance(array, np.ndarray | np.generic):
        return array
    value = array.item()
    same = isinstance(value, int | float | complex) and not isinstance(value, bool)
    if (
        same
        and value == value
        and jax.dtypes.canonicalize_dtype(np.dtype(type(value))) == array.dtype
    ):
        return value
    return array


def jax_ready(array: np.ndarray, path: str, cast: bool) -> np.ndarray:
    """``array`` in a dtype JAX holds as configured: 64-bit columns need x64 or ``cast``."""
    if _dtypes.jax_holds(array.dtype):
        return array
    target = np.dtype(jax.dtypes.canonicalize_dtype(array.dtype))
    if not cast:
        raise X64DisabledError(
            f"column {path} is {array.dtype}, which JAX holds only with x64 enabled. "
            f"Load it with as_numpy=True for the exact values, enable x64 "
            f"(jax.config.update('jax_enable_x64', True)), or cast it to {target}: open the "
            "store with pytreestore.open(..., cast=True) (every read) or pass cast=True to "
            "this read."
        )
    if target.kind in "iu" and not _dtypes.fits(array, target):
        raise _outside(path, target)
    with np.errstate(over="ignore"):
        out = array.astype(target)
    if target.kind in "fc" and not np.array_equal(np.isinf(out), np.isinf(array)):
        raise _outside(path, target)
    return out


def _outside(path: str, target: np.dtype) -> X64DisabledError:
    return X64DisabledError(
        f"column {path} holds values outside {target}, so cast=True cannot load it; "
        "load it with as_numpy=True or enable x64"
    )


# ---- shardings -----------------------------------------------------------------------------------


def column_shardings(spec: ShardingSpec, paths: Sequence[str]) -> list[Sharding]:
    """One sharding per column path from a ``sharding=`` argument (see the module docstring).

    None entries replicate over the devices of the first sharding given.

    Raises:
        ArgumentTypeError: ``spec`` or an entry of it is not a sharding, or none is given at all.
        ArgumentError: a pytree entry names no column, or a column has no entry.
    """
    if isinstance(spec, Sharding):
        return [spec] * len(paths)
    chosen = [_checked(spec(p), p) for p in paths] if callable(spec) else _from_tree(spec, paths)
    first = next((s for s in chosen if s is not None), None)
    if first is None:
        raise ArgumentTypeError("sharding= gives no sharding for any column; give at least one")
    return [s if s is not None else replicated(first) for s in chosen]


def _checked(value: Any, path: str) -> Sharding | None:
    if value is None or isinstance(value, Sharding):
        return value
    raise ArgumentTypeError(
        f"sharding for column {path} must be a jax.sharding.Sharding or None, "
        f"got {type(value).__name__}"
    )


def _from_tree(tree: Any, paths: Sequence[str]) -> list[Sharding | None]:
    flat, _ = tree_flatten_with_path(tree, is_leaf=lambda x: x is None or isinstance(x, Sharding))
    entries = {keystr(kp): _checked(s, keystr(kp) or "the root") for kp, s in flat}
    unused = [e for e in entries if not any(_keys.is_under(p, e) for p in paths)]
    if unused:
        raise ArgumentError(
            f"sharding tree has entries at {', '.join(unused)} that match no column; the "
            f"store's columns are {', '.join(paths)}"
        )
    chosen: list[Sharding | None] = []
    for path in paths:
        hits = [e for e in entries if _keys.is_under(path, e)]
        if not hits:
            raise ArgumentError(
                f"sharding tree has no entry for column {path}; give one (None replicates)"
            )
        chosen.append(entries[max(hits, key=len)])
    return chosen


def replicated(like: Sharding) -> Sharding:
    """A sharding that replicates over the devices of ``like``."""
    if isinstance(like, NamedSharding):
        return NamedSharding(like.mesh, PartitionSpec())
    devices = sorted(like.device_set, key=lambda d: d.id)
    return NamedSharding(Mesh(np.array(devices), ("replica",)), PartitionSpec())


def record_axis_sharding(like: Sharding) -> Sharding:
    """A sharding of a 1-d array split along the record axis the way ``like`` splits it.

    Used for the padding mask; shardings other than ``NamedSharding`` give a replicated mask.
    """
    if isinstance(like, NamedSharding):
        spec = tuple(like.spec)
        return NamedSharding(like.mesh, PartitionSpec(spec[0] if spec else None))
    return replicated(like)


def fitted(sharding: Sharding, ndim: int) -> Sharding:
    """``sharding`` for an array of ``ndim`` axes that shares the leading axes of the arrays
    it was given for (a ragged leaf's mask, which lacks the leaf's own axes): a
    ``NamedSharding``'s spec cut to ``ndim`` entries; another sharding as it is where it
    splits such an array, else replicated."""
    if isinstance(sharding, NamedSharding):
        spec = tuple(sharding.spec)
        if len(spec) <= ndim:
            return sharding
        return NamedSharding(sharding.mesh, PartitionSpec(*spec[:ndim]))
    try:
        sharding.shard_shape((len(sharding.device_set),) * ndim)
    except ValueError:
        return replicated(sharding)
    return sharding


def pmap_sharding(devices: Sequence[Any]) -> NamedSharding:
    """Splits a leading axis of length ``len(devices)`` one slice per device, in order."""
    devices = list(devices) if isinstance(devices, Iterable) else []
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise ArgumentTypeError(
            "pmap_devices must be a non-empty sequence of jax.Device, e.g. jax.local_devices()"
        )
    return NamedSharding(Mesh(np.array(devices), (PMAP_AXIS,)), PartitionSpec(PMAP_AXIS))
