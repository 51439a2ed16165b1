"""TreeStore.evolve and pytreestore.evolve: atomic, metadata-only schema changes."""

from __future__ import annotations

import json
import re
import shutil

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format import validate as _validate
from tests.class_change import Case, run_cases
from tests.data import make_golden
from tests.faults import fail_root_writes

FLAX_AB = """
@struct.dataclass
class C:
    a: np.ndarray
    b: np.ndarray
"""
RECORD_AB = "m.C(a=np.float32(i + 0.5), b=np.int32(10 + i))"

CASES = {
    "add": Case(
        FLAX_AB,
        FLAX_AB + "    c: np.ndarray\n",
        RECORD_AB,
        read="""
pytreestore.evolve(path, add={".c": np.int16(7)}, backend=backend)
store = pytreestore.open(path, "a", backend=backend)
store.append(m.C(a=np.float32(9), b=np.int32(9), c=np.int16(1)))
store.close()
result = plain(pytreestore.open(path, backend=backend).load(as_numpy=True))
""",
    ),
    "rename": Case(
        FLAX_AB,
        FLAX_AB.replace("b: np.ndarray", "c: np.ndarray"),
        RECORD_AB,
        read="""
pytreestore.evolve(path, rename={".b": ".c"}, backend=backend)
store = pytreestore.open(path, "a", backend=backend)
store.append(m.C(a=np.float32(9), c=np.int32(99)))
store.close()
result = plain(pytreestore.open(path, backend=backend)[1:])
""",
    ),
    "drop": Case(
        FLAX_AB,
        "@struct.dataclass\nclass C:\n    b: np.ndarray\n",
        RECORD_AB,
        read="""
import os
store = pytreestore.open(path, "a", backend=backend)
store.evolve(drop=[".a"])
store.append(m.C(b=np.int32(99)))
store.close()
store = pytreestore.open(path, backend=backend)
result = [plain(store.load(as_numpy=True)), os.path.exists(path + "/a/zarr.json"),
          [c.path for c in store.schema.dropped]]
""",
    ),
    "rename_class": Case(
        FLAX_AB,
        FLAX_AB.replace("class C", "class D"),
        RECORD_AB,
        read="""
pytreestore.evolve(path, rename_class={"cc_rename_class:C": "cc_rename_class:D"}, backend=backend)
result = plain(pytreestore.open(path, backend=backend)[0])
""",
    ),
    "add_without_evolve_refused": Case(
        FLAX_AB,
        FLAX_AB + "    c: np.ndarray\n",
        RECORD_AB,
        read="pytreestore.open(path, 'a', backend=backend)",
    ),
}


@pytest.fixture(scope="module", params=["tensorstore", "zarr"])
def outcomes(request, tmp_path_factory):
    return run_cases(tmp_path_factory.mktemp(request.param), request.param, CASES)


def value(dtype, v):
    return {"dtype": dtype, "value": v}


def test_evolve_add_fills_old_records_with_the_default(outcomes):
    assert outcomes["add"]["result"] == {
        "__class__": "C",
        "a": value("float32", [0.5, 1.5, 2.5, 9.0]),
        "b": value("int32", [10, 11, 12, 9]),
        "c": value("int16", [7, 7, 7, 1]),
    }


def test_evolve_rename_maps_the_old_column(outcomes):
    assert outcomes["rename"]["result"] == {
        "__class__": "C",
        "a": value("float32", [1.5, 2.5, 9.0]),
        "c": value("int32", [11, 12, 99]),
    }


def test_evolve_drop_hides_the_column_and_keeps_its_data(outcomes):
    loaded, kept, dropped = outcomes["drop"]["result"]
    assert loaded == {"__class__": "C", "b": value("int32", [10, 11, 12, 99])}
    assert kept and dropped == [".a"]


def test_evolve_rename_class(outcomes):
    assert outcomes["rename_class"]["result"] == {
        "__class__": "D",
        "a": value("float32", 0.5),
        "b": value("int32", 10),
    }


