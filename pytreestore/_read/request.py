"""One read, resolved once: the columns, the dtype policy, the placement and the shardings.

Every read (``load``, ``store[...]``, iteration, ``batches``, ``map``, a Grain source, the read
side of ``copy``, the CLI's ``head``) builds one :class:`LoadRequest` from its arguments and
hands it to :mod:`pytreestore._read.load`, which executes it against a store. Building the
request checks every argument and resolves the column selectors, the ``cast`` policy and the
``sharding=`` argument once; a pipeline that loads many batches reuses the same request for
every batch. A request is a value: it holds a snapshot of the schema and no storage.

Example:
    >>> import numpy as np
    >>> from pytreestore._format.schema import TreeSchema
    >>> schema = TreeSchema.from_example({"a": np.float32(0), "b": np.zeros(2, np.int32)})
    >>> request = LoadRequest.build(schema, policy=False, columns="['b']", as_numpy=True)
    >>> request.chosen, request.cast, request.split
    ((1,), False, False)
    >>> request.selection(-1, 10)
    Selection(index=slice(9, 10, 1), count=1, scalar=True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from pytreestore import _arguments
from pytreestore._format.schema import ColumnSpec, TreeSchema
from pytreestore._read import sharded as _sharded
from pytreestore._read.index import Selection, normalize
from pytreestore.errors import ArgumentError, ArgumentTypeError, ShardingError


def check_cast(cast: Any) -> bool:
    """``cast`` if it is a bool; raises TypeError otherwise."""
    if not isinstance(cast, bool):
        raise ArgumentTypeError(
            f"cast must be True, False or None (the store's policy), got {cast!r}"
        )
    return cast


@dataclasses.dataclass(frozen=True)
class LoadRequest:
    """A read's arguments, checked and resolved against one schema snapshot.

    Attributes:
        schema: the schema the read was resolved against and is unflattened with (a read
            keeps it whatever an ``evolve`` does meanwhile).
        chosen: indices of the columns to read, in column order; the others load as None.
        cast: cast 64-bit columns to 32 bits while x64 is disabled (the store's policy
            already applied).
        as_numpy: return host numpy arrays, dtypes exactly as stored.
        device: the ``jax.Device`` or ``Sharding`` to place leaves on (None: JAX's default).
        shardings: for a sharded or pmap load, one sharding per chosen column; None otherwise.
        pad: pad a record count the shardings cannot split, and return a mask as well.
        pmap: lay the records out for ``jax.pmap`` (``shardings`` are the pmap sharding).
    """

    schema: TreeSchema
    chosen: tuple[int, ...]
    cast: bool
    as_numpy: bool = False
    device: Any = None
    shardings: tuple[Sharding, ...] | None = None
    pad: bool = False
    pmap: bool = False

    @classmethod
    def build(
        cls,
        schema: TreeSchema,
        *,
        policy: bool,
        columns: str | Sequence[str] | Any | None = None,
        device: Any = None,
        as_numpy: bool = False,
        cast: bool | None = None,
        sharding: Any = None,
        pad: bool = False,
        pmap_devices: Sequence[Any] | None = None,
    ) -> LoadRequest:
        """Checks the arguments of :meth:`pytreestore.TreeStore.load` and resolves them.

        Args:
            schema: the store's schema now.
            policy: the store's ``cast`` policy, used when ``cast`` is None.
            columns, device, as_numpy, cast, sharding, pad, pmap_devices: as for ``load``.

        Raises:
            ArgumentTypeError: ``cast`` is not a bool or None, a selector is not a string, or a
                sharding is not a ``jax.sharding.Sharding``.
            ArgumentError: placements that exclude each other, a sharding tree that does
                not match the schema, or ``columns`` that select no column (an empty list, a
                mask of False leaves, empty ragged lists and ``None`` optional subtrees).
            UnknownColumnError: a selector names no column.
        """
        resolved = policy if cast is None else check_cast(cast)
        _check_placement(device, as_numpy, pad)
        split = sharding is not None or pmap_devices is not None or pad
        if split:
            _check_split(sharding, pmap_devices, device=device, as_numpy=as_numpy)
        chosen = tuple(schema.select(columns))
        if columns is not None and not chosen:
            raise ArgumentError(_selects_nothing(columns, schema.paths))
        shardings = None
        if split:
            every = _sharded.resolve(sharding, pmap_devices, schema.paths)
            shardings = tuple(every[i] for i in chosen)
        pmap = pmap_devices is not None
        return cls(schema, chosen, resolved, as_numpy, device, shardings, pad, pmap)

    @property
    def split(self) -> bool:
        """Whether the read builds global arrays (``sharding=``, ``pmap_devices=``)."""
        return self.shardings is not None

    @property
    def specs(self) -> list[ColumnSpec]:
        """The chosen columns."""
        return [self.schema.columns[i] for i in self.chosen]

    @property
    def record_nbytes(self) -> int:
        """Bytes one record of the chosen columns takes in memory."""
        return sum(c.record_nbytes for c in self.specs)

    def selection(self, index: Any, records: int, first: int = 0) -> Selection:
        """``index`` normalised against the rows ``first`` to ``records`` of the record
        table (a store of ``records - first`` records; ``first``: the rows released from
        its front), as rows (:func:`~pytreestore._read.index.normalize`).

        Raises:
            ShardingError: an int index for a split read (one record has no record axis).
            StoreIndexError: an index :func:`pytreestore._read.index.normalize` refuses.
        """
        if self.split and _is_int(index):
            raise ShardingError(
                f"a sharded load splits the record axis, which one record ({index}) does not "
                f"have; load a slice such as {index}:{index}+1, or use device= for one record"
            )
        return normalize(index, records - first, first)

    def check_batches(self, batch_size: int, count: int, *, drop_last: bool) -> None:
        """Checks that this request's shardings split every batch (no-op unsplit).

        Raises:
            ShardingError: naming the batch size to use instead.
        """
        if self.shardings is not None:
            _sharded.check_batches(
                self.specs, self.shardings, batch_size, count, drop_last=drop_last
            )


def _selects_nothing(columns: Any, paths: Sequence[str]) -> str:
    """The message of a ``columns=`` that selects no column: what was given, the store's
    columns, and what a mask selects (offsets and presence are no columns of their own: they
    come with the leaves they shape)."""
    shown = ", ".join(paths[:_LISTED]) + (
        f", ... ({len(paths)} in all)" if len(paths) > _LISTED else ""
    )
    return (
        f"columns={columns!r:.120} selects no column, and a read loads at least one. "
        f"Select some of the store's columns: {shown or 'none'}. A mask selects a column where "
        "its leaf is True; an empty ragged list or a None optional subtree in it selects "
        "nothing (the lengths and presence come with the leaves they shape; store.lengths() "
        "reads the ragged axes' lengths alone)"
    )


#: the store's columns an error lists before it cuts the list short
_LISTED = 12


def _check_placement(device: Any, as_numpy: Any, pad: Any) -> None:
    """Refuses a ``device`` that is no device or sharding, and flags that are not bools."""
    if device is not None and not isinstance(device, jax.Device | Sharding):
        raise ArgumentTypeError(
            f"device= takes a jax.Device or a jax.sharding.Sharding (or None: JAX's default), "
            f"got {type(device).__name__} {device!r:.80}"
        )
    _arguments.flag(as_numpy, "as_numpy")
    _arguments.flag(pad, "pad")


def _check_split(sharding: Any, pmap_devices: Any, *, device: Any, as_numpy: bool) -> None:
    """Refuses argument combinations a sharded or pmap load cannot honour."""
    if sharding is not None and pmap_devices is not None:
        raise ArgumentError("give sharding= or pmap_devices=, not both")
    if sharding is None and pmap_devices is None:
        raise ArgumentError("pad=True needs sharding= or pmap_devices=: only a split load pads")
    if device is not None:
        raise ArgumentError(
            "device= places leaves on one device or sharding; drop it when "
            "giving sharding= or pmap_devices="
        )
    if as_numpy:
        raise ArgumentError(
            "as_numpy=True loads to host; it cannot be combined with sharding= or pmap_devices="
        )


def _is_int(index: Any) -> bool:
    return isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_))
