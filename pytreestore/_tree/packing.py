"""Records packed into one row of 32-bit words, on the device, and cut back into leaves on
the host (the recorder's blocks, :mod:`pytreestore._write.recorder`).

A record of 20 leaves is 20 arrays; packed, it is one ``uint32`` row: each leaf's bits
(``lax.bitcast_convert_type``: a 4-byte leaf as is, an 8-byte one as two words, 1- and
2-byte ones padded to whole words; a bool as one byte), its place a :class:`Part` of the
row (in words). Words, not bytes: XLA:CPU concatenates bytes 3-6x slower. A typed PRNG key or a sub-byte leaf (int4, float4) is a
row of its own, unchanged. The pack is traceable (it runs inside ``jit`` and
``lax.scan``); the unpack gives views of a block's row (``ndarray.view``), exact to the bit.
One output per record instead of one per leaf: a jitted step that also returns its packed
record costs one more output, a scan stacks one array per step, and a block is one copy to
the host.

Example:
    >>> import jax, numpy as np
    >>> layout = Layout.of({"a": np.arange(3, dtype=np.float32), "n": np.int32(5)})
    >>> rows = [np.asarray(r)[None] for r in layout.pack(jax.tree.leaves(
    ...     {"a": np.arange(3, dtype=np.float32), "n": np.int32(5)}))]
    >>> layout.unpack(rows, 1)
    {'a': array([[0., 1., 2.]], dtype=float32), 'n': array([5], dtype=int32)}
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import tree_flatten


class LayoutChanged(Exception):
    """Internal: a record's leaves do not have the recorder's layout (a new one is made)."""


@dataclasses.dataclass(frozen=True)
class Part:
    """One leaf's place in a packed row: leaf ``index``, columns ``start:stop``."""

    index: int
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a record of one structure is packed: one row of words (a typed PRNG key or a
    sub-byte leaf, which has no bytes of its own, is a row of its own, unchanged).

    Example:
        >>> import numpy as np
        >>> layout = Layout.of({"a": np.zeros(3, np.float32), "b": np.float32(0)})
        >>> layout.width  # a's 3 words, b's 1
        (4,)
    """

    treedef: Any
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    groups: tuple[tuple[Any, tuple[Part, ...], bool], ...]  # dtype, parts, packed

    @classmethod
    def of(cls, tree: Any) -> Layout:
        """The layout of ``tree``'s leaves (arrays or ``jax.ShapeDtypeStruct``)."""
        leaves, treedef = tree_flatten(tree)
        shapes = tuple(tuple(np.shape(x)) for x in leaves)
        dtypes = tuple(jnp.result_type(x) if not hasattr(x, "dtype") else x.dtype for x in leaves)
        return cls(treedef, shapes, dtypes, _groups(shapes, dtypes))

    @property
    def width(self) -> tuple[int, ...]:
        """Each packed row's length in words (a row of its own: 1)."""
        return tuple(parts[-1].stop if packed else 1 for _, parts, packed in self.groups)

    def empty(self) -> Any:
        """A batch of no records of this layout (concrete, even while a jit traces): numpy
        arrays, but a typed PRNG key's (a ``jax.Array``)."""
        return self.treedef.unflatten(
            [_empty(s, d) for s, d in zip(self.shapes, self.dtypes, strict=True)]
        )

    def pack(self, leaves: Sequence[Any]) -> tuple[Any, ...]:
        """The rows of one record's ``leaves`` (traceable: runs inside ``jit``).

        Raises:
            LayoutChanged: a leaf's shape or dtype is not this layout's (found as the
                jitted packer traces new shapes, so a call with known ones checks nothing).
        """
        for x, shape, dtype in zip(leaves, self.shapes, self.dtypes, strict=True):
            if tuple(np.shape(x)) != shape or jnp.result_type(x) != dtype:
                raise LayoutChanged
        rows = []
        for _, parts, packed in self.groups:
            if not packed:
                rows.append(leaves[parts[0].index])
                continue
            pieces = [_words(leaves[p.index], self.dtypes[p.index]) for p in parts]
            rows.append(pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces))
        return tuple(rows)

    def unpack(self, rows: Sequence[Any], count: int) -> Any:
        """The batch of ``count`` records whose packed rows (a leading record axis) are
        ``rows``: each leaf a view of its row's columns."""
        leaves: list[Any] = [None] * len(self.shapes)
        for row, (_, parts, packed) in zip(rows, self.groups, strict=True):
            for p in parts:
                if not packed:
                    leaves[p.index] = row[:count]
                    continue
                dtype, shape = np.dtype(self.dtypes[p.index]), self.shapes[p.index]
                size = int(np.prod(shape, dtype=np.int64))
                cut = row[:count, p.start : p.stop].view(dtype)
                leaves[p.index] = cut[:, :size].reshape((count, *shape))
        return self.treedef.unflatten(leaves)