def test_open_refuses_and_names_evolve(outcomes):
    out = outcomes["add_without_evolve_refused"]
    assert out["error"] == "SchemaMismatchError"
    assert "store.evolve(add={'.c': <default>})" in out["message"]


# ---- in one process: dict records, chunk boundaries, bad input, crashes -------------------------


@pytest.fixture(params=["tensorstore", "zarr"])
def backend(request):
    return request.param


def small(path, backend, n=5):
    store = pytreestore.create(path, {"x": np.float32(0)}, chunk_records=2, backend=backend)
    store.extend({"x": np.float32(i)} for i in range(n))
    return store


def test_add_across_chunks_then_append(tmp_path, backend):
    store = small(tmp_path / "s", backend)
    store.evolve(add={"['y']": np.full(2, -1.5, np.float32)})
    store.extend({"x": np.float32(i), "y": np.full(2, i, np.float32)} for i in range(5, 8))
    store.close()
    store = pytreestore.open(tmp_path / "s", backend=backend)
    y = store.load(as_numpy=True)["y"]
    assert y.tolist() == [[-1.5, -1.5]] * 5 + [[5.0, 5.0], [6.0, 6.0], [7.0, 7.0]]
    assert store[3]["y"].tolist() == [-1.5, -1.5]
    assert store.verify().ok  # chunks before the start are not written, and not missing
    column = store.schema.columns[1]
    assert (column.path, column.start, column.default) == ("['y']", 5, -1.5)


def test_evolved_store_metadata(tmp_path, backend):
    store = small(tmp_path / "s", backend)
    store.evolve(add={"['y']": np.int8(3)}, rename={"['x']": "['w']"})
    store.close()
    info = json.loads((tmp_path / "s" / "zarr.json").read_text())["attributes"]["pytreestore"]
    assert info["format_version"] == 3
    assert info["digest"] == _validate.digest(info)
    assert _validate.schema_errors({"zarr_format": 3, "node_type": "group",
                                    "attributes": {"pytreestore": info}}) == []  # fmt: skip
    assert info["tree"] == {"node": "dict", "keys": ["w", "y"],
                            "children": [{"node": "leaf"}, {"node": "leaf"}]}  # fmt: skip
    assert [(c["path"], c["key"], c.get("start"), c.get("default")) for c in info["columns"]] == [
        ("['w']", "x", None, None),  # the storage key stays
        ("['y']", "y", 5, 3),
    ]
    y_meta = json.loads((tmp_path / "s" / "y" / "zarr.json").read_text())
    assert (y_meta["fill_value"], y_meta["shape"]) == (3, [5])


def test_drop_then_add_the_same_name_gets_a_new_key(tmp_path, backend):
    store = small(tmp_path / "s", backend)
    store.evolve(add={"['y']": np.int32(1)})
    store.append({"x": np.float32(5), "y": np.int32(50)})
    store.evolve(drop=["['y']"])
    store.evolve(add={"['y']": np.int32(2)})
    store.append({"x": np.float32(6), "y": np.int32(60)})
    assert [c.key for c in store.schema.columns] == ["x", "y-231"]
    assert store.load(as_numpy=True)["y"].tolist() == [2] * 6 + [60]


def test_a_reader_refreshing_past_a_drop_is_told_the_schema_changed(tmp_path, backend):
    store = small(tmp_path / "s", backend)
    store.evolve(add={"['y']": np.int32(1)})
    store.flush()
    reader = pytreestore.open(tmp_path / "s", backend=backend)
    store.evolve(drop=["['y']"])
    store.evolve(add={"['y']": np.int32(2)})
    store.append({"x": np.float32(9), "y": np.int32(90)})
    store.flush()
    with pytest.raises(errors.SchemaMismatchError, match=r"evolve.*\['y'\].*open it again"):
        reader.refresh()
    assert reader.load(as_numpy=True)["y"].tolist() == [1] * 5  # still its own snapshot
    fresh = pytreestore.open(tmp_path / "s", backend=backend)
    assert fresh.load(as_numpy=True)["y"].tolist() == [2] * 5 + [90]


