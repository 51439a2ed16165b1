"""The pytrees other projects test with, rebuilt here (their test modules are not imported).

Each case is a tree and what ``create`` must do with it: store it (and a fresh process must read
it back exactly), or refuse it with an error whose message contains the given text. Sources:
JAX ``tests/tree_util_test.py`` (TREES, TREES_WITH_KEYPATH and their node classes), flax
``tests/struct_test.py``, optree ``tests/helpers.py`` (its TREES; optree-only registrations are
leaves to JAX), chex, equinox and penzai. Python ints and floats become int32 and float32 leaves;
strings are not leaves a store can hold.

:func:`main`, run in a fresh process that imports this module (``python -c "from tests import
peer_trees; peer_trees.main()" DIR``), checks every store that :func:`write_all` wrote below
``DIR`` and prints one JSON object: case and backend to "ok" or what differed.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import chex
import equinox as eqx
import jax
import numpy as np
import optree
from flax import struct
from jax.tree_util import (
    GetAttrKey,
    keystr,
    register_dataclass,
    register_pytree_node,
    register_pytree_node_class,
    register_pytree_with_keys,
    register_pytree_with_keys_class,
    register_static,
    tree_flatten_with_path,
    tree_structure,
)
from penzai import pz

import pytreestore
from pytreestore import errors

# ---- JAX tests/tree_util_test.py ----------------------------------------------------------------
from pytreestore._format import dtypes as _dtypes
from pytreestore._format import dtypes as _prng

ATuple = collections.namedtuple("ATuple", ("foo", "bar"))


class ANamedTupleSubclass(ATuple):
    pass


# a NamedTuple registered with its own flatten: one field a child, the other static
ATuple2 = collections.namedtuple("ATuple2", ("foo", "bar"))
register_pytree_node(ATuple2, lambda t: ((t.foo,), t.bar), lambda bar, kids: ATuple2(kids[0], bar))


class Pair(NamedTuple):
    """The issue's case: a registered flatten that swaps the fields."""

    a: Any
    b: Any


register_pytree_node(Pair, lambda p: ((p.b, p.a), None), lambda _, kids: Pair(kids[1], kids[0]))


class AnObject:
    def __init__(self, x: Any, y: Any, z: Any) -> None:
        self.x, self.y, self.z = x, y, z


register_pytree_node(AnObject, lambda o: ((o.x, o.y), o.z), lambda z, xy: AnObject(*xy, z))


class AnObject2(AnObject):
    pass


# plain str keys, as JAX's test registers them
register_pytree_with_keys(
    AnObject2, lambda o: ((("x", o.x), ("y", o.y)), o.z), lambda z, xy: AnObject2(*xy, z)
)


class IntKeyed:
    """Children keyed by plain ints and a FlattenedIndexKey-free mix."""

    def __init__(self, first: Any, second: Any) -> None:
        self.first, self.second = first, second


register_pytree_with_keys(
    IntKeyed,
    lambda o: (((0, o.first), (jax.tree_util.DictKey(("k", 1)), o.second)), None),
    lambda _, kids: IntKeyed(*kids),
)


@register_pytree_node_class
class Special:
    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y

    def tree_flatten(self) -> tuple[tuple[Any, Any], None]:
        return (self.x, self.y), None

    @classmethod
    def tree_unflatten(cls, aux: Any, children: Any) -> Special:
        return cls(*children)


@register_pytree_with_keys_class
class SpecialWithKeys(Special):
    def tree_flatten_with_keys(self) -> tuple[Any, None]:
        return ((GetAttrKey("x"), self.x), (GetAttrKey("y"), self.y)), None


@register_pytree_node_class
class FlatCache:
    """Keeps its own treedef as static data (which a store cannot hold)."""

    def __init__(self, structured: Any, *, leaves: Any = None, treedef: Any = None) -> None:
        if treedef is None:
            leaves, treedef = jax.tree_util.tree_flatten(structured)
        self.leaves, self.treedef = leaves, treedef

    def tree_flatten(self) -> tuple[Any, Any]:
        return self.leaves, self.treedef

    @classmethod
    def tree_unflatten(cls, treedef: Any, leaves: Any) -> FlatCache:
        return cls(None, leaves=list(leaves), treedef=treedef)


@register_static
class StaticInt(int):
    pass


@register_static
class StaticTuple(tuple):
    pass


