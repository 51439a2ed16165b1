"""A griffe extension: reads pytreestore's docstrings the way the API reference shows them.

The docstrings follow Google style with a singular ``Example:`` section and a few Sphinx
roles (:func:`pytreestore.create`). Griffe's Google parser knows only ``Examples:``, and
Markdown knows no roles, so this turns ``Example:`` into ``Examples:`` (whose ``>>>`` lines
griffe renders as code) and ``:role:`name``` into ```name```. The docstrings themselves stay
as they are: help() and doctest read them too.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:\s*$", re.M)
_ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|exc|obj):`~?([^`]+)`")


class PytreestoreDocstrings(griffe.Extension):
    """Rewrites each docstring as it is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(r"`\1`", text)
