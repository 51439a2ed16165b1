"""The schema of a ragged store and the layout its records follow.

:func:`build_schema` turns ``create(like, ragged=, optional=)`` into a format-3
:class:`~pytreestore._format.schema.TreeSchema`: the tree and columns of a *representative*
record (one element per ragged list, every optional subtree present; a list empty in ``like``
stays empty and an optional ``None`` stays ``None``: their structure is pending), plus the
:class:`~pytreestore._format.ragged.RaggedInfo` of its tables. :func:`attach_layout` rebuilds,
on open, the :class:`Model` of records from the representative record of today's classes.

Example:
    >>> import numpy as np
    >>> schema = build_schema({"p": [np.float32(0)]}, ["['p']"], None, chunk_records=None,
    ...                       codec=None)
    >>> [(c.path, c.key, c.table) for c in schema.storage_columns]
    [("['p'][*]", 'p/-2A', "['p']"), ("['p']", 'p-offsets', None)]
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias, TypeVar

import numpy as np

from pytreestore._format import ragged as _info
from pytreestore._format import validate as _validate
from pytreestore._format.columns import (
    ColumnSpec,
    check_unique_keys,
    default_chunk_records,
    leaf_chunks,
)
from pytreestore._format.dtypes import fill_value
from pytreestore._format.keys import ROOT_KEY
from pytreestore._format.schema import TreeSchema
from pytreestore._log.commit_record import Commit
from pytreestore._log.protocol import group_json
from pytreestore._log.versions import other_schema
from pytreestore._tree.layout import Walker
from pytreestore._tree.layout import check_used as _check_used
from pytreestore._tree.layout_nodes import (
    Declarations,
    Fixed,
    LayoutNode,
    Leaf,
    OptionalTree,
    RaggedList,
    Visitor,
    visit,
    zeros_record,
)
from pytreestore.backends import Backend
from pytreestore.errors import (
    CorruptStoreError,
    RaggedDeclarationError,
    SchemaMismatchError,
    UnsupportedTreeError,
)

_Entry = TypeVar("_Entry", _info.AxisInfo, _info.PresenceInfo)
_Paths: TypeAlias = Sequence[str] | None  # optional= (and ragged=), as create takes them
_Ragged: TypeAlias = bool | _Paths


class GenericViewError(UnsupportedTreeError):
    """``open(generic=True)`` of a ragged store (its declarations name today's paths)."""


@dataclasses.dataclass
class Model:
    """A ragged store's layout and where each part of it is stored.

    Attributes:
        spec: the layout (:mod:`pytreestore._tree.layout`) of records, today's classes.
        decl: the declarations it was built with.
        leaves: each array leaf of the layout with the table holding its values, in walk
            (flatten) order.
        axes: each ragged axis's keypath -> the table its offsets live in, parents first.
        presence: each optional subtree's keypath -> the table its presence lives in.
    """

    spec: LayoutNode
    decl: Declarations
    leaves: list[tuple[Leaf, str | None]] = dataclasses.field(default_factory=list)
    axes: dict[str, str | None] = dataclasses.field(default_factory=dict)
    presence: dict[str, str | None] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, spec: LayoutNode, decl: Declarations) -> Model:
        model = cls(spec, decl)
        model.walk(spec, None)
        return model

    def walk(self, spec: LayoutNode | None, table: str | None) -> None:
        visit(spec, _Tables(self), table)

    @property
    def tables(self) -> list[str | None]:
        """The record table (None), then each axis's table."""
        return [None, *self.axes]

    @property
    def pending(self) -> list[str]:
        """Keypaths whose structure no record has shown yet (an empty list, a None subtree)."""
        pending = _Pending()
        visit(self.spec, pending)
        return pending.out


