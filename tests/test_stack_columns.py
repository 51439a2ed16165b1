"""stack(records, ragged=/optional=) column by column (pytreestore._tree.pad_columns, scatter,
split): records walked once into columns, padded by index arithmetic, split back by
unstack; compared exactly with the per-record padding (pytreestore._tree.pad) and with
values written out, and every refusal still the checked path's."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.struct import dataclass
from hypothesis import given, settings
from hypothesis import strategies as st

import pytreestore
from pytreestore import errors
from pytreestore._tree.layout import build_layout
from pytreestore._tree.layout_nodes import Declarations
from pytreestore._tree.pad import Padder, check_pad_to, recall, stack_trees, unpad
from pytreestore.testing import assert_trees_equal


class Hit(NamedTuple):
    x: Any
    y: Any
    k: Any


@dataclass
class Extra:
    w: Any
    c: Any


def per_record(records: list[Any], **declared: Any) -> tuple[Any, Any]:
    """The padded batch and mask as the per-record padding makes them (numpy)."""
    pad_to, trim = check_pad_to(declared.pop("pad_to", None)), declared.pop("trim", False)
    decl = Declarations.parse(declared.get("ragged"), declared.get("optional"))
    spec = build_layout(records, declared.get("like"), decl)
    padder = Padder(spec, pad_to, trim)
    parts = [padder.pad(spec, r, i) for i, r in enumerate(records)]
    return stack_trees([p[0] for p in parts]), stack_trees([p[1] for p in parts])


def per_record_unstack(records: list[Any], **declared: Any) -> list[Any]:
    """The records back from the per-record padding (numpy), as its skeletons give them."""
    pad_to, trim = check_pad_to(declared.pop("pad_to", None)), declared.pop("trim", False)
    decl = Declarations.parse(declared.get("ragged"), declared.get("optional"))
    spec = build_layout(records, declared.get("like"), decl)
    padder = Padder(spec, pad_to, trim)
    parts = [padder.pad(spec, r, i) for i, r in enumerate(records)]
    batch = stack_trees([p[0] for p in parts])
    rows = [jax.tree.map(lambda x, i=i: x[i, ...], batch) for i in range(len(records))]
    return [unpad(spec, p[2], row) for p, row in zip(parts, rows, strict=True)]


def assert_same_kinds(got: Any, want: Any) -> None:
    """One structure, and leaf by leaf the same type (0-d array or numpy scalar) and value."""
    assert_trees_equal(got, want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert type(a) is type(b), (a, b)


def gathered(records: list[Any], **declared: Any) -> tuple[Any, Any]:
    """``stack(..., as_numpy=True)``, asserting that it took the column by column path."""
    batch, mask = pytreestore.stack(records, as_numpy=True, **declared)
    assert recall(mask).gathered is not None, "stack took the per-record path"
    return batch, mask


def assert_same_as_per_record(records: list[Any], **declared: Any) -> tuple[Any, Any]:
    """stack and unstack column by column give what the per-record padding gives."""
    batch, mask = gathered(records, **declared)
    want_batch, want_mask = per_record(records, **dict(declared))
    assert_trees_equal(batch, want_batch)
    assert_trees_equal(mask, want_mask)
    assert_same_kinds(pytreestore.unstack(batch, mask), per_record_unstack(records, **declared))
    return batch, mask


# ---- every kind of structure, values written out --------------------------------------------


def test_fixed_only_records() -> None:
    records = [{"s": np.int32(i), "t": float(i) / 2} for i in range(3)]
    batch, mask = assert_same_as_per_record(records, ragged=True)
    assert batch["s"].tolist() == [0, 1, 2] and batch["s"].dtype == np.int32
    assert batch["t"].tolist() == [0.0, 0.5, 1.0] and batch["t"].dtype == np.float32
    assert mask["s"].tolist() == [True] * 3


def test_a_ragged_list_of_namedtuples_with_empty_lists() -> None:
    records = [
        {"p": [Hit(np.float32(1.5), np.float32(2), np.int32(3))]},
        {"p": []},
        {"p": [Hit(np.float32(4), np.float32(5), np.int32(6))] * 2},
    ]
    batch, mask = assert_same_as_per_record(records, ragged=["['p']"])
    assert isinstance(batch["p"], Hit)
    np.testing.assert_array_equal(batch["p"].x, [[1.5, 0], [0, 0], [4, 4]])
    np.testing.assert_array_equal(batch["p"].k, [[3, 0], [0, 0], [6, 6]])
    np.testing.assert_array_equal(mask["p"].y, [[1, 0], [0, 0], [1, 1]])
    assert batch["p"].k.dtype == np.int32


def test_a_ragged_leading_axis() -> None:
    records = [{"pos": np.arange(6, dtype=np.float32).reshape(3, 2)}, {"pos": np.ones((1, 2))}]
    batch, mask = assert_same_as_per_record(records, ragged=["['pos']"], pad_to=4)
    np.testing.assert_array_equal(
        batch["pos"], [[[0, 1], [2, 3], [4, 5], [0, 0]], [[1, 1], [0, 0], [0, 0], [0, 0]]]
    )
    assert batch["pos"].dtype == np.float32  # float64 values cast to the first record's
    np.testing.assert_array_equal(mask["pos"], [[1, 1, 1, 0], [1, 0, 0, 0]])


def test_an_optional_subtree() -> None:
    records = [
        {"e": None, "s": 1},
        {"e": Extra(np.array([1.0, 2.0], np.float32), np.int32(7)), "s": 2},
        {"e": None, "s": 3},
    ]
    batch, mask = assert_same_as_per_record(records, optional=["['e']"])
    np.testing.assert_array_equal(batch["e"].w, [[0, 0], [1, 2], [0, 0]])
    np.testing.assert_array_equal(batch["e"].c, [0, 7, 0])
    np.testing.assert_array_equal(mask["e"].w, [False, True, False])
    back = pytreestore.unstack(batch, mask)
    assert back[0]["e"] is None and back[1]["e"].c == 7 and back[2]["s"] == 3


def test_nested_ragged_lists_with_optional_elements() -> None:
    records = [
        {"r": [{"ev": [np.int32(1), np.int32(2)], "d": None}, {"ev": [], "d": np.float32(3)}]},
        {"r": []},
        {"r": [{"ev": [np.int32(4)], "d": np.float32(5)}]},
    ]
    declared = {"ragged": ["['r']", "['r'][*]['ev']"], "optional": ["['r'][*]['d']"]}
    batch, mask = assert_same_as_per_record(records, **declared)
    np.testing.assert_array_equal(
        batch["r"]["ev"], [[[1, 2], [0, 0]], [[0, 0]] * 2, [[4, 0], [0, 0]]]
    )
    np.testing.assert_array_equal(
        mask["r"]["ev"], [[[1, 1], [0, 0]], [[0, 0]] * 2, [[1, 0], [0, 0]]]
    )
    np.testing.assert_array_equal(batch["r"]["d"], [[0, 3], [0, 0], [5, 0]])
    np.testing.assert_array_equal(mask["r"]["d"], [[0, 1], [0, 0], [1, 0]])
    back = pytreestore.unstack(batch, mask)
    assert [int(e) for e in back[0]["r"][0]["ev"]] == [1, 2] and back[0]["r"][0]["d"] is None
    assert back[1] == {"r": []} and float(back[2]["r"][0]["d"]) == 5.0


def test_a_node_whose_leaves_share_one_ragged_axis() -> None:
    records = [
        {"a": {"u": np.zeros((2, 3), np.float32), "v": np.arange(2, dtype=np.int32)}},
        {"a": {"u": np.ones((1, 3), np.float32), "v": np.arange(1, dtype=np.int32)}},
    ]
    batch, mask = assert_same_as_per_record(records, ragged=["['a']"])
    np.testing.assert_array_equal(batch["a"]["v"], [[0, 1], [0, 0]])
    np.testing.assert_array_equal(mask["a"]["u"], [[1, 1], [1, 0]])


# ---- values of every kind, cast as a store casts them -----------------------------------------


def test_python_numpy_and_jax_scalars_in_one_column() -> None:
    values = [np.float32(0.5), 2.0, jnp.float32(3.5), 4, np.int8(5), jnp.asarray(6.25)]
    records = [{"p": [Hit(v, np.float32(i), i)]} for i, v in enumerate(values)]
    batch, _ = assert_same_as_per_record(records, ragged=True)
    np.testing.assert_array_equal(batch["p"].x[:, 0], [0.5, 2.0, 3.5, 4.0, 5.0, 6.25])
    assert batch["p"].x.dtype == np.float32 and batch["p"].k.dtype == np.int32
    np.testing.assert_array_equal(batch["p"].k[:, 0], np.arange(6))


def test_narrow_values_are_cast_to_the_first_records_dtype() -> None:
    records = [
        {"p": [np.int32(1)], "a": np.zeros((1, 2), np.float32)},
        {"p": [np.int8(-3), np.int16(300)], "a": np.full((2, 2), 2.5, np.float16)},
    ]
    batch, _ = assert_same_as_per_record(records, ragged=True)
    np.testing.assert_array_equal(batch["p"], [[1, 0], [-3, 300]])
    np.testing.assert_array_equal(batch["a"][1], [[2.5, 2.5], [2.5, 2.5]])
    assert batch["p"].dtype == np.int32 and batch["a"].dtype == np.float32


def test_an_infinity_given_is_kept() -> None:
    records = [{"p": [np.float32(1)]}, {"p": [float("inf"), float("nan")]}]
    batch, _ = assert_same_as_per_record(records, ragged=True)
    assert batch["p"][1, 0] == np.inf and np.isnan(batch["p"][1, 1])


def test_records_of_every_root_and_nesting() -> None:
    assert_same_as_per_record([[1.0, 2.0], [3.0]], ragged=True)
    assert_same_as_per_record([np.ones((2, 3)), np.zeros((1, 3))], ragged=True)
    batch, _ = assert_same_as_per_record(
        [{"p": [1.0]}, {"p": [2.0, 3.0]}], ragged=True, like={"p": [0.0] * 5}
    )
    assert batch["p"].shape == (2, 2)  # like= fixes the structure, the records the lengths
    assert_same_as_per_record(
        [{"d": {"e": None, "f": 1}}, {"d": None}],
        optional=["['d']", "['d']['e']"],
        like={"d": {"e": np.int8(1), "f": 1}},
    )
    assert_same_as_per_record([{"p": [(1, 2.0)], "t": ()}, {"p": [], "t": ()}], ragged=True)
    assert_same_as_per_record([{"p": [(), ()], "x": 1}, {"p": [()], "x": 2}], ragged=True)


def test_jax_batch_unstacks_to_jax_leaves() -> None:
    records = [
        {"p": [Hit(1.0, 2.0, 3)], "pos": np.ones((2, 2), np.float32)},
        {"p": [], "pos": np.ones((0, 2), np.float32)},
    ]
    batch, mask = pytreestore.stack(records, ragged=True)
    back = pytreestore.unstack(batch, mask)
    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(back))
    assert back[1]["p"] == [] and back[1]["pos"].shape == (0, 2)
    assert float(back[0]["p"][0].y) == 2.0 and back[0]["pos"].shape == (2, 2)


# ---- refusals: the checked path's messages ----------------------------------------------------


def test_a_value_that_does_not_fit_is_refused_naming_the_record() -> None:
    records = [{"p": [np.int32(1)]}, {"p": [2, 2**40]}]
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape("record 1 does not match the store schema at ['p'][*]"),
    ):
        pytreestore.stack(records, ragged=True)
    floats = [{"p": [np.float32(1)]}, {"p": [1e300]}]
    with pytest.raises(errors.SchemaMismatchError, match=r"record 1 .* would become infinite"):
        pytreestore.stack(floats, ragged=True)


def test_a_float_in_an_int_column_is_refused() -> None:
    records = [{"p": [np.int32(1)]}, {"p": [np.int32(2)]}, {"p": [np.float32(2.5)]}]
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape(
            "record 2 does not match the store schema at ['p'][*]: expected int32[], got float32[]"
        ),
    ):
        pytreestore.stack(records, ragged=True)


def test_a_departing_element_is_refused_with_its_keypath_and_hint() -> None:
    good = {"p": [Hit(1.0, 2.0, 3)], "e": Extra(np.zeros(2, np.float32), 1)}
    records = [good, good, {"p": [Hit(1.0, 2.0, 3)], "e": None}]
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape(
            "stack() refused record 2: its structure departs from the records before it"
        ),
    ) as info:
        pytreestore.stack(records, ragged=["['p']"])
    assert "declare optional=[\"['e']\"] to allow None there" in str(info.value)
    bad_element = [good, {"p": [Hit(1.0, 2.0, 3), Hit(1.0, (2.0,), 3)], "e": good["e"]}]
    with pytest.raises(errors.SchemaMismatchError, match=re.escape("at ['p'][*].y: expected")):
        pytreestore.stack(bad_element, ragged=["['p']"])


def test_a_leading_axis_of_another_shape_is_refused() -> None:
    records = [{"pos": np.zeros((2, 3), np.float32)}, {"pos": np.zeros((2, 4), np.float32)}]
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape("at ['pos']: expected float32[*,3], got float32[2,4]"),
    ):
        pytreestore.stack(records, ragged=True)


def test_pad_to_below_a_list_is_refused_and_trim_cuts() -> None:
    records = [{"p": [Hit(float(j), 0.0, j) for j in range(n)]} for n in (1, 2, 4)]
    with pytest.raises(
        errors.RaggedLengthError,
        match=re.escape("record 2 has length 4 at ['p'], above the limit 3 of pad_to=3"),
    ):
        pytreestore.stack(records, ragged=True, pad_to=3)
    batch, mask = assert_same_as_per_record(records, ragged=True, pad_to=3, trim=True)
    np.testing.assert_array_equal(batch["p"].x[2], [0, 1, 2])
    assert [len(r["p"]) for r in pytreestore.unstack(batch, mask)] == [1, 2, 3]


def test_trim_cuts_nested_lists_below_cut_elements() -> None:
    records = [
        {"r": [[np.int32(1)], [np.int32(2), np.int32(3), np.int32(4)]]},
        {"r": [[np.int32(5)]]},
    ]
    batch, mask = assert_same_as_per_record(records, ragged=True, pad_to=1, trim=True)
    np.testing.assert_array_equal(batch["r"], [[[1]], [[5]]])
    back = pytreestore.unstack(batch, mask)
    assert [[int(x) for x in e] for e in back[0]["r"]] == [[1]]


# ---- random records: the same as the per-record padding ---------------------------------------


def leaf(draw: st.DrawFn, value: float, dtype: Any) -> Any:
    kind = draw(st.sampled_from(["numpy", "python", "jax", "array"]))
    if kind == "numpy":
        return np.dtype(dtype).type(value)
    if kind == "python":
        return int(value) if np.dtype(dtype).kind == "i" else float(value)
    array = np.asarray(value, dtype)
    return jnp.asarray(array) if kind == "jax" else array


@st.composite
def records(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 5))):
        hits = [
            Hit(
                leaf(draw, draw(st.floats(-9, 9, width=32)), np.float32),
                np.float32(j),
                leaf(draw, draw(st.integers(-99, 99)), np.int32),
            )
            for j in range(draw(st.integers(0, 4)))
        ]
        events = [
            [np.int32(e) for e in draw(st.lists(st.integers(0, 9), max_size=3))]
            for _ in range(draw(st.integers(0, 3)))
        ]
        pos = np.arange(2 * (n := draw(st.integers(0, 4))), dtype=np.float32).reshape(n, 2) + i
        extra = Extra(np.full(2, i, np.float32), np.int32(i)) if draw(st.booleans()) else None
        out.append(
            {"hits": hits, "events": events, "pos": pos, "extra": extra, "step": np.int32(i)}
        )
    return out


LIKE = {
    "hits": [Hit(np.float32(0), np.float32(0), np.int32(0))],
    "events": [[np.int32(0)]],
    "pos": np.zeros((1, 2), np.float32),
    "extra": Extra(np.zeros(2, np.float32), np.int32(0)),
    "step": np.int32(0),
}


@settings(max_examples=40, deadline=None)
@given(records=records(), pad_to=st.sampled_from([None, 2, "pow2", (2, 8)]))
def test_random_records_stack_as_the_per_record_padding(records: list[Any], pad_to: Any) -> None:
    declared = {
        "like": LIKE,
        "ragged": ["['hits']", "['events']", "['events'][*]", "['pos']"],
        "optional": ["['extra']"],
        "pad_to": pad_to,
        "trim": True,
    }
    batch, mask = assert_same_as_per_record(records, **declared)
    back = pytreestore.unstack(batch, mask)
    limit = int(jax.tree.leaves(batch["hits"])[0].shape[1])
    for got, want in zip(back, records, strict=True):
        assert len(got["hits"]) == min(len(want["hits"]), limit)
        for g, w in zip(got["hits"], want["hits"]):
            assert (g.x, g.y, g.k) == (np.float32(w.x), w.y, np.int32(w.k))
        assert (got["extra"] is None) == (want["extra"] is None)
        assert got["step"] == want["step"]


def test_weakly_typed_leaves_unstack_weakly_typed() -> None:
    records = [{"p": [1.5, 2.5], "s": 1}, {"p": [], "s": 2}]
    batch, mask = pytreestore.stack(records, ragged=True)
    assert batch["p"].weak_type and batch["s"].weak_type
    back = pytreestore.unstack(batch, mask)
    assert back[0]["p"][1].weak_type and back[1]["s"].weak_type
    assert float(back[0]["p"][1]) == 2.5 and int(back[1]["s"]) == 2 and back[1]["p"] == []
    assert back[0]["p"][0].dtype == jnp.float32


def test_elements_with_unhashable_static_data() -> None:
    import equinox as eqx

    class Tagged(eqx.Module):
        w: jax.Array
        tags: list = eqx.field(static=True)

    records = [{"p": [Tagged(np.float32(i), ["a"])] * (i + 1)} for i in range(3)]
    batch, mask = assert_same_as_per_record(records, ragged=True)
    np.testing.assert_array_equal(batch["p"].w, [[0, 0, 0], [1, 1, 0], [2, 2, 2]])
    assert [len(r["p"]) for r in pytreestore.unstack(batch, mask)] == [1, 2, 3]
