"""The reads of a store: ``load``, indexing, iteration and ``lengths``, for fixed and ragged
stores alike (a face of :class:`~pytreestore.TreeStore`, using only its
:class:`~pytreestore._core.StoreCore`).

Example:
    >>> import pytreestore
    >>> s = pytreestore.create("memory://doc-reads", {"a": 0})
    >>> s.extend({"a": i} for i in range(3))
    >>> s[1:]["a"].tolist()
    [1, 2]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

import numpy as np

from pytreestore import _arguments
from pytreestore._core import StoreCore
from pytreestore._read.records import record_reads

#: the record type of a store (``TreeStore[T]``): the class of the example it was created with
T = TypeVar("T")


class Reads(Generic[T]):
    """``load``, ``store[...]``, iteration, ``records`` and ``lengths`` of a store of records
    of type ``T``."""

    _core: StoreCore

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def load(
        self,
        index: Any = slice(None),
        *,
        columns: str | Sequence[str] | Any | None = None,
        device: Any = None,
        as_numpy: bool = False,
        cast: bool | None = None,
        sharding: Any = None,
        pad: bool = False,
        pmap_devices: Sequence[Any] | None = None,
        ragged: str = "pad",
        pad_to: int | str | Sequence[int] | None = None,
        trim: bool = False,
        size: int | None = None,
        truncate: bool | None = None,
    ) -> Any:
        """Loads records ``index`` as a record of the stored classes.

        Args:
            index: an int (one record), a slice, a list or array of ints, or a bool mask.
            columns: tree-path strings of the columns to load; a node's path selects every
                column below it (``".p[0]"``). Or a mask: a pytree of bools shaped like a
                record (or a padded batch, or a prefix of either), True where a column is
                wanted, e.g. ``jax.tree.map(lambda _: False, record)`` with some leaves set
                True; under a ragged list any element's True selects that column. Columns not
                selected come back as None.
            device: a ``jax.Device`` or ``jax.sharding.Sharding`` to place the leaves on
                (default: JAX's default device).
            as_numpy: return host numpy arrays, with every dtype exactly as stored; a column
                of typed PRNG keys comes back as its key data (uint32, see
                :func:`jax.random.key_data`), since numpy has no key dtype.
            cast: load 64-bit columns while x64 is disabled by casting them to 32 bits
                (values that do not fit raise); without it they raise. None (default): the
                store's policy, set by ``pytreestore.open(..., cast=...)`` or ``create``.
            sharding: build each column as a global ``jax.Array`` split along the record axis:
                one ``jax.sharding.Sharding`` for every column, a pytree of them shaped like
                the schema (None replicates), or a callable from tree path to sharding. Each
                device's rows are read once, for that device only (under ``jax.distributed``,
                each process reads only its own devices' rows). A ragged store's padded
                leaves and masks split the same way, records first, each mask by its leaf's
                sharding cut to its axes (``ragged="segments"`` takes one sharding for every
                leaf). See docs/sharding.md.
            pad: with ``sharding`` or ``pmap_devices``, pad a record count that does not split
                evenly with fill values (zeros) and return ``(records, mask)``, where ``mask``
                is a bool ``jax.Array`` over the padded records, True for real ones (a
                ragged store's pair ``(batch, mask)`` keeps its form, its masks False in the
                padding records).
            pmap_devices: devices (e.g. ``jax.local_devices()``) to lay the records out for
                ``jax.pmap``: leaves shaped ``(len(devices), count // len(devices), ...)``,
                slice ``i`` already on ``devices[i]`` (a ragged store's padded leaves and
                masks too).
            ragged: for a store created with ``ragged=``/``optional=`` (docs/ragged.md):
                ``"pad"`` (default) returns ``(batch, mask)``, each ragged list stacked into
                one element padded to ``L``, ``mask`` True where a value is real;
                ``"segments"`` returns ``(values, segments)``, the leaves flat along each
                axis and, per axis, the :class:`~pytreestore.Segments` of its elements
                (and, per optional subtree, its presence under ``"present" + keypath``).
            pad_to: with ``ragged="pad"``: None (the longest in the selection), an int,
                ``"pow2"`` or increasing bucket sizes; a longer list raises
                :class:`~pytreestore.errors.RaggedLengthError`.
            trim: with ``pad_to``, cut longer lists instead of raising.
            size: with ``ragged="segments"``, pad every axis's elements to this many.
            truncate: the old name of ``trim`` (an alias; ``truncate`` now means only
                :meth:`truncate`).

        Returns:
            For an int index, one record whose leaves have the per-record shape; otherwise a
            batched record whose leaves carry a leading record axis; with ``pad=True`` a pair
            ``(records, mask)``.

        Raises:
            ShardingError: a sharding cannot split the record count (and ``pad`` is false) or
                a leaf's shape.

        Example:
            >>> import pytreestore
            >>> s = pytreestore.create("memory://doc-load", {"a": 0, "b": (0.0, 0.0)})
            >>> s.extend({"a": i, "b": (i * 1.0, i * 2.0)} for i in range(5))
            >>> s.load([4, 0], columns="['b']", as_numpy=True)
            {'a': None, 'b': (array([4., 0.], dtype=float32), array([8., 0.], dtype=float32))}
        """
        core = self._core
        request = core.request(
            columns=columns,
            device=device,
            as_numpy=as_numpy,
            cast=cast,
            sharding=sharding,
            pad=pad,
            pmap_devices=pmap_devices,
        )
        options = (ragged, pad_to, _arguments.trimmed(trim, truncate), size)
        reads = record_reads(request.schema)
        return reads.load(core.read_context(), core.head, request, index, options)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: Any) -> Any: ...

    def __getitem__(self, index: Any) -> Any:
        return self.load(index)

    def __iter__(self) -> Iterator[T]:
        return self.records()

    def records(
        self,
        *,
        columns: str | Sequence[str] | Any | None = None,
        as_numpy: bool = False,
        cast: bool | None = None,
    ) -> Iterator[T]:
        """Iterates over the records one at a time, reading a block of records per read.

        ``iter(store)`` is ``store.records()``. The arguments are those of :meth:`load`.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-records", {"t": np.float64(0)})
            >>> s.extend({"t": np.float64(i)} for i in range(2))
            >>> [r["t"].item() for r in s.records(as_numpy=True)]
            [0.0, 1.0]
        """
        core = self._core
        request = core.request(columns=columns, as_numpy=as_numpy, cast=cast)
        yield from record_reads(request.schema).iterate(core.read_context(), core.head, request)

    def lengths(self, index: Any = slice(None)) -> dict[str, np.ndarray]:
        """Per ragged axis, each selected record's longest list (or leading axis) there,
        reading only the offsets: what a sampler needs to bucket records by size.

        Returns:
            ``{axis keypath: int64 array over the selected records}``; a nested axis gives
            the longest list of the record's elements. ``load(index, pad_to=None)`` pads
            each axis to the largest of these.

        Example:
            >>> import numpy as np, pytreestore
            >>> s = pytreestore.create("memory://doc-lengths", {"p": [np.int8(0)]},
            ...                        ragged=["['p']"])
            >>> s.extend([{"p": [np.int8(1)] * n} for n in (3, 0, 2)])
            >>> s.lengths()["['p']"].tolist()
            [3, 0, 2]
        """
        core = self._core
        return record_reads(core.schema).lengths(core.read_context(), core.head, core.schema, index)


__all__ = ["Reads", "T"]
