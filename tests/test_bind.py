"""Stored nodes bound to today's classes by field name, in a fresh process per class version.

Each case writes a store with one version of a module's classes and reads it in a new process
whose module of the same name defines the next version (see tests/class_change.py).
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.class_change import Case, run_cases

FLAX_AB = """
@struct.dataclass
class C:
    a: np.ndarray
    b: np.ndarray
"""
FLAX_BA = """
@struct.dataclass
class C:
    b: np.ndarray
    a: np.ndarray
"""
RECORD_AB = "m.C(a=np.float32(i + 0.5), b=np.int32(10 + i))"
APPEND_AND_LOAD = """
store = pytreestore.open(path, "a", backend=backend)
store.append(m.C(b=np.int32(99), a=np.float32(7.5)))
store.close()
result = plain(pytreestore.open(path, backend=backend)[-1])
"""
TRY_APPEND = """
store = pytreestore.open(path, "a", backend=backend)
try:
    store.append(RECORD)
finally:
    store.close()
"""

CASES = {
    # the cases
    "swapped": Case(FLAX_AB, FLAX_BA, RECORD_AB),
    "swapped_append": Case(FLAX_AB, FLAX_BA, RECORD_AB, read=APPEND_AND_LOAD),
    "renamed": Case(
        FLAX_AB,
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            c: np.ndarray
        """,
        RECORD_AB,
    ),
    "added_default": Case(
        FLAX_AB,
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            b: np.ndarray
            c: np.ndarray = struct.field(default_factory=lambda: np.float32(2.5))
        """,
        RECORD_AB,
        read="""
store = pytreestore.open(path, backend=backend)
result = [plain(store.load(as_numpy=True)), plain(store.load(1, as_numpy=True)),
          plain(store[0:2]), plain(store.load(columns=".a", as_numpy=True)),
          [plain(r) for r in store.records(as_numpy=True)][2]]
""",
    ),
    "added_default_append": Case(
        FLAX_AB,
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            b: np.ndarray
            c: np.ndarray = 0
        """,
        RECORD_AB,
        read=TRY_APPEND.replace("RECORD", "m.C(np.float32(1), np.int32(2), np.int32(3))"),
    ),
    "added_no_default": Case(
        FLAX_AB,
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            b: np.ndarray
            c: np.ndarray
        """,
        RECORD_AB,
    ),
    "added_static": Case(
        FLAX_AB,
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            b: np.ndarray
            tag: str = struct.field(pytree_node=False, default="t")
        """,
        RECORD_AB,
    ),
    "added_static_no_default": Case(
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            tag: str = struct.field(pytree_node=False, default="t")
        """,
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            mode: str = struct.field(pytree_node=False)
            tag: str = struct.field(pytree_node=False, default="t")
        """,
        "m.C(a=np.float32(i), tag='x')",
    ),
    "static_reordered": Case(
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            tag: str = struct.field(pytree_node=False, default="t")
            n: int = struct.field(pytree_node=False, default=0)
        """,
        """
        @struct.dataclass
        class C:
            n: int = struct.field(pytree_node=False, default=0)
            a: np.ndarray = 0
            tag: str = struct.field(pytree_node=False, default="t")
        """,
        "m.C(a=np.float32(i), tag='x', n=5)",
    ),
    "static_changed_on_append": Case(
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            tag: str = struct.field(pytree_node=False, default="t")
        """,
        """
        @struct.dataclass
        class C:
            a: np.ndarray
            tag: str = struct.field(pytree_node=False, default="t")
        """,
        "m.C(a=np.float32(i))",
        read=TRY_APPEND.replace("RECORD", "m.C(a=np.float32(1), tag='other')"),
    ),
    "removed": Case(FLAX_AB, "@struct.dataclass\nclass C:\n    b: np.ndarray\n", RECORD_AB),
    "removed_append": Case(
        FLAX_AB,
        "@struct.dataclass\nclass C:\n    b: np.ndarray\n",
        RECORD_AB,
        read=TRY_APPEND.replace("RECORD", "m.C(b=np.int32(1))"),
    ),
    # other node kinds
    "register_dataclass_swapped": Case(
        """
        @dataclasses.dataclass
        class C:
            a: np.ndarray
            b: np.ndarray
            m: str = "x"
        jax.tree_util.register_dataclass(C, data_fields=["a", "b"], meta_fields=["m"])
        """,
        """
        @dataclasses.dataclass
        class C:
            b: np.ndarray
            a: np.ndarray
            extra: int = 4
            m: str = "x"
        jax.tree_util.register_dataclass(C, data_fields=["b", "a"], meta_fields=["extra", "m"])
        """,
        "m.C(a=np.float32(i + 0.5), b=np.int32(10 + i), m='y')",
    ),
    "namedtuple_swapped_and_added": Case(
        "class C(typing.NamedTuple):\n    a: np.ndarray\n    b: np.ndarray\n",
        "class C(typing.NamedTuple):\n    b: np.ndarray\n    a: np.ndarray\n"
        "    c: np.ndarray = np.int8(3)\n",
        RECORD_AB,
    ),
    "custom_flatten_changed": Case(
        """
        class C:
            def __init__(self, a, b):
                self.a, self.b = a, b
        jax.tree_util.register_pytree_with_keys(
            C,
            lambda c: (((jax.tree_util.GetAttrKey("a"), c.a), (jax.tree_util.GetAttrKey("b"), c.b)), None),
            lambda aux, ch: C(*ch),
        )
        """,
        """
        class C:
            def __init__(self, a, b):
                self.a, self.b = a, b
        jax.tree_util.register_pytree_with_keys(
            C,
            lambda c: (((jax.tree_util.GetAttrKey("b"), c.b), (jax.tree_util.GetAttrKey("a"), c.a)), "v2"),
            lambda aux, ch: C(ch[1], ch[0]),
        )
        """,
        "m.C(np.float32(i), np.int32(i))",
    ),
    "kind_changed": Case(FLAX_AB, "C = dict\n", RECORD_AB),
    "two_nodes_differ": Case(
        FLAX_AB + "\n@struct.dataclass\nclass D:\n    x: np.ndarray\n",
        FLAX_AB.replace("b: np.ndarray", "c: np.ndarray")
        + "\n@struct.dataclass\nclass D:\n    y: np.ndarray\n",
        "{'p': m.C(a=np.float32(i), b=np.int32(i)), 'q': m.D(x=np.float32(i))}",
    ),
    "unchanged": Case(FLAX_AB, FLAX_AB, RECORD_AB),
}
if importlib.util.find_spec("chex") is not None:  # chex is in the test extra with equinox
    CASES["chex_swapped_and_added"] = Case(
        "import chex\n@chex.dataclass\nclass C:\n    a: np.ndarray\n    b: np.ndarray\n",
        "import chex\n@chex.dataclass\nclass C:\n    b: np.ndarray\n    a: np.ndarray\n"
        "    c: np.ndarray = np.float32(1)\n",
        RECORD_AB,
    )


