"""``pytreestore head`` (one line per leaf, --start, --columns, --full) and the static fields
that ``info`` and ``head`` print, on real stores read back from disk.

The command runs in this process through click (tests/test_cli.py runs the console script);
``COLUMNS`` fixes the terminal width, so the lines asserted are exact.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import json
from pathlib import Path
from typing import Any, NamedTuple

import equinox as eqx
import jax
import numpy as np
import pytest
from click.testing import CliRunner, Result
from flax import struct

import pytreestore
from pytreestore._inspect.printed import preview, static_fields, summary_lines
from pytreestore.cli import main
from tests import trees

WIDTH = 100  # the width head fits its lines to: the terminal's columns less 4


def invoke(*args: str | Path) -> Result:
    """Runs the command in this process, in a terminal of WIDTH + 4 columns."""
    return CliRunner().invoke(
        main,
        [str(a) for a in args],
        prog_name="pytreestore",
        catch_exceptions=False,
        env={"COLUMNS": str(WIDTH + 4)},
    )


def lines(*args: str | Path) -> list[str]:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


# ---- the stores ---------------------------------------------------------------------------------


class Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2


@struct.dataclass
class Config:
    lr: Any
    run: str = struct.field(pytree_node=False, default="run-a")
    mode: Mode = struct.field(pytree_node=False, default=Mode.TRAIN)
    sizes: tuple[int, ...] = struct.field(pytree_node=False, default=(64, 64))


@struct.dataclass
class State:
    config: Config
    pos: Any
    grid: Any
    step: Any


@struct.dataclass
class Agent:
    x: Any
    trail: Any
    kind: str = struct.field(pytree_node=False, default="walker")


@struct.dataclass
class World:
    agents: list[Agent]
    t: Any
    name: str = struct.field(pytree_node=False, default="w1")


def state(i: int) -> State:
    return State(
        Config(np.float32(0.5 / (i + 1))),
        np.arange(10, dtype=np.float32) + i,
        np.arange(6, dtype=np.int64).reshape(2, 3) * i,
        np.int32(i),
    )


@pytest.fixture(scope="module", params=["tensorstore", "zarr"])
def states(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five records of a flax struct with static fields, written by each backend."""
    path = tmp_path_factory.mktemp("head") / "states"
    with pytreestore.create(path, state(0), backend=request.param, chunk_records=2) as store:
        store.extend(state(i) for i in range(5))
    return path


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("head") / "seed"
    with pytreestore.create(path, trees.seed_records()[0]) as store:
        store.extend(trees.seed_records())
    return path


def worlds() -> list[World]:
    def agent(x: int, trail: int) -> Agent:
        return Agent(np.int32(x), np.arange(trail, dtype=np.float32))

    return [
        World([agent(3, 2)], np.int32(0)),
        World([agent(4, 9), agent(5, 0)], np.int32(1)),
        World([], np.int32(2)),
    ]


