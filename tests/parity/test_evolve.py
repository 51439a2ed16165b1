"""``evolve`` on every kind of store (issue 29's parity matrix): add, drop and rename at the top
of the record and inside the elements of a ragged list, by ``TreeStore.evolve`` and by
``pytreestore.evolve(path)``, on every backend; every value checked after reopening, and the
versions before the evolve still read with their own schema."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from tests.conftest import tiered
from tests.parity import evolved, kinds

DEFAULT = np.float32(-1.5)  # the default of every added column
N = 6  # records before the evolve
ROOT = Path(__file__).resolve().parents[2]


def plain(obj: Any) -> Any:
    """A record as JSON-able values: classes by name, arrays as (dtype, values)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return {"__class__": type(obj).__name__, **fields}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if obj is None:
        return None
    value = np.asarray(obj)
    return [str(value.dtype), value.tolist()]


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def changed(record: kinds.Step, where: str, change: str, value: Any) -> Any:
    """``record`` as the evolve of ``change`` at ``where`` ("top" or "inside") makes it;
    ``value``: the added field's value."""
    step_cls, agent_cls = (evolved.TOP if where == "top" else evolved.INSIDE)[change][1:]
    top = _fields(record)
    top["agents"] = [_agent(a, agent_cls, change, value) for a in record.agents]
    if where == "top":
        if change == "add":
            top["w"] = value
        elif change == "drop":
            del top["x"]
        else:
            top["time"] = top.pop("t")
    return step_cls(**top)


def _agent(agent: kinds.Agent, cls: type, change: str, value: Any) -> Any:
    if cls is kinds.Agent:
        return agent
    fields = _fields(agent)
    if change == "add":
        fields["mass"] = value
    elif change == "drop":
        del fields["energy"]
    else:
        fields["power"] = fields.pop("energy")
    return cls(**fields)


def changes(kind: str, where: str, change: str) -> dict[str, Any]:
    """The keyword arguments of ``evolve`` for ``change`` at ``where``, with the
    ``rename_class`` to the evolved classes."""
    args, step_cls, agent_cls = (evolved.TOP if where == "top" else evolved.INSIDE)[change]
    args = {k: v if k != "add" else dict.fromkeys(v, DEFAULT) for k, v in args.items()}
    renames = {evolved.name(kinds.Step): evolved.name(step_cls)}
    if agent_cls is not kinds.Agent:
        renames[evolved.name(kinds.Agent)] = evolved.name(agent_cls)
    renames = {old: new for old, new in renames.items() if old != new}
    return {**args, "rename_class": renames}


def evolve(path: Path, backend: str, via: str, args: dict[str, Any]) -> None:
    if via == "path":
        pytreestore.evolve(path, backend=backend, **args)
    else:
        with pytreestore.open(path, "a", backend=backend) as store:
            store.evolve(**args)


def _turn(kind: str, where: str, change: str) -> int:
    """The backend (its index) of a change in ``make test``: a Latin square over the kinds,
    places and changes, so every value of each meets every backend."""
    turn = kinds.KINDS.index(kind) + ("top", "inside").index(where)
    return (turn + ("add", "drop", "rename").index(change)) % len(kinds.BACKENDS)


CHANGES = [
    (kind, where, change)
    for kind in kinds.KINDS
    for where in ("top", "inside")
    for change in ("add", "drop", "rename")
    if where == "top" or kind in ("ragged_list", "nested")
]
#: every change on every backend by TreeStore.evolve; by pytreestore.evolve(path) on one
#: backend (the same steps, without the classes: the backend adds nothing there)
CELLS = [(*c, backend, "method") for c in CHANGES for backend in kinds.BACKENDS]
CELLS += [(*c, "tensorstore", "path") for c in CHANGES]
#: ``make test`` runs each change by the method on one backend, the backends in turn (so each
#: kind, place and change meets every backend, each pair of them at least once), and every
#: change by path; ``make test-long`` every cell
DEFAULT_CELLS = [
    (kind, where, change, kinds.BACKENDS[_turn(kind, where, change)], "method")
    for kind, where, change in CHANGES
] + [c for c in CELLS if c[4] == "path"]


