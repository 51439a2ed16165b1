"""A store's columns: :class:`ColumnSpec` (one leaf's array on disk) and chunk sizing.

Example:
    >>> import numpy as np
    >>> leaf_chunks(np.dtype("float32"), (3,), 1024)
    (3,)
    >>> ColumnSpec("['a']", "a", np.dtype("float32"), (3,), (1024, 3)).record_nbytes
    12
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pytreestore._format import dtypes as _dtypes
from pytreestore._format import keys as _keys
from pytreestore.errors import UnsupportedTreeError

_CHUNK_TARGET = 4 << 20  # bytes of one column chunk we aim at, for the widest column
_BUFFER_LIMIT = 64 << 20  # bytes of one chunk row across all columns, at most
#: records per chunk, at most: a flush re-encodes the whole tail chunk of every column, so very
#: long chunks of small leaves make frequent flushes slow
_MAX_CHUNK_RECORDS = 1 << 16


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    """One column: the leaf at ``path`` (as ``keystr`` prints it), stored at ``key``.

    Attributes:
        path: the leaf's tree path, e.g. ``.p[0].x``.
        key: the column's storage key below the store root, e.g. ``p/0/x``.
        dtype: the column's dtype.
        shape: the shape of one record's leaf (the column's shape less the record axis).
        chunks: the chunk shape, record axis first.
        start: the record count when the column was added by ``evolve`` (0: from the start).
        default: for a column added by ``evolve``, the value of every record before
            ``start``, as zarr ``fill_value`` JSON (None: a column from the start).
        key_impl: for a column of typed PRNG keys, the implementation's name (e.g.
            ``threefry2x32``); ``dtype`` and ``shape`` are then those of the key data.
        table: in a ragged store (format 3), the ragged axis whose table holds the column,
            one row per element (None: the record table, one row per record).
        role: ``"offsets"`` or ``"presence"`` for a ragged store's index arrays (described
            by the schema's ``ragged`` section, not listed among its columns); None for a leaf.
        weak_type: whether the leaf was weakly typed (a Python scalar, or a ``jax.Array``
            with ``weak_type``; see docs/pytrees.md): reads return it as a
            weakly typed ``jax.Array``, so ``jax.jit`` sees the abstract value it saw.
    """

    path: str
    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    start: int = 0
    default: Any = None
    key_impl: str | None = None
    table: str | None = None
    role: str | None = None
    weak_type: bool = False

    @property
    def record_nbytes(self) -> int:
        """Bytes one record takes in this column."""
        return self.dtype.itemsize * math.prod(self.shape)

    @property
    def dimension_names(self) -> list[str]:
        """``record`` (``element`` in a ragged axis's table) then one name per leaf axis,
        unique within the leaf's parent node."""
        name = _keys.decode_name(self.key.rsplit("/", 1)[-1]) or "leaf"
        first = "record" if self.table is None else "element"
        return [first] + [f"{name}_{i}" for i in range(len(self.shape))]

    def to_json(self) -> dict[str, Any]:
        out = {
            "path": self.path,
            "key": self.key,
            "dtype": _dtypes.name_of(self.dtype),
            "shape": list(self.shape),
            "chunks": list(self.chunks),
        }
        if self.default is not None:
            out.update(start=self.start, default=self.default)
        if self.key_impl is not None:
            out["key_impl"] = self.key_impl
        if self.table is not None:
            out["table"] = self.table
        if self.weak_type:
            out["weak_type"] = True
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ColumnSpec:
        if obj.keys() <= _PLAIN_KEYS:  # most columns: built without the dataclass __init__,
            spec = object.__new__(cls)  # whose frozen assignments cost more than the parse
            spec.__dict__.update(
                _PLAIN_DEFAULTS,
                path=obj["path"],
                key=obj["key"],
                dtype=_dtypes.from_name(obj["dtype"]),
                shape=tuple(obj["shape"]),
                chunks=tuple(obj["chunks"]),
                weak_type=_checked_weak(obj),
            )
            return spec
        return cls(
            path=obj["path"],
            key=obj["key"],
            dtype=_dtypes.from_name(obj["dtype"]),
            shape=tuple(obj["shape"]),
            chunks=tuple(obj["chunks"]),
            start=int(obj.get("start", 0)),
            default=_checked_default(obj),
            key_impl=obj.get("key_impl"),
            table=obj.get("table"),
            weak_type=_checked_weak(obj),
        )


#: the members of a column's JSON that need no more than a lookup each
_PLAIN_KEYS = frozenset(("path", "key", "dtype", "shape", "chunks", "weak_type"))
_PLAIN_DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(ColumnSpec)
    if f.name not in _PLAIN_KEYS and f.default is not dataclasses.MISSING
}