@pytest.mark.parametrize("fill", [2**40, 1.5, "NaN", [1.0, 2.0], True])
def test_a_hand_edited_default_the_dtype_cannot_hold_is_refused(tmp_path, backend, fill):
    store = small(tmp_path / "s", backend)
    store.evolve(add={"['y']": np.int32(1)})
    store.close()
    root = tmp_path / "s" / "zarr.json"
    document = json.loads(root.read_text())
    info = document["attributes"]["pytreestore"]
    info["columns"][1]["default"] = fill
    del info["digest"]
    root.write_text(json.dumps(document))
    with pytest.raises(errors.CorruptStoreError, match=r"\['y'\].*default.*int32"):
        pytreestore.open(tmp_path / "s", backend=backend).load(as_numpy=True)


def test_a_read_keeps_one_schema_while_another_thread_evolves(tmp_path, backend):
    store = pytreestore.create(  # whole chunks: the read reaches storage (buffered rows it
        tmp_path / "s",  # would take from the writer's memory)
        {"a": np.int32(0), "b": np.float32(0)},
        backend=backend,
        chunk_records=1,
    )
    store.extend({"a": np.int32(i), "b": np.float32(-i)} for i in range(3))
    store.flush()
    backend = store._backend
    names = [n for n in ("read", "read_many") if hasattr(backend, n)]  # the cache reads many
    originals = {n: getattr(backend, n) for n in names}

    def meanwhile(original):
        def evolve_meanwhile(*args, **kwargs):  # the evolve lands between schema and read
            for n in names:
                setattr(backend, n, originals[n])
            store.evolve(rename={"['a']": "['z']"}, add={"['c']": np.int8(7)})
            return original(*args, **kwargs)

        return evolve_meanwhile

    for n in names:
        setattr(backend, n, meanwhile(originals[n]))
    got = store.load(as_numpy=True)
    assert {k: v.tolist() for k, v in got.items()} == {"a": [0, 1, 2], "b": [0, -1, -2]}
    got = store.load(as_numpy=True)
    assert {k: v.tolist() for k, v in got.items()} == {
        "b": [0, -1, -2],
        "c": [7] * 3,
        "z": [0, 1, 2],
    }


def test_prng_keys_stay_keys_after_evolve_reorders_the_columns(tmp_path, backend):
    record = {"b": jax.random.key(1), "c": np.float32(0.5)}
    store = pytreestore.create(tmp_path / "s", record, backend=backend)
    store.append(record)
    store.evolve(rename={"['b']": "['z']"})  # columns now c, z
    got = store[0]
    assert got["c"].tolist() == 0.5
    assert jax.random.key_data(got["z"]).tolist() == jax.random.key_data(record["b"]).tolist()


def test_a_hand_edited_start_past_the_committed_records_is_refused(tmp_path, backend):
    store = small(tmp_path / "s", backend)
    store.evolve(add={"['y']": np.int32(1)})
    store.append({"x": np.float32(5), "y": np.int32(50)})
    store.close()
    root = tmp_path / "s" / "zarr.json"
    document = json.loads(root.read_text())
    info = document["attributes"]["pytreestore"]
    info["columns"][1]["start"] = 99  # would hide the record appended after the evolve
    del info["digest"]
    root.write_text(json.dumps(document))
    with pytest.raises(errors.CorruptStoreError, match=r"\['y'\] starts at record 99.*only 6"):
        pytreestore.open(tmp_path / "s", backend=backend).schema


def test_a_default_damaged_while_the_store_is_open_stops_evolve(tmp_path, backend):
    store = small(tmp_path / "s", backend)
    store.evolve(add={"['y']": np.int32(1)})
    root = tmp_path / "s" / "zarr.json"
    document = json.loads(root.read_text())
    document["attributes"]["pytreestore"]["columns"][1]["default"] = 2**40
    root.write_text(json.dumps(document))
    with pytest.raises(errors.CorruptStoreError, match=r"\['y'\].*default.*int32"):
        store.evolve(add={"['z']": np.int8(0)})


