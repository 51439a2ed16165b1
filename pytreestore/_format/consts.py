"""Constant leaves: a leaf that holds a function (or other import-path object), not an array.

Some pytrees keep functions as leaves: ``eqx.nn.MLP`` holds ``jax.nn.relu`` in its
``activation`` leaf. Such a leaf has no column. The schema stores it once, as a node
``{"node": "const", "value": <static value>}`` (``value`` is a ``ref``, ``enum`` or
``sentinel`` static value of :mod:`pytreestore._format.values`), every appended record must hold the
very same object there, and every read gives that object back (never batched).

A function is stored by import path (``module:qualname``), and must import back as the same
object; a lambda bound to a module-level name (equinox's ``_identity``) by that name. Lambdas,
closures, local functions and bound methods are refused.

Example:
    >>> import jax
    >>> from pytreestore._format.schema import TreeSchema
    >>> schema = TreeSchema.from_example({"f": jax.nn.relu, "w": 0.0})
    >>> schema.tree["children"][0]
    {'node': 'const', 'value': {'ref': 'jax._src.nn.functions:relu'}}
    >>> schema.paths
    ("['w']",)
    >>> schema.unflatten([1.0])["f"] is jax.nn.relu
    True
"""

from __future__ import annotations

import enum
import sys
from typing import Any

from pytreestore._format import values as _values
from pytreestore.errors import SchemaMismatchError, UnsupportedTreeError

#: the static-value tags a constant leaf may hold: objects that are one object by name
_TAGS = ("ref", "enum", "sentinel")


class Const:
    """A constant leaf of today's tree: ``value``, at keypath ``path`` (``keystr`` form)."""

    __slots__ = ("path", "value")

    def __init__(self, value: Any, path: str) -> None:
        self.value = value
        self.path = path

    def check(self, leaf: Any) -> None:
        """Refuses a record whose leaf here is not the stored object."""
        if leaf is not self.value:
            raise SchemaMismatchError(
                f"record does not match the store schema at {self.path or 'the root'}: "
                f"stored the constant {describe(self.value)}, got {describe(leaf)}. A leaf "
                "that holds a function (not an array) is stored once, in the schema: every "
                "record must hold that same object there."
            )


def describe(value: Any) -> str:
    """A short name for a constant (``jax._src.nn.functions:relu``) or any other leaf."""
    try:
        return _label(encode_value(value))
    except TypeError:
        return f"{type(value).__name__} {value!r:.80}"


def _label(encoded: dict[str, Any]) -> str:
    ((tag, inner),) = encoded.items()
    if tag == "ref":
        return inner
    return f"{inner['type']}.{inner['name']}"


def label(node: dict[str, Any]) -> str:
    """The name of the stored constant of a ``const`` schema node."""
    return _label(node["value"])


def encode_leaf(value: Any, where: str) -> dict[str, Any] | None:
    """The ``const`` node for a leaf that is a function, class, Enum member or module-level
    sentinel; None when ``value`` is none of those (the caller refuses it as a leaf).

    Raises:
        UnsupportedTreeError: ``value`` is a lambda, closure, local function, bound method or
            another callable that cannot be imported back as itself.
    """
    if not (callable(value) or isinstance(value, enum.Enum)):
        return None
    try:
        encoded = encode_value(value)
    except TypeError as err:
        raise UnsupportedTreeError(
            f"leaf at {where} holds {value!r:.80}, which is not an array and cannot be stored "
            f"as a constant: {err}. Leaves that hold functions are stored by import path."
        ) from None
    return {"node": "const", "value": encoded}


def encode_value(value: Any) -> dict[str, Any]:
    """``value`` as a ``ref``/``enum``/``sentinel`` static value; TypeError if it is none."""
    try:
        encoded = _values.encode(value)
    except TypeError:
        name = _module_name(value)
        if name is None:
            raise
        encoded = {"ref": name}  # a lambda bound at module level, e.g. equinox's _identity
    if not (isinstance(encoded, dict) and next(iter(encoded)) in _TAGS):
        raise TypeError(
            f"{value!r:.80} is a {type(value).__name__}, not an object named by import path"
        )
    return encoded


def _module_name(value: Any) -> str | None:
    """``module:name`` under which ``value`` is bound at the top level of its own module."""
    module_name = getattr(value, "__module__", None)
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    if module is None or not callable(value):
        return None
    names = [k for k, v in vars(module).items() if v is value]
    return f"{module_name}:{names[0]}" if names else None


def decode(node: dict[str, Any]) -> Any:
    """The object a ``const`` node names, imported.

    Raises:
        ClassResolutionError: it cannot be imported.
    """
    return _values.decode(node["value"])


__all__ = ["Const", "decode", "describe", "encode_leaf", "encode_value", "label"]
