"""The schema of a store: its tree structure and columns, as JSON and back, without pickle.

A schema is built from an example record. Each node of the tree becomes a JSON object that
names its kind (``list``, ``tuple``, ``dict``, ``ordered_dict``, ``none``, ``namedtuple``,
``custom``), a class as ``module:qualname`` where there is one, the child keys and the static
(aux) data. Each leaf becomes a column: its tree path, storage key, dtype and per-record shape.
On open, the classes are imported and bound to the stored nodes by field name
(:mod:`pytreestore._format.bind`); nothing is unpickled and no ``__init__`` named in the schema is
called.

Example:
    >>> import numpy as np
    >>> schema = TreeSchema.from_example({"a": np.zeros(3, np.float32), "b": 1})
    >>> [(c.path, c.dtype.name, c.shape) for c in schema.columns]
    [("['a']", 'float32', (3,)), ("['b']", 'int32', ())]
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import math
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

import numpy as np
from jax.tree_util import (
    DictKey,
    GetAttrKey,
    SequenceKey,
    tree_flatten_with_path,
    tree_structure,
)

from pytreestore._format import bind as _bind
from pytreestore._format import consts as _consts
from pytreestore._format import dtypes as _dtypes
from pytreestore._format import keys as _keys
from pytreestore._format import nodes as _nodes
from pytreestore._format import prng as _prng
from pytreestore._format import values as _values
from pytreestore.errors import (
    ClassResolutionError,
    CorruptStoreError,
    SchemaMismatchError,
    UnknownColumnError,
    UnsupportedDtypeError,
    UnsupportedTreeError,
)

FORMAT_VERSION = 2
#: ``jax.tree_util.PyTreeDef``, which JAX defines as a runtime alias that type checkers can't use.
TreeDef: TypeAlias = Any
_LEAF = tree_structure(0)
_BUILTIN = {list: "list", tuple: "tuple", dict: "dict", collections.OrderedDict: "ordered_dict"}
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
    """

    path: str
    key: str
    dtype: np.dtype
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    start: int = 0
    default: Any = None
    key_impl: str | None = None

    @property
    def record_nbytes(self) -> int:
        """Bytes one record takes in this column."""
        return self.dtype.itemsize * math.prod(self.shape)

    @property
    def dimension_names(self) -> list[str]:
        """``record`` then one name per leaf axis, unique within the leaf's parent node."""
        name = _keys.unescape(self.key.rsplit("/", 1)[-1]) or "leaf"
        return ["record"] + [f"{name}_{i}" for i in range(len(self.shape))]

    def to_json(self) -> dict[str, Any]:
        out = {
            "path": self.path,
            "key": self.key,
            "dtype": self.dtype.name,
            "shape": list(self.shape),
            "chunks": list(self.chunks),
        }
        if self.default is not None:
            out.update(start=self.start, default=self.default)
        if self.key_impl is not None:
            out["key_impl"] = self.key_impl
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ColumnSpec:
        return cls(
            path=obj["path"],
            key=obj["key"],
            dtype=_dtypes.from_name(obj["dtype"]),
            shape=tuple(obj["shape"]),
            chunks=tuple(obj["chunks"]),
            start=int(obj.get("start", 0)),
            default=_checked_default(obj),
            key_impl=obj.get("key_impl"),
        )


_FLOAT_WORDS = ("NaN", "Infinity", "-Infinity")


