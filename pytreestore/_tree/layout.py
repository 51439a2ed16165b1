"""The layout of records stacked with ragged and optional declarations
(:mod:`pytreestore._tree.layout_nodes`): per node, a ragged list, an array leaf (with its ragged
leading axis), an optional subtree or a fixed node, and the longest length of every ragged
axis; built from ``like`` (or the first record) and checked against every record.

Example:
    >>> from pytreestore._tree.layout_nodes import Declarations
    >>> decl = Declarations.parse(["['p']"], None)
    >>> layout = build_layout([{"p": [1.0, 2.0]}, {"p": [3.0]}], None, decl)
    >>> layout.children[0].axis.longest
    2

The declaration that would accept a record a store or ``stack()`` refuses: each differing
keypath of a refusal with its ``ragged=``/``optional=`` entry (from the walk of
:class:`~pytreestore._tree.layout.Walker`), so that every refusal names the fix.

Example:
    >>> print(record_problems({"x": [1.0]}, {"x": [1.0, 2.0]})[0][1])
    declare ragged=["['x']"] to allow lists of varying length
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax.tree_util import keystr

from pytreestore._format import dtypes as _dtypes
from pytreestore._format import dtypes as _prng
from pytreestore._format import nodes as _nodes
from pytreestore._format.dtypes import is_weak
from pytreestore._tree.layout_nodes import (
    STAR,
    Axis,
    Declarations,
    Fixed,
    Kept,
    LayoutNode,
    Leaf,
    OptionalTree,
    Position,
    RaggedList,
    node_class,
    text,
)
from pytreestore.errors import PyTreeStoreError, RaggedDeclarationError, SchemaMismatchError


def build_layout(records: Sequence[Any], like: Any, decl: Declarations) -> LayoutNode:
    """The layout of ``records`` (and ``like``, which fixes it first when given).

    Raises:
        SchemaMismatchError: a record departs from the others where nothing was declared,
            listing every differing keypath with the declaration that would accept it.
        RaggedDeclarationError: a declaration names nothing, or a structure is unknown.
    """
    walker = Walker(decl)
    spec = walker.build(like if like is not None else records[0], (), None)
    if like is not None:
        _forget_lengths(spec)  # like= fixes the structure; the records, the lengths
    for i, record in enumerate(records):
        walker.record = i
        if i > 0 or like is not None:  # record 0 fixed the layout when no like= is given
            walker.merge(spec, record, ())
        if walker.problems:
            check_used(decl, spec, known_only=True)
            lines = "\n".join(f"  {p}" for p, _ in walker.problems)
            raise SchemaMismatchError(
                f"stack() refused record {i}: its structure departs from "
                f"{'like=' if like is not None else 'the records before it'} where nothing "
                f"was declared ragged or optional:\n{lines}"
            )
    check_known(spec)
    check_used(decl, spec)
    return spec


def _forget_lengths(spec: LayoutNode | None) -> None:
    if isinstance(spec, Leaf | RaggedList) and spec.axis is not None:
        spec.axis.longest = 0
    if isinstance(spec, RaggedList | OptionalTree):
        _forget_lengths(spec.element if isinstance(spec, RaggedList) else spec.inner)
    elif isinstance(spec, Fixed):
        for child in spec.children:
            _forget_lengths(child)


def weak_paths(spec: LayoutNode | None) -> tuple[set[str], set[str]]:
    """The paths of the weakly typed leaves of a layout, and of its ragged lists (for
    :func:`pytreestore._format.dtypes.ragged_weak`)."""
    weak: set[str] = set()
    lists: set[str] = set()
    todo = [spec]
    while todo:
        node = todo.pop()
        if isinstance(node, Leaf) and node.weak:
            weak.add(node.path)
        elif isinstance(node, RaggedList):
            lists.add(node.path)
            todo.append(node.element)
        elif isinstance(node, OptionalTree):
            todo.append(node.inner)
        elif isinstance(node, Fixed):
            todo.extend(node.children)
    return weak, lists


class Walker:
    """Builds a layout from one tree and merges further trees into it."""

    def __init__(self, decl: Declarations) -> None:
        self.decl = decl
        self.problems: list[tuple[str, str]] = []
        self.record = 0

    def build(self, value: Any, at: Position, shared: Axis | None) -> LayoutNode:
        if self.decl.is_optional(at):
            inner = None if value is None else self.build_present(value, at, shared)
            return OptionalTree(text(at), inner, shared)
        return self.build_present(value, at, shared)

    def build_present(self, value: Any, at: Position, shared: Axis | None) -> LayoutNode:
        level = _nodes.one_level(value)
        if level is None:
            return self.leaf(value, at, shared)
        sub, keys, children = level
        if type(value) is list and (self.decl.ragged_all or self.decl.is_ragged(at)):
            spec = RaggedList(text(at), Axis(text(at)))
            self.merge(spec, value, at)
            return spec
        own = Axis(text(at)) if type(value) is not list and self.decl.is_ragged(at) else None
        axis = own or shared
        kids = [self.build(c, child_position(at, k, value), axis) for k, c in zip(keys, children)]
        spec = Fixed(text(at), sub, kids, own)
        if own is not None:
            check_shared(spec, value, self.record)
        return spec

    def leaf(self, value: Any, at: Position, shared: Axis | None) -> LayoutNode:
        if _prng.is_key(value):
            raise SchemaMismatchError(
                f"stack() with ragged=/optional= cannot stack the PRNG key array at "
                f"{text(at) or 'the root'} yet; stack jax.random.key_data(key) instead and "
                "rewrap it with jax.random.wrap_key_data"
            )
        dtype = _dtypes.value_dtype(value)
        if dtype is None:
            return Kept(text(at), value)
        shape = tuple(np.shape(value))
        named = self.decl.is_ragged(at)
        if named and not shape:
            raise RaggedDeclarationError(
                f"ragged= names the leaf at {text(at)}, which is a scalar ({_describe(value)}): "
                "only an array's leading axis can be ragged"
            )
        weak = is_weak(value)
        if not shape or not (named or self.decl.ragged_all or shared is not None):
            return Leaf(text(at), dtype, shape, weak=weak)
        axis = shared or Axis(text(at))
        axis.longest = max(axis.longest, shape[0])
        return Leaf(text(at), dtype, shape[1:], axis, weak)

    def merge(self, spec: LayoutNode, value: Any, at: Position) -> None:
        """Checks ``value`` against ``spec``, filling what is still unknown and the longest
        length of every ragged axis; differences go to ``problems``."""
        if isinstance(spec, OptionalTree):
            if value is None:
                return
            if spec.inner is None:
                spec.inner = self.build_present(value, at, spec.common_axis)
            else:
                self.merge(spec.inner, value, at)
        elif isinstance(spec, RaggedList):
            self.merge_list(spec, value, at)
        elif isinstance(spec, Leaf):
            self.merge_leaf(spec, value, at)
        elif isinstance(spec, Fixed):
            self.merge_node(spec, value, at)
        elif _nodes.one_level(value) is not None:
            self.problem(at, "a leaf", _describe(value))

    def merge_list(self, spec: RaggedList, value: Any, at: Position) -> None:
        if type(value) is not list:
            self.problem(at, "a list", _describe(value))
            return
        spec.axis.longest = max(spec.axis.longest, len(value))
        element = (*at, (STAR, True))
        for item in value:
            if spec.element is None:
                spec.element = self.build(item, element, None)
            else:
                self.merge(spec.element, item, element)

    def merge_leaf(self, spec: Leaf, value: Any, at: Position) -> None:
        if _nodes.one_level(value) is not None:
            hint = "optional" if value is None else ""
            self.problem(at, _describe_leaf(spec), _describe(value), hint)
            return
        shape = tuple(np.shape(value))
        if spec.axis is None:
            if shape != spec.shape:
                hint = shape[1:] == spec.shape[1:] and len(shape) == len(spec.shape) > 0
                self.problem(at, _describe_leaf(spec), _describe(value), "leading" if hint else "")
            return
        if shape[1:] != spec.shape or not shape:
            self.problem(at, _describe_leaf(spec), _describe(value))
            return
        spec.axis.longest = max(spec.axis.longest, shape[0])

    def merge_node(self, spec: Fixed, value: Any, at: Position) -> None:
        level = _nodes.one_level(value)
        if level is None or not _nodes.same_structure(level[0], spec.treedef):
            want, got = describe_node(spec), _describe(value)
            if level is not None and want == got:  # one class, other static (aux) data
                want, got = _with_static(spec.treedef), _with_static(level[0])
            self.problem(at, want, got, _node_hint(spec, value))
            return
        _, keys, children = level
        for child_spec, key, child in zip(spec.children, keys, children):
            self.merge(child_spec, child, child_position(at, key, value))
        if spec.common_axis is not None and not self.problems:
            check_shared(spec, value, self.record)

    def problem(self, at: Position, want: str, got: str, hint: str = "") -> None:
        where = text(at) or "the root"
        line = f"at {where}: expected {want}, got {got}"
        advice = _HINTS.get(hint, "").format(path=text(at))
        if STAR in where and not hint:
            advice = "every element of a ragged list needs one structure"
        self.problems.append((f"{line} ({advice})" if advice else line, advice))


_HINTS = {
    "list": 'declare ragged=["{path}"] to allow lists of varying length',
    "leading": 'declare ragged=["{path}"] to allow a leading axis of varying length',
    "optional": 'declare optional=["{path}"] to allow None there',
}


def _node_hint(spec: Fixed, value: Any) -> str:
    cls = node_class(spec)
    if value is None or cls is type(None):
        return "optional"
    if cls is list and type(value) is list:
        return "list"
    return ""


def child_position(at: Position, key: Any, parent: Any) -> Position:
    """The position of the child ``key`` of ``parent`` at ``at``."""
    return (*at, (keystr((key,)), type(parent) is list))


def check_shared(spec: Fixed, value: Any, record: int) -> None:
    """The array leaves below a node declared ragged agree on their leading length."""
    lengths: list[tuple[str, int]] = []
    _leading_lengths(spec, value, lengths)
    for path, n in lengths[1:]:
        if n != lengths[0][1]:
            raise SchemaMismatchError(
                f"record {record}: the leaves below {spec.path or 'the root'} share one ragged "
                f"leading axis, but {lengths[0][0]} has length {lengths[0][1]} and {path} has length {n}"
            )


def _leading_lengths(spec: LayoutNode, value: Any, out: list[tuple[str, int]]) -> None:
    if isinstance(spec, Leaf) and spec.axis is not None and np.ndim(value):
        out.append((spec.path, int(np.shape(value)[0])))
    elif isinstance(spec, OptionalTree) and value is not None and spec.inner is not None:
        _leading_lengths(spec.inner, value, out)
    elif isinstance(spec, Fixed):
        level = _nodes.one_level(value)
        for child_spec, child in zip(spec.children, level[2] if level else ()):
            _leading_lengths(child_spec, child, out)


def check_known(spec: LayoutNode) -> None:
    """Every structure is known: no ragged list without any element, no optional subtree
    None everywhere, unless ``like`` showed it."""
    if isinstance(spec, RaggedList | OptionalTree):
        inner = spec.element if isinstance(spec, RaggedList) else spec.inner
        if inner is None:
            what = "an element of the list" if isinstance(spec, RaggedList) else "the subtree"
            raise RaggedDeclarationError(
                f"the structure at {spec.path or 'the root'} is unknown: no record has {what} "
                "there; give like= a record that has one"
            )
        check_known(inner)
    elif isinstance(spec, Fixed):
        for child in spec.children:
            check_known(child)


def check_used(decl: Declarations, spec: LayoutNode, *, known_only: bool = False) -> None:
    """Every declaration named a node, else an error saying why it names nothing; with
    ``known_only``, only those that cannot name a node still unknown (an element of a list or
    an optional subtree no record has shown yet)."""
    for kind, tokens in decl.unused():
        why = why_unused(spec, tokens)
        if why is not None or not known_only:
            why = why or "names a position no record (nor like=) has"
            raise RaggedDeclarationError(f"{kind}= entry {''.join(tokens)!r} {why}")


def why_unused(spec: LayoutNode, tokens: tuple[str, ...]) -> str | None:
    """Why a declared keypath names no node of ``spec``; None when it is below a structure
    still unknown."""
    node, depth = spec, 0
    while depth < len(tokens):
        nxt = _child(node, tokens[depth])
        if nxt is None:
            break
        node, depth = nxt, depth + 1
    done = "".join(tokens[:depth]) or "the root"
    if _unknown(node):
        return None
    if depth < len(tokens) and tokens[depth] == STAR:
        return f"uses [*] under {done}, which is {describe_spec(node)}, not a list"
    if isinstance(node, Leaf | Kept) and depth < len(tokens):
        return f"goes inside the leaf at {done} ({describe_spec(node)}); name a node or a leaf"
    if depth < len(tokens):
        index = isinstance(node, RaggedList) and re.fullmatch(r"\[\d+\]", tokens[depth])
        note = " (write [*], not an index, for the elements of a ragged list)" if index else ""
        return f"names nothing: {done} has no child {tokens[depth]}{note}"
    return f"names {describe_spec(node)} at {done}, which cannot be declared that way"


def _unknown(spec: LayoutNode) -> bool:
    return (isinstance(spec, OptionalTree) and spec.inner is None) or (
        isinstance(spec, RaggedList) and spec.element is None
    )


def _child(spec: LayoutNode, token: str) -> LayoutNode | None:
    if isinstance(spec, OptionalTree):
        spec = spec.inner
    if isinstance(spec, RaggedList):
        return spec.element if token == STAR else None
    if not isinstance(spec, Fixed):
        return None
    for child in spec.children:
        key = child.path[len(spec.path) :]
        if key == token or (token == STAR and node_class(spec) is list):
            return child
    return None


def describe_spec(spec: LayoutNode | None) -> str:
    if isinstance(spec, Leaf):
        return _describe_leaf(spec)
    if isinstance(spec, RaggedList):
        return "a ragged list"
    if isinstance(spec, OptionalTree):
        return f"optional {describe_spec(spec.inner)}"
    if isinstance(spec, Fixed):
        return describe_node(spec)
    return "a leaf" if spec is not None else "unknown"


def describe_node(spec: Fixed) -> str:
    data = spec.treedef.node_data()
    return _describe_class(node_class(spec), data[1] if data else None, len(spec.children))


def _with_static(treedef: Any) -> str:
    """A node described with its static (aux) data, for nodes of one class that differ."""
    data = treedef.node_data()
    aux = repr(data[1]) if data else "()"
    aux = aux if len(aux) <= 120 else aux[:117] + "..."
    name = getattr(data[0], "__name__", data[0]) if data else "node"
    return f"a {name} with static data {aux}"


def _describe_class(cls: Any, aux: Any, n: int) -> str:
    if cls is type(None):
        return "None"
    if cls in (list, tuple):
        return f"a {cls.__name__} of {n}"
    if cls is dict:
        return f"a dict with keys {list(aux)}"
    return f"a {getattr(cls, '__name__', cls)}"


def _describe_leaf(spec: Leaf) -> str:
    if spec.axis is None:
        return _dtypes.describe(spec.dtype, spec.shape)
    return _dtypes.describe(spec.dtype, ("*", *spec.shape))  # type: ignore[arg-type]


def _describe(value: Any) -> str:
    level = _nodes.one_level(value)
    if level is None:
        dtype = _dtypes.value_dtype(value)
        if dtype is None or _prng.is_key(value):
            return f"a leaf of type {type(value).__name__}"
        return _dtypes.describe(dtype, tuple(np.shape(value)))
    data = level[0].node_data()
    return _describe_class(type(value), data[1] if data else None, len(level[2]))


def record_problems(like: Any, record: Any) -> list[tuple[str, str]]:
    """Where ``record`` departs from ``like`` with nothing declared: (line, hint) pairs."""
    walker = Walker(Declarations.none())
    walker.merge(walker.build(like, (), None), record, ())
    return walker.problems


def layout_problems(spec: LayoutNode, record: Any, decl: Declarations) -> list[tuple[str, str]]:
    """Where ``record`` departs from the layout ``spec`` (a ragged store's, declared by
    ``decl``; ``spec`` is not changed): (line, hint) pairs."""
    walker = Walker(decl)
    walker.merge(copy.deepcopy(spec), record, ())
    return walker.problems


def with_hints(
    message: str, problems: Sequence[tuple[str, str]], header: str = "Every differing keypath:"
) -> str:
    """``message`` with the declaration that would accept each of ``problems`` (from
    :func:`record_problems` or :func:`layout_problems`): a line of ``message`` that states
    a problem gains its ``ragged=``/``optional=`` entry, and every problem it does not state
    yet is listed after ``header`` (one with no entry to suggest at a keypath ``message``
    names already is left out: it says the same thing in other words).

    Example:
        >>> import numpy as np
        >>> like, record = {"x": np.zeros(3)}, {"x": np.zeros(4)}
        >>> print(with_hints("at ['x']: expected float64[3], got float64[4].",
        ...                  record_problems(like, record)))
        at ['x']: expected float64[3], got float64[4] (declare ragged=["['x']"] to allow a leading axis of varying length).
    """
    extra = []
    for line, hint in problems:
        bare = line.removesuffix(f" ({hint})") if hint else line
        if bare in message:
            message = message.replace(bare, line, 1)
        elif line not in message and (hint or line.split(": expected", 1)[0] not in message):
            extra.append(f"  {line}")
    return message + (f"\n{header}\n" + "\n".join(extra) if extra else "")


def hinted(
    message: str,
    problems: Callable[[], Sequence[tuple[str, str]]],
    header: str = "Every differing keypath:",
) -> str:
    """:func:`with_hints` of ``problems()``, or ``message`` as it is where the record is too
    far from the layout to walk (the message then says what differs)."""
    try:
        found = problems()
    except (PyTreeStoreError, ValueError, TypeError, IndexError):
        return message
    return with_hints(message, found, header)
