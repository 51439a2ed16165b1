"""The row fill of one schema, generated as straight-line Python: the hot path of ``append``.

A loop over a record's leaves pays, per leaf, the loop, a tuple of the column's facts to
unpack and the checks; the floor of an append (a flatten and one numpy assignment per leaf)
pays only the assignment. :func:`compile_fill` writes, once per column layout, a function with
one line per column: the leaf's type tested against the types the column takes as they are
(its Python scalar types and numpy scalar type; or an array of its dtype and shape), then
assigned. Any other leaf goes to ``slow(column, leaf, row)`` (the casting rule, a device
array, an error). The code is built from column numbers only, never from names found in a
store, as :mod:`dataclasses` builds its methods.

Columns past :data:`MAX_COLUMNS` get no generated code (its cost would grow with the width);
the caller loops instead.

Example:
    >>> import numpy as np
    >>> buf = np.zeros(2, np.int32)
    >>> make = compile_fill([(frozenset({int}), np.dtype("int32"), ())], "demo")
    >>> fill = make([buf], lambda column, leaf, row: None, None)
    >>> fill([7], 1); buf
    array([0, 7], dtype=int32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: the widest record given generated code
MAX_COLUMNS = 256

#: what a column takes as it is: (exact types, dtype or None, per-record shape)
Facts = tuple[frozenset | set, np.dtype | None, tuple[int, ...]]
Fill = Callable[[Sequence[Any], int], None]
Slow = Callable[[int, Any, int], None]
Keep = Callable[[tuple[int, int, Any]], None]


def compile_fill(
    facts: Sequence[Facts], name: str, device: set[type] | None = None
) -> Callable[[Sequence[np.ndarray], Slow, Keep | None], Fill] | None:
    """A factory ``make(buffers, slow, keep) -> fill(leaves, row)`` for columns of ``facts``
    (None past :data:`MAX_COLUMNS`, or for no column); ``name`` labels the generated code in
    tracebacks. With ``device`` (a set of ``jax.Array`` classes, which may grow), a leaf of
    one of those classes with the column's dtype and shape is given to ``keep((row, column,
    leaf))`` instead of being assigned."""
    count = len(facts)
    if not 0 < count <= MAX_COLUMNS:
        return None
    names = ", ".join(f"v{i}" for i in range(count))
    body = [f"    {names}, = leaves"]
    for i, (_, dtype, _) in enumerate(facts):
        test = f"type(v{i}) in E{i}"
        if dtype is not None:
            test += f" or (type(v{i}) is ndarray and v{i}.dtype is D{i} and v{i}.shape == S{i})"
        body += [f"    if {test}:", f"        B{i}[row] = v{i}"]
        if device is not None and dtype is not None:
            body += [
                f"    elif type(v{i}) in DEVICE and v{i}.aval.dtype == D{i}"
                f" and v{i}.aval.shape == S{i}:",
                f"        keep((row, {i}, v{i}))",
            ]
        body += ["    else:", f"        slow({i}, v{i}, row)"]
    buffers = ", ".join(f"B{i}" for i in range(count))
    source = "\n".join(
        [
            f"def make({buffers}, slow, keep):",
            "    def fill(leaves, row):",
            *("    " + line for line in body),
            "    return fill",
        ]
    )
    scope: dict[str, Any] = {"ndarray": np.ndarray, "DEVICE": device}
    for i, (exact, dtype, shape) in enumerate(facts):
        scope[f"E{i}"], scope[f"D{i}"], scope[f"S{i}"] = frozenset(exact), dtype, shape
    code = compile(source, f"<pytreestore fill of {name}>", "exec")
    exec(code, scope)
    factory = scope["make"]

    def make(buffers: Sequence[np.ndarray], slow: Slow, keep: Keep | None = None) -> Fill:
        return factory(*buffers, slow, keep)

    return make


__all__ = ["MAX_COLUMNS", "compile_fill"]