@pytest.mark.parametrize(
    ("kind", "where", "change", "backend", "via"), tiered(CELLS, DEFAULT_CELLS)
)
def test_evolve_then_append_reopen_and_read_old_versions(
    tmp_path, kind, where, change, backend, via
):
    path = tmp_path / "s"
    old = kinds.filled(path, kind, backend, n=N, chunk_records=4)
    before = pytreestore.open(path, backend=backend).version
    evolve(path, backend, via, changes(kind, where, change))
    new = [
        changed(r, where, change, np.float32(r.t + 0.5))
        for r in kinds.records(kind, 3, seed=1, start=N)
    ]
    with pytreestore.open(path, "a", backend=backend) as store:
        store.extend(new[:2])
        store.append(new[2])
    want = [changed(r, where, change, DEFAULT) for r in old] + new
    store = pytreestore.open(path, backend=backend)
    assert [plain(store[i]) for i in range(len(store))] == plain(want)
    assert plain(list(store)) == plain(want)
    then = pytreestore.open(path, backend=backend, version=before)
    assert [plain(then[i]) for i in range(len(then))] == plain(old)
    assert store.verify().ok


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_drop_the_part_that_varies(tmp_path, kind, backend):
    """Dropping a ragged list, a ragged leaf or an optional subtree forgets its axis or
    presence (and declaration); appends, truncate and old versions go on."""
    path = tmp_path / "s"
    old = kinds.filled(path, kind, backend, n=N, chunk_records=4)
    part, cls = evolved.VARYING[kind]
    field = part[1:]
    before = pytreestore.open(path, backend=backend).version
    evolve(path, backend, "method", {"drop": [part], "rename_class": _to(kinds.Step, cls)})

    def without(r: kinds.Step) -> Any:
        return cls(**{k: v for k, v in _fields(r).items() if k != field})

    new = [without(r) for r in kinds.records(kind, 3, seed=3, start=N)]
    with pytreestore.open(path, "a", backend=backend) as store:
        if store.schema.ragged is not None:
            assert part not in {a.path for a in store.schema.ragged.axes}
            assert part not in {p.path for p in store.schema.ragged.presence}
        store.extend(new)
        store.truncate(N + 1)
        store.append(new[2])
    want = [without(r) for r in old] + [new[0], new[2]]
    store = pytreestore.open(path, backend=backend)
    assert [plain(store[i]) for i in range(len(store))] == plain(want)
    assert [plain(r) for r in pytreestore.open(path, backend=backend, version=before)] == plain(old)


@pytest.mark.parametrize("backend", kinds.BACKENDS)
def test_add_inside_an_optional_subtree(tmp_path, backend):
    """Records whose subtree is None stay None; the others read the default."""
    path = tmp_path / "s"
    old = kinds.filled(path, "optional", backend, n=N)
    renames = {**_to(kinds.Storm, evolved.StormAdded)}
    pytreestore.evolve(path, add={".storm.wind": DEFAULT}, rename_class=renames, backend=backend)

    def added(r: kinds.Step, wind: Any) -> kinds.Step:
        storm = None if r.storm is None else evolved.StormAdded(**_fields(r.storm), wind=wind)
        return dataclasses.replace(r, storm=storm)

    new = [added(r, np.float32(r.t)) for r in kinds.records("optional", 4, seed=4, start=N)]
    with pytreestore.open(path, "a", backend=backend) as store:
        store.extend(new)
    store = pytreestore.open(path, backend=backend)
    want = [added(r, DEFAULT) for r in old] + new
    assert [plain(store[i]) for i in range(len(store))] == plain(want)


def _to(old: type, new: type) -> dict[str, str]:
    return {evolved.name(old): evolved.name(new)}


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", ["ragged_list", "nested"])
def test_truncate_below_the_start_of_a_column_added_inside_list_elements(tmp_path, kind, backend):
    """The added column starts at a row of the list's table, not at a record: a truncate
    below it lowers it to that table's rows, and the rows written after read their values."""
    path = tmp_path / "s"
    old = kinds.filled(path, kind, backend, n=N, chunk_records=4)
    args = changes(kind, "inside", "add")
    with pytreestore.open(path, "a", backend=backend) as store:
        store.evolve(**args)
        (column,) = [c for c in store.schema.columns if c.path == ".agents[*].mass"]
        assert column.table == ".agents"
        assert column.start == sum(len(r.agents) for r in old)  # rows, not records
        store.extend(changed(r, "inside", "add", np.float32(7)) for r in kinds.records(kind, 2))
        store.truncate(2)
        new = [
            changed(r, "inside", "add", np.float32(r.t + 0.25))
            for r in kinds.records(kind, 3, seed=2, start=2)
        ]
        store.extend(new)
    want = [changed(r, "inside", "add", DEFAULT) for r in old[:2]] + new
    store = pytreestore.open(path, backend=backend)
    assert [plain(store[i]) for i in range(len(store))] == plain(want)
    (column,) = [c for c in store.schema.columns if c.path == ".agents[*].mass"]
    assert column.start == sum(len(r.agents) for r in old[:2])


def test_evolve_by_path_without_the_classes_then_a_fresh_process_reads(tmp_path):
    """``pytreestore.evolve(path)`` of a nested ragged store in a process that cannot import
    the store's classes; a fresh process with the evolved classes reads every value."""
    path = tmp_path / "s"
    old = kinds.filled(path, "nested", "tensorstore", n=N)
    args = changes("nested", "inside", "add")
    script = (
        "import sys, numpy as np, pytreestore\n"
        "try:\n    import tests.parity.kinds\nexcept ImportError:\n    pass\n"
        "else:\n    sys.exit('the classes are importable')\n"
        f"pytreestore.evolve(sys.argv[1], add={{'.agents[*].mass': np.float32({DEFAULT})}}, "
        f"rename_class={args['rename_class']!r})\n"
    )
    bare = tmp_path / "bare"  # the package alone on the path, not the tests
    bare.mkdir()
    (bare / "pytreestore").symlink_to(ROOT / "pytreestore")
    env = {**os.environ, "PYTHONPATH": str(bare)}
    _run([sys.executable, "-c", script, str(path)], env, bare)
    read = (
        "import json, sys, pytreestore\nfrom tests.parity.test_evolve import plain\n"
        "s = pytreestore.open(sys.argv[1])\n"
        "print(json.dumps([plain(s[i]) for i in range(len(s))]))\n"
    )
    env["PYTHONPATH"] = str(ROOT)
    got = json.loads(_run([sys.executable, "-c", read, str(path)], env, bare).splitlines()[-1])
    assert got == plain([changed(r, "inside", "add", DEFAULT) for r in old])


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# ---- refusals, by name, before anything is written ----------------------------------------------


