"""stack(records, ragged=, optional=, pad_to=) and unstack(batch, mask)
(pytreestore._tree.layout_nodes, pytreestore._tree.pad): records whose lists, leading axes and
optional subtrees vary, stacked in memory to a padded batch and its mask, and back."""

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
from pytreestore.testing import assert_trees_equal


@dataclass
class Params:
    x: jax.Array
    y: jax.Array


@dataclass
class AllParams:
    p: list[Params]


@dataclass
class Agents:
    position: jax.Array
    alive: jax.Array


@dataclass
class Disturbance:
    strength: jax.Array


@dataclass
class Region:
    events: list[jax.Array]
    disturbance: Disturbance | None


@dataclass
class World:
    agents: Agents
    regions: list[Region]
    step: jax.Array


class Item(NamedTuple):
    w: Any
    events: list[Any]


def seed_records() -> list[AllParams]:
    return [
        AllParams([Params(4, 2), Params(4, 3)]),
        AllParams([Params(3, 5)]),
        AllParams([Params(3, 2), Params(6, 3), Params(1, 1)]),
    ]


def world(i: int, agents: int, regions: list[tuple[int, bool]]) -> World:
    return World(
        Agents(
            np.arange(agents * 2, dtype=np.float32).reshape(agents, 2) + i,
            np.ones(agents, bool),
        ),
        [
            Region(
                [np.int32(10 * i + e) for e in range(n)],
                Disturbance(np.float32(i + 0.5)) if hit else None,
            )
            for n, hit in regions
        ],
        np.int32(i),
    )


# ---- the seed case --------------------------------------------------------------------------


def test_seed_case_vmaps_with_the_mask_like_a_python_loop() -> None:
    records = seed_records()
    batch, mask = pytreestore.stack(records, ragged=[".p"])
    assert isinstance(batch, AllParams) and isinstance(batch.p, Params)
    assert batch.p.x.shape == (3, 3) and batch.p.x.dtype == np.int32
    np.testing.assert_array_equal(batch.p.x, [[4, 4, 0], [3, 0, 0], [3, 6, 1]])
    np.testing.assert_array_equal(mask.p.y, [[1, 1, 0], [1, 0, 0], [1, 1, 1]])

    def f(params: AllParams, m: AllParams) -> jax.Array:
        return jnp.sum(jnp.where(m.p.x, params.p.x * params.p.y, 0))

    got = jax.jit(jax.vmap(f))(batch, mask)
    want = [sum(q.x * q.y for q in r.p) for r in records]
    np.testing.assert_array_equal(got, want)
    assert pytreestore.unstack(batch, mask)[1].p[0].x == 3


def test_without_declarations_the_mismatch_names_the_declaration() -> None:
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape(
            "at .p: expected a list of 2, got a list of 1 "
            '(declare ragged=[".p"] to allow lists of varying length)'
        ),
    ):
        pytreestore.stack(seed_records())


def test_without_declarations_every_differing_keypath_gets_its_hint() -> None:
    a = world(0, 20, [(1, False), (2, True)])
    b = world(1, 19, [(1, True), (3, True)])
    with pytest.raises(errors.SchemaMismatchError) as info:
        pytreestore.stack([a, b])
    message = str(info.value)
    assert message.startswith("record 1 does not match the store schema:")
    for line in [
        "at .regions[0].disturbance: expected None, got a Disturbance "
        '(declare optional=[".regions[0].disturbance"] to allow None there)',
        "at .regions[1].events: expected a list of 2, got a list of 3 "
        '(declare ragged=[".regions[1].events"] to allow lists of varying length)',
    ]:
        assert line in message
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape(
            "at .agents.position: expected float32[20,2], got float32[19,2] "
            '(declare ragged=[".agents.position"] to allow a leading axis of varying length)'
        ),
    ):
        pytreestore.stack([a, world(1, 19, [(1, False), (2, True)])])


