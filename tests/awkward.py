"""Records whose dict keys need escaping (``/``, ``.``, spaces, ``%``, non-ASCII, the empty
string), under every standard dtype: what readers without pytreestore are tried on."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from pytreestore.testing.conformance import dtype_values

N = 5  # records per store


class Point(NamedTuple):
    x: Any
    y: Any


#: (dict key, dtype, leaf shape): every standard dtype zarrita reads, under an awkward key
LEAVES = [
    ("a/b", "int8", ()),
    ("a.b", "int16", (2,)),
    (".hidden", "int32", ()),
    ("a b", "int64", (3,)),
    ("100%", "uint8", ()),
    ("a-b", "uint16", ()),
    ("__x", "uint32", (2,)),
    ("zarr.json", "uint64", ()),
    ("énergie", "float16", (3,)),
    ("日本", "float32", ()),
    ("", "float64", (2, 2)),
    ("ok", "bool", (2,)),
]


def _values(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    size = N * int(np.prod(shape, dtype=int))
    return dtype_values(np.dtype(dtype), size, seed).reshape(N, *shape)


def awkward_records() -> list[Any]:
    """N records whose dict keys need escaping, nested in dicts, a list and a NamedTuple."""
    flat = {name: _values(dtype, shape, i) for i, (name, dtype, shape) in enumerate(LEAVES)}
    inner = {"x.__lock": _values("int8", (), 90), "-": _values("uint64", (2,), 91)}
    point = Point(_values("float32", (2,), 92), _values("int64", (), 93))
    return [
        {
            **{k: v[i] for k, v in flat.items()},
            "nested": {"list": [inner["x.__lock"][i], point._replace(x=point.x[i], y=point.y[i])]},
            "..": {k: v[i] for k, v in inner.items()},
        }
        for i in range(N)
    ]


def ragged_records() -> list[Any]:
    """N records with a ragged list under an awkward key, and an optional subtree."""
    return [
        {
            "hits/é": [{"e": np.int16(i + j), "x y": np.float32(j)} for j in range(i % 3)],
            "calib": None if i % 2 else {"gain": np.float32(i)},
        }
        for i in range(N)
    ]