@register_static
class StaticDict(dict):
    pass


@register_static
@dataclasses.dataclass
class BlackBox:
    value: int

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BlackBox)


@register_dataclass
@dataclasses.dataclass
class ADataclass:
    x: tuple[int, int]
    y: int


@register_dataclass
@dataclasses.dataclass
class ADataclassWithMeta:
    x: tuple[int, int]
    y: int
    z: int = dataclasses.field(metadata={"static": True})


# ---- flax tests/struct_test.py, and kw_only / generic flax dataclasses -------------------------


@struct.dataclass
class Point:
    x: float
    y: float
    meta: Any = struct.field(pytree_node=False)


@struct.dataclass
class GenericDataClass:
    value: Any
    meta: Any = struct.field(pytree_node=False)


class NodeSubclass(struct.PyTreeNode):
    a: int


@struct.dataclass(kw_only=True)
class KwOnly:
    a: float
    b: float = 0.0
    name: str = struct.field(pytree_node=False, default="kw")
    count: Any = struct.field(pytree_node=False, default=np.int16(7))  # a numpy scalar


T = TypeVar("T")


class GenericNode(struct.PyTreeNode, Generic[T]):
    value: T
    tag: str = struct.field(pytree_node=False, default="g")


# ---- chex ----------------------------------------------------------------------------------------


@chex.dataclass
class ChexState:
    params: Any
    step: Any


@chex.dataclass(frozen=True)
class ChexFrozen:
    w: Any


# ---- equinox and static values -------------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Config:
    lr: float
    color: Color
    sizes: tuple[int, ...]


def scale_by_two(x: Any) -> Any:
    return x * 2


class Block(eqx.Module):
    w: Any
    b: Any
    name: str = eqx.field(static=True)


class Model(eqx.Module):
    blocks: list[Block]
    head: eqx.nn.Linear
    scale: Any
    activation: Callable = eqx.field(static=True)
    post: Callable = eqx.field(static=True)
    config: Config = eqx.field(static=True)
    dtype: Any = eqx.field(static=True)


class WithFunction(eqx.Module):
    w: Any
    fn: Callable = eqx.field(static=True)


class FunctionLeaf(eqx.Module):
    """A Module holding a function as a leaf (not a static field), as eqx.nn.MLP does."""

    w: Any
    fn: Callable


def _key(i: int) -> Any:
    return jax.random.key(i)


def _model() -> Model:
    blocks = [Block(np.full(3, i, np.float32), np.float32(i), name=f"b{i}") for i in range(2)]
    return Model(
        blocks=blocks,
        head=eqx.nn.Linear(3, 2, key=_key(0)),
        scale=np.float32(0.5),
        activation=jax.nn.relu,
        post=scale_by_two,
        config=Config(1e-3, Color.BLUE, (2, 3)),
        dtype=np.dtype("bfloat16"),
    )


def _mlp() -> eqx.nn.MLP:
    return eqx.nn.MLP(2, 2, 4, 2, key=_key(1))


def _mlp_relu_sigmoid() -> eqx.nn.MLP:
    return eqx.nn.MLP(
        3, 2, 5, 1, activation=jax.nn.relu, final_activation=jax.nn.sigmoid, key=_key(5)
    )


def _local_function() -> WithFunction:
    def double(x: Any) -> Any:
        return x * 2

    return WithFunction(np.ones(2, np.float32), double)


def _local_function_leaf() -> FunctionLeaf:
    def double(x: Any) -> Any:
        return x * 2

    return FunctionLeaf(np.ones(2, np.float32), double)


# ---- optree tests/helpers.py (JAX sees optree-only registrations as leaves) --------------------

CustomTuple = collections.namedtuple("CustomTuple", ("foo", "bar"))


class EmptyTuple(NamedTuple):
    pass


class Vector3D:
    def __init__(self, x: Any, y: Any, z: Any) -> None:
        self.x, self.y, self.z = x, y, z


optree.register_pytree_node(
    Vector3D,
    lambda o: ((o.x, o.y), o.z),
    lambda z, xy: Vector3D(*xy, z),
    namespace="pytreestore-tests",
)


class Vector2D:
    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y


