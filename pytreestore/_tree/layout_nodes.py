"""Ragged and optional declarations, and the nodes of the record layout they become.

Ragged and optional declarations (``ragged=``, ``optional=``): which lists and leading
axes may vary in length, which subtrees may be None (the layout they give records is
:mod:`pytreestore._tree.layout`).

A declaration is a keypath spelled as :func:`jax.tree_util.keystr` spells it (the store's
column paths, ``.p[0].x``, ``['key']``); ``[*]`` stands for every element of a list.

Example:
    >>> decl = Declarations.parse([".p", ".q[*].x"], None)
    >>> decl.is_ragged(((".q", False), ("[3]", True), (".x", False)))
    True

The nodes of a record layout (:mod:`pytreestore._tree.layout` builds them) and the one
way to tell their kinds apart: a :class:`Visitor`, a method per kind, called by :func:`visit`.

A fixed store's record is a layout with no lists and no optional subtrees. Code outside the
layout's modules never tests a node's kind (``tests/test_architecture.py`` checks it): it
passes a visitor, as :mod:`pytreestore._write.walk` does to compile its walk once per layout.

Example:
    >>> import numpy as np
    >>> class Paths(Visitor):
    ...     def leaf(self, node): return [node.path]
    ...     def ragged(self, node): return [node.path, *visit(node.element, self)]
    ...     def unknown(self): return []
    >>> visit(RaggedList("['p']", Axis("['p']"), Leaf("['p'][*]", np.dtype("f4"), ())), Paths())
    ["['p']", "['p'][*]"]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from pytreestore._format.ragged import KEYPATH_TOKEN
from pytreestore.errors import RaggedDeclarationError

STAR = "[*]"


#: a node's position: one (token, is a list element) pair per level; elements of a ragged
#: list have the token ``[*]``
Position = tuple[tuple[str, bool], ...]


def parse_keypath(path: Any, what: str) -> tuple[str, ...]:
    """The tokens of one declared keypath; RaggedDeclarationError when it is no keypath."""
    if not isinstance(path, str):
        raise RaggedDeclarationError(f"{what} takes keypath strings, got {path!r}")
    tokens = tuple(KEYPATH_TOKEN.findall(path))
    if "".join(tokens) != path:
        raise RaggedDeclarationError(
            f"{what} entry {path!r} is not a keypath as jax.tree_util.keystr spells it "
            "(e.g. '.p', \"['key']\", '.regions[*].events')"
        )
    return tokens


def text(position: Position) -> str:
    """A position as a keypath string (``[*]`` for the elements of a ragged list)."""
    return "".join(token for token, _ in position)


@dataclasses.dataclass(frozen=True)
class Declarations:
    """Where records may vary: every list and array leaf (``ragged_all``), or the declared
    keypaths. ``used`` collects the declarations that named a node."""

    ragged_all: bool
    ragged: tuple[tuple[str, ...], ...]
    optional: tuple[tuple[str, ...], ...]
    used: set[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=set)

    @classmethod
    def parse(cls, ragged: Any, optional: Any) -> Declarations:
        """Checks and parses ``ragged=`` (True, or keypaths) and ``optional=`` (keypaths)."""
        ragged_all = ragged is True
        paths = (
            ()
            if ragged is None or ragged is False or ragged is True
            else _entries(ragged, "ragged=")
        )
        opts = () if optional is None else _entries(optional, "optional=")
        for tokens in opts:
            if not tokens:
                raise RaggedDeclarationError(
                    "optional= entry '' names the record itself, not a subtree position; "
                    "name a field or element that may be None"
                )
        return cls(ragged_all, paths, opts)

    @classmethod
    def none(cls) -> Declarations:
        """Nothing declared: every record has the structure and shapes of the first."""
        return cls(False, (), ())

    def is_optional(self, position: Position) -> bool:
        return self._match("optional", self.optional, position)

    def is_ragged(self, position: Position) -> bool:
        """Whether a list, leaf or node at ``position`` was declared ragged by name."""
        return self._match("ragged", self.ragged, position)

    def _match(self, kind: str, declared: Sequence[tuple[str, ...]], position: Position) -> bool:
        hits = [d for d in declared if _matches(d, position)]
        self.used.update((kind, d) for d in hits)
        return bool(hits)

    def unused(self) -> list[tuple[str, tuple[str, ...]]]:
        """The declarations that named no node of any record (nor of ``like``)."""
        every = [("ragged", d) for d in self.ragged] + [("optional", d) for d in self.optional]
        return [d for d in every if d not in self.used]


def _entries(value: Any, what: str) -> tuple[tuple[str, ...], ...]:
    if not isinstance(value, list | tuple):  # not a str, dict, set, int, ...
        raise RaggedDeclarationError(
            f"{what} takes a list of keypath strings (or, for ragged=, True), got {value!r}"
        )
    return tuple(parse_keypath(p, what) for p in value)


def _matches(declared: tuple[str, ...], position: Position) -> bool:
    if len(declared) != len(position):
        return False
    return all(
        d == token or (d == STAR and is_element)
        for d, (token, is_element) in zip(declared, position)
    )


@dataclasses.dataclass
class Axis:
    """One ragged axis: a ragged list, a ragged leading axis, or one shared by a node's leaves."""

    path: str
    longest: int = 0