def test_golden_format_1_store_is_upgraded_by_evolve(tmp_path, backend):
    shutil.copytree(make_golden.GOLDEN / "format-1" / "root-leaf", tmp_path / "s")
    root = tmp_path / "s" / "zarr.json"
    assert json.loads(root.read_text())["attributes"]["pytreestore"]["format_version"] == 1
    before = pytreestore.open(tmp_path / "s", backend=backend).load(as_numpy=True)
    with pytest.raises(
        errors.SchemaMismatchError, match="evolve: a leaf has no children to add, drop or rename"
    ):
        pytreestore.evolve(tmp_path / "s", add={".x": np.int8(0)}, backend=backend)
    assert json.loads(root.read_text())["attributes"]["pytreestore"]["format_version"] == 1
    shutil.copytree(make_golden.GOLDEN / "format-1" / "tree", tmp_path / "t")
    store = pytreestore.open(tmp_path / "t", generic=True, backend=backend)
    first = store.schema.paths[0]
    pytreestore.evolve(tmp_path / "t", rename={first: first[:-2] + "zz']"}, backend=backend)
    info = json.loads((tmp_path / "t" / "zarr.json").read_text())["attributes"]["pytreestore"]
    assert info["format_version"] == 3
    assert np.array_equal(before, pytreestore.open(tmp_path / "s", backend=backend)[:], True)


BAD = [
    (dict(drop=["['nope']"]), errors.SchemaMismatchError, "evolve: no node at \"['nope']\""),
    (dict(rename={"['nope']": "['z']"}), errors.SchemaMismatchError, "evolve: no node at"),
    (dict(add={"['x']": np.int8(0)}), errors.SchemaMismatchError, "already exists"),
    (dict(add={"['q'][0.5]": np.int8(0)}), errors.SchemaMismatchError, "is not a keypath ending"),
    (
        dict(add={"['q'][0]": np.int8(0)}),
        errors.SchemaMismatchError,
        "evolve: no node at \"['q']\"",
    ),
    (dict(add={".q": np.int8(0)}), errors.SchemaMismatchError, "children of a dict are named"),
    (dict(add={"['q']": "text"}), errors.UnsupportedDtypeError, "which a column cannot hold"),
    (dict(add={"['q']": np.arange(3)}), errors.UnsupportedDtypeError, "holds different values"),
    (dict(add={"['q']": jax.random.key(0)}), errors.UnsupportedDtypeError, "cannot hold"),
    (dict(drop=["['x']"]), errors.SchemaMismatchError, "without columns"),
    (dict(rename={"['x']": "['x']['y']"}), errors.SchemaMismatchError, "must keep the parent"),
    (dict(rename_class={"a:B": "c:D"}), errors.SchemaMismatchError, "no node of class 'a:B'"),
]


@pytest.mark.parametrize(("changes", "error", "text"), BAD)
def test_bad_input_leaves_the_store_unchanged(tmp_path, changes, error, text):
    store = small(tmp_path / "s", "tensorstore")
    before = (tmp_path / "s" / "zarr.json").read_bytes()
    with pytest.raises(error, match=re.escape(text)):
        store.evolve(**changes)
    assert (tmp_path / "s" / "zarr.json").read_bytes() == before
    assert json.loads((tmp_path / "s" / ".pytreestore/commit.json").read_bytes())["records"] == 4
    store.append({"x": np.float32(9)})
    assert store.load(as_numpy=True)["x"].tolist() == [0, 1, 2, 3, 4, 9]


def test_evolve_needs_mode_a(tmp_path):
    small(tmp_path / "s", "zarr").close()
    with pytest.raises(errors.ReadOnlyError, match=re.escape("open it with pytreestore.open")):
        pytreestore.open(tmp_path / "s").evolve(drop=["['x']"])


def test_a_generic_view_evolves_but_does_not_append(tmp_path):
    small(tmp_path / "s", "tensorstore").close()
    store = pytreestore.open(tmp_path / "s", "a", generic=True)
    with pytest.raises(errors.ReadOnlyError, match="generic view, which can evolve but not"):
        store.append({"x": np.float32(1)})