# the same class registered with JAX as well: then it is a JAX pytree and is stored
register_pytree_node(Vector2D, lambda o: ((o.x, o.y), None), lambda _, xy: Vector2D(*xy))
optree.register_pytree_node(
    Vector2D,
    lambda o: ((o.x, o.y), None),
    lambda _, xy: Vector2D(*xy),
    namespace="pytreestore-tests",
)

# ---- penzai (its Structs register with JAX; a Parameter is a mutable variable, not a pytree) ----


def _named(shape: tuple[int, ...], *names: str) -> Any:
    data = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return pz.nx.wrap(data).tag(*names)


def _penzai_linear() -> Any:
    return pz.nn.Linear(
        weights=_named((3, 2), "i", "o"), in_axis_names=("i",), out_axis_names=("o",)
    )


def _penzai_with_parameter() -> Any:
    return pz.nn.Linear.from_config(
        name="lin", init_base_rng=_key(6), input_axes={"i": 3}, output_axes={"o": 2}
    )


# ---- the cases -----------------------------------------------------------------------------------

NO_LEAVES = (errors.SchemaMismatchError, "the example record has no leaves")
STR_LEAF = (errors.UnsupportedTreeError, "unsupported leaf at")


def _refused_static(cls: str) -> tuple[type, str]:
    return (errors.UnsupportedTreeError, f"{cls} at the root has static (aux) data that cannot be")