def _schema_document(path: Path) -> bytes:
    return (path / "zarr.json").read_bytes()


@pytest.mark.parametrize(
    ("kind", "args", "text"),
    [
        ("ragged_list", {"rename": {".agents": ".bots"}}, "the ragged axis '.agents' lies there"),
        ("nested", {"rename": {".agents[*].events": ".agents[*].log"}}, "names its tables"),
        ("ragged_axis", {"rename": {".trail": ".path"}}, "the ragged axis '.trail' lies there"),
        (
            "ragged_list",
            {"drop": [".agents[*].pos", ".agents[*].energy"]},
            "without an array leaf to carry its elements",
        ),
        ("ragged_list", {"drop": [".agents[*]"]}, "positional children"),
        ("ragged_list", {"add": {".agents[*].pos": DEFAULT}}, "already exists"),
    ],
)
@pytest.mark.parametrize("via", ["method", "path"])
def test_changes_the_tables_cannot_follow_are_refused(tmp_path, kind, args, text, via):
    path = tmp_path / "s"
    kinds.filled(path, kind, "zarr", n=3)
    before = _schema_document(path)
    with pytest.raises(errors.SchemaMismatchError, match=text):
        evolve(path, "zarr", via, args)
    assert _schema_document(path) == before
    assert len(pytreestore.open(path)) == 3


@pytest.mark.parametrize(
    ("ragged", "add", "text"),
    [
        (["['p']"], {"['p']['c']": DEFAULT}, "share one ragged leading axis"),
        (True, {"['c']": np.zeros(2, np.float32)}, "created with ragged=True"),
        (True, {"['l'][*]['c']": np.zeros(2, np.float32)}, "created with ragged=True"),
    ],
)
def test_an_add_the_declarations_would_make_ragged_is_refused(tmp_path, ragged, add, text):
    """A new leaf whose rows would need a length per record (below a node whose leaves
    share one ragged leading axis, or an array where every array leaf is ragged)."""
    path = tmp_path / "s"
    like = {
        "p": {"a": np.zeros((2,), np.float32), "b": np.zeros((2,), np.int32)},
        "l": [{"x": np.float32(0)}],
    }
    pytreestore.create(path, like, ragged=ragged, backend="zarr").close()
    before = _schema_document(path)
    with pytest.raises(errors.SchemaMismatchError, match=text):
        pytreestore.evolve(path, add=add)
    assert _schema_document(path) == before


def test_drop_and_rename_of_an_optional_subtree(tmp_path):
    """The presence array and the declaration follow the subtree's new keypath."""
    path = tmp_path / "s"
    like = {"a": np.float32(0), "s": {"v": np.int16(0)}}
    records = [{"a": np.float32(i), "s": None if i % 2 else {"v": np.int16(i)}} for i in range(4)]
    with pytreestore.create(path, like, optional=["['s']"], backend="zarr") as store:
        store.extend(records)
        store.evolve(rename={"['s']": "['t']"})
        store.append({"a": np.float32(4), "t": {"v": np.int16(4)}})
    store = pytreestore.open(path)
    assert store.schema.ragged is not None
    assert [p.path for p in store.schema.ragged.presence] == ["['t']"]
    got = [store[i] for i in range(5)]
    assert [None if r["t"] is None else int(r["t"]["v"]) for r in got] == [0, None, 2, None, 4]
    pytreestore.evolve(path, drop=["['t']"])
    store = pytreestore.open(path)
    assert store.schema.ragged is not None and store.schema.ragged.presence == ()
    assert [float(store[i]["a"]) for i in range(5)] == [0, 1, 2, 3, 4]


def test_a_ragged_reader_refreshing_past_a_drop_is_told_the_schema_changed(tmp_path):
    path = tmp_path / "s"
    kinds.filled(path, "ragged_list", "zarr", n=4)
    reader = pytreestore.open(path)
    evolve(path, "zarr", "path", changes("ragged_list", "inside", "drop"))
    with pytreestore.open(path, "a") as store:
        store.extend(changed(r, "inside", "drop", None) for r in kinds.records("ragged_list", 2))
    with pytest.raises(errors.SchemaMismatchError, match=r"evolve dropped.*open it again"):
        reader.refresh()  # today it refreshes, and reading a new record fails
        reader[len(reader) - 1]
