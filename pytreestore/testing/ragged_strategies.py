"""Hypothesis strategies for ragged stores: random ragged structures and records of them.

A test draws a case, a ``like=`` record, records and the declarations that accept them::

    from hypothesis import given
    from pytreestore.testing import ragged_strategies as prs

    @given(prs.ragged_cases())
    def test_roundtrip(case):
        like, records, ragged, optional = case
        store = pytreestore.create(path, like, ragged=ragged, optional=optional)
        store.extend(records)
        ...

or draws a :class:`RaggedSchema` (:func:`ragged_schemas`), then records of it
(:func:`ragged_records`), when it needs to know where the structure varies.

A structure is built from dicts, tuples, fixed-length lists, the NamedTuples and flax
dataclasses of :mod:`pytreestore.testing.strategies` (module level, so a store written with
them reopens in another process) and array leaves, nested up to ``max_depth`` levels; some
lists are ragged (their elements' keypaths have ``[*]``), some array leaves have a ragged
leading axis, some dicts and dataclasses are declared ragged so that their array leaves share
one leading axis, and some subtrees are optional (sometimes None). Declarations are keypaths as
:func:`jax.tree_util.keystr` spells them (``.field``, ``['key']``, ``[*]``), or
``ragged=True``, which makes every list and every leading axis ragged. The structures respect
what a store requires: no optional subtree below a node declared ragged, an array leaf in
every ragged list's element, one structure for the elements of one list. Leaves are numpy
arrays and scalars of :data:`RAGGED_DTYPES`, floats with NaN and infinities; ``float64`` needs
``as_numpy=True`` loads to stay exact.

This module needs hypothesis; ``import pytreestore.testing`` never imports it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from jax.tree_util import keystr, tree_flatten_with_path

from pytreestore.testing.strategies import DATACLASSES, NAMEDTUPLES, STATIC_VALUES, Tagged

__all__ = [
    "RAGGED_DTYPES",
    "LeafPart",
    "ListPart",
    "NodePart",
    "OptionalPart",
    "RaggedSchema",
    "ragged_cases",
    "ragged_records",
    "ragged_schemas",
]

#: The dtypes of drawn leaves (``float64`` loads exactly only with ``as_numpy=True``).
RAGGED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(d) for d in ("float32", "int32", "int16", "bool", "float64")
)

_KEYS = ("a", "b", "pos", "x", "a/b", "é", "", "x'y", "[0]", "%", "0")


# ---- parts of a structure -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeafPart:
    """An array leaf.

    Attributes:
        dtype: its dtype.
        shape: one row's shape: the leaf's shape without its ragged leading axis, if any.
        leading: None (a fixed shape), ``"own"`` (its leading axis is ragged, declared at its
            keypath) or ``"shared"`` (the leading axis of the node declared ragged above it).
    """

    dtype: np.dtype
    shape: tuple[int, ...] = ()
    leading: str | None = None


@dataclasses.dataclass(frozen=True)
class NodePart:
    """A fixed node: ``kind`` is ``"dict"`` (``keys`` its keys), ``"dataclass"`` or
    ``"namedtuple"`` (``cls`` its class, ``label`` a :class:`Tagged` label), ``"tuple"`` or
    ``"list"`` (fixed length). ``shared``: declared ragged, its array leaves share one
    leading axis."""

    kind: str
    children: tuple[Any, ...]
    keys: tuple[str, ...] = ()
    cls: Any = None
    label: Any = None
    shared: bool = False

    def build(self, children: list[Any]) -> Any:
        """This node around ``children`` (in the order of :attr:`children`)."""
        if self.kind == "dict":
            return dict(zip(self.keys, children))
        if self.kind == "list":
            return list(children)
        if self.kind == "tuple":
            return tuple(children)
        if self.cls is Tagged:
            return Tagged(children[0], label=self.label)
        return self.cls(*children)

    def entries(self) -> list[tuple[str, int]]:
        """``(keystr token, index into children)`` of each child, in flatten order."""
        node = self.build(list(range(len(self.children))))
        flat, _ = tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
        return [(keystr(path), i) for path, i in flat]

    def values(self, node: Any) -> list[Any]:
        """The children of ``node`` (built by :meth:`build`), in the order of
        :attr:`children`."""
        if self.kind == "dict":
            return [node[k] for k in self.keys]
        if self.kind in ("list", "tuple", "namedtuple"):
            return list(node)
        if self.cls is Tagged:
            return [node.value]
        return [getattr(node, f.name) for f in dataclasses.fields(self.cls)]


@dataclasses.dataclass(frozen=True)
class ListPart:
    """A ragged list: any number of elements of ``element``'s structure (keypath ``[*]``)."""

    element: Any


@dataclasses.dataclass(frozen=True)
class OptionalPart:
    """A subtree that is None in some records."""

    inner: Any


