"""Every pytree kind of the ecosystem round-trips exactly in a fresh process, or is refused.

The trees are those of JAX's, flax's, optree's, chex's and equinox's tests (see
``tests/peer_trees.py``), written on both backends by this process and read back by one
subprocess that imports the classes afresh.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.schema import TreeSchema
from tests import interpreters, peer_trees
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parent.parent

#: the counts the closing note of issue 11 quotes; a change here is a visible change of support
WORKS, REFUSED = 42, 27


def _fresh_check(root: Path) -> dict[str, str]:
    code = "from tests import peer_trees; peer_trees.main()"
    done = interpreters.run(  # forked (tests/interpreters.py): the classes not imported
        [sys.executable, "-W", "ignore", "-c", code, str(root)],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_peer_trees_round_trip_in_a_fresh_process_or_are_refused(tmp_path):
    outcome = peer_trees.write_all(tmp_path)
    results = _fresh_check(tmp_path)
    works = [n for n, o in outcome.items() if o == "stored"]
    refused = [n for n, o in outcome.items() if o.startswith("refused")]
    assert len(results) == len(works) * len(peer_trees.BACKENDS)
    wrong = {k: v for k, v in results.items() if v != "ok" and not v.startswith("crash")}
    crash = {k: v for k, v in results.items() if v.startswith("crash")}
    assert wrong == {} and crash == {}
    assert (len(works), len(refused)) == (WORKS, REFUSED)


def test_registered_namedtuple_keeps_its_field_order(tmp_path):
    # issue 11: Pair(a=1.5, b=7) was read back as Pair(a=7, b=1.5) by a fresh process
    tree = peer_trees.Pair(a=np.float32(1.5), b=np.int32(7))
    with pytreestore.create(tmp_path / "s", tree) as store:
        store.append(tree)
    assert store.schema.tree["node"] == "custom"
    assert store.schema.tree["keys"] == [{"flat": 0}, {"flat": 1}]
    code = (
        "import pytreestore, sys; from tests import peer_trees; "
        "r = pytreestore.open(sys.argv[1])[0]; "
        "print(type(r).__name__, float(r.a), int(r.b))"
    )
    done = interpreters.run(
        [sys.executable, "-c", code, str(tmp_path / "s")],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout.split() == ["Pair", "1.5", "7"], done.stderr[-2000:]


def test_str_keyed_nodes_are_stored_with_their_keys(tmp_path):
    # issue 11: register_pytree_with_keys with str keys crashed create with a bare TypeError
    tree = peer_trees.AnObject2(np.float32(3), np.int32(4), [4, "foo"])
    store = pytreestore.create(tmp_path / "s", tree)
    assert store.schema.paths == ("x", "y")
    assert [c.key for c in store.schema.columns] == ["x", "y"]
    store.append(tree)
    got = store[0]
    assert (float(got.x), int(got.y), got.z) == (3.0, 4, [4, "foo"])
    store.close()


def test_equinox_static_mismatch_names_the_field(tmp_path):
    store = pytreestore.create(tmp_path / "s", peer_trees._model())
    changed = peer_trees._model()
    changed = jax.tree_util.tree_map(lambda x: x, changed)  # same structure
    store.append(changed)
    other = peer_trees.Block(np.zeros(3, np.float32), np.float32(0), name="other")
    bad = peer_trees.Model(
        blocks=[changed.blocks[0], other],
        head=changed.head,
        scale=changed.scale,
        activation=changed.activation,
        post=changed.post,
        config=peer_trees.Config(1e-2, peer_trees.Color.RED, (2, 3)),
        dtype=changed.dtype,
    )
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.append(bad)
    message = str(info.value)
    assert ".config: stored Config(lr=0.001, color=<Color.BLUE: 'blue'>, sizes=(2, 3)), " in message
    assert "got Config(lr=0.01, color=<Color.RED: 'red'>, sizes=(2, 3))" in message
    assert "\n  .blocks[1].name: stored 'b1', got 'other'\n" in message
    assert len(store) == 1
    store.close()


@pytest.mark.parametrize(
    ("static", "text"),
    [
        (lambda x: x, "is a lambda, which cannot be stored by import path"),
        ({1, 2}, "{1, 2} of type set"),
        (peer_trees.ADataclass(x=(1, 2), y=3), "is a dataclass that is not frozen"),
    ],
    ids=["lambda", "set", "mutable-dataclass"],
)
def test_unstorable_static_values_are_refused_before_writing(tmp_path, static, text):
    tree = peer_trees.WithFunction(np.ones(2, np.float32), static)
    with pytest.raises(errors.UnsupportedTreeError, match="WithFunction at the root has static"):
        pytreestore.create(tmp_path / "s", tree)
    with pytest.raises(errors.UnsupportedTreeError) as info:
        pytreestore.create(tmp_path / "s", tree)
    assert "static field .fn that cannot be stored" in str(info.value)
    assert text in str(info.value)
    assert not (tmp_path / "s").exists()


def test_format_1_registered_namedtuples_read_in_flatten_order_or_refused():
    # format 1 wrote a registered NamedTuple as a plain `namedtuple` node, its columns in the
    # registered flatten's order; a reader must not unflatten them by field order
    schema = TreeSchema.from_example(peer_trees.Pair(np.float32(1.5), np.int32(7))).to_json()
    schema["format_version"] = 1  # a format-2/3 plain namedtuple node binds by field name
    schema["tree"] = {
        "node": "namedtuple",
        "type": "tests.peer_trees:Pair",
        "fields": ["a", "b"],
        "children": [{"node": "leaf"}, {"node": "leaf"}],
    }
    old = TreeSchema.from_json(schema)
    assert old.unflatten([np.int32(7), np.float32(1.5)]) == peer_trees.Pair(1.5, 7)
    schema = TreeSchema.from_example([peer_trees.ATuple2(np.float32(1.5), 3)]).to_json()
    schema["format_version"] = 1
    schema["tree"]["children"][0] = {
        "node": "namedtuple",
        "type": "tests.peer_trees:ATuple2",
        "fields": ["foo", "bar"],
        "children": [{"node": "leaf"}],
    }
    # format 1 kept no static data for it: the node names 2 fields over 1 child, refused
    with pytest.raises(errors.CorruptStoreError, match="child 0 has 1 children but 2 fields"):
        TreeSchema.from_json(schema)