class _Tables(Visitor):
    """Fills a :class:`Model`'s leaves, axes and presence from its layout, in walk order."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def leaf(self, node: Leaf, table: str | None) -> None:
        axes = self.model.axes
        if node.axis is not None and node.axis.path not in axes:
            axes[node.axis.path] = table  # its own axis (a shared one is the node's)
        self.model.leaves.append((node, table if node.axis is None else node.axis.path))

    def ragged(self, node: RaggedList, table: str | None) -> None:
        self.model.axes[node.axis.path] = table
        visit(node.element, self, node.axis.path)

    def optional(self, node: OptionalTree, table: str | None) -> None:
        self.model.presence[node.path] = table
        visit(node.inner, self, table)

    def fixed(self, node: Fixed, table: str | None) -> None:
        if node.common_axis is not None:
            self.model.axes[node.common_axis.path] = table
        for child in node.children:
            visit(child, self, table)


class _Pending(Visitor):
    """Collects the keypaths of the lists and optional subtrees whose structure is unknown."""

    def __init__(self) -> None:
        self.out: list[str] = []

    def ragged(self, node: RaggedList) -> None:
        self.note(node.path, node.element)

    def optional(self, node: OptionalTree) -> None:
        self.note(node.path, node.inner)

    def fixed(self, node: Fixed) -> None:
        for child in node.children:
            visit(child, self)

    def note(self, path: str, inner: LayoutNode | None) -> None:
        if inner is None:
            self.out.append(path)
        visit(inner, self)


# ---- create ------------------------------------------------------------------------------------


def build_schema(
    like: object, ragged: _Ragged, optional: _Paths, *, chunk_records: int | None, codec: str | None
) -> TreeSchema:
    """The format-3 schema of a store whose records may vary where declared.

    Raises:
        RaggedDeclarationError: a declaration names nothing, or names what cannot vary.
        SchemaMismatchError, UnsupportedTreeError: ``like`` cannot be stored.
    """
    decl = Declarations.parse(ragged, optional)
    spec = Walker(decl).build(like, (), None)
    _check_used(decl, spec, known_only=True)
    model = Model.of(spec, decl)
    _check_storable(model)
    base = TreeSchema.from_example(representative(spec), chunk_records=1, codec=codec)
    return _schema(base, model, ragged, optional, chunk_records)


def grow_schema(
    schema: TreeSchema, record: object, rows: Callable[[str | None], int]
) -> TreeSchema:
    """``schema`` with the structures ``record`` shows where the schema's were pending (an
    element of a list that was empty so far, a subtree that was None).

    Raises:
        SchemaMismatchError: ``record`` departs from the schema elsewhere.
        RaggedDeclarationError: the structure it shows cannot be stored.

    The arrays ``schema`` has keep their stored keys (a store written by another key scheme
    keeps its keys); new arrays get keys from their keypaths. New arrays in a table that has
    rows already (``rows(table)``, committed) start there: the rows before read zeros,
    offsets 0 and absent, unstored.
    """
    model: Model = schema.layout
    info = schema.ragged
    assert info is not None
    spec = copy.deepcopy(model.spec)
    walker = Walker(model.decl)
    walker.merge(spec, record, ())
    if walker.problems:
        lines = "\n".join(f"  {line}" for line, _ in walker.problems)
        raise SchemaMismatchError(f"record does not match the store schema:\n{lines}")
    grown = Model.of(spec, model.decl)
    _check_storable(grown)
    base = TreeSchema.from_example(representative(spec), chunk_records=1, codec=schema.codec)
    known = {a.path: a.chunk_rows for a in info.axes}
    declared = info.declared_ragged
    new = _schema(base, grown, declared, list(info.optional), schema.chunk_records, known)
    return _started(schema, new, rows)


def _started(old: TreeSchema, new: TreeSchema, rows: Callable[[str | None], int]) -> TreeSchema:
    """``new`` with the arrays of ``old`` as stored (their keys and starts, matched by
    :func:`~pytreestore._format.ragged.slot`), the arrays not in ``old`` starting at their
    table's rows, and the columns ``old`` lists as dropped by ``evolve``."""
    before = {_info.slot(c): c for c in old.table_columns}

    def column(c: ColumnSpec) -> ColumnSpec:
        was = before.get(_info.slot(c))
        if was is not None:
            return dataclasses.replace(
                c, key=was.key, start=was.start, default=was.default, weak_type=was.weak_type
            )
        n = rows(c.table)
        return dataclasses.replace(c, start=n, default=fill_value(c.dtype)) if n else c

    info = new.ragged
    assert info is not None
    axes = tuple(
        _kept(a, "offsets", before.get((_info.OFFSETS, a.path)), rows(a.table)) for a in info.axes
    )
    presence = tuple(
        _kept(p, "presence", before.get((_info.PRESENCE, p.path)), rows(p.table))
        for p in info.presence
    )
    out = dataclasses.replace(
        new,
        columns=tuple(column(c) for c in new.columns),
        ragged=dataclasses.replace(info, axes=axes, presence=presence),
        format_version=old.format_version,
        packs=old.packs,  # a learnt column gets its own array; the packs stay as they are
        dropped=old.dropped,  # an evolve's: their keys stay taken
        inner_chunk_bytes=old.inner_chunk_bytes,  # a learnt column's chunks as the others'
    )
    check_unique_keys(out.storage_columns)  # a new key may meet a key of another scheme
    return out


def _kept(item: _Entry, field: str, was: ColumnSpec | None, rows: int) -> _Entry:
    """An axis's or optional subtree's entry with the stored key (its ``field``) and start
    of its array ``was``; a new array (None) starts at its table's ``rows``."""
    if was is None:
        return dataclasses.replace(item, start=rows)
    return dataclasses.replace(item, start=was.start, **{field: was.key})