Part = LeafPart | NodePart | ListPart | OptionalPart


def _has_array(part: Part) -> bool:
    if isinstance(part, LeafPart):
        return True
    if isinstance(part, ListPart):
        return _has_array(part.element)
    if isinstance(part, OptionalPart):
        return _has_array(part.inner)
    return any(_has_array(c) for c in part.children)


# ---- schemas ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class RaggedSchema:
    """A drawn ragged structure.

    Attributes:
        template: its root :class:`NodePart`.
        ragged_all: declared with ``ragged=True`` (every list and leading axis ragged).
    """

    template: NodePart
    ragged_all: bool = False

    def parts(self) -> list[tuple[str, Part]]:
        """Every part with its keypath (``[*]`` below a ragged list), parents first; an
        optional part comes before its inner part, at the same keypath."""
        out: list[tuple[str, Part]] = []
        _walk(self.template, "", out)
        return out

    @property
    def ragged(self) -> Any:
        """``ragged=`` for ``create`` and ``stack``: True, or the declared keypaths."""
        if self.ragged_all:
            return True
        return [p for p, part in self.parts() if _declared_ragged(part)]

    @property
    def optional(self) -> list[str]:
        """``optional=``: the keypaths of the optional subtrees."""
        return [p for p, part in self.parts() if isinstance(part, OptionalPart)]

    @property
    def like(self) -> Any:
        """An example record: zeros, one element per ragged list and one row per ragged
        leading axis, every optional subtree present."""
        return _zeros(self.template, None)

    @property
    def needs_x64(self) -> bool:
        """Whether some leaf is 64-bit (load with ``as_numpy=True`` to stay exact)."""
        return any(isinstance(p, LeafPart) and p.dtype.itemsize == 8 for _, p in self.parts())


def _declared_ragged(part: Part) -> bool:
    if isinstance(part, LeafPart):
        return part.leading == "own"
    return isinstance(part, ListPart) or (isinstance(part, NodePart) and part.shared)


def _walk(part: Part, path: str, out: list[tuple[str, Part]]) -> None:
    out.append((path, part))  # an optional part, then its inner part, at one keypath
    if isinstance(part, OptionalPart):
        _walk(part.inner, path, out)
    elif isinstance(part, ListPart):
        _walk(part.element, path + "[*]", out)
    elif isinstance(part, NodePart):
        for token, i in part.entries():
            _walk(part.children[i], path + token, out)


def _zeros(part: Part, shared: int | None) -> Any:
    if isinstance(part, LeafPart):
        n = shared if part.leading == "shared" and shared is not None else 1
        lead = (n,) if part.leading else ()
        return np.zeros((*lead, *part.shape), part.dtype)
    if isinstance(part, OptionalPart):
        return _zeros(part.inner, shared)
    if isinstance(part, ListPart):
        return [_zeros(part.element, None)]
    n = 1 if part.shared else shared
    return part.build([_zeros(c, n) for c in part.children])


class _Drawer:
    """Draws parts, spending a budget of array leaves."""

    def __init__(self, draw: st.DrawFn, leaves: int, ragged_all: bool, dtypes: Any) -> None:
        self.draw, self.budget, self.ragged_all, self.dtypes = draw, leaves, ragged_all, dtypes

    def part(self, depth: int, *, shared: bool = False) -> Part:
        kinds = ["leaf", "leaf"]
        if depth > 0 and self.budget > 1:
            kinds += ["dict", "dataclass", "namedtuple", "tuple"]
            if not shared:
                kinds += ["ragged", "ragged", *(["list", "shared"] if not self.ragged_all else [])]
        kind = self.draw(st.sampled_from(kinds))
        part = self.leaf(shared) if kind == "leaf" else self.container(kind, depth, shared)
        if not shared and self.draw(st.integers(0, 4)) == 0:
            return OptionalPart(part)
        return part

    def leaf(self, shared: bool) -> LeafPart:
        self.budget -= 1
        dtype = self.draw(self.dtypes)
        dims = self.draw(st.integers(0, 2))
        shape = self.draw(hnp.array_shapes(min_dims=dims, max_dims=dims, min_side=0, max_side=3))
        if shared:
            return LeafPart(dtype, shape[:1], "shared")
        ragged = dims > 0 and (self.ragged_all or self.draw(st.integers(0, 2)) == 0)
        return LeafPart(dtype, shape[1:], "own") if ragged else LeafPart(dtype, shape)

    def container(self, kind: str, depth: int, shared: bool) -> Part:
        if kind == "ragged":
            element = self.part(depth - 1)
            return ListPart(element if _has_array(element) else self.leaf(False))
        if kind == "shared":
            node = self.container(self.draw(st.sampled_from(["dict", "dataclass"])), depth, True)
            assert isinstance(node, NodePart)
            if not _has_array(node):
                node = NodePart("dict", (self.leaf(True),), ("a",))
            return dataclasses.replace(node, shared=True)
        return self.node(kind, depth, shared)

    def node(self, kind: str, depth: int, shared: bool) -> NodePart:
        def children(k: int) -> tuple[Any, ...]:
            return tuple(self.part(depth - 1, shared=shared) for _ in range(k))

        if kind == "dict":
            keys = self.draw(st.lists(st.sampled_from(_KEYS), min_size=1, max_size=3, unique=True))
            return NodePart("dict", children(len(keys)), tuple(keys))
        if kind in ("tuple", "list"):
            return NodePart(kind, children(self.draw(st.integers(1, 3))))
        if kind == "namedtuple":
            cls = self.draw(st.sampled_from(NAMEDTUPLES))
            return NodePart(kind, children(len(cls._fields)), cls=cls)
        cls = self.draw(st.sampled_from(DATACLASSES))
        label = self.draw(st.sampled_from(STATIC_VALUES)) if cls is Tagged else None
        width = len([f for f in dataclasses.fields(cls) if f.metadata.get("pytree_node", True)])
        return NodePart(kind, children(width), cls=cls, label=label)