@pytest.fixture(scope="module", params=["tensorstore", "zarr"])
def outcomes(request, tmp_path_factory):
    return run_cases(tmp_path_factory.mktemp(request.param), request.param, CASES)


def value(dtype, v):
    return {"dtype": dtype, "value": v}


A = [value("float32", [0.5, 1.5, 2.5])]
B = [value("int32", [10, 11, 12])]


def test_no_case_crashes(outcomes):
    crashes = {k: v for k, v in outcomes.items() if "crash" in v}
    assert not crashes


def test_swapped_fields_load_by_name(outcomes):
    got = outcomes["swapped"]["result"]
    assert got == {"__class__": "C", "b": B[0], "a": A[0]}


def test_swapped_fields_append_by_name(outcomes):
    got = outcomes["swapped_append"]["result"]
    assert got == {"__class__": "C", "b": value("int32", 99), "a": value("float32", 7.5)}


def test_renamed_field_lists_both_and_suggests_rename(outcomes):
    out = outcomes["renamed"]
    assert out["error"] == "SchemaMismatchError"
    assert "fields ['c'] that the store lacks" in out["message"]
    assert "Fields ['b'] are stored but not in the class" in out["message"]
    assert "store.evolve(rename={'.b': '.c'})" in out["message"]


def test_added_field_with_default_is_filled(outcomes):
    full, one, jax_slice, some, third = outcomes["added_default"]["result"]
    c3 = value("float32", [2.5, 2.5, 2.5])
    assert full == {"__class__": "C", "a": A[0], "b": B[0], "c": c3}
    assert one == {"__class__": "C", "a": value("float32", 1.5), "b": value("int32", 11),
                   "c": value("float32", 2.5)}  # fmt: skip
    assert jax_slice["c"] == value("float32", [2.5, 2.5])
    assert some == {"__class__": "C", "a": A[0], "b": None, "c": c3}
    assert third["c"] == value("float32", 2.5)