def _checked_weak(obj: dict[str, Any]) -> bool:
    """A column's ``weak_type`` (absent: False, a strongly typed column).

    Raises:
        ValueError: a value other than a JSON boolean.
    """
    weak = obj.get("weak_type", False)
    if not isinstance(weak, bool):
        raise ValueError(
            f"column {obj['path']}: its weak_type {weak!r} is not true or false; the schema "
            "was edited or damaged outside pytreestore"
        )
    return weak


_FLOAT_WORDS = ("NaN", "Infinity", "-Infinity")


def _checked_default(obj: dict[str, Any]) -> Any:
    """A column's ``default`` (zarr v3 fill value JSON), if its dtype holds it exactly.

    Raises:
        ValueError: a default of the wrong JSON type or out of the dtype's range.
    """
    fill, dtype = obj.get("default"), _dtypes.from_name(obj["dtype"])
    dkind = _dtypes.kind(dtype)

    def real(x: Any) -> bool:
        return x in _FLOAT_WORDS or (isinstance(x, int | float) and not isinstance(x, bool))

    if dkind == "b":
        ok = isinstance(fill, bool)
    elif dkind in "iu":
        info = np.iinfo(dtype)
        ok = type(fill) is int and info.min <= fill <= info.max
    elif dkind == "c":
        ok = isinstance(fill, list) and len(fill) == 2 and all(real(x) for x in fill)
    else:
        ok = real(fill)
    if fill is not None and not ok:
        raise ValueError(
            f"column {obj['path']}: its default {fill!r} is not a {dtype.name} value; the "
            "schema was edited or damaged outside pytreestore"
        )
    return fill


def check_unique_keys(columns: Sequence[ColumnSpec]) -> None:
    """Refuses two leaves whose paths map to one storage key."""
    seen: dict[str, str] = {}
    for c in columns:
        if c.key in seen:
            raise UnsupportedTreeError(
                f"leaves at {seen[c.key]} and {c.path} map to the same storage key {c.key!r}; "
                "rename one of them"
            )
        seen[c.key] = c.path


def default_chunk_records(leaves: Sequence[tuple[Any, ...]]) -> int:
    """Records per chunk for leaves ``(path, key, dtype, shape, ...)``: a power of two that
    keeps the widest column's chunk near the target and a chunk row within the buffer limit."""
    sizes = [leaf[2].itemsize * math.prod(leaf[3]) for leaf in leaves] or [1]
    per_chunk = _CHUNK_TARGET // max(max(sizes), 1)
    per_buffer = _BUFFER_LIMIT // max(sum(sizes), 1)
    n = max(1, min(per_chunk, per_buffer, _MAX_CHUNK_RECORDS))
    return 1 << (n.bit_length() - 1)


#: the decoded bytes of an inner chunk of a new compressed store (``create(inner_chunk_bytes=)``)
INNER_CHUNK_BYTES = 8 << 10


def inner_records(column: ColumnSpec, target: int | None) -> int | None:
    """Records per inner chunk of ``column`` in a store of ``inner_chunk_bytes`` ``target``
    (docs/format.md, "Inner chunks"): the largest power of two of records whose bytes in the
    column stay within ``target`` (at least one), when the column's chunk holds at least two
    such inner chunks, its leaf axes are whole and its chunk is a multiple of it; else None,
    a plain chunk. None for ``target`` None or 0 (no inner chunks).

    Example:
        >>> column = ColumnSpec("['a']", "a", np.dtype("float32"), (30,), (4096, 30))
        >>> inner_records(column, 32 << 10), inner_records(column, None)
        (256, None)
    """
    chunk = column.chunks[0]
    if not target or tuple(column.chunks[1:]) != tuple(column.shape):
        return None
    fit = max(1, target // max(column.record_nbytes, 1))
    inner = 1 << (fit.bit_length() - 1)
    return inner if 2 * inner <= chunk and chunk % inner == 0 else None


def leaf_chunks(dtype: np.dtype, shape: tuple[int, ...], records: int) -> tuple[int, ...]:
    """Leaf axes stay whole unless one record's leaf alone is far above the chunk target."""
    chunks = list(shape)
    for axis in range(len(chunks)):
        while records * dtype.itemsize * math.prod(chunks) > 2 * _CHUNK_TARGET and chunks[axis] > 1:
            chunks[axis] = -(-chunks[axis] // 2)
    return tuple(max(c, 1) for c in chunks)


__all__ = [
    "INNER_CHUNK_BYTES",
    "ColumnSpec",
    "check_unique_keys",
    "default_chunk_records",
    "inner_records",
    "leaf_chunks",
]
