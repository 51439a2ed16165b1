"""How long each test module takes, so ``make test`` starts the longest first.

``make test`` runs the modules on one worker per core (``pytest -n auto --dist loadfile``), and
pytest-xdist hands them out in collection order. In name order the longest came last, and one
worker went on alone for tens of seconds after the other had finished. ``tests/conftest.py``
therefore collects modules longest first, by the seconds recorded in ``durations.json`` (a
module missing there counts as :data:`UNKNOWN`). The order changes when a test runs, never
what it checks.

Refresh the table after tests change much (it only steers the order, so a stale one costs
seconds, never a result)::

    .venv/bin/python -m pytest -n auto --dist loadfile --durations=0 > /tmp/report.txt
    .venv/bin/python -m tests.durations /tmp/report.txt
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TABLE = Path(__file__).with_name("durations.json")
#: seconds assumed for a module the table does not name (a new one): about the median
UNKNOWN = 2.0
_LINE = re.compile(r"^([\d.]+)s (?:call|setup|teardown)\s+([^:\s]+)::")


def load() -> dict[str, float]:
    """The recorded seconds of each module, by its path from the repository root."""
    try:
        return json.loads(TABLE.read_text())
    except (OSError, ValueError):
        return {}


def from_report(text: str) -> dict[str, float]:
    """Seconds per module summed from the lines of a ``pytest --durations=0`` report.

    Example:
        >>> from_report("1.50s call     tests/test_a.py::test_x")
        {'tests/test_a.py': 1.5}
    """
    seconds: dict[str, float] = {}
    for line in text.splitlines():
        if m := _LINE.match(line):
            seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
    return {module: round(s, 1) for module, s in sorted(seconds.items())}


def main(argv: list[str]) -> int:
    table = from_report(Path(argv[0]).read_text())
    if not table:
        print("no --durations=0 lines in the report", file=sys.stderr)
        return 1
    TABLE.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n")
    print(f"wrote {TABLE} ({len(table)} modules, {sum(table.values()):.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
