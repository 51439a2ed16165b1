"""Telling a backend's optional capabilities (the ``runtime_checkable`` Protocols of
:mod:`pytreestore.backends._base`) fast and right: :func:`capable`.

Example:
    >>> from pytreestore.backends import BatchedReads
    >>> class Plain:
    ...     def read_many(self, requests, records): ...
    >>> capable(Plain(), BatchedReads), capable(object(), BatchedReads)
    (True, False)
"""

from __future__ import annotations

from typing import Any, TypeGuard, TypeVar

_C = TypeVar("_C")

#: whether a backend of each class chain (a wrapper's class, then what it wraps: see
#: :func:`capable`) has each capability: ``isinstance`` of a runtime Protocol checks every
#: member by name (about 60 us), once per chain here
_CAPABLE: dict[tuple[type, ...], bool] = {}


def capable(backend: Any, capability: type[_C]) -> TypeGuard[_C]:
    """Whether ``backend`` is ``capability`` (a ``runtime_checkable`` Protocol of the backend contract), told
    once per class. A wrapper (a class with an ``inner`` property, such as the packed
    columns' backend) answers as what it wraps does, so the answer is kept per chain of
    classes, not per the wrapper's class alone.

    """
    chain: list[type] = [capability]
    seen = backend
    while True:
        chain.append(type(seen))
        if not isinstance(getattr(type(seen), "inner", None), property):
            break
        seen = seen.inner
    key = tuple(chain)
    known = _CAPABLE.get(key)
    if known is None:
        known = _CAPABLE[key] = isinstance(backend, capability)
    return known


__all__ = ["capable"]