def _schema(
    base: TreeSchema,
    model: Model,
    ragged: _Ragged,
    optional: _Paths,
    chunk_records: int | None,
    known: dict[str, int] | None = None,
) -> TreeSchema:
    if len(base.columns) != len(model.leaves):
        raise SchemaMismatchError(  # a leaf the layout keeps as a value but the schema not
            "the example record holds leaves a ragged store cannot store (PRNG keys?); "
            "store jax.random.key_data(key) instead"
        )
    chunks = {**_table_chunks(model, base, chunk_records), **(known or {})}
    columns = tuple(
        ColumnSpec(
            leaf.path,
            _info.path_key(leaf.path),
            c.dtype,
            leaf.shape,
            (chunks[table], *leaf_chunks(c.dtype, leaf.shape, chunks[table])),
            table=table,
            weak_type=leaf.weak,
        )
        for (leaf, table), c in zip(model.leaves, base.columns)
    )
    info = _info.RaggedInfo(
        True if ragged is True else tuple(ragged or ()),
        tuple(optional or ()),
        tuple(_info.AxisInfo(p, _info.offsets_key(p), t, chunks[p]) for p, t in model.axes.items()),
        tuple(_info.PresenceInfo(p, _info.presence_key(p), t) for p, t in model.presence.items()),
    )
    schema = dataclasses.replace(
        base, columns=columns, chunk_records=chunks[None], ragged=info, layout=model
    )
    check_unique_keys(schema.storage_columns)
    return schema


def _table_chunks(
    model: Model, base: TreeSchema, chunk_records: int | None
) -> dict[str | None, int]:
    """Rows per chunk of every table: ``chunk_records`` (or about 4 MiB) for the record
    table, about 4 MiB of the widest column for each axis's table."""
    sizes: dict[str | None, list[tuple[object, ...]]] = {t: [] for t in model.tables}
    for (leaf, table), c in zip(model.leaves, base.columns):
        sizes[table].append((c.path, c.key, c.dtype, leaf.shape, None))
    for _, table in list(model.axes.items()) + list(model.presence.items()):
        sizes[table].append(("", "", np.dtype("int64"), (), None))
    out = {t: default_chunk_records(rows) for t, rows in sizes.items()}
    if chunk_records is not None:
        out[None] = chunk_records
    return out


def _check_storable(model: Model) -> None:
    """Refuses layouts whose tables could not count their rows."""
    counted = {t for _, t in model.leaves} | set(model.axes.values())
    counted |= set(model.presence.values())
    for axis in model.axes:
        if axis not in counted and axis not in model.pending:
            raise RaggedDeclarationError(
                f"the ragged axis at {axis or 'the root'} has no array leaf below it to carry "
                "its elements (only None, empty nodes, functions or scalars of a node declared "
                "ragged); give its elements at least one array leaf"
            )
    visit(model.spec, _NoOptionalInShared(), False)


class _NoOptionalInShared(Visitor):
    """Refuses an optional subtree below a node declared ragged (``shared``)."""

    def optional(self, node: OptionalTree, shared: bool) -> None:
        if shared:
            raise RaggedDeclarationError(
                f"optional= entry {node.path!r} lies below a node declared ragged (whose leaves "
                "share one leading axis); declare the optional subtree outside it"
            )
        visit(node.inner, self, shared)

    def ragged(self, node: RaggedList, shared: bool) -> None:
        visit(node.element, self, False)

    def fixed(self, node: Fixed, shared: bool) -> None:
        for child in node.children:
            visit(child, self, shared or node.common_axis is not None)


def representative(spec: LayoutNode | None) -> object:
    """The record the schema's tree and columns describe: zeros, one element per ragged list
    (none while pending), one row per ragged leading axis, every known optional present."""
    return zeros_record(spec, leading=True)


# ---- open --------------------------------------------------------------------------------------


def attach_layout(schema: TreeSchema, where: str) -> TreeSchema:
    """``schema`` (read from a ragged store) with the :class:`Model` of its records, built
    from today's classes (or the generic view).

    Raises:
        SchemaMismatchError: today's classes differ from the stored ones in a way a ragged
            store cannot bind (fields added or removed; reordered fields are fine).
        CorruptStoreError: the stored axes disagree with the stored tree.
    """
    info = schema.ragged
    assert info is not None
    if schema.treedef is None:
        raise GenericViewError(
            f"{where} holds ragged or optional records, which have no generic view yet: "
            "open it with its classes importable, or with like= a record of its structure"
        )
    decl = Declarations.parse(info.declared_ragged, info.optional)
    zeros = [np.zeros((1, *c.shape) if _leading(c) else c.shape, c.dtype) for c in schema.columns]
    try:
        rep = schema.unflatten(zeros)
        spec = Walker(decl).build(rep, (), None)
    except (ValueError, TypeError) as err:
        raise CorruptStoreError(
            f"{where}: the ragged store's schema is inconsistent: {err}"
        ) from err
    model = Model.of(spec, decl)
    _check_model(model, schema, where)
    return dataclasses.replace(schema, layout=model)