def test_append_with_a_field_the_store_lacks_is_refused(outcomes):
    out = outcomes["added_default_append"]
    assert out["error"] == "SchemaMismatchError"
    assert "today's classes have fields ['.c'] that the store lacks" in out["message"]
    assert "store.evolve(add={'.c': <default>})" in out["message"]


def test_added_field_without_default(outcomes):
    out = outcomes["added_no_default"]
    assert out["error"] == "SchemaMismatchError"
    assert "C has fields ['c'] that the store lacks and that have no default" in out["message"]
    assert "store.evolve(add={'.c': <default>})" in out["message"]


def test_added_static_field_with_default(outcomes):
    got = outcomes["added_static"]["result"]
    assert got == {"__class__": "C", "a": A[0], "b": B[0], "tag": "t"}


def test_added_static_field_without_default(outcomes):
    out = outcomes["added_static_no_default"]
    assert out["error"] == "SchemaMismatchError"
    assert ".mode: static field added to C since the store was written" in out["message"]


def test_static_fields_bind_by_name(outcomes):
    got = outcomes["static_reordered"]["result"]
    assert got == {"__class__": "C", "n": 5, "a": value("float32", [0.0, 1.0, 2.0]), "tag": "x"}


def test_static_value_mismatch_names_the_field(outcomes):
    out = outcomes["static_changed_on_append"]
    assert out["error"] == "SchemaMismatchError"
    assert ".tag: stored 't', got 'other'" in out["message"]


def test_removed_field_is_left_out(outcomes):
    assert outcomes["removed"]["result"] == {"__class__": "C", "b": B[0]}


def test_append_without_a_stored_column_is_refused(outcomes):
    out = outcomes["removed_append"]
    assert out["error"] == "SchemaMismatchError"
    assert "the store has columns ['.a'] that today's classes no longer have" in out["message"]
    assert "store.evolve(drop=['.a'])" in out["message"]


def test_register_dataclass_binds_by_name(outcomes):
    got = outcomes["register_dataclass_swapped"]["result"]
    assert got == {"__class__": "C", "b": B[0], "a": A[0], "extra": 4, "m": "y"}


def test_namedtuple_binds_by_name(outcomes):
    got = outcomes["namedtuple_swapped_and_added"]["result"]
    assert got == {"__class__": "C", "b": B[0], "a": A[0], "c": value("int8", [3, 3, 3])}


def test_custom_flatten_changed(outcomes):
    out = outcomes["custom_flatten_changed"]
    assert out["error"] == "SchemaMismatchError"
    assert "C children: stored ['a', 'b'], today's flatten gives ['b', 'a']" in out["message"]


def test_node_kind_changed(outcomes):
    out = outcomes["kind_changed"]
    assert out["error"] == "SchemaMismatchError"
    assert (
        "the root: stored as a custom node of class cc_kind_changed:C, but today dict is a "
        "built-in container (the node kind changed)"
    ) in out["message"]


def test_every_differing_keypath_is_listed(outcomes):
    message = outcomes["two_nodes_differ"]["message"]
    assert "\n  ['p']: C has fields ['c']" in message
    assert "\n  ['q']: D has fields ['y']" in message


def test_unchanged_classes(outcomes):
    assert outcomes["unchanged"]["result"] == {"__class__": "C", "a": A[0], "b": B[0]}


def test_chex_dataclass_binds_by_name(outcomes):
    if "chex_swapped_and_added" not in outcomes:
        pytest.skip("chex is not installed")
    got = outcomes["chex_swapped_and_added"]["result"]
    assert got == {"__class__": "C", "b": B[0], "a": A[0], "c": value("float32", [1.0] * 3)}
