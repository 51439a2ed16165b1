"""Ragged and optional declarations (``ragged=``, ``optional=``): which lists and leading
axes may vary in length, which subtrees may be None (the layout they give records is
:mod:`pytreestore._tree.layout`).

A declaration is a keypath spelled as :func:`jax.tree_util.keystr` spells it (the store's
column paths, ``.p[0].x``, ``['key']``); ``[*]`` stands for every element of a list.

Example:
    >>> decl = Declarations.parse([".p", ".q[*].x"], None)
    >>> decl.is_ragged(((".q", False), ("[3]", True), (".x", False)))
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

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