class Visitor:
    """One method per kind of layout node; :func:`visit` calls the one of a node's kind, so
    that code outside this module passes a function per kind instead of testing the kind.

    A kind a subclass does not handle goes to :meth:`other` (None by default); ``None`` in
    place of a node (a list element or optional subtree no record has shown) goes to
    :meth:`unknown`. The extra arguments of :func:`visit` are passed on.
    """

    def leaf(self, node: Leaf, *args: Any) -> Any:
        return self.other(node, *args)

    def kept(self, node: Kept, *args: Any) -> Any:
        return self.other(node, *args)

    def ragged(self, node: RaggedList, *args: Any) -> Any:
        return self.other(node, *args)

    def optional(self, node: OptionalTree, *args: Any) -> Any:
        return self.other(node, *args)

    def fixed(self, node: Fixed, *args: Any) -> Any:
        return self.other(node, *args)

    def unknown(self, *args: Any) -> Any:
        return None

    def other(self, node: LayoutNode, *args: Any) -> Any:
        return None


def visit(node: LayoutNode | None, visitor: Visitor, *args: Any) -> Any:
    """``visitor``'s method for the kind of ``node`` (:meth:`Visitor.unknown` for None),
    called with ``node`` and ``args``."""
    return visitor.unknown(*args) if node is None else node.visit(visitor, *args)


def below(node: LayoutNode | None) -> list[LayoutNode]:
    """The nodes right below ``node``: a fixed node's children, a list's element, an optional
    subtree's inner tree (each when known); none below a leaf."""
    if isinstance(node, Fixed):
        return list(node.children)
    inner = node.element if isinstance(node, RaggedList) else None
    inner = node.inner if isinstance(node, OptionalTree) else inner
    return [] if inner is None else [inner]


def plain_leaf(node: LayoutNode | None) -> Leaf | None:
    """``node`` when it is an array leaf with no ragged axis (one value in its table's row)."""
    return node if type(node) is Leaf and node.axis is None else None


@dataclasses.dataclass
class Leaf:
    """An array leaf; ``shape`` leaves out the ragged leading axis when ``axis`` is set;
    ``weak``: the first record's leaf was weakly typed (:mod:`pytreestore._format.dtypes`)."""

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]
    axis: Axis | None = None
    weak: bool = False

    def visit(self, visitor: Visitor, *args: Any) -> Any:
        return visitor.leaf(self, *args)


@dataclasses.dataclass
class Kept:
    """A leaf that is no array (a function, a PRNG key): kept as each record has it."""

    path: str
    value: Any

    def visit(self, visitor: Visitor, *args: Any) -> Any:
        return visitor.kept(self, *args)


@dataclasses.dataclass
class RaggedList:
    """A list whose length varies; ``element`` is None until some record has an element."""

    path: str
    axis: Axis
    element: Any = None

    def visit(self, visitor: Visitor, *args: Any) -> Any:
        return visitor.ragged(self, *args)


@dataclasses.dataclass
class OptionalTree:
    """A subtree that may be None; ``inner`` is None until some record has it."""

    path: str
    inner: Any = None
    common_axis: Axis | None = None

    def visit(self, visitor: Visitor, *args: Any) -> Any:
        return visitor.optional(self, *args)


@dataclasses.dataclass
class Fixed:
    """Any other node (dict, dataclass, tuple, fixed-length list, None): one level of it.
    ``common_axis`` is the ragged leading axis its leaves share when it was declared ragged."""

    path: str
    treedef: Any
    children: list[Any]
    common_axis: Axis | None = None

    def visit(self, visitor: Visitor, *args: Any) -> Any:
        return visitor.fixed(self, *args)


LayoutNode = Leaf | Kept | RaggedList | OptionalTree | Fixed


def node_class(spec: LayoutNode | None) -> Any:
    """The class of a fixed node (``list``, ``dict``, ``type(None)``, a dataclass, ...);
    None for a node of another kind."""
    if not isinstance(spec, Fixed):
        return None
    data = spec.treedef.node_data()
    return data[0] if data else None


class _Record(Visitor):
    """A record of zeros of a layout: one element per ragged list (none while pending), every
    known optional subtree present; each leaf with one row of its ragged leading axis
    (``leading``: :func:`representative`) or without it (:func:`described`)."""

    def __init__(self, *, leading: bool) -> None:
        self.leading = leading

    def leaf(self, node: Leaf) -> Any:
        shape = node.shape if node.axis is None or not self.leading else (1, *node.shape)
        return np.zeros(shape, node.dtype)

    def kept(self, node: Kept) -> Any:
        return node.value

    def ragged(self, node: RaggedList) -> Any:
        return [] if node.element is None else [visit(node.element, self)]

    def optional(self, node: OptionalTree) -> Any:
        return visit(node.inner, self)

    def fixed(self, node: Fixed) -> Any:
        return node.treedef.unflatten([visit(c, self) for c in node.children])


def zeros_record(spec: LayoutNode | None, *, leading: bool) -> Any:
    """A record of zeros of layout ``spec``: one element per ragged list (none while
    pending), every known optional subtree present, each leaf with one row of its ragged
    leading axis (``leading``) or without it."""
    return visit(spec, _Record(leading=leading))