def _checked_default(obj: dict[str, Any]) -> Any:
    """A column's ``default`` (zarr v3 fill value JSON), if its dtype holds it exactly.

    Raises:
        ValueError: a default of the wrong JSON type or out of the dtype's range.
    """
    fill, dtype = obj.get("default"), _dtypes.from_name(obj["dtype"])
    kind = _dtypes.kind(dtype)

    def real(x: Any) -> bool:
        return x in _FLOAT_WORDS or (isinstance(x, int | float) and not isinstance(x, bool))

    if kind == "b":
        ok = isinstance(fill, bool)
    elif kind in "iu":
        info = np.iinfo(dtype)
        ok = type(fill) is int and info.min <= fill <= info.max
    elif kind == "c":
        ok = isinstance(fill, list) and len(fill) == 2 and all(real(x) for x in fill)
    else:
        ok = real(fill)
    if fill is not None and not ok:
        raise ValueError(
            f"column {obj['path']}: its default {fill!r} is not a {dtype.name} value; the "
            "schema was edited or damaged outside pytreestore"
        )
    return fill


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
    """

    tree: dict[str, Any]
    columns: tuple[ColumnSpec, ...]
    chunk_records: int
    codec: str | None
    treedef: TreeDef | None
    binding: _bind.Binding | None = None
    dropped: tuple[ColumnSpec, ...] = ()
    format_version: int = FORMAT_VERSION

    @classmethod
    def from_example(
        cls, like: Any, *, chunk_records: int | None = None, codec: str | None = "zstd"
    ) -> TreeSchema:
        """Builds the schema of records shaped like ``like``; its values are not kept."""
        leaves: list[tuple[str, str, np.dtype, tuple[int, ...], str | None]] = []
        tree = _encode(like, (), leaves)
        _bind.annotate(tree, like)
        chunk = _default_chunk_records(leaves) if chunk_records is None else chunk_records
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise ValueError(f"chunk_records must be a positive int, got {chunk_records!r}")
        columns = tuple(
            ColumnSpec(
                path, key, dtype, shape, (chunk, *_leaf_chunks(dtype, shape, chunk)), key_impl=impl
            )
            for path, key, dtype, shape, impl in leaves
        )
        _check_unique_keys(columns)
        binding = _consts.binding(tree, [c.shape for c in columns])
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
        return out

    @classmethod
    def from_json(
        cls, obj: dict[str, Any], *, like: Any = None, generic: bool = False
    ) -> TreeSchema:
        """Rebuilds a schema; classes come from ``like``, from imports, or none if ``generic``."""
        try:
            columns = tuple(ColumnSpec.from_json(c) for c in obj["columns"])
            dropped = tuple(ColumnSpec.from_json(c) for c in obj.get("dropped", ()))
            tree, chunk, codec = obj["tree"], int(obj["chunk_records"]), obj["codec"]
            version = int(obj.get("format_version", FORMAT_VERSION))
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptStoreError(f"the store's schema is malformed: {err!r}") from err
        _bind.check_tree(tree, len(columns))
        binding = None
        if generic:
            treedef = None
        elif like is not None:
            treedef = _treedef_from_like(tree, columns, like)
            binding = _consts.binding(tree, [c.shape for c in columns])
        else:
            shapes, paths = [c.shape for c in columns], [c.path for c in columns]
            treedef, binding = _bind.bind(tree, shapes, paths)
        return cls(tree, columns, chunk, codec, treedef, binding, dropped, version)

    @property
    def paths(self) -> tuple[str, ...]:
        """Every column's tree path, in column order."""
        return tuple(c.path for c in self.columns)

    def unflatten(self, leaves: Sequence[Any]) -> Any:
        """Builds a tree of the stored classes (or the generic view) around ``leaves``."""
        if self.binding is not None:
            leaves = self.binding.leaves(leaves)
        if self.treedef is not None:
            return self.treedef.unflatten(leaves)
        return _generic(self.tree, iter(leaves))

    def column_leaves(self, leaves: list[Any]) -> list[Any]:
        """The columns' values, in column order, from the leaves of a record of ``treedef``.

        Raises:
            SchemaMismatchError: today's classes have fields the store lacks, or lack fields
                it has (see :meth:`TreeStore.evolve`).
        """
        return leaves if self.binding is None else self.binding.columns(leaves)

    def select(self, columns: str | Sequence[str] | None) -> list[int]:
        """Indices of the columns that the tree-path selectors ``columns`` name.

        A selector names a column by its path, or every column below a node by the node's
        path (``.p[0]``); ``""`` selects everything. A constant leaf (a function, see
        :mod:`pytreestore._format.consts`) is no column: every load returns it whatever is selected,
        and a selector under which only constants live is refused like one naming nothing.
        """
        if columns is None:
            return list(range(len(self.columns)))
        selectors = [columns] if isinstance(columns, str) else list(columns)
        chosen: set[int] = set()
        for sel in selectors:
            if not isinstance(sel, str):
                raise TypeError(f"columns takes tree-path strings, got {sel!r}")
            hits = [i for i, c in enumerate(self.columns) if _keys.is_under(c.path, sel)]
            if not hits:
                raise UnknownColumnError(
                    f"no column at or below {sel!r}{_consts.only_consts_note(self.tree, sel)}; "
                    f"the store's columns are {', '.join(self.paths)}"
                )
            chosen.update(hits)
        return sorted(chosen)

    def mismatch_message(self, record: Any, what: str = "record") -> str:
        """Explains, path by path, how ``record``'s structure differs from the schema's."""
        if self.binding is not None and not self.binding.consts_only:  # classes changed
            problems = [f"expected treedef {self.treedef}, got {tree_structure(record)}"]
        else:
            problems = list(_mismatches(self.tree, record, ()))
        if not problems:
            problems = [f"expected treedef {self.treedef}, got {tree_structure(record)}"]
        lines = "\n".join(f"  {p}" for p in problems)
        return (
            f"{what} does not match the store schema:\n{lines}\n"
            "The tree structure (and static fields) is fixed when the store is created."
        )