def test_crash_before_the_root_write_keeps_the_old_schema(tmp_path, backend, monkeypatch):
    store = small(tmp_path / "s", backend)
    store.flush()  # the commit rewrites the root too (its consolidated metadata)
    fail_root_writes(monkeypatch, store._backend, KeyboardInterrupt("crash"))
    with pytest.raises(KeyboardInterrupt):
        store.evolve(add={"['y']": np.int32(4)})
    monkeypatch.undo()
    store.close()
    assert (tmp_path / "s" / "y" / "zarr.json").exists()  # the unused array of the crash
    again = pytreestore.open(tmp_path / "s", "a", backend=backend)
    assert again.schema.paths == ("['x']",)
    again.evolve(add={"['y']": np.int32(4)})
    assert [c.key for c in again.schema.columns] == ["x", "y-231"]
    assert again.load(as_numpy=True)["y"].tolist() == [4] * 5


def test_an_old_reader_refuses_an_evolved_store(tmp_path, monkeypatch):
    small(tmp_path / "s", "tensorstore").close()
    monkeypatch.setattr(_validate, "FORMAT_VERSION", 1)  # a reader of format 1 only
    _validate.forget_validated()
    with pytest.raises(errors.FormatVersionError, match="upgrade pytreestore to read it"):
        pytreestore.open(tmp_path / "s")


def test_copy_of_an_evolved_store(tmp_path, backend):
    store = small(tmp_path / "s", backend)
    store.evolve(add={"['y']": np.int8(-2)}, drop=["['x']"])
    store.append({"y": np.int8(9)})
    store.close()
    source = pytreestore.open(tmp_path / "s", backend=backend)
    assert pytreestore.copy(source, tmp_path / "c", chunk_records=4, backend=backend) == 6
    copied = pytreestore.open(tmp_path / "c", backend=backend)
    assert copied.load(as_numpy=True)["y"].tolist() == [-2] * 5 + [9]
    assert copied.schema.dropped == () and copied.verify().ok
    info = json.loads((tmp_path / "c" / "zarr.json").read_text())["attributes"]["pytreestore"]
    assert "dropped" not in info and info["columns"][0]["key"] == "y"


# ---- an evolve whose commit record failed -----------------------------------------------------


