"""Run every script in examples/ as a user would, and check what it prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import interpreters
from tests.conftest import child_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
#: the scripts ``make demo`` runs: with no directory given, each writes in a temporary one
DEMOS = ("simulation.py", "particles.py")

# Lines each script must print. A script not listed here only has to exit with status 0.
EXPECTED_OUTPUT: dict[str, list[str]] = {
    "seed.py": [
        "Array([ 4,  2, -3], dtype=int32, weak_type=True)",
        "Array([20,  0, 30, 18], dtype=int32)",
        "store[1] = AllParams(p=[])",
        "seed example OK",
    ],
    "particles.py": [
        "mean speed per step matches a Python loop over the steps",
        "particles: all checks passed",
    ],
    "grain_workers.py": [
        "240 records in 15 batches from 2 worker processes",
        "grain_workers example OK",
    ],
    "ragged_episodes.py": [
        "masked mean return matches a Python loop over the episodes",
        "ragged_episodes example OK",
    ],
    "ray_write_read.py": ["1000 records", "ray_write_read example OK"],
    "read_ragged_with_zarr.py": ["read_ragged_with_zarr example OK"],
    "replay_buffer.py": [
        "samples are exactly transitions of the last capacity, as the store holds them",
        "a reopened store resumes the buffer with the same window",
        "replay buffer: all checks passed",
    ],
    "record_scan.py": [
        "1,000 steps recorded from lax.scan blocks match an unrecorded scan",
        "record scan: all checks passed",
    ],
    "simulation.py": [
        "2,000 records, 78 columns",
        "kinetic energy matches the in-memory states",
        "float64 time stamps, bit for bit",
        "all checks passed",
    ],
    "train_batches.py": ["train_batches example OK"],
    "train_checkpoint.py": [
        "the resumed run ends with the same bytes in every leaf as an uninterrupted one",
        "train checkpoint: all checks passed",
    ],
}


def run_script(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs ``python SCRIPT ARGS`` (forked from the test zygote: tests/zygote.py)."""
    return interpreters.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=EXAMPLES.parent,
        env=child_env(),
        check=False,
    )


def test_examples_are_found() -> None:
    assert {"seed.py", *DEMOS} <= {s.name for s in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_example_runs(script: Path, tmp_path: Path) -> None:
    """A demo runs as ``make demo`` runs it (no directory: a temporary one of its own); every
    other script writes in the directory it is given."""
    result = run_script(script) if script.name in DEMOS else run_script(script, str(tmp_path))
    report = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, f"{script.name} exited with {result.returncode}\n{report}"
    for expected in EXPECTED_OUTPUT.get(script.name, []):
        assert expected in result.stdout, f"{script.name} did not print {expected!r}\n{report}"


def test_segments_load_with_x64_off(tmp_path: Path) -> None:
    import pytreestore

    with pytreestore.create(tmp_path / "s", {"p": [1]}, ragged=True) as store:
        store.extend([{"p": [1, 2]}, {"p": []}])
    _, segments = pytreestore.open(tmp_path / "s").load(ragged="segments")
    assert segments["['p']"].record.tolist() == [0, 0]
