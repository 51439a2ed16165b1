"""Prints issue 29's parity matrix: one row per feature (a test of ``tests/parity``), one
column per kind of store, each cell the backends on which every test of that cell passed.

Run: ``python -m tests.parity.matrix`` (it runs ``pytest tests/parity``, the tests marked ``slow``
too, and reads the outcomes).
A cell reads ``ts zarr ocdbt`` when all passed, names failures with ``!``, and refusals (tests
named ``refuses``) with ``(refused)``.
"""

from __future__ import annotations

import collections
import sys

import pytest

from tests.parity.kinds import BACKENDS, KINDS

#: parity tests that live beside the suite they belong to (two processes, one launch)
ELSEWHERE = ["tests/test_multihost_ragged.py::test_every_kind_and_backend"]

SHORT = {"tensorstore": "ts", "zarr": "zarr", "ocdbt": "ocdbt"}


class _Collect:
    def __init__(self) -> None:
        self.cells: dict[tuple[str, str], dict[str, list[str]]] = collections.defaultdict(
            lambda: collections.defaultdict(list)
        )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
            return
        path, _, name = report.nodeid.partition("::")
        feature = path.rsplit("/", 1)[-1].removeprefix("test_").removesuffix(".py")
        test = name.split("[", 1)[0].removeprefix("test_")
        ids = name.split("[", 1)[1].rstrip("]").split("-") if "[" in name else []
        kinds = [k for k in KINDS if k in ids] or list(KINDS)
        backends = [b for b in BACKENDS if b in ids] or list(BACKENDS)
        row = f"{feature}: {test}"
        for kind in kinds:
            for backend in backends:
                self.cells[(row, kind)][backend].append(report.outcome)


def _cell(outcomes: dict[str, list[str]], refused: bool) -> str:
    parts = []
    for backend in BACKENDS:
        got = outcomes.get(backend)
        if not got:
            continue
        mark = "" if all(o == "passed" for o in got) else ("-" if "skipped" in got else "!")
        parts.append(SHORT[backend] + mark)
    text = " ".join(parts) or "."
    return f"{text} (refused)" if refused else text


def main() -> int:
    collect = _Collect()
    suites = ["tests/parity", *ELSEWHERE]
    every = ["-m", "slow or not slow"]  # the cells make test leaves to make test-long too
    code = pytest.main(["-q", "-p", "no:cacheprovider", *every, *suites, *sys.argv[1:]], [collect])
    rows = sorted({row for row, _ in collect.cells})
    width = max(len(r) for r in rows) if rows else 10
    print(f"\n{'feature: test'.ljust(width)} | " + " | ".join(k.ljust(16) for k in KINDS))
    print("-" * (width + 19 * len(KINDS)))
    for row in rows:
        cells = [_cell(collect.cells.get((row, k), {}), "refuse" in row) for k in KINDS]
        print(f"{row.ljust(width)} | " + " | ".join(c.ljust(16) for c in cells))
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
