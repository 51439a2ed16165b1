"""A class is recorded by ``module:qualname`` only where that name imports as the class itself
(issue 28, defect 3): a name that imports as another class would bring records back as that
class, silently. pickle refuses such a class; so does every path that records one: create,
a ragged store learning a structure (append, extend, write_fragment), and static values and
constant leaves. A name that imports as nothing (a class made in a function) is kept: its
readers get a ClassResolutionError and pass ``like=``.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from tests import clashing_names as cn

#: (id, a record whose node is of a class that imports as another one, its keypath, name)
NODES = [
    ("namedtuple", lambda i: {"p": cn.PointAlias(np.float32(i), np.int32(i))}, "['p']", "Point"),
    ("register_dataclass", lambda i: [cn.WeightsAlias(np.float32(i))], "[0]", "Weights"),
    ("flax-struct", lambda i: {"b": cn.BoxAlias(np.float32(i))}, "['b']", "Box"),
    ("equinox-module", lambda i: cn.LinearAlias(np.float32(i)), "the root", "Linear"),
    ("registered-custom", lambda i: {"c": cn.CustomAlias(np.float32(i))}, "['c']", "Custom"),
]
STATIC = [
    ("static-class", cn.WeightsAlias, "Weights"),
    ("static-enum-member", cn.ModeAlias.TRAIN, "Mode"),
    ("static-function", cn.relu_alias, "relu"),
]


def _assert_names(err: BaseException, where: str, name: str) -> None:
    text = str(err)
    assert f"at {where}" in text and f"tests.clashing_names:{name}" in text, text


@pytest.mark.parametrize(
    ("make", "where", "name"), [p[1:] for p in NODES], ids=[p[0] for p in NODES]
)
def test_create_refuses_a_node_class_named_as_another(tmp_path: Path, backend, make, where, name):
    with pytest.raises(errors.UnsupportedTreeError) as caught:
        pytreestore.create(tmp_path / "s", make(0), backend=backend)
    _assert_names(caught.value, where, name)
    assert "gives another object" in str(caught.value) and "unique name" in str(caught.value)
    assert not (tmp_path / "s").exists()
    with pytest.raises(pickle.PicklingError, match="not the same object"):  # pickle agrees
        pickle.dumps(make(0))


def test_the_message_says_how_to_fix_it(tmp_path: Path) -> None:
    with pytest.raises(errors.UnsupportedTreeError) as caught:
        pytreestore.create(tmp_path / "s", {"p": cn.PointAlias(np.float32(0), np.int32(0))})
    assert str(caught.value) == (
        "the Point node at ['p'] would be recorded as tests.clashing_names:Point, but "
        "importing tests.clashing_names:Point gives another object (<class "
        "'tests.clashing_names.Point'>), so the store would read its records back as that "
        "(pickle refuses this class for the same reason). Give the class a unique name: it "
        "is bound as tests.clashing_names.PointAlias, so make it under that name "
        "(collections.namedtuple('PointAlias', ...)) or set PointAlias.__qualname__ = "
        "'PointAlias'."
    )


@pytest.mark.parametrize(("value", "name"), [p[1:] for p in STATIC], ids=[p[0] for p in STATIC])
def test_static_values_and_constants_named_as_another(tmp_path: Path, value, name) -> None:
    with pytest.raises(errors.UnsupportedTreeError, match="is not importable as") as caught:
        pytreestore.create(tmp_path / "s", cn.WithStatic(np.float32(0), value))
    assert f"tests.clashing_names:{name}" in str(caught.value)
    if name == "Mode":  # an Enum member is named by its class: no other name to use
        with pytest.raises(errors.UnsupportedTreeError, match=f"clashing_names:{name}"):
            pytreestore.create(tmp_path / "c", {"f": value, "x": np.float32(0)})
        return
    # a function or class leaf is stored by the module-level name it is bound to
    with pytreestore.create(tmp_path / "c", {"f": value, "x": np.float32(0)}) as store:
        store.append({"f": value, "x": np.float32(1)})
    assert pytreestore.open(tmp_path / "c")[0]["f"] is value


def test_classes_that_import_as_themselves_round_trip(tmp_path: Path) -> None:
    record = {
        "p": cn.Point(np.float32(1), np.int32(2)),
        "w": cn.Weights(np.float32(3)),
        "b": cn.Box(np.float32(4)),
        "l": cn.Linear(np.float32(5)),
        "s": cn.WithStatic(np.float32(6), cn.Mode.TRAIN),
    }
    with pytreestore.create(tmp_path / "s", record) as store:
        store.append(record)
    got = pytreestore.open(tmp_path / "s")[0]
    assert type(got["p"]) is cn.Point and type(got["w"]) is cn.Weights
    assert type(got["b"]) is cn.Box and type(got["l"]) is cn.Linear
    assert got["s"].static is cn.Mode.TRAIN and float(got["l"].w) == 5.0


def test_a_record_of_the_alias_is_refused_with_the_reason(tmp_path: Path, backend: str) -> None:
    store = pytreestore.create(
        tmp_path / "s", {"p": cn.Point(np.float32(0), np.int32(0))}, backend=backend
    )
    store.append({"p": cn.Point(np.float32(1), np.int32(1))})
    with pytest.raises(errors.SchemaMismatchError) as caught:
        store.append({"p": cn.PointAlias(np.float32(2), np.int32(2))})
    _assert_names(caught.value, "['p']", "Point")
    store.close()
    got = pytreestore.open(tmp_path / "s", backend=backend)
    assert len(got) == 1 and type(got[0]["p"]) is cn.Point


def _ragged(i: int, alias: bool) -> dict[str, Any]:
    cls = cn.PointAlias if alias else cn.Point
    return {"x": np.int32(i), "p": None if i < 2 else cls(np.float32(i), np.int32(i))}


def test_a_ragged_store_refuses_to_learn_an_alias(tmp_path: Path, backend: str) -> None:
    path = tmp_path / "s"
    store = pytreestore.create(path, _ragged(0, False), optional=["['p']"], backend=backend)
    store.extend(_ragged(i, True) for i in range(2))
    store.flush()
    for write in (
        lambda: store.append(_ragged(2, True)),
        lambda: store.extend(_ragged(i, True) for i in range(2, 4)),
        lambda: pytreestore.write_fragment(path, [_ragged(2, True)], backend=backend),
    ):
        with pytest.raises(errors.UnsupportedTreeError) as caught:
            write()
        _assert_names(caught.value, "['p']", "Point")
    assert store.schema.pending == ("['p']",)
    store.extend(_ragged(i, False) for i in range(2, 4))  # the right class is learnt
    store.close()
    got = pytreestore.open(path, backend=backend)
    assert len(got) == 4 and got[1]["p"] is None and type(got[3]["p"]) is cn.Point
    assert int(got[3]["p"].y) == 3


def test_reading_with_like_or_stacking_an_alias_records_nothing(tmp_path: Path) -> None:
    xs = [{"p": cn.Point(np.float32(i), np.int32(i))} for i in range(3)]
    with pytreestore.create(tmp_path / "s", xs[0]) as store:
        store.extend(xs)
    like = {"p": cn.PointAlias(np.float32(0), np.int32(0))}
    got = pytreestore.open(tmp_path / "s", like=like)[2]
    assert type(got["p"]) is cn.PointAlias and int(got["p"].y) == 2
    stacked = pytreestore.stack([like, like], as_numpy=True)
    assert type(stacked["p"]) is cn.PointAlias and stacked["p"].x.shape == (2,)


def test_a_class_after_a_reload_is_refused(tmp_path: Path, monkeypatch) -> None:
    old = cn.Point(np.float32(0), np.int32(0))

    class Point(NamedTuple):  # what importlib.reload leaves in the module
        x: Any
        y: Any

    Point.__module__, Point.__qualname__ = cn.__name__, "Point"
    monkeypatch.setattr(cn, "Point", Point)
    with pytest.raises(errors.UnsupportedTreeError, match=re.escape("unique name (qualname)")):
        pytreestore.create(tmp_path / "s", {"p": old})
    with pytreestore.create(tmp_path / "s", {"p": Point(np.float32(0), np.int32(0))}) as s:
        s.append({"p": Point(np.float32(1), np.int32(1))})
    assert type(pytreestore.open(tmp_path / "s")[0]["p"]) is Point


def test_local_classes_and_unimportable_names_are_kept(tmp_path: Path) -> None:
    class Local(NamedTuple):
        x: Any

    for cls, name in [(Local, "Local"), (cn.made_in_a_function(), "NowhereToBeFound")]:
        path = tmp_path / name
        with pytreestore.create(path, {"n": cls(np.float32(0))}) as store:
            store.append({"n": cls(np.float32(7))})
        with pytest.raises(errors.ClassResolutionError, match=f"{name}.*like="):
            pytreestore.open(path)[0]
        got = pytreestore.open(path, like={"n": cls(np.float32(0))})[0]
        assert type(got["n"]) is cls and float(got["n"].x) == 7.0
