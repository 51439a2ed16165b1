"""Hypothesis strategies for pytreestore: dtypes, leaves, tree structures and records.

A test draws a structure, then records of that structure::

    from hypothesis import given, strategies as st
    from pytreestore.testing import strategies as pts

    @given(st.data())
    def test_roundtrip(data):
        schema = data.draw(pts.tree_schemas())
        xs = data.draw(pts.records(schema, 5))
        store = pytreestore.create(path, schema.like)
        ...

Structures are built from dicts (with odd keys such as ``"a/b"``, ``"é"``, ``""``, or int keys), lists,
tuples, ``None``, and the NamedTuple and ``flax.struct.dataclass`` classes defined below at
module level, so a store written with them can be reopened in another process. Float values
include NaN, infinities and subnormals; compare with :func:`pytreestore.testing.assert_trees_equal`.

This module needs hypothesis; ``import pytreestore`` and ``import pytreestore.testing`` never
import it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pytreestore._format.statics import register_static_codec

__all__ = [
    "DATACLASSES",
    "DTYPES",
    "NAMEDTUPLES",
    "ODD_KEYS",
    "STATIC_VALUES",
    "HashableArray",
    "LeafSpec",
    "Pair",
    "Params",
    "Point",
    "RecordSchema",
    "Single",
    "State",
    "Tagged",
    "Triple",
    "dict_keys",
    "dtypes",
    "int_dict_keys",
    "leaf_specs",
    "leaf_values",
    "records",
    "tree_schemas",
]

# ---- node classes (module level, so stores written with them reopen anywhere) ------------------


class Single(NamedTuple):
    value: Any


class Pair(NamedTuple):
    first: Any
    second: Any


class Triple(NamedTuple):
    x: Any
    y: Any
    z: Any


@flax.struct.dataclass
class Point:
    x: Any


@flax.struct.dataclass
class Params:
    x: Any
    y: Any


@flax.struct.dataclass
class State:
    position: Any
    velocity: Any
    mass: Any


@flax.struct.dataclass
class Tagged:
    """A dataclass with a static (aux) field: records must carry the same ``label``."""

    value: Any
    label: Any = flax.struct.field(pytree_node=False, default="")


class HashableArray:
    """A numpy array as a hashable static value, as MJX keeps its static arrays; stores hold
    it through its static codec (registered below, on import)."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __hash__(self) -> int:
        return hash((self.array.dtype.str, self.array.shape, self.array.tobytes()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HashableArray):
            return NotImplemented
        a, b = self.array, other.array
        return (a.dtype, a.shape) == (b.dtype, b.shape) and a.tobytes() == b.tobytes()

    def __repr__(self) -> str:
        return f"HashableArray({self.array!r})"


register_static_codec(HashableArray, lambda h: h.array, HashableArray)

NAMEDTUPLES: tuple[type, ...] = (Single, Pair, Triple)
DATACLASSES: tuple[type, ...] = (Point, Params, State, Tagged)

#: Dict keys that stress the storage-key escaping.
ODD_KEYS: tuple[str, ...] = (
    "a/b",
    "é",
    ".x",
    "",
    "__y",
    "zarr.json",
    "%",
    "a.b",
    "..",
    "[0]",
    " ",
    "x'y",
    "0",
    "日本",
)

#: Static values a :class:`Tagged` label takes (all JSON-encodable, all equal to themselves),
#: among them bytes and numpy arrays in a :class:`HashableArray` (empty, 0-d, bfloat16).
STATIC_VALUES: tuple[Any, ...] = (
    "",
    "run/1",
    3,
    -1,
    2.5,
    True,
    None,
    ("a", (1, 2)),
    b"\x00b",
    HashableArray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    HashableArray(np.zeros((0, 2), np.float32)),
    (HashableArray(np.array(1.5, ml_dtypes.bfloat16)), "x"),
)

DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(d)
    for d in (
        "float32",
        "int32",
        "bool",
        "int8",
        "int16",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float64",
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e5m2,
        "complex64",
        "complex128",
    )
)
_ML_DTYPES = frozenset(
    np.dtype(d) for d in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
)
_X64 = frozenset(np.dtype(d) for d in ("int64", "uint64", "float64", "complex128"))
_PYTHON_WIDE = {bool: np.bool_, int: np.int64, float: np.float64, complex: np.complex128}