def _empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """No values of ``shape`` and ``dtype`` (a leading axis of 0)."""
    if not jnp.issubdtype(dtype, jax.dtypes.extended):
        return np.zeros((0, *shape), dtype)
    with jax.ensure_compile_time_eval():
        return jnp.zeros((0, *shape), dtype)


#: dtypes of fewer than 8 bits a value, kept as rows of their own (no bytes to bitcast)
SUB_BYTE = frozenset({"int4", "uint4", "int2", "uint2", "float4_e2m1fn"})


def _words(leaf: Any, dtype: Any) -> Any:
    """``leaf``'s bits as ``uint32`` words, raveled and padded (traceable)."""
    flat = jnp.ravel(jnp.asarray(leaf, dtype))
    size = np.dtype(dtype).itemsize
    if flat.dtype == jnp.bool_:
        flat = flat.astype(jnp.uint8)
    if size == 4:
        return jax.lax.bitcast_convert_type(flat, jnp.uint32)
    if size == 8:
        return jnp.ravel(jax.lax.bitcast_convert_type(flat, jnp.uint32))
    per = 4 // size  # 1- and 2-byte values: padded to whole words
    pad = -flat.shape[0] % per
    if pad:
        flat = jnp.concatenate([flat, jnp.zeros(pad, flat.dtype)])
    return jax.lax.bitcast_convert_type(flat.reshape(-1, per), jnp.uint32)


def _groups(
    shapes: Sequence[tuple[int, ...]], dtypes: Sequence[Any]
) -> tuple[tuple[Any, tuple[Part, ...], bool], ...]:
    """The row of words (each leaf's whole words in turn), then a row for each key or
    sub-byte leaf."""
    packed: list[Part] = []
    single: list[tuple[Any, tuple[Part, ...], bool]] = []
    end = 0
    for i, (shape, dtype) in enumerate(zip(shapes, dtypes, strict=True)):
        if jnp.issubdtype(dtype, jax.dtypes.extended) or np.dtype(dtype).name in SUB_BYTE:
            single.append((dtype, (Part(i, 0, 1),), False))
            continue
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        packed.append(Part(i, end, end + -(-nbytes // 4)))
        end = packed[-1].stop
    head = ((np.dtype(np.uint32), tuple(packed), True),) if packed else ()
    return head + tuple(single)


@functools.lru_cache(maxsize=64)
def packer(layout: Layout) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    return jax.jit(layout.pack)


@functools.cache
def stacker() -> Callable[[Sequence[tuple[Any, ...]]], tuple[Any, ...]]:
    return jax.jit(lambda rows: tuple(jnp.stack(c) for c in zip(*rows, strict=True)))


def start_copies(rows: Sequence[Any]) -> None:
    for row in rows:
        row.copy_to_host_async()


def host(row: Any) -> Any:
    """A packed block on the host (a key block stays a ``jax.Array``: the store takes it)."""
    if jnp.issubdtype(row.dtype, jax.dtypes.extended):
        return row
    return np.asarray(row)


@dataclasses.dataclass(frozen=True)
class Packed:
    """``count`` records packed by ``layout`` into ``rows``, each row with a leading record
    axis (a scan's outputs, say: :func:`pytreestore.record_scan`)."""

    layout: Layout
    rows: tuple[Any, ...]
    count: int

    def unpacked(self) -> Any:
        """The batch, on the host (its rows fetched)."""
        return self.layout.unpack([host(r) for r in self.rows], self.count)


def same(x: Any) -> Any:
    """The identity: what is recorded of a carry by default."""
    return x


def shapes_of(tree: Any) -> str:
    """``tree``'s leaves as ``dtype[shape]``, for messages."""
    return str(jax.tree.map(lambda s: f"{s.dtype}{list(s.shape)}", tree))[:400]


__all__ = [
    "SUB_BYTE",
    "Layout",
    "LayoutChanged",
    "Packed",
    "Part",
    "host",
    "packer",
    "same",
    "shapes_of",
    "stacker",
    "start_copies",
]
