"""The declaration that would accept a record a store or ``stack()`` refuses: each differing
keypath of a refusal with its ``ragged=``/``optional=`` entry (from the walk of
:class:`~pytreestore._tree.layout.Walker`), so that every refusal names the fix.

Example:
    >>> print(record_problems({"x": [1.0]}, {"x": [1.0, 2.0]})[0][1])
    declare ragged=["['x']"] to allow lists of varying length
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from pytreestore._tree.layout import LayoutNode, Walker
from pytreestore._tree.ragged import Declarations
from pytreestore.errors import PyTreeStoreError


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