def reread_schema(
    backend: Backend, where: str, commit: Commit, *, like: object, generic: bool
) -> TreeSchema:
    """A ragged store's schema read again (``refresh`` of a reader whose schema had pending
    structures, to ``commit``), with its layout; the backend told of its arrays.

    It is the schema ``commit`` names: a truncate or a learning writes the root before its
    commit record, so the root may hold one no commit names yet (or ever, after a crash)."""
    raw = backend.read_bytes(ROOT_KEY)
    digest = _validate.schema_id(_validate.root_schema(raw, where))
    assert raw is not None  # root_schema refuses a missing root
    info = other_schema(backend, commit, digest)
    if info is not None:
        raw = group_json({"pytreestore": info})
    schema = load_schema(raw, where, like=like, generic=generic)
    backend.open_columns(schema.storage_columns)
    return schema


def load_schema(raw: bytes, where: str, *, like: object, generic: bool) -> TreeSchema:
    """The schema in root metadata ``raw`` (:func:`pytreestore._format.validate.load_schema`),
    with its layout if it is a ragged store's. ``like`` may also be a record as ``create``
    took it (lists of any length, ragged leading axes): it is cut to the record the stored
    tree describes, one element per list and no ragged axis (:func:`described`).

    Raises:
        SchemaMismatchError: ``like`` matches the stored structure in neither form.
    """
    try:
        schema = _validate.load_schema(raw, where, like=like, generic=generic)
    except SchemaMismatchError as err:
        cut = described_like(_validate.root_schema(raw, where), like)
        if cut is None:
            raise
        try:
            schema = _validate.load_schema(raw, where, like=cut, generic=generic)
        except SchemaMismatchError:
            raise err from None
    return with_layout(schema, where)


def with_layout(schema: TreeSchema, where: str) -> TreeSchema:
    """``schema`` with the layout of its records if it is a ragged store's
    (:func:`attach_layout`); a fixed store's records need none (its treedef is their
    layout)."""
    return schema if schema.ragged is None else attach_layout(schema, where)


def described_like(info: dict[str, Any], like: object) -> object:
    """``like``, a record of the ragged store whose stored schema is ``info``, as the stored
    tree describes records (:func:`described`); None for another store, or a ``like`` the
    declarations cannot walk."""
    if like is None or "ragged" not in info:
        return None
    try:
        ragged = _info.RaggedInfo.from_json(info["ragged"])
        decl = Declarations.parse(ragged.declared_ragged, ragged.optional)
        return described(Walker(decl).build(like, (), None))
    except (KeyError, TypeError, ValueError):
        return None


def described(spec: LayoutNode | None) -> object:
    """The record a ragged schema's tree describes: :func:`representative`, but leaves
    without their ragged leading axis (the shapes of their columns)."""
    return zeros_record(spec, leading=False)


def _leading(column: ColumnSpec) -> bool:
    """Whether a column's leaf has a ragged leading axis (its own, or its node's)."""
    table = column.table
    return table is not None and (
        column.path == table or not column.path[len(table) :].startswith("[*]")
    )


def _check_model(model: Model, schema: TreeSchema, where: str) -> None:
    info = schema.ragged
    assert info is not None
    stored = {(c.path, c.table) for c in schema.columns}
    now = {(leaf.path, table) for leaf, table in model.leaves}
    if stored != now:
        gone = sorted(p for p, _ in stored - now)
        new = sorted(p for p, _ in now - stored)
        raise SchemaMismatchError(
            f"{where}: today's classes do not match the ragged store's leaves (stored only: "
            f"{gone or 'none'}; today's only: {new or 'none'}). A ragged store binds classes "
            "whose fields were reordered, not added or removed: evolve the store to today's "
            "classes first (pytreestore.evolve(path, add=..., drop=...)), or open it with "
            "like= a record of the stored structure"
        )
    axes = {a.path: a.table for a in info.axes}
    presence = {p.path: p.table for p in info.presence}
    if axes != model.axes or presence != model.presence:
        raise CorruptStoreError(
            f"{where}: the ragged store's axes {axes} and optional subtrees {presence} "
            f"disagree with its tree ({model.axes}, {model.presence}); the schema was edited "
            "or damaged outside pytreestore"
        )


__all__ = [
    "GenericViewError",
    "Model",
    "attach_layout",
    "build_schema",
    "described",
    "described_like",
    "grow_schema",
    "load_schema",
    "representative",
    "reread_schema",
    "with_layout",
]
