"""Host arrays to ``jax.Array``: dtype policy, placement, shardings, and packed copies.

Many small host arrays onto an accelerator in one copy per dtype.

Each ``jax.device_put`` of an array to an accelerator pays a fixed cost (on a TPU v5e about
0.1 ms, so a record of 60 small leaves spent 6 ms in transfers of 720 bytes). Here the small
arrays of one dtype (at most ``RUNTIME.reads.pack_small_bytes`` each, at least
``RUNTIME.reads.pack_min_arrays`` of them)
are copied into one host buffer, placed with one ``device_put``, and cut back into their
shapes on the device by one compiled call (cached by JAX per layout). Larger arrays, and
everything placed on the CPU, go as they are.

Example:
    >>> import numpy as np
    >>> out = device_put([np.arange(3, dtype=np.int32), np.float32(2)], None)
    >>> [a.tolist() for a in out]
    [[0, 1, 2], 2.0]

Host arrays to ``jax.Array``: dtype policy for 64-bit columns, placement, and shardings.

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

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding
from jax.tree_util import keystr, tree_flatten_with_path

from pytreestore._format import dtypes as _dtypes
from pytreestore._format import keys as _keys
from pytreestore._format.dtypes import weaken
from pytreestore._read import slabs as _slabs
from pytreestore._runtime import RUNTIME
from pytreestore.errors import ArgumentError, ArgumentTypeError, X64DisabledError


class RepeatedShapes:
    """A placement on JAX's default device for loads whose arrays take the same shapes and
    dtypes again and again (a replay buffer's samples): on the CPU, from the second time a
    set of shapes comes, one jitted identity takes the arrays, which JAX's compiled dispatch
    copies to the device (eight small arrays in about 65 us of CPU where
    ``jax.device_put`` took 420-520 us). Its compile is kept per set of shapes; a set seen
    once goes by ``jax.device_put``, so shapes that never come back compile nothing. On an
    accelerator the arrays go as :func:`device_put` places them (small ones packed per
    dtype): the identity was not measured there.

    Example:
        >>> repeated = RepeatedShapes()
        >>> [device_put([np.arange(3)], repeated)[0].tolist() for _ in range(2)]
        [[0, 1, 2], [0, 1, 2]]
    """

    #: the sets of shapes remembered (forgotten all at once past it: shapes that vary)
    limit = 256

    def __init__(self) -> None:
        self._seen: set[tuple[Any, ...]] = set()
        #: the ``jax_default_device`` setting last seen, and whether it named an accelerator
        self._default: tuple[Any, bool] | None = None

    def put(self, arrays: Sequence[Any]) -> list[Any]:
        if self._accelerator():  # measured on the CPU only:
            return device_put(arrays, None)  # an accelerator's packed copies per dtype
        shapes = tuple((np.shape(a), getattr(a, "dtype", None)) for a in arrays)
        if shapes in self._seen:
            return list(_identity(*arrays))
        if len(self._seen) >= self.limit:
            self._seen.clear()
        self._seen.add(shapes)
        return list(jax.device_put(list(arrays)))

    def _accelerator(self) -> bool:
        """Whether JAX's default device is an accelerator: asked again only when the
        ``jax_default_device`` setting changed (``jax.devices()`` costs a sample 5-25 us)."""
        setting = getattr(jax.config, "jax_default_device", None)
        if self._default is None or self._default[0] is not setting:
            platform = _slabs.device_of(None).platform
            self._default = (setting, platform in _slabs.PLATFORMS)
        return self._default[1]


@jax.jit
def _identity(*arrays: Any) -> tuple[Any, ...]:
    return arrays


def device_put(arrays: Sequence[Any], device: Any) -> list[Any]:
    """``jax.device_put(arrays, device)``, the small arrays of each dtype placed in one copy
    when ``device`` (None: the default one) is an accelerator; by a jitted identity for
    :class:`RepeatedShapes`."""
    if isinstance(device, RepeatedShapes):
        return device.put(arrays)
    target = _slabs.device_of(device)
    if (
        target is None
        or target.platform not in _slabs.PLATFORMS
        or len(arrays) < RUNTIME.reads.pack_min_arrays
    ):
        return list(jax.device_put(list(arrays), device))
    groups: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        if isinstance(a, np.ndarray) and a.nbytes <= RUNTIME.reads.pack_small_bytes:
            groups.setdefault(a.dtype, []).append(i)
    packed = [g for g in groups.values() if len(g) >= RUNTIME.reads.pack_min_arrays]
    if not packed:
        return list(jax.device_put(list(arrays), device))
    out: list[Any] = [None] * len(arrays)
    alone = sorted(set(range(len(arrays))) - {i for g in packed for i in g})
    for i, a in zip(alone, jax.device_put([arrays[i] for i in alone], device)):
        out[i] = a
    for group in packed:
        shapes = tuple(arrays[i].shape for i in group)
        buffer = np.concatenate([arrays[i].reshape(-1) for i in group])
        for i, a in zip(group, _unpack(jax.device_put(buffer, device), shapes)):
            out[i] = a
    return out


@functools.partial(jax.jit, static_argnums=1)
def _unpack(buffer: jax.Array, shapes: tuple[tuple[int, ...], ...]) -> list[jax.Array]:
    """``buffer`` cut into consecutive arrays of ``shapes``."""
    parts, offset = [], 0
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        parts.append(lax.slice(buffer, (offset,), (offset + size,)).reshape(shape))
        offset += size
    return parts


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
    weakly typed (see :func:`pytreestore._format.dtypes.weaken`).
    """
    ready = [jax_ready(a, p, cast) if a is not None else None for a, p in zip(arrays, paths)]
    if weak is not None:  # a weak scalar goes as a Python scalar: device_put keeps it weak
        ready = [_scalar(a) if w and a is not None else a for a, w in zip(ready, weak)]
    present = [a for a in ready if a is not None]
    placed = iter(device_put(present, device) if present else [])
    out = [next(placed) if a is not None else None for a in ready]
    return out if weak is None else weaken(out, weak)


def _scalar(array: Any) -> Any:
    """A 0-d array of the dtype JAX gives its Python scalar as that scalar (which JAX
    places weakly typed, at no extra cost); any other array (and NaN, whose payload bits
    must stay) as it is, for :func:`~pytreestore._format.dtypes.weaken`."""
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
