"""The schema of a store: its tree structure and columns, as JSON and back, without pickle.

A schema is built from an example record. Each node of the tree becomes a JSON object that
names its kind (``list``, ``tuple``, ``dict``, ``ordered_dict``, ``none``, ``namedtuple``,
``custom``), a class as ``module:qualname`` where there is one, the child keys and the static
(aux) data. Each leaf becomes a column: its tree path, storage key, dtype and per-record shape.
On open, the classes are imported and bound to the stored nodes by field name
(:mod:`pytreestore._format.binding`); nothing is unpickled and no ``__init__`` named in the schema is
called.

Example:
    >>> import numpy as np
    >>> schema = TreeSchema.from_example({"a": np.zeros(3, np.float32), "b": 1})
    >>> [(c.path, c.dtype.name, c.shape) for c in schema.columns]
    [("['a']", 'float32', (3,)), ("['b']", 'int32', ())]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
from jax.tree_util import tree_structure

from pytreestore import _arguments
from pytreestore._format import binding as _binding
from pytreestore._format import classes as _fields
from pytreestore._format import consts as _consts
from pytreestore._format import dtypes as _dtypes
from pytreestore._format import dtypes as _prng
from pytreestore._format import keys as _keys
from pytreestore._format import kinds as _kinds
from pytreestore._format import mask as _mask
from pytreestore._format import mismatch as _mismatch
from pytreestore._format import nodes as _nodes
from pytreestore._format import upgrades as _upgrades
from pytreestore._format.binding import bind
from pytreestore._format.columns import ColumnSpec as ColumnSpec
from pytreestore._format.columns import (
    check_unique_keys,
    default_chunk_records,
    inner_records,
    leaf_chunks,
)
from pytreestore._format.compression import Pack, check_packs, storage
from pytreestore._format.dtypes import is_weak
from pytreestore._format.ragged import NO_TABLES, RaggedInfo
from pytreestore._format.upgrades import FORMAT_VERSION as FORMAT_VERSION
from pytreestore.errors import (
    ArgumentTypeError,
    CorruptStoreError,
    SchemaMismatchError,
    UnknownColumnError,
    UnsupportedDtypeError,
    UnsupportedTreeError,
)

#: ``jax.tree_util.PyTreeDef``, which JAX defines as a runtime alias that type checkers can't use.
TreeDef: TypeAlias = Any


@dataclasses.dataclass(frozen=True)
class TreeSchema:
    """The structure and columns of a store.

    Attributes:
        tree: the tree's JSON description (see the format specification).
        columns: one :class:`ColumnSpec` per leaf, in ``jax.tree_util`` flatten order.
        chunk_records: records per chunk along the record axis.
        codec: ``"zstd"``, ``"blosc"``, ``"gzip"`` or None (uncompressed).
        treedef: the treedef records are flattened with and loads are built with (today's
            classes, bound to the stored fields by name), or None for a generic view (dicts,
            lists and tuples instead of the stored classes).
        binding: how the leaves of ``treedef`` map to the columns, when they differ from the
            columns (fields reordered, added with a default, or removed); None when the same.
        dropped: columns hidden by ``evolve(drop=...)``, whose data stays on disk.
        format_version: the format the schema was read in (new schemas: ``FORMAT_VERSION``).
        ragged: for a store created with ``ragged=``/``optional=`` (format 3), where records
            may vary and the offsets and presence arrays that say how; None for a fixed store.
            ``tree`` and ``columns`` then describe a representative record: one element per
            ragged list, every optional subtree present (see docs/format.md).
        packs: with ``create(pack=...)`` (format 3), the shared arrays that hold small leaves
            side by side (see docs/format.md); () when every column has its own array.
        inner_chunk_bytes: the decoded bytes an inner chunk of a column holds at most
            (format 3, ``create(inner_chunk_bytes=)``): each column's chunks are zarr v3
            shards of inner chunks of as many records as fit in those bytes, decoded one at
            a time; None: plain chunks.
        layout: for a ragged store, the layout of records (today's classes) that
            pytreestore builds on create and open; not stored.
    """

    tree: dict[str, Any]
    columns: tuple[ColumnSpec, ...]
    chunk_records: int
    codec: str | None
    treedef: TreeDef | None
    binding: _binding.Binding | None = None
    dropped: tuple[ColumnSpec, ...] = ()
    format_version: int = FORMAT_VERSION
    ragged: RaggedInfo | None = None
    packs: tuple[Pack, ...] = ()
    inner_chunk_bytes: int | None = None
    layout: Any = dataclasses.field(default=None, compare=False, repr=False)
    #: the digest of the stored schema document this schema was read from (its id in the
    #: version log); None for a schema not read from a store
    digest: str | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_example(
        cls,
        like: Any,
        *,
        chunk_records: int | None = None,
        codec: str | None = "zstd",
        recorded: bool = True,
    ) -> TreeSchema:
        """Builds the schema of records shaped like ``like``; its values are not kept.

        ``recorded=False`` for a schema no store records (``like=`` of a reader, ``stack``):
        its classes' names need not import back as those classes.

        Raises:
            UnsupportedTreeError: a node or leaf a store cannot hold, or (``recorded``) a class
                whose ``module:qualname`` imports as another object.
        """
        leaves: list[tuple[str, str, np.dtype, tuple[int, ...], str | None, bool]] = []
        tree = _encode(like, (), leaves, recorded)
        _fields.annotate(tree, like)
        chunk = (
            default_chunk_records(leaves)
            if chunk_records is None
            else _arguments.count(chunk_records, "chunk_records must be a positive int", minimum=1)
        )
        columns = tuple(
            ColumnSpec(
                path,
                key,
                dtype,
                shape,
                (chunk, *leaf_chunks(dtype, shape, chunk)),
                key_impl=impl,
                weak_type=weak,
            )
            for path, key, dtype, shape, impl, weak in leaves
        )
        check_unique_keys(columns)
        binding = _binding.const_binding(tree, [c.shape for c in columns])
        return cls(tree, columns, chunk, codec, tree_structure(like), binding)

    def to_json(self) -> dict[str, Any]:
        """The schema as stored in the root group's ``zarr.json`` attributes."""
        out = {
            "format_version": self.format_version,
            "chunk_records": self.chunk_records,
            "codec": self.codec,
            "tree": self.tree,
            "columns": [c.to_json() for c in self.columns],
        }
        if self.dropped:
            out["dropped"] = [c.to_json() for c in self.dropped]
        out.update(self.tables.schema_json())
        if self.packs:
            out["packs"] = [p.to_json() for p in self.packs]
        if self.inner_chunk_bytes:
            out["inner_chunk_bytes"] = self.inner_chunk_bytes
        return out

    @classmethod
    def from_json(
        cls, obj: dict[str, Any], *, like: Any = None, generic: bool = False
    ) -> TreeSchema:
        """Rebuilds a schema; classes come from ``like``, from imports, or none if ``generic``."""
        try:
            today = _upgrades.schema(obj)
            columns = tuple(ColumnSpec.from_json(c) for c in obj["columns"])
            dropped = tuple(ColumnSpec.from_json(c) for c in obj.get("dropped", ()))
            tree, chunk, codec = obj["tree"], int(obj["chunk_records"]), obj["codec"]
            version = today["format_version"]
            tables = RaggedInfo.from_json(obj["ragged"]) if "ragged" in obj else NO_TABLES
            packs = tuple(Pack.from_json(p) for p in obj.get("packs", ()))
            inner = _inner_chunk_bytes(obj)
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptStoreError(f"the store's schema is malformed: {err!r}") from err
        _kinds.check_tree(tree, len(columns))
        if packs:
            check_packs(packs, (*columns, *dropped))
        unknown = sorted({str(c.table) for c in columns if c.table not in tables.tables()})
        if unknown:
            raise CorruptStoreError(
                f"the store's schema is malformed: its columns live in the tables of ragged "
                f"axes {unknown} ('table'), but its 'ragged' section describes no such axis; "
                "the schema was edited or damaged outside pytreestore"
            )
        binding = None
        if generic:
            treedef = None
        elif like is not None:
            treedef = _treedef_from_like(tree, columns, like)
            binding = _binding.const_binding(tree, [c.shape for c in columns])
        else:
            shapes, paths = [c.shape for c in columns], [c.path for c in columns]
            treedef, binding = bind(today["tree"], shapes, paths)
        ragged = tables.section()
        return cls(
            tree, columns, chunk, codec, treedef, binding, dropped, version, ragged, packs, inner
        )

    def inner(self, column: ColumnSpec) -> int | None:
        """Records per inner chunk of ``column`` (a packed leaf's: its pack array's), or
        None for plain chunks: the unit a read of a few records decodes."""
        return inner_records(self._stored_in.get(column.key, column), self.inner_chunk_bytes)

    def read_unit(self, column: ColumnSpec) -> int:
        """Records a read decodes at least, in ``column``: an inner chunk, or a chunk (a
        packed leaf's: its pack array's); worked out once per column."""
        units = self._units
        unit = units.get(column.key)
        if unit is None:
            unit = self.inner(column) or self._stored_in.get(column.key, column).chunks[0]
            units[column.key] = unit
        return unit

    @functools.cached_property
    def _units(self) -> dict[str, int]:
        """:meth:`read_unit` of the columns asked about so far, by storage key (unique)."""
        return {}

    @functools.cached_property
    def _stored_in(self) -> dict[str, ColumnSpec]:
        """The pack array of each packed leaf, by the leaf's key (none: no packs)."""
        if not self.packs:
            return {}
        arrays = {c.key: c for c in self.storage_columns}
        kept = [p for p in self.packs if p.key in arrays]  # (a pack of dropped leaves: none)
        return {key: arrays[p.key] for p in kept for key, *_ in p.members}

    @property
    def pending(self) -> tuple[str, ...]:
        """A ragged store's keypaths whose structure no record has shown yet (an empty list,
        or None, in ``like``); they are learnt from the first record that has one."""
        return tuple(self.layout.pending) if self.layout is not None else ()

    @property
    def storage_columns(self) -> tuple[ColumnSpec, ...]:
        """Every array of the store: the columns (less packed ones, then the packs), then a
        ragged store's offsets and presence arrays."""
        arrays = storage(self.columns, self.dropped, self.packs) if self.packs else self.columns
        return (*arrays, *self.tables.index_columns(self.chunk_records))

    @property
    def table_columns(self) -> tuple[ColumnSpec, ...]:
        """Every column the tables' writers and readers name: the leaves (packed ones by
        their own keys, which the backend maps into their packs), then a ragged store's
        offsets and presence arrays."""
        return (*self.columns, *self.tables.index_columns(self.chunk_records))

    @property
    def tables(self) -> RaggedInfo:
        """The store's axis tables and optional subtrees (the record model): a fixed store's
        are none."""
        return NO_TABLES if self.ragged is None else self.ragged

    def with_tables(self, tables: RaggedInfo) -> TreeSchema:
        """``self`` with ``tables`` (a fixed store's :class:`NoTables` keep it fixed)."""
        return dataclasses.replace(self, ragged=tables.section())

    @functools.cached_property
    def weak(self) -> tuple[bool, ...] | None:
        """Each column's ``weak_type`` (see :attr:`ColumnSpec.weak_type`), or None when
        no column is weakly typed."""
        flags = tuple(c.weak_type for c in self.columns)
        return flags if any(flags) else None

    @property
    def paths(self) -> tuple[str, ...]:
        """Every column's tree path, in column order."""
        return tuple(c.path for c in self.columns)

    def __str__(self) -> str:
        """The schema as a person reads it: one line per column (its keypath, dtype and
        per-record shape), then the chunking and codec; ``repr`` keeps every field.

        Example:
            >>> import numpy as np
            >>> print(TreeSchema.from_example({"a": np.zeros(3, np.float32)}, recorded=False))
            TreeSchema of 1 column, 65536 records a chunk, codec zstd:
              ['a']  float32[3]
        """
        columns = [c for c in self.columns if c.role is None]
        width = max((len(c.path or "(root)") for c in columns), default=0)
        lines = [
            f"  {(c.path or '(root)').ljust(width)}  {_dtypes.describe(c.dtype, c.shape)}"
            + (f"  (table {c.table})" if c.table else "")
            for c in columns
        ]
        head = (
            f"TreeSchema of {len(columns)} column{'s' * (len(columns) != 1)}, "
            f"{self.chunk_records} records a chunk, codec {self.codec}:"
        )
        return "\n".join([head, *lines])

    def holds(self, treedef: Any) -> bool:
        """Whether records of ``treedef`` are this schema's: an equal treedef *of the same
        classes*. JAX's treedef equality does not compare the class of a dataclass node
        (``register_dataclass``, flax ``struct.dataclass``): a record of another class with
        the same fields compares equal, and would be read back as the stored class. Its hash
        does, so it is compared too (where the static data hashes).

        Example:
            >>> import dataclasses, jax, numpy as np
            >>> @jax.tree_util.register_dataclass
            ... @dataclasses.dataclass
            ... class A:
            ...     x: np.ndarray
            >>> @jax.tree_util.register_dataclass
            ... @dataclasses.dataclass
            ... class B:
            ...     x: np.ndarray
            >>> schema = TreeSchema.from_example(A(np.int32(0)), recorded=False)
            >>> schema.holds(jax.tree.structure(A(1))), schema.holds(jax.tree.structure(B(1)))
            (True, False)
        """
        return _nodes.same_structure(treedef, self.treedef, self._structure_hash)

    @functools.cached_property
    def _structure_hash(self) -> int | None:
        """:func:`~pytreestore._format.nodes.structure_hash` of :attr:`treedef`, kept."""
        return _nodes.structure_hash(self.treedef)

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        """Builds a tree of the stored classes (or the generic view) around ``leaves``."""
        if self.binding is not None:
            leaves = self.binding.leaves(leaves)
        if self.treedef is not None:
            return self.treedef.unflatten(leaves)
        return _kinds.generic(self.tree, iter(leaves))

    def column_leaves(self, leaves: list[Any]) -> list[Any]:
        """The columns' values, in column order, from the leaves of a record of ``treedef``.

        Raises:
            SchemaMismatchError: today's classes have fields the store lacks, or lack fields
                it has (see :meth:`TreeStore.evolve`).
        """
        return leaves if self.binding is None else self.binding.columns(leaves)

    def select(self, columns: Any) -> list[int]:
        """Indices of the columns that the tree-path selectors ``columns`` name.

        A selector names a column by its path, or every column below a node by the node's
        path (``.p[0]``); ``""`` selects everything. A constant leaf (a function, see
        docs/format.md, "Constant leaves") is no column: every load returns it whatever is selected,
        and a selector under which only constants live is refused like one naming nothing.
        ``columns`` may also be a mask: a pytree of bools shaped like a record, True where a
        column is wanted (see :meth:`pytreestore.TreeStore.load`).
        """
        if columns is None:
            return list(range(len(self.columns)))
        if _mask.is_mask(columns):
            consts = [s.path for s in _binding.sources(self.tree) if isinstance(s, _consts.Const)]
            columns = _mask.selectors(columns, self.paths, consts)
        selectors = [columns] if isinstance(columns, str) else list(_columns(columns))
        chosen: set[int] = set()
        for sel in selectors:
            if not isinstance(sel, str):
                raise ArgumentTypeError(f"columns takes tree-path strings, got {sel!r}")
            hits = [i for i, c in enumerate(self.columns) if _keys.is_under(c.path, sel)]
            if not hits:
                raise UnknownColumnError(
                    f"no column at or below {sel!r}{_binding.only_consts_note(self.tree, sel)}; "
                    f"the store's columns are {', '.join(self.paths)}"
                )
            chosen.update(hits)
        return sorted(chosen)

    def mismatch_message(self, record: Any, what: str = "record") -> str:
        """Explains, path by path, how ``record``'s structure differs from the schema's."""
        if self.binding is not None and not self.binding.consts_only:  # classes changed
            problems = [f"expected treedef {self.treedef}, got {tree_structure(record)}"]
        else:
            problems = list(_mismatch.record_differences(self.tree, record))
        if not problems:
            problems = [f"expected treedef {self.treedef}, got {tree_structure(record)}"]
        lines = "\n".join(f"  {p}" for p in problems)
        return (
            f"{what} does not match the store schema:\n{lines}\n"
            "The tree structure (and static fields) is fixed when the store is created."
        )


def _columns(columns: Any) -> Any:
    if not isinstance(columns, Iterable) or isinstance(columns, Mapping | bytes):
        raise ArgumentTypeError(
            f"columns takes a tree-path string or a list of them, got {columns!r:.80}"
        )
    return columns


# ---- encoding a tree ---------------------------------------------------------------------------


def _encode(node: Any, path: tuple[Any, ...], leaves: list, recorded: bool) -> dict[str, Any]:
    level = _nodes.one_level(node)
    if level is None:
        return _encode_leaf(node, path, leaves)
    sub, keys, children = level
    cls, aux = sub.node_data()  # type: ignore[misc]
    out = _kinds.encode_node(cls, aux, keys, path, recorded=recorded)
    if children or out["node"] != "none":
        out["children"] = [_encode(c, (*path, k), leaves, recorded) for k, c in zip(keys, children)]
    return out


#: what an unsupported str or bytes leaf's error adds
_TEXT = (
    " A str or bytes is kept as static data: a static field of a registered dataclass, or a"
    " node's aux data (a BatchIterator.state() read back as a plain dict goes in as"
    " pytreestore.BatchState(d))."
)


def _encode_leaf(value: Any, path: tuple[Any, ...], leaves: list) -> dict[str, Any]:
    where = _keys.path_str(path) or "the root"
    if _prng.is_key(value):
        dtype, shape = _prng.key_layout(value)
        leaves.append(
            (
                _keys.path_str(path),
                _keys.path_to_key(path),
                dtype,
                shape,
                _prng.impl_of(value),
                False,
            )
        )
        return {"node": "leaf"}
    dtype = _dtypes.value_dtype(value)
    const = None if dtype is not None else _consts.encode_leaf(value, where)
    if const is not None:
        return const
    is_text = isinstance(value, str | bytes)
    if dtype is None or is_text:
        raise UnsupportedTreeError(
            f"unsupported leaf at {where}: {type(value).__name__}. Leaves must be numpy arrays "
            "or scalars, Python bool/int/float/complex, or jax.Array; other objects need to be "
            "registered as pytree nodes or kept out of the record." + _TEXT * is_text
        )
    if not _dtypes.is_supported(dtype):
        raise UnsupportedDtypeError(
            f"unsupported dtype at {where}: {dtype}. Columns hold bool, (u)int8-64, "
            "float16/32/64, bfloat16, float8 and complex64/128."
        )
    key = _keys.path_to_key(path)
    leaves.append((_keys.path_str(path), key, dtype, np.shape(value), None, is_weak(value)))
    return {"node": "leaf"}


# ---- decoding a tree ---------------------------------------------------------------------------


def _treedef_from_like(tree: dict[str, Any], columns: Sequence[ColumnSpec], like: Any) -> TreeDef:
    got = TreeSchema.from_example(like, chunk_records=1, recorded=False)
    if _mismatch.strip_types(got.tree) != _mismatch.strip_types(tree):
        raise SchemaMismatchError(
            "like= does not have the stored structure:\n"
            + "\n".join(f"  {p}" for p in _mismatch.structure_differences(tree, got.tree))
        )
    for want, have in zip(columns, got.columns):
        if (want.dtype, want.shape) != (have.dtype, have.shape):
            raise SchemaMismatchError(
                f"like= does not match the store schema at {want.path}: expected "
                f"{_dtypes.describe(want.dtype, want.shape)}, got "
                f"{_dtypes.describe(have.dtype, have.shape)}"
            )
    assert got.treedef is not None
    return got.treedef


def _inner_chunk_bytes(obj: dict[str, Any]) -> int | None:
    """A schema's ``inner_chunk_bytes`` (absent: None, plain chunks).

    Raises:
        ValueError: not a positive whole number.
    """
    value = obj.get("inner_chunk_bytes")
    if value is not None and (type(value) is not int or value < 1):
        raise ValueError(
            f"its inner_chunk_bytes {value!r} is not a positive whole number of bytes; the "
            "schema was edited or damaged outside pytreestore"
        )
    return value


__all__ = ["FORMAT_VERSION", "ColumnSpec", "TreeDef", "TreeSchema"]