# ---- leaves -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """One leaf: its dtype and per-record shape.

    Attributes:
        dtype: the column's dtype.
        shape: one record's shape.
        python: ``bool``, ``int``, ``float`` or ``complex`` when the leaf is a Python scalar
            (its dtype is then JAX's dtype for it), else None.
    """

    dtype: np.dtype
    shape: tuple[int, ...] = ()
    python: type | None = None

    @classmethod
    def scalar(cls, python: type) -> LeafSpec:
        """The spec of a Python scalar leaf, with the dtype JAX gives it (x64 setting)."""
        return cls(np.dtype(jax.dtypes.canonicalize_dtype(_PYTHON_WIDE[python])), (), python)

    @property
    def needs_x64(self) -> bool:
        """Whether JAX holds this dtype only with x64 enabled (load with ``as_numpy=True``)."""
        return self.dtype in _X64

    def example(self) -> Any:
        """A zero value of this leaf (for ``like=``)."""
        if self.python is not None:
            return self.python(0)
        return np.zeros(self.shape, self.dtype)

    def __repr__(self) -> str:
        if self.python is not None:
            return f"LeafSpec(python {self.python.__name__})"
        return f"LeafSpec({self.dtype.name}[{','.join(map(str, self.shape))}])"


def dtypes(*, x64: bool = True) -> st.SearchStrategy[np.dtype]:
    """Every dtype a column holds; with ``x64=False`` only those JAX holds without x64."""
    return st.sampled_from([d for d in DTYPES if x64 or d not in _X64])


def leaf_specs(
    *,
    dtype_strategy: st.SearchStrategy[np.dtype] | None = None,
    max_dims: int = 2,
    max_side: int = 3,
    python_scalars: bool = True,
) -> st.SearchStrategy[LeafSpec]:
    """Leaf specs: a dtype (from ``dtype_strategy``, default :func:`dtypes`) and a shape of
    up to ``max_dims`` axes (sides may be 0), or a Python scalar."""
    shapes = hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=max_side)
    arrays = st.builds(LeafSpec, dtype_strategy or dtypes(), shapes)
    if not python_scalars:
        return arrays
    scalars = st.sampled_from([int, float, bool, complex]).map(LeafSpec.scalar)
    return st.one_of(arrays, scalars)


def leaf_values(spec: LeafSpec) -> st.SearchStrategy[Any]:
    """Values of one leaf: Python scalars for a Python spec; else numpy arrays of the exact
    dtype and shape (0-d ones sometimes as numpy scalars). Floats include NaN and inf."""
    if spec.python is not None:
        return _python_values(spec)
    if spec.dtype in _ML_DTYPES:
        bits = np.dtype(f"uint{8 * spec.dtype.itemsize}")
        values = hnp.arrays(bits, spec.shape).map(lambda a: a.view(spec.dtype))
    else:
        values = hnp.arrays(spec.dtype, spec.shape)
    if spec.shape != ():
        return values
    return st.tuples(values, st.booleans()).map(lambda p: p[0][()] if p[1] else p[0])


def _python_values(spec: LeafSpec) -> st.SearchStrategy[Any]:
    if spec.python is bool:
        return st.booleans()
    if spec.python is int:
        info = np.iinfo(spec.dtype)
        return st.integers(int(info.min), int(info.max))
    wide = spec.dtype.itemsize == 8 if spec.python is float else spec.dtype.itemsize == 16
    if spec.python is float:  # values the column's float type holds: no overflow on append
        return st.floats(width=64 if wide else 32)
    return st.complex_numbers(width=128 if wide else 64)


# ---- structures ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class RecordSchema:
    """A drawn record structure: a pytree whose leaves are :class:`LeafSpec`.

    Attributes:
        template: the structure, with a :class:`LeafSpec` in place of every leaf.
    """

    template: Any

    @property
    def leaf_specs(self) -> list[LeafSpec]:
        """The leaves' specs, in ``jax.tree_util`` flatten order."""
        return jax.tree_util.tree_leaves(self.template)

    @property
    def like(self) -> Any:
        """An example record (zeros), for ``pytreestore.create(path, like)``."""
        return self.build([s.example() for s in self.leaf_specs])

    @property
    def needs_x64(self) -> bool:
        """Whether some leaf is 64-bit, so loads must use ``as_numpy=True`` to be exact."""
        return any(s.needs_x64 for s in self.leaf_specs)

    def build(self, leaves: Sequence[Any]) -> Any:
        """A record of this structure around ``leaves`` (in flatten order)."""
        return jax.tree_util.tree_structure(self.template).unflatten(leaves)

    def __repr__(self) -> str:
        return f"RecordSchema({self.template!r})"


_CONTAINERS = ("dict", "list", "tuple", "namedtuple", "dataclass")


def dict_keys() -> st.SearchStrategy[str]:
    """Dict keys: mostly odd ones (``"a/b"``, ``"é"``, ``""``, ...), some random text."""
    return st.one_of(st.sampled_from(ODD_KEYS), st.text(max_size=4))


def int_dict_keys() -> st.SearchStrategy[int]:
    """Int dict keys (as ``nnx.State`` and ``nnx.List`` hold): small, negative and huge."""
    return st.one_of(st.integers(-2, 12), st.sampled_from((2**40, -(2**63))))


@st.composite
def tree_schemas(
    draw: st.DrawFn,
    max_depth: int = 4,
    max_leaves: int = 12,
    *,
    min_leaves: int = 1,
    leaves: st.SearchStrategy[LeafSpec] | None = None,
) -> RecordSchema:
    """Random record structures of at most ``max_depth`` levels of nodes and between
    ``min_leaves`` and ``max_leaves`` leaves (a store needs at least one).

    Nodes are dicts, lists, tuples, None, the NamedTuples :data:`NAMEDTUPLES` and the flax
    dataclasses :data:`DATACLASSES`; the root may be a leaf. When too few leaves were drawn,
    the structure is wrapped in a tuple with extra leaves after it.
    """
    specs = leaves if leaves is not None else leaf_specs()
    budget = [max_leaves]
    template = _draw_node(draw, max_depth, budget, specs, root=True)
    missing = min_leaves - (max_leaves - budget[0])
    if missing > 0:
        template = (template, *(draw(specs) for _ in range(missing)))
    return RecordSchema(template)


def _draw_node(
    draw: st.DrawFn, depth: int, budget: list[int], specs: Any, *, root: bool = False
) -> Any:
    ends = ("leaf",) if root else ("leaf", "leaf", "none")
    kinds = (*ends, *(_CONTAINERS if depth > 0 else ()))
    kind = draw(st.sampled_from(kinds))
    if kind == "leaf":
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        return draw(specs)
    if kind == "none":
        return None

    def children(k: int) -> list[Any]:
        return [_draw_node(draw, depth - 1, budget, specs) for _ in range(k)]

    if kind == "dict":
        key = draw(st.sampled_from((dict_keys, dict_keys, int_dict_keys)))
        keys: list[Any] = draw(st.lists(key(), unique=True, max_size=3))
        return dict(zip(keys, children(len(keys))))
    if kind in ("list", "tuple"):
        items = children(draw(st.integers(0, 3)))
        return items if kind == "list" else tuple(items)
    if kind == "namedtuple":
        cls = draw(st.sampled_from(NAMEDTUPLES))
        return cls(*children(len(cls._fields)))
    cls = draw(st.sampled_from(DATACLASSES))
    if cls is Tagged:
        return Tagged(children(1)[0], label=draw(st.sampled_from(STATIC_VALUES)))
    return cls(*children(len(dataclasses.fields(cls))))


# ---- records ------------------------------------------------------------------------------------


def records(schema: RecordSchema, n: int) -> st.SearchStrategy[list[Any]]:
    """Lists of exactly ``n`` records of ``schema``'s structure, with values of each leaf's
    dtype and shape (see :func:`leaf_values`)."""
    one = st.tuples(*(leaf_values(s) for s in schema.leaf_specs)).map(schema.build)
    return st.lists(one, min_size=n, max_size=n)