@pytest.fixture(scope="module", params=["tensorstore", "zarr"])
def ragged(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three records whose agent lists (and each agent's trail) change length."""
    path = tmp_path_factory.mktemp("head") / "worlds"
    like = worlds()[0]
    ragged = [".agents", ".agents[*].trail"]
    with pytreestore.create(path, like, ragged=ragged, backend=request.param) as store:
        store.extend(worlds())
    return path


STATICS = [
    "static fields",
    "  .config.run = 'run-a'",
    "  .config.mode = Mode.TRAIN",
    "  .config.sizes = (64, 64)",
    "",
]


# ---- one line per leaf ---------------------------------------------------------------------------


def test_head_prints_one_line_per_leaf_after_the_static_fields(states: Path) -> None:
    assert lines("head", states, "-n", "2") == [
        *STATICS,
        "[0] State",
        "  .config.lr  float32[]    0.5",
        "  .pos        float32[10]  [0., 1., 2., 3., 4., 5., ...]",
        "  .grid       int64[2,3]   [0, 0, 0, 0, 0, 0]",
        "  .step       int32[]      0",
        "[1] State",
        "  .config.lr  float32[]    0.25",
        "  .pos        float32[10]  [1., 2., 3., 4., 5., 6., ...]",
        "  .grid       int64[2,3]   [0, 1, 2, 3, 4, 5]",
        "  .step       int32[]      1",
        "... 3 more of 5 records",
    ]


def test_start_counts_from_the_front_or_from_the_end(states: Path) -> None:
    third = lines("head", states, "--start", "2", "-n", "1")
    assert third[len(STATICS) :] == [
        "[2] State",
        "  .config.lr  float32[]    0.1667",
        "  .pos        float32[10]  [2., 3., 4., 5., 6., 7., ...]",
        "  .grid       int64[2,3]   [ 0,  2,  4,  6,  8, 10]",
        "  .step       int32[]      2",
        "... 2 more of 5 records",
    ]
    last_two = lines("head", states, "--start", "-2")[len(STATICS) :]
    assert [line for line in last_two if line.startswith("[")] == ["[3] State", "[4] State"]
    assert last_two[-1] == "  .step       int32[]      4"  # nothing more to tell
    assert lines("head", states, "--start", "-5", "-n", "1")[len(STATICS)] == "[0] State"


@pytest.mark.parametrize("start", ["5", "-6", "99"])
def test_a_start_out_of_range_is_a_usage_error(states: Path, start: str) -> None:
    result = invoke("head", states, "--start", start)
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.endswith(
        f"Error: Invalid value for '--start': {start} is out of range for a store of 5 "
        "records (use 0 to 4, or -5 to -1)\n"
    )
    assert "Traceback" not in result.stderr


def test_start_on_an_empty_store(tmp_path: Path) -> None:
    pytreestore.create(tmp_path / "empty", {"a": np.float32(0)}).close()
    assert lines("head", tmp_path / "empty") == []
    refused = invoke("head", tmp_path / "empty", "--start", "1")
    assert refused.exit_code == 2
    assert "1 is out of range for a store of 0 records (use 0: the store is empty)" in (
        refused.stderr
    )


def test_columns_by_node_and_by_leaf(states: Path) -> None:
    node = lines("head", states, "-n", "1", "--columns", ".config")
    assert node[len(STATICS) :] == [
        "[0] State",
        "  .config.lr  float32[]  0.5",
        "... 4 more of 5 records",
    ]
    several = [
        lines("head", states, "-n", "1", "--columns", ".step", ".pos"),  # one option, two paths
        lines("head", states, "-n", "1", "-c", ".pos", "-c", ".step"),  # the option twice
        lines("head", states, "--columns", ".step", ".pos", "-n", "1"),  # an option after them
        lines("head", states, "--columns=.step", ".pos", "-n", "1"),  # the value inline
        lines("head", states, "-c.step", "-n", "1", "-c", ".pos"),  # the short form, inline
        lines("head", "-n", "1", "-c", ".step", ".pos", "--", states),  # the path after --
    ]
    for got in several:
        assert got[len(STATICS) :] == [
            "[0] State",
            "  .pos   float32[10]  [0., 1., 2., 3., 4., 5., ...]",
            "  .step  int32[]      0",
            "... 4 more of 5 records",
        ]
    as_json = invoke("head", states, "-n", "2", "--start", "3", "--columns", ".step", "--json")
    assert json.loads(as_json.stdout) == [
        {"config": {"lr": None}, "pos": None, "grid": None, "step": 3},
        {"config": {"lr": None}, "pos": None, "grid": None, "step": 4},
    ]
    full = lines("head", states, "-n", "1", "--columns", ".grid", "--full")
    assert full[len(STATICS) :] == [
        "[0] State(",
        "  config=Config(lr=None),",
        "  pos=None,",
        "  grid=[[0, 0, 0],",
        "        [0, 0, 0]],",
        "  step=None,",
        ")",
        "... 4 more of 5 records",
    ]


def test_unknown_columns_print_the_load_error(states: Path) -> None:
    result = invoke("head", states, "--columns", ".pos", ".nothing")
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr == (
        "pytreestore: error: no column at or below '.nothing'; the store's columns are "
        ".config.lr, .pos, .grid, .step\n"
    )
    with pytest.raises(pytreestore.errors.UnknownColumnError, match=r"at or below '\.nothing'"):
        pytreestore.open(states, generic=True).load(0, columns=[".pos", ".nothing"])


def test_full_and_json_keep_every_value(states: Path) -> None:
    full = lines("head", states, "--full", "-n", "1", "--start", "4")
    assert full[len(STATICS) :] == [
        "[4] State(",
        "  config=Config(lr=0.1),",
        "  pos=[ 4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.],",
        "  grid=[[ 0,  4,  8],",
        "        [12, 16, 20]],",
        "  step=4,",
        ")",
    ]
    records = json.loads(invoke("head", states, "--json", "--start", "-1").stdout)
    assert records == [
        {
            "config": {"lr": pytest.approx(0.1)},
            "pos": list(range(4, 14)),
            "grid": [[0, 4, 8], [12, 16, 20]],
            "step": 4,
        }
    ]


def test_a_stray_keypath_is_a_usage_error(states: Path) -> None:
    result = invoke("head", states, ".pos")
    assert result.exit_code == 2 and "Got unexpected extra argument (.pos)" in result.stderr


def test_full_prints_every_value_exactly(tmp_path: Path) -> None:
    """A 2,000-element leaf comes back whole: a fixed store's record as its classes print it
    (here a dict, which Python reads back), a ragged store's as JSON; every float exactly."""
    values = np.linspace(0, 1, 2000, dtype=np.float32) / 3
    with pytreestore.create(tmp_path / "fixed", {"x": values, "n": np.int32(0)}) as fixed:
        fixed.append({"x": values, "n": np.int32(7)})
    text = invoke("head", tmp_path / "fixed", "--full").stdout
    assert text.startswith("[0] {") and "..." not in text
    record = ast.literal_eval(text.removeprefix("[0] "))
    assert record["n"] == 7 and np.array_equal(np.array(record["x"], np.float32), values)
    like = {"p": [np.float32(0)], "t": np.int32(0)}
    with pytreestore.create(tmp_path / "ragged", like, ragged=True) as ragged:
        ragged.append({"p": list(values), "t": np.int32(3)})
    out = invoke("head", tmp_path / "ragged", "--full").stdout.splitlines()
    assert len(out) == 1 and out[0].startswith("[0] {")
    record = json.loads(out[0].removeprefix("[0] "))
    assert record["t"] == 3 and np.array_equal(np.array(record["p"], np.float32), values)
    assert json.loads(invoke("head", tmp_path / "ragged", "--json").stdout) == [record]


def test_the_seed_store_has_no_static_fields(seed: Path) -> None:
    assert lines("head", seed, "-n", "1") == [
        "[0] AllParams",
        "  .p[0].x  int32[]  4",
        "  .p[0].y  int32[]  2",
        "  .p[1].x  int32[]  4",
        "  .p[1].y  int32[]  3",
        "... 2 more of 3 records",
    ]
    assert "static" not in invoke("info", seed).stdout
    assert json.loads(invoke("info", seed, "--json").stdout)["static_fields"] == []


def test_a_record_of_146_leaves_prints_a_line_each(tmp_path: Path) -> None:
    """The record of issue #15 printed 28 KB with ``head -n 1``."""
    rng = np.random.default_rng(0)
    record = {
        f"part{i:02d}": {f"leaf{j}": rng.normal(size=(64, 3)).astype(np.float32) for j in range(2)}
        for i in range(73)
    }
    with pytreestore.create(tmp_path / "big", record) as store:
        store.append(record)
    out = invoke("head", tmp_path / "big", "-n", "1").stdout
    shown = out.splitlines()
    assert len(shown) == 1 + 146 and shown[0] == "[0] dict"
    assert max(len(line) for line in shown) <= WIDTH
    first = record["part00"]["leaf0"].reshape(-1)[:6]
    values = np.array2string(first, separator=", ", precision=4)[:-1] + ", ...]"
    assert shown[1] == f"  ['part00']['leaf0']  float32[64,3]  {values}"
    assert len(out) < 15_000
    full = invoke("head", tmp_path / "big", "-n", "1", "--full").stdout
    assert len(full) > 3 * len(out)


def test_summary_lines_cut_values_to_the_width() -> None:
    wide = np.linspace(-1e6, 1e6, 50)
    assert summary_lines([(".w", wide)], width=40) == ["  .w  float64[50]  [-1000000., ...]"]
    assert summary_lines([(".w", wide)], width=60) == [
        "  .w  float64[50]  [-1000000.    ,  -959183.6735, ...]"
    ]
    assert summary_lines([(".s", np.array(["a" * 100]))], width=40)[0].endswith("...")
    assert preview(np.zeros((2, 0))) == "[]"
    assert preview(np.array([True, False])) == "[ True, False]"
    assert preview(np.array(1 + 2j, np.complex64)) == "1.+2.j"
    assert preview(np.array([1.5, 2], "bfloat16")) == "[1.5, 2]"


# ---- static fields in info ------------------------------------------------------------------------


def test_info_lists_the_static_fields_once(states: Path) -> None:
    shown = lines("info", states)
    assert shown[-4:] == [
        "  static fields",
        "    .config.run = 'run-a'",
        "    .config.mode = Mode.TRAIN",
        "    .config.sizes = (64, 64)",
    ]
    assert shown[-5] == ""
    assert sum("static fields" in line for line in shown) == 1
    data = json.loads(invoke("info", states, "--json").stdout)
    assert data["static_fields"] == [
        {"path": ".config.run", "value": "run-a", "text": "'run-a'"},
        {
            "path": ".config.mode",
            "value": {"enum": {"type": f"{__name__}:Mode", "name": "TRAIN"}},
            "text": "Mode.TRAIN",
        },
        {"path": ".config.sizes", "value": {"tuple": [64, 64]}, "text": "(64, 64)"},
    ]


class Layer(eqx.Module):
    w: Any
    act: Any = eqx.field(static=True)
    shape: tuple[int, ...] = eqx.field(static=True, default=(2,))


class Spec(NamedTuple):
    value: Any
    unit: Any


def _spec_flatten(spec: Spec) -> tuple[tuple[Any], Any]:
    return (spec.value,), spec.unit


jax.tree_util.register_pytree_node(Spec, _spec_flatten, lambda unit, kids: Spec(kids[0], unit))


@dataclasses.dataclass(frozen=True)
class Window:
    size: int
    name: str


@struct.dataclass
class Odd:
    x: Any
    dtype: Any = struct.field(pytree_node=False, default=np.dtype("float32"))
    scale: Any = struct.field(pytree_node=False, default=np.float32(0.5))
    bad: Any = struct.field(pytree_node=False, default=float("nan"))
    z: Any = struct.field(pytree_node=False, default=1 - 2j)
    table: Any = struct.field(pytree_node=False, default=None)
    opts: Any = struct.field(pytree_node=False, default=None)
    window: Any = struct.field(pytree_node=False, default=Window(3, "hann"))


def test_every_kind_of_static_value_prints_as_python_would(tmp_path: Path) -> None:
    record = {
        "layer": Layer(np.zeros(2, np.float32), jax.nn.relu),
        "spec": Spec(np.float32(1), "m/s"),
        "odd": Odd(np.int32(0), table={"k": [1, 2]}, opts=Mode.EVAL),
        "plain": trees.Pair(np.int8(1), np.int8(2)),
    }
    with pytreestore.create(tmp_path / "s", record) as store:
        store.append(record)
    got = [f.text for f in static_fields(pytreestore.open(tmp_path / "s").schema.tree)]
    assert got == [
        "['layer'].act = jax._src.nn.functions.relu",
        "['layer'].shape = (2,)",
        "['odd'].dtype = dtype('float32')",
        "['odd'].scale = float32(0.5)",
        "['odd'].bad = nan",
        "['odd'].z = (1-2j)",
        "['odd'].table = {'k': [1, 2]}",
        "['odd'].opts = Mode.EVAL",
        "['odd'].window = Window(size=3, name='hann')",
        "['spec'] (static data) = 'm/s'",
    ]
    head = lines("head", tmp_path / "s", "-n", "0")
    assert head == ["static fields", *(f"  {line}" for line in got), "", "... 1 more of 1 records"]


# ---- ragged stores ---------------------------------------------------------------------------------


def test_head_of_a_ragged_store(ragged: Path) -> None:
    assert lines("head", ragged) == [
        "static fields",
        "  .name = 'w1'",
        "  .agents[*].kind = 'walker'",
        "",
        "[0] World",
        "  .agents           list[1]",
        "  .agents[0].x      int32[]     3",
        "  .agents[0].trail  float32[2]  [0., 1.]",
        "  .t                int32[]     0",
        "[1] World",
        "  .agents           list[2]",
        "  .agents[0].x      int32[]     4",
        "  .agents[0].trail  float32[9]  [0., 1., 2., 3., 4., 5., ...]",
        "  .agents[1].x      int32[]     5",
        "  .agents[1].trail  float32[0]  []",
        "  .t                int32[]     1",
        "[2] World",
        "  .agents  list[0]",
        "  .t       int32[]  2",
    ]


def test_ragged_start_columns_full_and_json(ragged: Path) -> None:
    statics = 4
    assert lines("head", ragged, "--start", "-2", "-n", "1", "--columns", ".agents[*].trail")[
        statics:
    ] == [
        "[1] World",
        "  .agents           list[2]",
        "  .agents[0].trail  float32[9]  [0., 1., 2., 3., 4., 5., ...]",
        "  .agents[1].trail  float32[0]  []",
        "... 1 more of 3 records",
    ]
    assert lines("head", ragged, "--full", "-n", "1")[statics:] == [
        '[0] {"agents": [{"x": 3, "trail": [0.0, 1.0], "kind": "walker"}], "t": 0, "name": "w1"}',
        "... 2 more of 3 records",
    ]
    records = json.loads(invoke("head", ragged, "--json", "--start", "1").stdout)
    assert [len(r["agents"]) for r in records] == [2, 0]
    assert records[0]["agents"][0]["trail"] == list(range(9))
    bad = invoke("head", ragged, "--start", "3")
    assert bad.exit_code == 2 and "out of range for a store of 3 records" in bad.stderr
    unknown = invoke("head", ragged, "--columns", ".agents[*].speed")
    assert unknown.exit_code == 2
    assert unknown.stderr.startswith("pytreestore: error: no column at or below '.agents[*].speed'")


def test_info_of_a_ragged_store_names_its_elements_static_fields(ragged: Path) -> None:
    assert lines("info", ragged)[-3:] == [
        "  static fields",
        "    .name = 'w1'",
        "    .agents[*].kind = 'walker'",
    ]