@st.composite
def ragged_schemas(
    draw: st.DrawFn,
    max_depth: int = 3,
    max_leaves: int = 6,
    *,
    ragged_all: bool | None = None,
    dtype_strategy: st.SearchStrategy[np.dtype] | None = None,
) -> RaggedSchema:
    """Random ragged structures of up to ``max_depth`` levels below the root (a dict,
    dataclass, NamedTuple or tuple) with about ``max_leaves`` array leaves, at least one
    declaration and at least one array leaf.

    Args:
        ragged_all: declare ``ragged=True`` (None: drawn, one time in five).
        dtype_strategy: the leaves' dtypes (default: :data:`RAGGED_DTYPES`).
    """
    every = draw(st.integers(0, 4)) == 0 if ragged_all is None else ragged_all
    drawer = _Drawer(draw, max_leaves, every, dtype_strategy or st.sampled_from(RAGGED_DTYPES))
    kind = draw(st.sampled_from(["dict", "dataclass", "namedtuple", "tuple"]))
    root = drawer.node(kind, max(1, max_depth), False)
    schema = RaggedSchema(root, every)
    if not _has_array(root) or not (schema.ragged or schema.optional):
        extra = ListPart(drawer.leaf(False))
        schema = RaggedSchema(NodePart("tuple", (root, extra)), every)
    return schema


# ---- records ------------------------------------------------------------------------------------


def _leaf_values(dtype: np.dtype, shape: tuple[int, ...]) -> st.SearchStrategy[Any]:
    arrays = hnp.arrays(dtype, shape)
    if shape:
        return arrays
    return st.tuples(arrays, st.booleans()).map(lambda p: p[0][()] if p[1] else p[0])


def _draw_record(draw: st.DrawFn, part: Part, shared: int | None, longest: int) -> Any:
    if isinstance(part, LeafPart):
        if part.leading is None:
            return draw(_leaf_values(part.dtype, part.shape))
        n = shared if part.leading == "shared" else draw(st.integers(0, longest))
        assert n is not None
        return draw(hnp.arrays(part.dtype, (n, *part.shape)))
    if isinstance(part, OptionalPart):
        return None if draw(st.booleans()) else _draw_record(draw, part.inner, shared, longest)
    if isinstance(part, ListPart):
        n = draw(st.integers(0, longest))
        return [_draw_record(draw, part.element, None, longest) for _ in range(n)]
    n = draw(st.integers(0, longest)) if part.shared else shared
    return part.build([_draw_record(draw, c, n, longest) for c in part.children])


def ragged_records(
    schema: RaggedSchema, min_size: int = 1, max_size: int = 6, *, longest: int = 3
) -> st.SearchStrategy[list[Any]]:
    """Lists of ``min_size`` to ``max_size`` records of ``schema``: ragged lists and leading
    axes of 0 to ``longest`` (one length per record for the leaves of a node declared
    ragged), optional subtrees None about half the time."""

    @st.composite
    def one(draw: st.DrawFn) -> Any:
        return _draw_record(draw, schema.template, None, longest)

    return st.lists(one(), min_size=min_size, max_size=max_size)


@st.composite
def ragged_cases(
    draw: st.DrawFn, min_records: int = 1, max_records: int = 6, **schema_options: Any
) -> tuple[Any, list[Any], Any, list[str]]:
    """``(like, records, ragged, optional)``: a ragged structure's example record, records of
    it, and the declarations to give ``create`` and ``stack``. ``schema_options`` go to
    :func:`ragged_schemas`."""
    schema = draw(ragged_schemas(**schema_options))
    records = draw(ragged_records(schema, min_records, max_records))
    return schema.like, records, schema.ragged, schema.optional