def _fail_the_evolve_commit_once(engine) -> None:
    """The first write of an evolve's commit record through ``engine`` raises StorageError
    (its root, written before, stays)."""
    from pytreestore._format.keys import COMMIT_KEY

    failed: list[bool] = []

    def hooked(write):
        def call(key, data, *args):
            if key == COMMIT_KEY and b'"evolve"' in data and not failed:
                failed.append(True)
                raise errors.StorageError("injected: the commit record was not written")
            return write(key, data, *args)

        return call

    engine.write_bytes = hooked(engine.write_bytes)
    if hasattr(engine, "write_bytes_if"):
        engine.write_bytes_if = hooked(engine.write_bytes_if)


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_an_evolve_whose_commit_failed_is_not_in_force_and_can_be_retried(tmp_path, backend):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, {"step": np.int32(0)}, chunk_records=4, backend=backend)
    store.extend({"step": np.int32(i)} for i in range(6))
    store.flush()
    _fail_the_evolve_commit_once(store._backend)
    with pytest.raises(errors.StorageError):
        store.evolve(add={"['lr']": np.float32(7)})
    assert [c.path for c in store.schema.columns] == ["['step']"]
    if backend == "ocdbt":  # nothing of its transaction landed: the writer goes on
        store.extend({"step": np.int32(i)} for i in range(6, 8))  # was committed as evolved
        store.flush()
        got = pytreestore.open(path, backend=backend)
        assert [c.path for c in got.schema.columns] == ["['step']"] and len(got) == 8
    start = len(store)
    store.evolve(add={"['lr']": np.float32(7)})  # the retry (the root had it: "already exists")
    store.extend({"step": np.int32(i), "lr": np.float32(i)} for i in range(start, start + 2))
    store.close()
    got = pytreestore.open(path, backend=backend).load(as_numpy=True)
    assert got["lr"].tolist() == [7.0] * start + [float(start), float(start + 1)]
    assert got["step"].tolist() == list(range(start + 2))


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_a_reader_refreshing_past_a_drop_whose_commit_never_came(tmp_path, backend):
    """The root holds an evolve(drop=)'s schema whose commit record failed; records committed
    after it (by the writer going on, or by the next writer) keep the column: a reader's
    refresh reads them, no 'evolve dropped' error."""
    path = str(tmp_path / "s")
    like = {"step": np.int32(0), "lr": np.float32(0)}
    store = pytreestore.create(path, like, chunk_records=4, backend=backend)
    store.extend({"step": np.int32(i), "lr": np.float32(i)} for i in range(3))
    store.flush()
    reader = pytreestore.open(path, backend=backend)
    _fail_the_evolve_commit_once(store._backend)
    with pytest.raises(errors.StorageError):
        store.evolve(drop=["['lr']"])
    if backend != "ocdbt":  # the version record landed: this writer must reopen
        store.close()
        store = pytreestore.open(path, "a", backend=backend)
    store.extend({"step": np.int32(i), "lr": np.float32(i)} for i in range(3, 5))
    store.flush()
    assert reader.refresh() == 5
    assert reader.load(as_numpy=True)["lr"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    store.close()


# ---- ragged and optional stores (the parity matrix is tests/parity/test_evolve.py) --------------


def test_a_ragged_store_learning_a_structure_after_a_drop_keeps_the_dropped_columns(tmp_path):
    """A list empty so far is learnt after an evolve: the columns the evolve dropped stay
    listed (their keys taken), and the pending list did not stop the drop."""
    path = tmp_path / "s"
    like = {"x": np.float32(0), "y": np.float32(0), "l": []}
    with pytreestore.create(path, like, ragged=["['l']"], backend="zarr") as store:
        store.extend({"x": np.float32(i), "y": np.float32(i), "l": []} for i in range(3))
        store.evolve(drop=["['x']"])
        store.append({"y": np.float32(5), "l": [np.int32(3), np.int32(4)]})
        assert [c.path for c in store.schema.dropped] == ["['x']"]
    store = pytreestore.open(path)
    assert [c.path for c in store.schema.dropped] == ["['x']"]
    assert [int(v) for v in store[3]["l"]] == [3, 4]
    assert [float(store[i]["y"]) for i in range(4)] == [0, 1, 2, 5]
    assert "['x']" not in store[0]


def test_a_ragged_evolve_refused_by_todays_classes_writes_nothing(tmp_path):
    """An add inside list elements whose class today lacks the field is refused before
    anything is written (the layout is bound to today's classes first)."""
    from tests.parity import kinds

    path = tmp_path / "s"
    kinds.filled(path, "ragged_list", "zarr", n=3)
    before = (path / "zarr.json").read_bytes()
    with pytreestore.open(path, "a") as store, pytest.raises(errors.SchemaMismatchError):
        store.evolve(add={".agents[*].mass": np.float32(0)})
    assert (path / "zarr.json").read_bytes() == before
    assert not (path / "agents" / "-2A" / "mass").exists()
    assert len(pytreestore.open(path)) == 3


@pytest.mark.parametrize("backend", ["tensorstore", "zarr"])
def test_a_ragged_evolve_cut_off_before_the_root_write_keeps_the_old_schema(
    tmp_path, backend, monkeypatch
):
    """The array of a column added inside list elements was created when the crash came: the
    old schema stays in force, and the add done again takes another key."""
    from tests.parity import evolved, kinds

    path = tmp_path / "s"
    old = kinds.filled(path, "ragged_list", backend, n=4)
    renames = {evolved.name(kinds.Agent): evolved.name(evolved.AgentAdded)}
    store = pytreestore.open(path, "a", backend=backend)
    fail_root_writes(monkeypatch, store._backend, KeyboardInterrupt("crash"))
    with pytest.raises(KeyboardInterrupt):
        store.evolve(add={".agents[*].mass": np.float32(2)}, rename_class=renames)
    monkeypatch.undo()
    store.close()
    assert (path / "agents" / "-2A" / "mass" / "zarr.json").exists()  # unused, left
    again = pytreestore.open(path, "a", backend=backend)
    assert ".agents[*].mass" not in again.schema.paths
    again.evolve(add={".agents[*].mass": np.float32(2)}, rename_class=renames)
    (mass,) = [c for c in again.schema.columns if c.path == ".agents[*].mass"]
    assert mass.key == "agents/-2A/mass-231" and mass.table == ".agents"
    again.close()
    got = pytreestore.open(path, backend=backend)
    assert [[float(a.mass) for a in got[i].agents] for i in range(4)] == [
        [2.0] * len(r.agents) for r in old
    ]


@pytest.mark.parametrize(
    ("added", "inside"),
    [("['l'][*]['e']", "the elements of \"['l']\""), ("['o']['z']", "the optional subtree")],
)
def test_an_evolve_inside_a_pending_structure_says_to_show_it_first(tmp_path, added, inside):
    """A list whose elements, or an optional subtree, no record has shown yet has no node to
    add to: the refusal names the keypath and the pending structure, writes nothing, and the
    same evolve works once a record has shown it."""
    path = str(tmp_path / "s")
    like = {"i": np.int32(0), "l": [], "o": None}
    store = pytreestore.create(path, like, ragged=["['l']"], optional=["['o']"])
    store.append(like)
    with pytest.raises(errors.SchemaMismatchError) as info:
        store.evolve(add={added: np.int16(3)})
    assert added in str(info.value) and inside in str(info.value)
    assert "pending" in str(info.value) and "append a record that shows it" in str(info.value)
    assert added not in store.schema.paths
    store.append({"i": np.int32(1), "l": [{"x": np.float32(2)}], "o": {"w": np.float32(4)}})
    store.evolve(add={added: np.int16(3)})
    store.close()
    got = pytreestore.open(path)[1]
    assert int(got["l"][0]["e"] if "['l']" in added else got["o"]["z"]) == 3


def test_a_column_added_to_an_optional_subtree_pads_absent_records_with_zeros(tmp_path, backend):
    """docs/ragged.md: an absent optional subtree is padded with zeros. A column evolve added
    later reads its default in the records before it, but where the subtree is absent that is
    padding, so zeros (top level and inside list elements), as for the other columns."""
    path = str(tmp_path / "s")
    like = {"o": {"w": np.float32(0)}, "l": [{"p": {"v": np.int16(0)}}]}
    decl = {"ragged": ["['l']"], "optional": ["['o']", "['l'][*]['p']"]}
    store = pytreestore.create(path, like, backend=backend, **decl)
    store.append({"o": None, "l": [{"p": None}, {"p": {"v": np.int16(2)}}]})
    store.append({"o": {"w": np.float32(1)}, "l": []})
    store.evolve(add={"['o']['z']": np.int32(93), "['l'][*]['p']['u']": np.uint8(7)})
    store.append({"o": None, "l": [{"p": None}]})
    store.close()
    reader = pytreestore.open(path, backend=backend)
    batch, mask = reader.load(ragged="pad", as_numpy=True)
    np.testing.assert_array_equal(batch["o"]["z"], [0, 93, 0])
    np.testing.assert_array_equal(mask["o"]["z"], [False, True, False])
    np.testing.assert_array_equal(batch["l"]["p"]["u"], [[0, 7], [0, 0], [0, 0]])
    np.testing.assert_array_equal(batch["l"]["p"]["v"], [[0, 2], [0, 0], [0, 0]])
    assert reader[0]["o"] is None and int(reader[1]["o"]["z"]) == 93
    assert reader[0]["l"][0]["p"] is None and int(reader[0]["l"][1]["p"]["u"]) == 7