def _check_unique_keys(columns: Sequence[ColumnSpec]) -> None:
    seen: dict[str, str] = {}
    for c in columns:
        if c.key in seen:
            raise UnsupportedTreeError(
                f"leaves at {seen[c.key]} and {c.path} map to the same storage key {c.key!r}; "
                "rename one of them"
            )
        seen[c.key] = c.path


def _default_chunk_records(leaves: Sequence[tuple[Any, ...]]) -> int:
    sizes = [dt.itemsize * math.prod(shape) for _, _, dt, shape, _ in leaves] or [1]
    per_chunk = _CHUNK_TARGET // max(max(sizes), 1)
    per_buffer = _BUFFER_LIMIT // max(sum(sizes), 1)
    n = max(1, min(per_chunk, per_buffer, _MAX_CHUNK_RECORDS))
    return 1 << (n.bit_length() - 1)


def _leaf_chunks(dtype: np.dtype, shape: tuple[int, ...], records: int) -> tuple[int, ...]:
    """Leaf axes stay whole unless one record's leaf alone is far above the chunk target."""
    chunks = list(shape)
    for axis in range(len(chunks)):
        while records * dtype.itemsize * math.prod(chunks) > 2 * _CHUNK_TARGET and chunks[axis] > 1:
            chunks[axis] = -(-chunks[axis] // 2)
    return tuple(max(c, 1) for c in chunks)


# ---- encoding a tree ---------------------------------------------------------------------------


def one_level(node: Any) -> tuple[TreeDef, list[Any], list[Any]] | None:
    """Flattens ``node`` one level: its treedef, child keypath entries and children.

    Returns None when ``node`` is a leaf.
    """
    flat, sub = tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if sub.num_nodes == 1 and sub.num_leaves == 1:
        return None
    return sub, [p[0] for p, _ in flat], [c for _, c in flat]


def class_path(cls: type) -> str:
    """``module:qualname`` of a class."""
    return f"{cls.__module__}:{cls.__qualname__}"


def _encode(node: Any, path: tuple[Any, ...], leaves: list) -> dict[str, Any]:
    level = one_level(node)
    if level is None:
        return _encode_leaf(node, path, leaves)
    sub, keys, children = level
    cls, aux = sub.node_data()  # type: ignore[misc]
    out = _encode_node(cls, aux, keys, path)
    if children or out["node"] != "none":
        out["children"] = [_encode(c, (*path, k), leaves) for k, c in zip(keys, children)]
    return out


def _encode_node(cls: type, aux: Any, keys: list[Any], path: tuple[Any, ...]) -> dict[str, Any]:
    where = _keys.path_str(path) or "the root"
    if cls is type(None):
        return {"node": "none"}
    if cls in (dict, collections.OrderedDict):
        bad = [k for k in aux if not isinstance(k, str)]
        if bad:
            raise UnsupportedTreeError(
                f"dict at {where} has a key {bad[0]!r} of type {type(bad[0]).__name__}; "
                "stored dicts need str keys (convert the keys to strings)"
            )
        return {"node": _BUILTIN[cls], "keys": list(aux)}
    if cls in (list, tuple):
        return {"node": _BUILTIN[cls]}
    if issubclass(cls, tuple) and hasattr(cls, "_fields") and not _nodes.has_own_flatten(cls):
        return {
            "node": "namedtuple",
            "type": _class_path_checked(cls, where),
            "fields": list(cls._fields),  # pyright: ignore[reportAttributeAccessIssue]
        }  # type: ignore[attr-defined]
    if cls is collections.defaultdict:
        raise UnsupportedTreeError(
            f"defaultdict at {where} cannot be stored (its default_factory is code); "
            "use a dict instead"
        )
    return {
        "node": "custom",
        "type": _class_path_checked(cls, where),
        "aux": _nodes.encode_aux(cls, aux, keys, where),
        "keys": _nodes.encode_keys(cls, keys, where),
    }


def _class_path_checked(cls: type, where: str) -> str:
    if not isinstance(cls, type):
        raise UnsupportedTreeError(f"node at {where} is not a class instance: {cls!r}")
    return class_path(cls)


def _encode_leaf(value: Any, path: tuple[Any, ...], leaves: list) -> dict[str, Any]:
    where = _keys.path_str(path) or "the root"
    if _prng.is_key(value):
        dtype, shape = _prng.key_layout(value)
        leaves.append(
            (_keys.path_str(path), _keys.path_to_key(path), dtype, shape, _prng.impl_of(value))
        )
        return {"node": "leaf"}
    dtype = _dtypes.value_dtype(value)
    const = None if dtype is not None else _consts.encode_leaf(value, where)
    if const is not None:
        return const
    if dtype is None or isinstance(value, str | bytes):
        raise UnsupportedTreeError(
            f"unsupported leaf at {where}: {type(value).__name__}. Leaves must be numpy arrays "
            "or scalars, Python bool/int/float/complex, or jax.Array; other objects need to be "
            "registered as pytree nodes or kept out of the record."
        )
    if not _dtypes.is_supported(dtype):
        raise UnsupportedDtypeError(
            f"unsupported dtype at {where}: {dtype}. Columns hold bool, (u)int8-64, "
            "float16/32/64, bfloat16, float8 and complex64/128."
        )
    leaves.append((_keys.path_str(path), _keys.path_to_key(path), dtype, np.shape(value), None))
    return {"node": "leaf"}


# ---- decoding a tree ---------------------------------------------------------------------------


def resolve_class(name: str, *, namedtuple: bool = False) -> type:
    """Imports the class a schema names as ``module:qualname``; calls nothing."""
    advice = (
        "Make it importable, pass like=<an example record> to pytreestore.open, "
        "or open with generic=True to get dicts and lists instead."
    )
    module, _, qualname = name.partition(":")
    try:
        obj: Any = sys.modules.get(module) or importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as err:
        raise ClassResolutionError(
            f"cannot import class {name} named in the schema ({err}). {advice}"
        ) from err
    if not isinstance(obj, type):
        raise ClassResolutionError(f"{name} named in the schema is not a class. {advice}")
    if namedtuple and not (issubclass(obj, tuple) and hasattr(obj, "_fields")):
        raise ClassResolutionError(f"{name} named in the schema is not a NamedTuple. {advice}")
    return obj


def _treedef_from_like(tree: dict[str, Any], columns: Sequence[ColumnSpec], like: Any) -> TreeDef:
    got = TreeSchema.from_example(like, chunk_records=1)
    if _strip_types(got.tree) != _strip_types(tree):
        raise SchemaMismatchError(
            "like= does not have the stored structure:\n"
            + "\n".join(f"  {p}" for p in _mismatches_json(tree, got.tree, ()))
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


#: node members that name classes or fields rather than fix the structure
_NOT_STRUCTURE = ("type", "aux_fields")


def _strip_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_types(v) for k, v in node.items() if k not in _NOT_STRUCTURE}
    if isinstance(node, list):
        return [_strip_types(v) for v in node]
    return node


def _mismatches_json(want: dict, got: dict, path: tuple) -> Iterator[str]:
    where = _keys.path_str(path) or "the root"
    if {k: v for k, v in want.items() if k not in ("children", *_NOT_STRUCTURE)} != {
        k: v for k, v in got.items() if k not in ("children", *_NOT_STRUCTURE)
    }:
        yield f"at {where}: expected {_describe_json(want)}, got {_describe_json(got)}"
        return
    for i, (w, g) in enumerate(zip(want.get("children", []), got.get("children", []))):
        yield from _mismatches_json(w, g, (*path, _child_entry(want, i)))


def _generic(node: dict[str, Any], leaves: Iterator[Any]) -> Any:
    kind = node["node"]
    if kind == "leaf":
        return next(leaves)
    if kind == "none":
        return None
    if kind == "const":
        return _consts.decode(node)
    children = [_generic(c, leaves) for c in node.get("children", [])]
    if kind == "list":
        return children
    if kind == "tuple":
        return tuple(children)
    names = [_keys.entry_name(_child_entry(node, i)) for i in range(len(children))]
    return dict(zip(names, children))


def _child_entry(node: dict[str, Any], i: int) -> Any:
    kind = node["node"]
    if kind in ("dict", "ordered_dict"):
        return DictKey(node["keys"][i])
    if kind == "namedtuple":
        return GetAttrKey(node["fields"][i])
    if kind == "custom":
        return _keys.entry_from_json(node["keys"][i])
    return SequenceKey(i)


def _describe_json(node: dict[str, Any]) -> str:
    kind = node["node"]
    n = len(node.get("children", []))
    if kind == "leaf":
        return "a leaf"
    if kind == "const":
        return f"the constant {_consts.label(node)}"
    if kind == "none":
        return "None"
    if kind in ("list", "tuple"):
        return f"a {kind} of {n}"
    if kind in ("dict", "ordered_dict"):
        return f"a {kind.replace('_', ' ')} with keys {node['keys']}"
    name = node["type"].rpartition(":")[2]
    if kind == "namedtuple":
        return f"{name} (NamedTuple)"
    fields = [_keys.entry_name(_keys.entry_from_json(k)) for k in node["keys"]]
    return f"{name} with fields {fields} and static data {_values.decode(node['aux'])!r}"


def _mismatches(node: dict[str, Any], value: Any, path: tuple[Any, ...]) -> Iterator[str]:
    """Every path at which ``value`` departs from the schema tree ``node``."""
    where = _keys.path_str(path) or "the root"
    level = one_level(value)
    if node["node"] == "const":
        if level is not None or _consts.describe(value) != _consts.label(node):
            yield f"at {where}: expected {_describe_json(node)}, got {_consts.describe(value)}"
        return
    if node["node"] == "leaf":
        if level is not None:
            yield f"at {where}: expected a leaf, got {_describe_value(value)}"
        return
    if level is None:
        yield f"at {where}: expected {_describe_json(node)}, got a leaf of type {type(value).__name__}"
        return
    try:
        got = _encode_node(*level[0].node_data(), level[1], path)  # type: ignore[misc]
    except UnsupportedTreeError as err:
        yield f"at {where}: {err}"
        return
    want = {k: v for k, v in node.items() if k not in ("children", "aux_fields")}
    if _nodes.only_aux_differs(want, got) and len(level[2]) == len(node.get("children", [])):
        yield from _nodes.static_differences(level[0].node_data()[0], want, got, path)
        want = got  # the static fields are named above; the children are compared below
    if got != want or len(level[2]) != len(node.get("children", [])):
        yield f"at {where}: expected {_describe_json(node)}, got {_describe_value(value)}"
        return
    for i, child in enumerate(level[2]):
        yield from _mismatches(node["children"][i], child, (*path, _child_entry(node, i)))


def _describe_value(value: Any) -> str:
    level = one_level(value)
    if level is None:
        return f"a leaf of type {type(value).__name__}"
    try:
        node = _encode_node(*level[0].node_data(), level[1], ())  # type: ignore[misc]
    except UnsupportedTreeError:
        return f"a {type(value).__name__}"
    node["children"] = level[2]
    return _describe_json(node)
