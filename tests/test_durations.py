"""tests/durations.py: the table that orders modules longest first, and its refresh."""

from __future__ import annotations

import doctest

from tests import durations


def test_a_report_sums_every_phase_of_each_module() -> None:
    report = "\n".join(
        [
            "3.25s call     tests/test_b.py::test_one[zarr]",
            "0.50s setup    tests/test_b.py::test_one[zarr]",
            "0.25s teardown tests/parity/test_c.py::test_two",
            "============ 12 passed in 4.00s ============",
        ]
    )
    assert durations.from_report(report) == {"tests/parity/test_c.py": 0.2, "tests/test_b.py": 3.8}


def test_the_table_names_existing_modules_with_seconds() -> None:
    table = durations.load()
    assert table, "tests/durations.json is missing or empty"
    root = durations.TABLE.parent.parent
    assert all((root / module).is_file() for module in table), "refresh tests/durations.json"
    assert all(isinstance(s, float | int) and s >= 0 for s in table.values())


def test_the_doctest() -> None:
    assert doctest.testmod(durations).failed == 0


def test_this_run_collected_the_longest_modules_first(request) -> None:
    seconds = durations.load()
    order = list(dict.fromkeys(i.nodeid.split("::")[0] for i in request.session.items))
    weights = [seconds.get(m, durations.UNKNOWN) for m in order]
    assert weights == sorted(weights, reverse=True)