#: name -> (tree factory, None when it must round-trip, else (error class, message part))
CASES: dict[str, tuple[Callable[[], Any], tuple[type, str] | None]] = {
    # JAX TREES and TREES_WITH_KEYPATH
    "jax/none": (lambda: None, NO_LEAVES),
    "jax/tuple-of-none": (lambda: (None,), NO_LEAVES),
    "jax/empty-tuple": (lambda: (), NO_LEAVES),
    "jax/list-of-empty-tuple": (lambda: [()], NO_LEAVES),
    "jax/pair": (lambda: (1, 2), None),
    "jax/pair-with-zero": (lambda: (1, 0), None),
    "jax/str-leaves": (lambda: ((1, "foo"), ["bar", (3, None, 7)]), STR_LEAF),
    "jax/numeric-nesting": (lambda: ((1, 2.5), [4, (3, None, 7)]), None),
    "jax/list": (lambda: [3], None),
    "jax/namedtuples": (
        lambda: [3, ATuple(foo=(3, ATuple(foo=3, bar=None)), bar={"baz": 34})],
        None,
    ),
    "jax/anobject": (lambda: [AnObject(3, None, [4, "foo"])], None),
    "jax/anobject2-str-keys": (lambda: [AnObject2(3, None, [4, "foo"])], None),
    "jax/int-and-tuple-keys": (lambda: IntKeyed(np.int8(1), np.float32(2)), None),
    "jax/special": (lambda: Special(2, 3.0), None),
    "jax/special-with-keys": (lambda: SpecialWithKeys(2, 3.0), None),
    "jax/dict": (lambda: {"a": 1, "b": 2}, None),
    "jax/dict-with-zero": (lambda: {"a": 1, "b": 0}, None),
    "jax/static-int": (lambda: StaticInt(1), _refused_static("StaticInt")),
    "jax/static-tuple": (lambda: StaticTuple((2, 3)), _refused_static("StaticTuple")),
    "jax/static-dict": (lambda: StaticDict(foo=4, bar=5), _refused_static("StaticDict")),
    "jax/dataclass": (lambda: ADataclass(x=(1, 2), y=3), None),
    "jax/dataclass-with-meta": (lambda: ADataclassWithMeta(x=(1, 2), y=3, z=4), None),
    "jax/ordered-dict": (
        lambda: collections.OrderedDict([("foo", 34), ("baz", 101), ("something", -42)]),
        None,
    ),
    "jax/defaultdict": (
        lambda: collections.defaultdict(dict, [("foo", 34), ("baz", 101)]),
        (errors.UnsupportedTreeError, "defaultdict at the root cannot be stored"),
    ),
    "jax/namedtuple-subclass-str": (lambda: ANamedTupleSubclass(foo="hello", bar=3.5), STR_LEAF),
    "jax/namedtuple-subclass": (lambda: ANamedTupleSubclass(foo=1, bar=3.5), None),
    "jax/registered-namedtuple-static-field": (lambda: [ATuple2(foo=1.5, bar=3)], None),
    "jax/registered-namedtuple-swapped": (lambda: Pair(a=1.5, b=7), None),
    "jax/flat-cache-none": (lambda: FlatCache(None), _refused_static("FlatCache")),
    "jax/flat-cache-leaf": (lambda: FlatCache(1), _refused_static("FlatCache")),
    "jax/flat-cache-tree": (lambda: FlatCache({"a": [1, 2]}), _refused_static("FlatCache")),
    "jax/black-box": (
        lambda: BlackBox(value=2),
        (errors.UnsupportedTreeError, "is a dataclass that is not frozen"),
    ),
    # flax struct_test.py
    "flax/point": (lambda: Point(x=1, y=2, meta={"abc": True}), None),
    "flax/point-empty-meta": (lambda: Point(x=1.0, y=2.0, meta={}), None),
    "flax/nested-generic": (
        lambda: GenericDataClass(
            value=GenericDataClass(value=Point(x=1, y=2, meta={}), meta={}), meta={}
        ),
        None,
    ),
    "flax/pytree-node-subclass": (lambda: NodeSubclass(a=1), None),
    "flax/kw-only": (lambda: KwOnly(a=1.0, name="k"), None),
    "flax/generic": (lambda: GenericNode(value=np.arange(3, dtype=np.int16)), None),
    # chex
    "chex/dataclass": (lambda: ChexState(params={"w": np.ones(2, np.float32)}, step=3), None),
    "chex/frozen": (lambda: ChexFrozen(w=np.float32(1)), None),
    # equinox
    "equinox/linear": (lambda: eqx.nn.Linear(3, 2, key=_key(2)), None),
    "equinox/model": (_model, None),
    # MLP keeps jax.nn.relu and equinox's module-level _identity lambda as leaves: constants
    "equinox/mlp": (_mlp, None),
    "equinox/mlp-relu-sigmoid": (_mlp_relu_sigmoid, None),
    "equinox/function-leaf": (lambda: FunctionLeaf(np.ones(2, np.float32), scale_by_two), None),
    "equinox/class-and-enum-leaves": (
        lambda: FunctionLeaf(np.zeros(1, np.int8), (Config, Color.RED)),
        None,
    ),
    "equinox/lambda-leaf": (
        lambda: FunctionLeaf(np.ones(2, np.float32), lambda x: x),
        (errors.UnsupportedTreeError, "leaf at .fn holds <function"),
    ),
    "equinox/local-function-leaf": (
        _local_function_leaf,
        (errors.UnsupportedTreeError, "is a local or unnamed object, which cannot be stored"),
    ),
    "equinox/mlp-arrays": (lambda: eqx.filter(_mlp(), eqx.is_array), None),
    "equinox/static-lambda": (
        lambda: WithFunction(np.ones(2, np.float32), lambda x: x),
        (errors.UnsupportedTreeError, "static field .fn that cannot be stored: <function"),
    ),
    "equinox/static-local-function": (
        _local_function,
        (errors.UnsupportedTreeError, "is a local or unnamed object, which cannot be stored"),
    ),
    # optree helpers.py TREES
    "optree/leaf": (lambda: 1, None),
    "optree/none-in-tuple": (lambda: (1, None), None),
    "optree/empty-list": (lambda: [], NO_LEAVES),
    "optree/empty-namedtuple": (lambda: EmptyTuple(), NO_LEAVES),
    "optree/custom-tuple": (
        lambda: [3, CustomTuple(foo=(3, CustomTuple(foo=3, bar=None)), bar={"baz": 34})],
        None,
    ),
    "optree/struct-time": (lambda: time.struct_time(tuple(range(1, 10))), STR_LEAF),
    "optree/float-info": (lambda: sys.float_info, STR_LEAF),
    "optree/optree-only-node": (lambda: [Vector3D(3, None, [4, "foo"])], STR_LEAF),
    "optree/registered-with-jax-too": (lambda: Vector2D(2, 3.0), None),
    "optree/empty-dict": (lambda: {}, NO_LEAVES),
    "optree/nested-dict": (
        lambda: {"b": (2, 3), "a": 1, "c": None, "d": {"f": 4, "e": None}},
        None,
    ),
    "optree/deque": (lambda: collections.deque([None, 2, 3]), STR_LEAF),
    "optree/defaultdict": (
        lambda: collections.defaultdict(int),
        (errors.UnsupportedTreeError, "defaultdict at the root cannot be stored"),
    ),
    # penzai
    "penzai/named-array": (lambda: _named((2, 3), "a", "b"), None),
    "penzai/linear": (_penzai_linear, None),
    "penzai/sequential": (
        lambda: pz.nn.Sequential([_penzai_linear(), pz.nn.Elementwise(jax.nn.relu)]),
        None,
    ),
    "penzai/with-parameter": (
        _penzai_with_parameter,
        (errors.UnsupportedTreeError, "unsupported leaf at .weights: Parameter"),
    ),
    # typed PRNG keys
    "jax/prng-keys": (
        lambda: {
            "key": _key(3),
            "keys": jax.random.split(_key(4), 3),
            "rbg": jax.random.key(5, impl="rbg"),
        },
        None,
    ),
}

