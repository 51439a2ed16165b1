"""Writers sharing an OCDBT store through the OCDBT coordinator (issue 17, part 2).

* **2 shared writers vs 1**: two writer processes, each opened with
  ``pytreestore.open(path, "a", backend="ocdbt", coordinator=address)``, each committing
  ``N`` records one commit each (``append`` + ``flush``), against one such writer committing
  ``2 N``: the same commits, the same coordinator. Timed from the moment every process is
  ready (opened) until the last one is done; process start-up is not timed. Ratio:
  throughput, ours (two writers) over the baseline (one). Commits take turns under the
  commit claim (``pytreestore._log.locks``), so about 1 is the expectation: a second
  writer adds no commit rate, and the row shows what the claim's hand-over costs.
* **shared writer vs exclusive writer**: one shared writer committing ``2 N`` records against
  one writer of the same OCDBT store opened without a coordinator (each commit one atomic
  OCDBT transaction). Ratio: slowdown, ours over the exclusive writer; the price of the
  claim, the re-read commit record and the rewritten tail per commit.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from _common import Case, Result, Timed, at_least, at_most, measure_side_by_side

import pytreestore
from pytreestore.backends import ocdbt_coordinator

TITLE = "OCDBT: writers sharing a store through the coordinator"
HERE = Path(__file__).resolve().parent

_WRITER = """
import sys, time
import numpy as np, pytreestore
path, address, count = sys.argv[1], sys.argv[2] or None, int(sys.argv[3])
options = {"coordinator": address} if address else {}
store = pytreestore.open(path, "a", backend="ocdbt", **options)
print("READY", flush=True)
sys.stdin.readline()
for i in range(count):
    store.append({"x": np.float32(i), "y": np.zeros(16, np.float32)})
    store.flush()
store.close()
print("DONE", flush=True)
"""


def _start(path: Path, address: str, count: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(path), address, str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=HERE.parent,  # `python -c` imports this checkout's pytreestore
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


def _setup(tmp: Path, address: str, counts: list[int]) -> list[subprocess.Popen[str]]:
    path = tmp / "store"
    shutil.rmtree(path, ignore_errors=True)
    like = {"x": np.float32(0), "y": np.zeros(16, np.float32)}
    pytreestore.create(path, like, backend="ocdbt", chunk_records=256).close()
    return [_start(path, address, n) for n in counts]


def _go(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        out, _ = proc.communicate(timeout=600)
        assert out.strip().endswith("DONE"), out


def _rows(quick: bool) -> list[Result]:
    count, repeats = (10, 1) if quick else (50, 3)
    with tempfile.TemporaryDirectory() as folder, ocdbt_coordinator() as address:
        tmp = Path(folder)

        def timed(address: str, counts: list[int]) -> Timed:
            return Timed(_go, repeats, setup=lambda: _setup(tmp, address, counts))

        two, one, alone = measure_side_by_side(
            timed(address, [count, count]), timed(address, [2 * count]), timed("", [2 * count])
        )
    commits = 2 * count
    return [
        Result(
            "2 shared writers vs 1 (commits/s)",
            commits,
            two,
            one,
            at_least(0.8),
            True,
            f"2 processes x {count} commits through the coordinator",
            f"1 process x {commits} commits through the coordinator",
            notes=("commits take turns under the commit claim: about 1 expected",),
        ),
        Result(
            "shared writer vs exclusive writer",
            commits,
            one,
            alone,
            at_most(4.0),
            False,
            f"1 shared writer x {commits} commits",
            f"1 writer without coordinator x {commits} commits (atomic transactions)",
        ),
    ]


def cases(quick: bool) -> list[Case]:
    return [Case("writers", lambda: _rows(quick))]