def test_a_hint_under_a_ragged_list_uses_star() -> None:
    a = world(0, 2, [(1, False), (2, True)])
    b = world(1, 2, [(1, True)])
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape(
            "at .regions[*].disturbance: expected None, got a Disturbance "
            '(declare optional=[".regions[*].disturbance"] to allow None there)'
        ),
    ):
        pytreestore.stack([a, b], ragged=[".regions", ".regions[*].events"])


def test_without_declarations_the_batch_is_returned_as_today() -> None:
    batch = pytreestore.stack([{"a": 1.0}, {"a": 2.0}])
    assert isinstance(batch, dict) and batch["a"].tolist() == [1.0, 2.0]


# ---- the read forms -------------------------------------------------------------------------


def test_ragged_leading_axis_is_padded_and_masked() -> None:
    records = [world(0, 3, []), world(1, 1, [])]
    batch, mask = pytreestore.stack(records, ragged=[".agents.position", ".agents.alive"])
    assert batch.agents.position.shape == (2, 3, 2)
    np.testing.assert_array_equal(batch.agents.position[1], [[1, 2], [0, 0], [0, 0]])
    np.testing.assert_array_equal(mask.agents.position, [[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(mask.step, [True, True])
    assert batch.regions == [] and mask.regions == []


def test_a_node_declared_ragged_shares_one_leading_axis() -> None:
    records = [world(0, 3, []), world(1, 2, [])]
    batch, mask = pytreestore.stack(records, ragged=[".agents"])
    assert batch.agents.alive.shape == (2, 3) and batch.agents.position.shape == (2, 3, 2)
    np.testing.assert_array_equal(mask.agents.alive, [[1, 1, 1], [1, 1, 0]])
    bad = world(1, 2, [])
    bad = bad.replace(agents=bad.agents.replace(alive=np.ones(1, bool)))
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape(
            "record 1: the leaves below .agents share one ragged leading axis, but "
            ".agents.position has length 2 and .agents.alive has length 1"
        ),
    ):
        pytreestore.stack([records[0], bad], ragged=[".agents"])


def test_nested_ragged_lists_and_optional_subtrees() -> None:
    records = [world(0, 1, [(1, False), (3, True)]), world(1, 1, [(2, True)])]
    batch, mask = pytreestore.stack(
        records,
        ragged=[".regions", ".regions[*].events"],
        optional=[".regions[*].disturbance"],
    )
    assert isinstance(batch.regions, Region)
    np.testing.assert_array_equal(
        batch.regions.events, [[[0, 0, 0], [0, 1, 2]], [[10, 11, 0], [0, 0, 0]]]
    )
    np.testing.assert_array_equal(
        mask.regions.events, [[[1, 0, 0], [1, 1, 1]], [[1, 1, 0], [0, 0, 0]]]
    )
    np.testing.assert_array_equal(batch.regions.disturbance.strength, [[0, 0.5], [1.5, 0]])
    np.testing.assert_array_equal(mask.regions.disturbance.strength, [[0, 1], [1, 0]])
    back = pytreestore.unstack(batch, mask)
    assert back[0].regions[0].disturbance is None and len(back[0].regions[1].events) == 3
    assert [int(e) for e in back[1].regions[0].events] == [10, 11]


def test_fixed_lists_stay_lists() -> None:
    records = [world(0, 1, [(1, False), (3, False)]), world(1, 1, [(2, False), (0, False)])]
    batch, mask = pytreestore.stack(records, ragged=[".regions[*].events"])
    assert isinstance(batch.regions, list) and len(batch.regions) == 2
    assert [r.events.shape for r in batch.regions] == [(2, 2), (2, 3)]
    np.testing.assert_array_equal(mask.regions[1].events, [[1, 1, 1], [0, 0, 0]])


def test_optional_subtree_is_zero_filled_and_masked_per_record() -> None:
    records = [{"d": None, "k": 1}, {"d": Disturbance(np.float32(2.0)), "k": 2}]
    batch, mask = pytreestore.stack(records, optional=["['d']"], as_numpy=True)
    assert isinstance(batch["d"], Disturbance)
    np.testing.assert_array_equal(batch["d"].strength, [0.0, 2.0])
    np.testing.assert_array_equal(mask["d"].strength, [False, True])
    np.testing.assert_array_equal(mask["k"], [True, True])
    assert pytreestore.unstack(batch, mask)[0]["d"] is None


def test_optional_none_everywhere_takes_its_structure_from_like() -> None:
    records = [{"d": None}, {"d": None}]
    with pytest.raises(
        errors.RaggedDeclarationError,
        match=re.escape(
            "the structure at ['d'] is unknown: no record has the subtree there; "
            "give like= a record that has one"
        ),
    ):
        pytreestore.stack(records, optional=["['d']"])
    like = {"d": Disturbance(np.float32(0))}
    batch, mask = pytreestore.stack(records, optional=["['d']"], like=like)
    assert batch["d"].strength.shape == (2,) and not mask["d"].strength.any()


def test_ragged_true_makes_every_list_and_leading_axis_ragged() -> None:
    records = [
        {"l": [1.0, 2.0], "v": np.arange(3, dtype=np.int16), "s": 1},
        {"l": [], "v": np.arange(1, dtype=np.int16), "s": 2},
    ]
    batch, mask = pytreestore.stack(records, ragged=True, as_numpy=True)
    assert batch["l"].dtype == np.float32 and batch["v"].dtype == np.int16
    np.testing.assert_array_equal(batch["l"], [[1, 2], [0, 0]])
    np.testing.assert_array_equal(mask["v"], [[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(mask["s"], [True, True])
    back = pytreestore.unstack(batch, mask)
    assert back[1]["l"] == [] and back[1]["v"].tolist() == [0]


def test_empty_lists_everywhere_need_like_and_give_zero_length() -> None:
    with pytest.raises(
        errors.RaggedDeclarationError, match=re.escape("the structure at ['p'] is unknown")
    ):
        pytreestore.stack([{"p": []}], ragged=True)
    batch, mask = pytreestore.stack([{"p": []}], ragged=True, like={"p": [Params(1, 2)]})
    assert batch["p"].x.shape == (1, 0) and mask["p"].y.shape == (1, 0)
    batch, mask = pytreestore.stack([], ragged=True, like={"p": [Params(1, 2)]}, pad_to=4)
    assert batch["p"].x.shape == (0, 4) and pytreestore.unstack(batch, mask) == []


def test_namedtuples_and_dicts_are_rebuilt() -> None:
    records = [{"items": [Item(np.float32(1), [np.int32(1)])]}, {"items": []}]
    batch, mask = pytreestore.stack(
        records, ragged=["['items']", "['items'][*].events"], as_numpy=True
    )
    assert isinstance(batch["items"], Item) and isinstance(mask["items"], Item)
    assert batch["items"].events.shape == (2, 1, 1)
    back = pytreestore.unstack(batch, mask)
    assert back[1] == {"items": []} and isinstance(back[0]["items"][0], Item)


# ---- pad_to ----------------------------------------------------------------------------------


def lists(*lengths: int) -> list[dict[str, Any]]:
    return [{"p": [np.float32(j) for j in range(n)]} for n in lengths]


@pytest.mark.parametrize(
    ("pad_to", "size"), [(None, 3), (5, 5), ("pow2", 4), ((2, 4, 8), 4), ([3], 3)]
)
def test_pad_to_variants(pad_to: Any, size: int) -> None:
    batch, mask = pytreestore.stack(lists(3, 1), ragged=True, pad_to=pad_to)
    assert batch["p"].shape == (2, size)
    assert mask["p"].sum() == 4


def test_a_length_above_pad_to_is_refused_unless_truncated() -> None:
    with pytest.raises(
        errors.RaggedLengthError,
        match=re.escape(
            "record 1 has length 3 at ['p'], above the limit 2 of pad_to=(1, 2); raise pad_to, "
            "or pass trim=True"
        ),
    ):
        pytreestore.stack(lists(1, 3), ragged=True, pad_to=[1, 2])
    assert isinstance(errors.RaggedLengthError("x"), ValueError)
    batch, mask = pytreestore.stack(lists(1, 3), ragged=True, pad_to=2, truncate=True)
    np.testing.assert_array_equal(batch["p"], [[0, 0], [0, 1]])
    assert [len(r["p"]) for r in pytreestore.unstack(batch, mask)] == [1, 2]


def test_one_compile_per_bucket() -> None:
    traces = []

    @jax.jit
    def total(batch: Any, mask: Any) -> jax.Array:
        traces.append(batch["p"].shape)
        return jnp.sum(jnp.where(mask["p"], batch["p"], 0), axis=1)

    for lengths in [(1, 2), (3, 4), (4, 0), (5, 2), (8, 7), (6, 1)]:
        got = total(*pytreestore.stack(lists(*lengths), ragged=True, pad_to=[4, 8]))
        np.testing.assert_array_equal(got, [n * (n - 1) / 2 for n in lengths])
    assert traces == [(2, 4), (2, 8)]


# ---- bad input -------------------------------------------------------------------------------


BAD = [
    ({"ragged": [".q"]}, "ragged= entry '.q' names nothing: the root has no child .q"),
    (
        {"ragged": [".p[*][*]"]},
        "ragged= entry '.p[*][*]' uses [*] under .p[*], which is a Params, not a list",
    ),
    (
        {"ragged": [".p", ".p[0].x"]},
        "ragged= entry '.p[0].x' names nothing: .p has no child [0] (write [*], not an index, for the elements of a ragged list)",
    ),
    (
        {"ragged": [".p", ".p[*].x.y"]},
        "ragged= entry '.p[*].x.y' goes inside the leaf at .p[*].x (int32[]); name a node or a leaf",
    ),
    (
        {"ragged": [".p", ".p[*].x"]},
        "ragged= names the leaf at .p[*].x, which is a scalar (int32[]): only an array's leading axis can be ragged",
    ),
    ({"ragged": ".p"}, "ragged= takes a list of keypath strings (or, for ragged=, True), got '.p'"),
    ({"ragged": [".p]"]}, "ragged= entry '.p]' is not a keypath as jax.tree_util.keystr spells it"),
    (
        {"ragged": [".p"], "optional": [""]},
        "optional= entry '' names the record itself, not a subtree position",
    ),
    (
        {"ragged": [".p"], "optional": [".p[*].y[0]"]},
        "optional= entry '.p[*].y[0]' goes inside the leaf at .p[*].y (int32[])",
    ),
    ({"ragged": [".p"], "pad_to": 0}, "pad_to must be positive, got 0"),
    (
        {"ragged": [".p"], "pad_to": 2.0},
        "pad_to takes None, a positive int, 'pow2' or a non-empty sequence of bucket sizes, got 2.0",
    ),
    ({"ragged": [".p"], "pad_to": "pow3"}, "got 'pow3'"),
    (
        {"ragged": [".p"], "pad_to": [4, 2]},
        "pad_to buckets must be sorted, smallest first, without repeats, got [4, 2]",
    ),
    ({"ragged": [".p"], "pad_to": [2, -4]}, "pad_to buckets must be positive ints, got [2, -4]"),
    ({"pad_to": 4}, "pad_to= and trim= apply to records stacked with ragged= or optional="),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD)
def test_bad_input(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.RaggedDeclarationError, match=re.escape(message)):
        pytreestore.stack(seed_records(), **kwargs)


def test_a_ragged_list_of_elements_of_different_structure() -> None:
    records = [AllParams([Params(1, 2), {"x": 1, "y": 2}])]
    with pytest.raises(
        errors.SchemaMismatchError,
        match=re.escape(
            "at .p[*]: expected a Params, got a dict with keys ['x', 'y'] (every element of a "
            "ragged list needs one structure)"
        ),
    ):
        pytreestore.stack(records, ragged=[".p"])


def test_unstack_refuses_a_mask_stack_did_not_make() -> None:
    batch, mask = pytreestore.stack(seed_records(), ragged=[".p"])
    with pytest.raises(errors.SchemaMismatchError, match=re.escape("takes the mask that stack(")):
        pytreestore.unstack(batch, jax.tree.map(jnp.copy, mask))


# ---- round trip ------------------------------------------------------------------------------


def leaf(value: Any, dtype: Any, as_jax: bool) -> Any:
    array = np.asarray(value, dtype)
    return jnp.asarray(array) if as_jax else array


@st.composite
def ragged_records(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        as_jax = draw(st.booleans())
        items = [
            Item(
                leaf(draw(st.floats(-9, 9, width=32)), np.float32, as_jax),
                [
                    leaf(e, np.int32, as_jax)
                    for e in draw(st.lists(st.integers(-99, 99), max_size=5))
                ],
            )
            for _ in range(draw(st.integers(0, 5)))
        ]
        n = draw(st.integers(0, 5))
        position = leaf(np.arange(2 * n).reshape(n, 2) + i, np.float32, as_jax)
        opt = {"z": leaf(i, np.int16, as_jax)} if draw(st.booleans()) else None
        out.append({"items": items, "position": position, "opt": opt})
    return out


LIKE = {
    "items": [Item(np.float32(0), [np.int32(0)])],
    "position": np.zeros((1, 2), np.float32),
    "opt": {"z": np.int16(0)},
}


@settings(max_examples=40, deadline=None)
@given(records=ragged_records(), as_numpy=st.booleans())
def test_unstack_of_stack_gives_back_the_records(records: list[Any], as_numpy: bool) -> None:
    batch, mask = pytreestore.stack(
        records,
        like=LIKE,
        as_numpy=as_numpy,
        ragged=["['items']", "['items'][*].events", "['position']"],
        optional=["['opt']"],
    )
    back = pytreestore.unstack(batch, mask)
    assert len(back) == len(records)
    for got, want in zip(back, records):
        assert_trees_equal(got, want)
    kind = (np.ndarray, np.generic) if as_numpy else jax.Array
    assert all(isinstance(x, kind) for x in jax.tree.leaves(back))


# ---- adversarial review: regressions ----------------------------------------------------------


def test_unstack_refuses_a_batch_whose_shapes_differ_from_the_masks() -> None:
    one = [{"a": [np.float32(1)] * n} for n in (0, 1, 2)]
    other = [{"a": [np.float32(2)] * n} for n in (1, 2, 3)]
    batch, mask = pytreestore.stack(one, ragged=True)
    other_batch, other_mask = pytreestore.stack(other, ragged=True)
    # a batch cut narrower than the mask's lists: jax clamps indices, so this read padding
    with pytest.raises(errors.SchemaMismatchError, match="leaf shapes"):
        pytreestore.unstack({"a": batch["a"][:, :1]}, mask)
    # masks swapped between two batches of different padded lengths
    with pytest.raises(errors.SchemaMismatchError, match="leaf shapes"):
        pytreestore.unstack(batch, other_mask)
    with pytest.raises(errors.SchemaMismatchError, match="leaf shapes"):
        pytreestore.unstack(other_batch, mask)
    # the very batch that came with the mask is fine
    assert [len(r["a"]) for r in pytreestore.unstack(batch, mask)] == [0, 1, 2]


@pytest.mark.parametrize("as_numpy", [False, True])
def test_unstack_refuses_another_batch_of_the_same_shapes(as_numpy: bool) -> None:
    one = [{"a": [np.float32(1)] * n} for n in (0, 1, 2)]
    other = [{"a": [np.float32(2)] * n} for n in (2, 0, 1)]
    batch, mask = pytreestore.stack(one, ragged=True, as_numpy=as_numpy)
    other_batch, other_mask = pytreestore.stack(other, ragged=True, as_numpy=as_numpy)
    assert np.shape(batch["a"]) == np.shape(other_batch["a"])
    # swapped between two batches of equal padded shape: the padding would read as values
    with pytest.raises(errors.SchemaMismatchError, match="unchanged"):
        pytreestore.unstack(other_batch, mask)
    with pytest.raises(errors.SchemaMismatchError, match="unchanged"):
        pytreestore.unstack({"a": batch["a"] + 1}, mask)
    assert [len(r["a"]) for r in pytreestore.unstack(other_batch, other_mask)] == [2, 0, 1]


@pytest.mark.parametrize("value", [jnp.sin, "label"])
def test_a_list_of_constant_leaves_round_trips(value: Any) -> None:
    records = [{"f": [value, value]}, {"f": [value]}]
    batch, mask = pytreestore.stack(records, ragged=True)
    assert pytreestore.unstack(batch, mask) == records


def test_records_without_any_leaf_are_refused_by_stack_not_by_unstack() -> None:
    with pytest.raises(errors.SchemaMismatchError, match="no leaf"):
        pytreestore.stack([{"a": [None, None]}, {"a": [None]}], ragged=True)


@pytest.mark.parametrize("where", ["list", "fixed"])
def test_prng_keys_are_refused_clearly(where: str) -> None:
    key = jax.random.key(0)
    records = [{"k": [key, key]}, {"k": []}] if where == "list" else [{"k": key, "d": None}]
    with pytest.raises(errors.SchemaMismatchError, match="key_data"):
        pytreestore.stack(records, ragged=True, optional=["['d']"] if where == "fixed" else None)


@pytest.mark.parametrize("ragged", [None, True])
def test_64_bit_values_outside_the_jax_dtype_are_refused_not_wrapped(ragged: Any) -> None:
    records = [{"a": np.array([1, 2**40])}]
    with pytest.raises(errors.SchemaMismatchError, match="as_numpy=True"):
        pytreestore.stack(records, ragged=ragged)
    with pytest.raises(errors.SchemaMismatchError, match="as_numpy=True"):
        pytreestore.stack([{"a": np.array([1e300])}], ragged=ragged)
    out = pytreestore.stack(records, ragged=ragged, as_numpy=True)
    batch = out[0] if ragged else out
    assert batch["a"].tolist() == [[1, 2**40]]
    fits = pytreestore.stack([{"a": np.array([1, 2])}], ragged=ragged)
    assert (fits[0] if ragged else fits)["a"].tolist() == [[1, 2]]


def test_elements_of_one_class_with_other_static_data_say_so() -> None:
    import equinox as eqx

    class Tagged(eqx.Module):
        w: jax.Array
        tag: str = eqx.field(static=True)

    records = [{"p": [Tagged(jnp.ones(2), "a"), Tagged(jnp.ones(2), "b")]}]
    with pytest.raises(errors.SchemaMismatchError, match="with static data") as info:
        pytreestore.stack(records, ragged=True)
    assert "'a'" in str(info.value) and "'b'" in str(info.value)
    assert "expected a Tagged, got a Tagged" not in str(info.value)


def test_trim_is_the_read_option_and_truncate_its_old_name():
    """``trim=`` cuts lists longer than ``pad_to``; ``truncate=`` (its old name) still does,
    and the two together must agree."""
    recs = lists(1, 3)
    want, want_mask = pytreestore.stack(recs, ragged=True, pad_to=2, trim=True, as_numpy=True)
    got, got_mask = pytreestore.stack(recs, ragged=True, pad_to=2, truncate=True, as_numpy=True)
    assert_trees_equal(got, want)
    assert_trees_equal(got_mask, want_mask)
    assert jax.tree.leaves(want)[0].shape[1] == 2
    with pytest.raises(errors.ArgumentError, match=re.escape("truncate= is the old name of trim=")):
        pytreestore.stack(recs, ragged=True, pad_to=2, trim=True, truncate=False)