BACKENDS = ("tensorstore", "zarr")


def write_all(root: Path) -> dict[str, str]:
    """Creates a store per case and backend below ``root``; returns case -> outcome.

    The outcome is ``"stored"`` or ``"refused: <message>"``; a case that neither stores nor
    raises the expected error raises AssertionError.
    """
    outcome: dict[str, str] = {}
    for name, (make, refusal) in CASES.items():
        for backend in BACKENDS:
            path = root / backend / name.replace("/", "-")
            tree = make()
            if refusal is None:
                with pytreestore.create(path, tree, backend=backend) as store:
                    store.append(tree)
                outcome[name] = "stored"
                continue
            cls, text = refusal
            try:
                pytreestore.create(path, tree, backend=backend).close()
            except cls as err:
                assert text in str(err), f"{name}: {err}"
                assert not path.exists() or not any(path.iterdir()), f"{name}: wrote {path}"
                outcome[name] = f"refused: {err}"
                continue
            raise AssertionError(f"{name}: create accepted a tree it must refuse")
    return outcome


def check_all(root: Path) -> dict[str, str]:
    """Reads back every stored case in this (fresh) process; case/backend -> "ok" or the diff."""
    results = {}
    for name, (make, refusal) in CASES.items():
        if refusal is not None:
            continue
        for backend in BACKENDS:
            path = root / backend / name.replace("/", "-")
            try:
                results[f"{name}/{backend}"] = _check(path, backend, make())
            except Exception as err:  # reported to the parent, which fails the test
                results[f"{name}/{backend}"] = f"crash: {type(err).__name__}: {err}"
    return results


def _check(path: Path, backend: str, want: Any) -> str:
    store = pytreestore.open(path, backend=backend)
    got = store[0]
    if tree_structure(got) != tree_structure(want):
        return f"wrong structure: {tree_structure(got)} != {tree_structure(want)}"
    got_flat, want_flat = tree_flatten_with_path(got)[0], tree_flatten_with_path(want)[0]
    if [keystr(p) for p, _ in got_flat] != [keystr(p) for p, _ in want_flat]:
        return f"wrong keypaths: {[keystr(p) for p, _ in got_flat]}"
    for (p, g), (_, w) in zip(got_flat, want_flat):
        problem = _leaf_problem(g, w)
        if problem:
            return f"wrong leaf at {keystr(p)}: {problem}"
    store.close()
    with pytreestore.open(path, mode="a", backend=backend) as appender:
        appender.append(want)  # today's record matches the stored treedef
    return "ok"


def _leaf_problem(got: Any, want: Any) -> str:
    if _prng.is_key(want):
        if not _prng.is_key(got) or _prng.impl_of(got) != _prng.impl_of(want):
            return f"expected a {_prng.impl_of(want)} key, got {got!r}"
        got, want = jax.random.key_data(got), jax.random.key_data(want)
    dtype = _dtypes.value_dtype(want)
    if dtype is None:  # a constant leaf (a function, a class, an Enum member): the same object
        return "" if got is want else f"expected the object {want!r}, got {got!r}"
    got_np = np.asarray(got)
    if got_np.dtype != dtype:
        return f"dtype {got_np.dtype}, expected {dtype}"
    if not np.array_equal(got_np, np.asarray(want, dtype), equal_nan=True):
        return f"value {got_np!r}, expected {want!r}"
    return ""


def main() -> None:
    """Prints :func:`check_all` of ``sys.argv[1]`` as JSON (run in a fresh process)."""
    print(json.dumps(check_all(Path(sys.argv[1]))))
