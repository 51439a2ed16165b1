"""Reopening in a fresh process: stores are written here and read by a subprocess.

A store records each node's class as ``module:qualname``; a reader imports it. Classes in an
importable module come back as themselves; a class that lived in the writing script's
``__main__`` cannot be imported elsewhere, and the reader passes ``like=`` or ``generic=True``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import flax.struct
import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import ClassResolutionError, SchemaMismatchError
from pytreestore.testing import assert_trees_equal, describe_tree
from pytreestore.testing import strategies as pts
from tests import interpreters
from tests.conftest import child_env


def run_python(code: str, *args: str, cwd: Path, fresh: bool = False) -> str:
    """Runs ``code`` in another interpreter, one that has not imported this test's classes
    (forked from the test zygote, tests/zygote.py, unless ``fresh``: then one that has not
    imported pytreestore either); returns its stdout, failing on a non-zero exit."""
    result = (subprocess.run if fresh else interpreters.run)(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=child_env(),
        check=False,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


# ---- classes from an importable module --------------------------------------------------------


def sample(i: int) -> pts.State:
    """Record ``i``: nested classes of pytreestore.testing.strategies, odd keys, a static field."""
    return pts.State(
        position=pts.Pair(np.float32(i) / 3, np.arange(2, dtype=np.int64) * -i),
        velocity={
            "a/b": [np.float16(i / 2), ml_dtypes.bfloat16(i)],
            "é": None,
            "": pts.Tagged(np.full((2, 2), i, np.uint8), label=("run", 1)),
        },
        mass=pts.Triple(np.complex64(i + 1j), np.bool_(i % 2), pts.Point(np.float64(np.nan))),
    )


READER = """
    import json, sys
    import pytreestore
    from pytreestore.testing import describe_tree

    assert "pytreestore.testing.strategies" not in sys.modules
    store = pytreestore.open(sys.argv[1])
    everything = store.load(as_numpy=True)
    second = store.load(1, as_numpy=True)

    from pytreestore.testing.strategies import Pair, State, Tagged, Triple
    assert type(everything) is State, type(everything)
    assert type(second.position) is Pair and type(second.mass) is Triple
    assert type(second.velocity[""]) is Tagged and second.velocity[""].label == ("run", 1)
    print(json.dumps({"len": len(store), "all": describe_tree(everything),
                      "second": describe_tree(second)}))
"""


def test_fresh_process_reads_importable_classes(tmp_path: Path) -> None:
    xs = [sample(i) for i in range(5)]
    with pytreestore.create(tmp_path / "store", xs[0], chunk_records=2) as store:
        store.extend(xs)
    got = json.loads(run_python(READER, str(tmp_path / "store"), cwd=tmp_path))
    stacked = pytreestore.stack(xs, as_numpy=True)
    assert got["len"] == 5
    assert got["all"] == describe_tree(stacked)
    assert got["second"] == describe_tree(pytreestore.unstack(stacked)[1])
    assert got["all"]["nodes"][".velocity['']"] == "pytreestore.testing.strategies:Tagged"


# ---- classes from the writing script's __main__ -----------------------------------------------

MAIN_WRITER = """
    import sys
    from typing import NamedTuple
    import flax.struct
    import numpy as np
    import pytreestore

    class Sample(NamedTuple):
        x: object
        y: object

    @flax.struct.dataclass
    class Box:
        sample: Sample
        scale: object

    def box(i):
        return Box(Sample(np.float32(i), np.full(2, i, np.int32)), np.float32(i / 4))

    with pytreestore.create(sys.argv[1], box(0), chunk_records=2) as store:
        store.extend(box(i) for i in range(5))
    print(pytreestore.open(sys.argv[1])[4].sample.y)
"""


class Sample(NamedTuple):
    x: Any
    y: Any


@flax.struct.dataclass
class Box:
    sample: Sample
    scale: Any


def box(i: int) -> Box:
    return Box(Sample(np.float32(i), np.full(2, i, np.int32)), np.float32(i / 4))


@pytest.fixture(scope="module")
def main_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store whose classes lived in the ``__main__`` of the script that wrote it."""
    path = tmp_path_factory.mktemp("main") / "store"
    assert run_python(MAIN_WRITER, str(path), cwd=path.parent).strip() == "[4 4]"
    return path


def test_classes_of_another_main_do_not_resolve(main_store: Path) -> None:
    with pytest.raises(ClassResolutionError, match=r"__main__:(Sample|Box)") as info:
        pytreestore.open(main_store).schema
    message = str(info.value)
    assert "like=" in message and "generic=True" in message
    assert isinstance(info.value, ImportError)


def test_like_supplies_the_classes(main_store: Path) -> None:
    with pytreestore.open(main_store, like=box(0)) as store:
        assert_trees_equal(store[:], pytreestore.stack([box(i) for i in range(5)]))
        assert type(store[2]) is Box and type(store[2].sample) is Sample
    with pytreestore.open(main_store, mode="a", like=box(0)) as store:
        store.append(box(5))
    with pytreestore.open(main_store, like=box(0)) as store:
        assert_trees_equal(store[:], pytreestore.stack([box(i) for i in range(6)]))


def test_like_of_another_schema_is_refused(main_store: Path) -> None:
    wrong = Box(Sample(np.float32(0), np.zeros(3, np.int32)), np.float32(0))
    expected = "like= does not match the store schema at .sample.y: expected int32[2], got int32[3]"
    with pytest.raises(SchemaMismatchError, match=re.escape(expected)):
        pytreestore.open(main_store, like=wrong).schema


def test_generic_gives_dicts(main_store: Path) -> None:
    with pytreestore.open(main_store, generic=True) as store:
        got = store.load(slice(0, 5))
    want = pytreestore.stack([box(i) for i in range(5)])
    assert_trees_equal(
        got, {"sample": {"x": want.sample.x, "y": want.sample.y}, "scale": want.scale}
    )


# ---- importing without hypothesis ---------------------------------------------------------------


def test_import_never_needs_hypothesis(tmp_path: Path) -> None:
    code = """
        import sys
        sys.modules["hypothesis"] = None  # any import of hypothesis now fails
        import pytreestore, pytreestore.testing
        try:
            import pytreestore.testing.strategies
        except ImportError:
            print("strategies need hypothesis")
    """
    assert run_python(code, cwd=tmp_path, fresh=True).strip() == "strategies need hypothesis"
