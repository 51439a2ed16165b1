"""Changing a store's schema in place: one atomic, metadata-only step (``TreeStore.evolve``).

:func:`plan` turns the requested changes into a new schema document, checking everything
before anything is written; :func:`apply` then creates the arrays of added columns (empty, no
chunk written: records before the add read the array's fill value, which is the default) and
replaces its root ``zarr.json`` in one atomic put; the writer then commits a version naming
the new schema. A crash before that commit leaves the old schema in force (readers read the
schema the commit record names; the next writer puts it back in the root) and at most unused
arrays, whose keys a later add skips; after it, the new one.

The changes apply in this order: ``rename_class``, ``drop``, ``rename``, ``add``. Paths are
keypaths as ``jax.tree_util.keystr`` prints them (``.agents.age``, ``['lr']``), the elements of
a ragged list written ``[*]`` (``.agents[*].mass``). Every kind of store takes the same steps:
a column added inside a ragged list's elements joins that list's table and starts at its
committed rows; what a ragged store's tables add to an edit is
:mod:`pytreestore._log.evolve_tables`'s (nothing, for a fixed store).

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-evolve", {"x": np.float32(0)})
    >>> s.extend({"x": np.float32(i)} for i in range(2))
    >>> s.evolve(add={"['y']": np.int32(7)})
    >>> s.append({"x": np.float32(2), "y": np.int32(1)})
    >>> s.load(as_numpy=True)["y"].tolist()
    [7, 7, 1]
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from jax.tree_util import DictKey, GetAttrKey

from pytreestore import _arguments
from pytreestore._format import dtypes as _dtypes
from pytreestore._format import keys as _keys
from pytreestore._format import ragged as _ragged_info
from pytreestore._format import validate as _validate
from pytreestore._format.columns import leaf_chunks
from pytreestore._format.dtypes import is_weak
from pytreestore._format.keys import ROOT_KEY
from pytreestore._format.kinds import child_entry
from pytreestore._format.schema import FORMAT_VERSION, ColumnSpec, TreeSchema
from pytreestore._log import protocol
from pytreestore._log.commit_record import Commit
from pytreestore._log.evolve_tables import Tables
from pytreestore._log.model import with_layout
from pytreestore._log.versions import committed_info, save_schema
from pytreestore.backends import Backend
from pytreestore.errors import CorruptStoreError, SchemaMismatchError, UnsupportedDtypeError

_LAST = re.compile(
    r"""(?:\.([A-Za-z_][A-Za-z0-9_]*)|\[((?:'(?:[^'\\]|\\.)*')|(?:"(?:[^"\\]|\\.)*")|-?[0-9]+)\])$"""
)


def plan(
    info: dict[str, Any],
    rows: Callable[[str | None], int],
    *,
    add: Mapping[str, Any] | None = None,
    drop: Sequence[str] | None = None,
    rename: Mapping[str, str] | None = None,
    rename_class: Mapping[str, str] | None = None,
    taken: Callable[[str], bool] = lambda key: False,
) -> tuple[dict[str, Any], list[ColumnSpec]]:
    """The schema document after the changes, and the columns to create.

    Args:
        info: the stored schema document (the root ``zarr.json``'s ``pytreestore``).
        rows: the committed rows of a table (None: the record table, one row per record):
            where a column added to that table starts.
        add: keypath -> default value of a new column.
        drop: keypaths of nodes to hide (their columns' data stays on disk).
        rename: keypath -> new keypath, under the same parent node.
        rename_class: ``module:qualname`` -> ``module:qualname``.
        taken: whether a storage key already holds something (an unused array of an
            interrupted evolve); an added column then gets another key.

    Raises:
        SchemaMismatchError: a path that does not exist (or already exists), a change the
            node kind does not allow, or no column left.
        UnsupportedDtypeError: a default whose dtype a column cannot hold, or that is not one
            repeated value.
    """
    add = _arguments.mapping(add, "evolve(add=...)", "keypaths to default values")
    drop = _arguments.strings(drop, "evolve(drop=...)", "keypaths")
    rename = _arguments.mapping(rename, "evolve(rename=...)", "keypaths to new keypaths")
    rename_class = _arguments.mapping(
        rename_class, "evolve(rename_class=...)", "'module:qualname' to 'module:qualname'"
    )
    tree = copy.deepcopy(info["tree"])
    try:
        columns = [ColumnSpec.from_json(c) for c in info["columns"]]
        tables = Tables.of(info)
    except (ValueError, KeyError, TypeError) as err:  # edited since the store was opened
        raise CorruptStoreError(f"the store's schema is malformed: {err}") from err
    _number_leaves(tree, iter(range(len(columns))))
    walk = _Walk(tree, frozenset(tables.axis_paths()))
    for old, new in rename_class.items():
        if not _rename_class(tree, old, new):
            raise SchemaMismatchError(f"rename_class: no node of class {old!r} in the schema")
    dropped = [columns[i] for p in drop for i in _drop(walk, tables, p)]
    for old, new in rename.items():
        _rename(walk, tables, old, new)
    used = {c.key for c in columns} | {c.key for c in dropped}
    used |= {c["key"] for c in info.get("dropped", ())}
    used |= {p["key"] for p in info.get("packs", ())}  # an added column never takes a pack's key
    used |= tables.keys()
    for path, default in add.items():
        new_column = _Added(path, default, len(columns), int(info["chunk_records"]))
        columns.append(_add(walk, tables, new_column, rows, used, taken))
    order = list(_leaf_order(walk))
    if not order:
        raise SchemaMismatchError("evolve would leave the store without columns; keep one")
    kept = [_with_path(columns[i], path) for i, path in order]
    tables.check_counted(kept, walk.pending)
    _strip(tree)
    out = {k: v for k, v in info.items() if k != "digest"}
    out.update(format_version=FORMAT_VERSION, tree=tree, columns=[c.to_json() for c in kept])
    if tables.info is not None:
        out["ragged"] = tables.info
    gone = list(info.get("dropped", ())) + [c.to_json() for c in dropped]
    if gone:
        out["dropped"] = gone
    new_keys = {c.key for c in kept} - {c["key"] for c in info["columns"]}
    return out, [c for c in kept if c.key in new_keys]


def check(backend: Backend, schema: TreeSchema, **changes: Any) -> None:
    """Raises what :func:`apply` of ``changes`` would raise on bad input, writing nothing: a
    writer runs it on its schema before it flushes, so refused changes commit nothing. A
    structure that only the writer's buffered records showed counts (the flush before
    :func:`apply` commits it)."""
    info = schema.to_json()
    plan(info, lambda table: 0, taken=functools.partial(protocol.taken, backend), **changes)


def apply(
    backend: Backend, schema: TreeSchema, commit: Commit, where: str, **changes: Any
) -> TreeSchema:
    """Applies ``changes`` (the arguments of :func:`plan`) to the store behind ``backend``,
    whose writer holds the lock and whose latest commit is ``commit``; the new schema.

    Added columns' arrays are created empty and sized to their tables' committed rows, with
    their groups; then the root ``zarr.json`` is replaced in one atomic put (the commit
    protocol, :mod:`pytreestore._log.protocol`, step 7). A ragged store's schema gets the
    layout of records again (:func:`~pytreestore._log.model.with_layout`: today's classes,
    as on open).
    """
    raw = backend.read_bytes(ROOT_KEY)
    info = committed_info(backend, commit, where)
    taken = functools.partial(protocol.taken, backend)
    new_info, added = plan(info, commit.rows, taken=taken, **changes)
    stamped = _validate.stamped(new_info)
    new = TreeSchema.from_json(stamped, generic=schema.treedef is None)
    if new.treedef is not None:  # bound to today's classes; a generic view has no layout
        new = with_layout(new, where)
    if added:
        columns = dataclasses.replace(new, columns=tuple(added), ragged=None)
        backend.create_columns(protocol.layouts(columns))
        for table in dict.fromkeys(c.table for c in added):
            keys = [c.key for c in added if c.table == table]
            backend.resize(keys, commit.rows(table))
        backend.write_many_bytes({k: protocol.group_json({}) for k in protocol.group_keys(columns)})
    save_schema(backend, stamped)
    backend.write_bytes(ROOT_KEY, protocol.with_info(raw, stamped))
    backend.open_columns(new.columns)
    return new


# ---- the tree, annotated with column numbers while it is edited --------------------------------


@dataclasses.dataclass(frozen=True)
class _Node:
    """One node of the stored tree met on a walk: its parent (None for the root), its index
    there, its keypath as entries (the key scheme of a fixed store) and as printed (the
    elements of a ragged list as ``[*]``)."""

    parent: dict[str, Any] | None
    index: int
    node: dict[str, Any]
    entries: tuple
    path: str


@dataclasses.dataclass(frozen=True)
class _Walk:
    """The stored tree being edited, and the keypaths of its ragged lists."""

    tree: dict[str, Any]
    axes: frozenset[str]

    def nodes(self, start: _Node | None = None) -> Iterator[_Node]:
        """Every node from ``start`` (the root) down, parents first."""
        here = start or _Node(None, -1, self.tree, (), "")
        yield here
        node = here.node
        star = node["node"] == "list" and here.path in self.axes
        for i, child in enumerate(node.get("children", ())):
            entry = child_entry(node, i)
            text = "[*]" if star else _keys.path_str((entry,))
            yield from self.nodes(_Node(node, i, child, (*here.entries, entry), here.path + text))

    @property
    def lists(self) -> frozenset[str]:
        """The keypaths of the ragged lists (the axes that are list nodes)."""
        lists = (n.path for n in self.nodes() if n.node["node"] == "list")
        return frozenset(p for p in lists if p in self.axes)

    @property
    def pending(self) -> frozenset[str]:
        """The keypaths of the ragged lists whose elements no record has shown yet."""
        lists = self.lists
        return frozenset(
            n.path for n in self.nodes() if n.path in lists and not n.node.get("children")
        )

    def find(self, path: str) -> _Node:
        """The node at ``path``."""
        for found in self.nodes():
            if found.path == path:
                return found
        self.check_shown(path)
        raise SchemaMismatchError(
            f"evolve: no node at {path!r}; the store's columns are "
            f"{[p for _, p in _leaf_order(self)]}"
        )

    def check_shown(self, path: str) -> None:
        """Refuses ``path`` inside the elements of a list whose structure is pending."""
        inside = [p for p in self.pending if path.startswith(p + "[*]")]
        if inside:
            raise SchemaMismatchError(_pending_message(path, f"the elements of {inside[0]!r}"))

    def check_free(self, path: str) -> None:
        if any(n.path == path for n in self.nodes()):
            raise SchemaMismatchError(f"evolve: {path!r} already exists in the store's schema")


def _pending_message(path: str, where: str) -> str:
    return (
        f"evolve: {path!r} lies inside {where}, whose structure no record has shown yet (it "
        "is pending: the store learns it from the first record that shows it); append a "
        "record that shows it first, then evolve"
    )


def _number_leaves(node: dict[str, Any], numbers: Iterator[int]) -> None:
    if node["node"] == "leaf":
        node["_col"] = next(numbers)
    for child in node.get("children", ()):
        _number_leaves(child, numbers)


def _leaf_order(walk: _Walk, start: _Node | None = None) -> Iterator[tuple[int, str]]:
    """``(column number, keypath)`` of every leaf from ``start`` down, in flatten order."""
    for n in walk.nodes(start):
        if n.node["node"] == "leaf":
            yield n.node["_col"], n.path


def _strip(node: dict[str, Any]) -> None:
    node.pop("_col", None)
    for child in node.get("children", ()):
        _strip(child)


def _with_path(column: ColumnSpec, path: str) -> ColumnSpec:
    return dataclasses.replace(column, path=path)


def _names(node: dict[str, Any]) -> list[Any]:
    kind = node["node"]
    if kind in ("dict", "ordered_dict"):
        return node["keys"]
    if kind == "namedtuple":
        return node["fields"]
    if kind == "custom":
        return node["keys"]
    if kind in ("leaf", "none"):
        raise SchemaMismatchError(f"evolve: a {kind} has no children to add, drop or rename")
    raise SchemaMismatchError(
        f"evolve: a {kind} has positional children; only children of dicts, NamedTuples and "
        "custom nodes (dataclasses) can be added, dropped or renamed"
    )


def _rename_class(node: dict[str, Any], old: str, new: str) -> bool:
    hit = node.get("type") == old
    if hit:
        if not isinstance(new, str) or not re.fullmatch(r"[^:\s]+:[^:\s]+", new):
            raise SchemaMismatchError(f"rename_class: {new!r} is not 'module:qualname'")
        node["type"] = new
    for child in node.get("children", ()):
        hit = _rename_class(child, old, new) or hit
    return hit


def _drop(walk: _Walk, tables: Tables, path: str) -> list[int]:
    found = walk.find(path)
    if found.parent is None:
        raise SchemaMismatchError("evolve: drop=[''] would drop the whole tree")
    names = _names(found.parent)
    gone = [c for c, _ in _leaf_order(walk, found)]
    del names[found.index], found.parent["children"][found.index]
    tables.drop(path)
    return gone


def _rename(walk: _Walk, tables: Tables, old: str, new: str) -> None:
    found = walk.find(old)
    head, entry = _split(new)
    if found.parent is None or head != _split(old)[0]:
        raise SchemaMismatchError(
            f"evolve: rename {old!r} -> {new!r} must keep the parent node (rename the last "
            "part of the path only)"
        )
    walk.check_free(new)
    tables.check_rename(old, new)
    names = _names(found.parent)
    names[found.index] = _entry_json(found.parent, entry, new)
    _sort_dict(found.parent)
    tables.rename(old, new)


@dataclasses.dataclass(frozen=True)
class _Added:
    """A column to add: its keypath, default, column number and the store's chunk records."""

    path: str
    default: object
    number: int
    chunk_records: int


def _add(
    walk: _Walk,
    tables: Tables,
    added: _Added,
    rows: Callable[[str | None], int],
    used: set,
    taken: Callable[[str], bool],
) -> ColumnSpec:
    path = added.path
    head, entry = _split(path)
    walk.check_shown(path)
    parent = walk.find(head)
    if parent.node["node"] == "none" and parent.parent is not None:
        raise SchemaMismatchError(_pending_message(path, f"the optional subtree {head!r}"))
    walk.check_free(path)
    value, dtype = _default_value(path, added.default)
    tables.check_add(path, walk.lists, value.shape)
    _names(parent.node).append(_entry_json(parent.node, entry, path))
    parent.node["children"].append({"node": "leaf", "_col": added.number})
    _sort_dict(parent.node)
    table = tables.table_of(path)
    if tables.info is None:
        key = _keys.path_to_key((*parent.entries, entry))
    else:  # a ragged store's keys follow its keypaths, [*] included
        key = _ragged_info.path_key(path)
    key = _free_key(key, used, taken)
    used.add(key)
    chunk = tables.chunk_rows(table, added.chunk_records)
    chunks = (chunk, *leaf_chunks(dtype, value.shape, chunk))
    fill = _fill_json(value.reshape(-1)[0] if value.size else np.zeros((), dtype))
    start = rows(table)
    weak = is_weak(added.default)  # a Python scalar default: a weakly typed column
    return ColumnSpec(
        path,
        key,
        dtype,
        value.shape,
        chunks,
        start=start,
        default=fill,
        table=table,
        weak_type=weak,
    )


def _split(path: str) -> tuple[str, Any]:
    """``(parent path, last keypath entry)`` of a keystr path."""
    match = _LAST.search(path) if isinstance(path, str) else None
    if match is None:
        raise SchemaMismatchError(
            f"evolve: {path!r} is not a keypath ending in .name, ['key'] or [int key] "
            "(as jax.tree_util.keystr prints paths)"
        )
    head = path[: match.start()]
    if match.group(1) is not None:
        return head, GetAttrKey(match.group(1))
    return head, DictKey(ast.literal_eval(match.group(2)))


def _entry_json(parent: dict[str, Any], entry: Any, path: str) -> object:
    kind = parent["node"]
    if kind in ("dict", "ordered_dict") and isinstance(entry, DictKey):
        if kind == "dict" and any(type(k) is not type(entry.key) for k in parent["keys"]):
            raise SchemaMismatchError(
                f"evolve: {path!r}: the dict's keys are {parent['keys']!r:.80}, and JAX cannot "
                f"sort a {type(entry.key).__name__} key among them; use keys of one type"
            )
        return entry.key
    if kind == "namedtuple" and isinstance(entry, GetAttrKey):
        return entry.name
    if kind == "custom" and isinstance(entry, GetAttrKey):
        return {"attr": entry.name}
    want = "['name']" if kind in ("dict", "ordered_dict") else ".name"
    raise SchemaMismatchError(f"evolve: {path!r}: children of a {kind} are named {want}")


def _sort_dict(node: dict[str, Any]) -> None:
    if node["node"] == "dict":  # jax flattens dicts in sorted key order
        pairs = sorted(zip(node["keys"], node["children"]), key=lambda kv: kv[0])
        node["keys"], node["children"] = [k for k, _ in pairs], [c for _, c in pairs]


def _free_key(key: str, used: set, taken: Callable[[str], bool]) -> str:
    candidate, n = key, 1
    while candidate in used or taken(candidate):
        candidate, n = f"{key}-23{n}", n + 1  # '#n', escaped: portable, like every key
    return candidate


def _default_value(path: str, default: object) -> tuple[np.ndarray, np.dtype]:
    try:
        dtype = _dtypes.value_dtype(default)
    except TypeError:  # a dtype numpy cannot represent, such as a PRNG key's
        dtype = None
    if dtype is None or isinstance(default, str | bytes) or not _dtypes.is_supported(dtype):
        raise UnsupportedDtypeError(
            f"evolve: the default for {path} is {default!r} of type {type(default).__name__}, "
            "which a column cannot hold; give a numpy scalar or array (e.g. np.int32(0))"
        )
    try:
        value = np.asarray(default, dtype)
    except (OverflowError, ValueError, TypeError) as err:
        raise UnsupportedDtypeError(
            f"evolve: the default for {path} is {default!r:.80}, which a {dtype} column cannot "
            f"hold ({err}); give a numpy scalar or array (e.g. np.int32(0))"
        ) from err
    flat = value.reshape(-1)
    if flat.size and not all(_same_bits(v, flat[0]) for v in flat):
        raise UnsupportedDtypeError(
            f"evolve: the default for {path} holds different values; a default is one value "
            f"repeated (e.g. np.full({value.shape}, 0.5, np.float32))"
        )
    return value, dtype


def _same_bits(a: object, b: object) -> bool:
    return np.asarray(a).tobytes() == np.asarray(b).tobytes()


def _fill_json(value: Any) -> Any:
    """One value as zarr v3 ``fill_value`` JSON."""
    value = np.asarray(value)
    kind = _dtypes.kind(value.dtype)
    if kind == "b":
        return bool(value)
    if kind in "iu":
        return int(value)
    if kind == "c":
        return [_float_json(value.real), _float_json(value.imag)]
    return _float_json(value)


def _float_json(value: Any) -> Any:
    x = float(value)
    if np.isnan(x):
        return "NaN"
    if np.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


__all__ = ["apply", "check", "plan"]
