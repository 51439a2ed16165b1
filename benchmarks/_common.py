"""Shared machinery for the benchmarks: timing, result rows, goals and Markdown tables.

A benchmark module is a file ``benchmarks/bench_<name>.py`` that defines

* ``TITLE``: a short heading for its table (optional; defaults to the module name), and
* ``cases(quick: bool) -> list[Case]``: the cases it offers, each a name and a function that
  runs it and returns its :class:`Result` rows (one case may return several rows), or
* ``run(quick: bool) -> list[Result]`` when its cases cannot be run one at a time.

``benchmarks/run.py`` finds the modules, runs the cases and writes the tables. Every
measurement compares our code with a baseline timed side by side in the same process; nothing
here asserts anything about time.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Goal:
    """A target for a ratio: ``ratio <= value`` or ``ratio >= value``."""

    op: Literal["<=", ">="]
    value: float

    def met(self, ratio: float) -> bool:
        if math.isnan(ratio):
            return False
        return ratio <= self.value if self.op == "<=" else ratio >= self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


def at_most(value: float) -> Goal:
    return Goal("<=", value)


def at_least(value: float) -> Goal:
    return Goal(">=", value)


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of each repeat of one measurement."""

    times: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    def __str__(self) -> str:
        if len(self.times) <= 5:
            return ", ".join(format_seconds(t) for t in self.times)
        lo, hi = min(self.times), max(self.times)
        return f"{len(self.times)} runs from {format_seconds(lo)} to {format_seconds(hi)}"


@dataclass(frozen=True)
class Timed:
    """What to time: ``fn(setup())``, ``repeats`` times after ``warmup`` untimed runs.

    ``setup`` and ``teardown(state, output)`` run outside the timed region, so each run can
    start from a fresh state (a new store, say), check its output and clean up after itself.
    """

    fn: Callable[[Any], Any]
    repeats: int
    warmup: int = 0
    setup: Callable[[], Any] | None = None
    teardown: Callable[[Any, Any], None] | None = None

    def once(self) -> float:
        state = self.setup() if self.setup is not None else None
        gc.collect()
        start = time.perf_counter()
        out = self.fn(state)
        elapsed = time.perf_counter() - start
        if self.teardown is not None:
            self.teardown(state, out)
        return elapsed


def measure_side_by_side(*timed: Timed) -> list[Timing]:
    """Times each of ``timed`` with ``time.perf_counter``, interleaving their runs.

    Round ``k`` runs the ``k``-th repeat of each one that has repeats left, so a slow spell of
    the machine (another process, page-cache pressure) falls on ours and the baseline alike.
    A full garbage collection runs before each run; the collector stays enabled while timing,
    as it would be in a user's program.
    """
    times: list[list[float]] = [[] for _ in timed]
    for k in range(max(t.warmup + t.repeats for t in timed)):
        for t, out in zip(timed, times, strict=True):
            if k < t.warmup + t.repeats:
                elapsed = t.once()
                if k >= t.warmup:
                    out.append(elapsed)
    return [Timing(tuple(t)) for t in times]


def measure(
    fn: Callable[[Any], Any],
    *,
    repeats: int,
    warmup: int = 0,
    setup: Callable[[], Any] | None = None,
    teardown: Callable[[Any, Any], None] | None = None,
) -> Timing:
    """Times one thing on its own; see :class:`Timed` and :func:`measure_side_by_side`."""
    return measure_side_by_side(Timed(fn, repeats, warmup, setup, teardown))[0]


@dataclass(frozen=True)
class Result:
    """One row of a benchmark table.

    ``ratio`` is ``ours / baseline`` when ``higher_is_better`` is false (a slowdown: lower is
    better) and ``baseline / ours`` when it is true (a speedup or throughput ratio).
    """

    case: str
    n: int
    ours: Timing
    baseline: Timing
    goal: Goal
    higher_is_better: bool
    ours_label: str
    baseline_label: str
    module: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    unit: str = "s"  # what ``ours`` and ``baseline`` measure: seconds, or e.g. "GiB"

    @property
    def ours_s(self) -> float:
        return self.ours.median

    @property
    def baseline_s(self) -> float:
        return self.baseline.median

    @property
    def ratio(self) -> float:
        num, den = (
            (self.baseline_s, self.ours_s)
            if self.higher_is_better
            else (self.ours_s, self.baseline_s)
        )
        return num / den if den > 0 else math.nan

    @property
    def paired_ratio(self) -> float | None:
        """The median of the per-run ratios, pairing the k-th run of ours with the baseline's.

        With runs interleaved (:func:`measure_side_by_side`) each pair saw the same state of
        the machine, so this is steadier than the ratio of medians when the machine is busy.
        None unless both sides have the same number (at least 3) of runs.
        """
        ours, base = self.ours.times, self.baseline.times
        if len(ours) != len(base) or len(ours) < 3 or min(*ours, *base) <= 0:
            return None
        pairs = (
            zip(base, ours, strict=True) if self.higher_is_better else zip(ours, base, strict=True)
        )
        return statistics.median(num / den for num, den in pairs)

    @property
    def ratio_label(self) -> str:
        return "baseline/ours" if self.higher_is_better else "ours/baseline"

    @property
    def met(self) -> bool:
        return self.goal.met(self.ratio)

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "case": self.case,
            "n": self.n,
            "ours_s": self.ours_s,
            "baseline_s": self.baseline_s,
            "ours_times_s": list(self.ours.times),
            "baseline_times_s": list(self.baseline.times),
            "ratio": self.ratio,
            "ratio_definition": self.ratio_label,
            "paired_ratio": self.paired_ratio,
            "goal": str(self.goal),
            "met": self.met,
            "ours": self.ours_label,
            "baseline": self.baseline_label,
            "notes": list(self.notes),
            "unit": self.unit,
        }


@dataclass(frozen=True)
class Case:
    """A named benchmark case; ``run()`` does its own setup and returns its rows."""

    name: str
    run: Callable[[], list[Result]]


def format_seconds(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.1f} us"


def format_rate(amount: float, seconds: float, unit: str) -> str:
    """``amount / seconds`` to three significant figures, e.g. ``"1.23e+05 records/s"``."""
    if seconds <= 0:
        return f"n/a {unit}/s"
    rate = amount / seconds
    text = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
    return f"{text} {unit}/s"


def format_ratio(result: Result) -> str:
    return f"{result.ratio:.2f}x" if not math.isnan(result.ratio) else "n/a"


TABLE_HEADER = ("case", "N", "ours", "baseline", "ratio", "goal", "met?")


def format_value(value: float, unit: str) -> str:
    """Seconds as :func:`format_seconds`; any other unit as ``"1.23 GiB"``."""
    return format_seconds(value) if unit == "s" else f"{value:.3g} {unit}"


def table_row(result: Result) -> tuple[str, ...]:
    return (
        result.case,
        f"{result.n:,}",
        format_value(result.ours_s, result.unit),
        format_value(result.baseline_s, result.unit),
        f"{format_ratio(result)} ({result.ratio_label})",
        str(result.goal),
        "skipped" if math.isnan(result.ratio) else "yes" if result.met else "**no**",
    )


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured Markdown table with columns padded to line up in plain text."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def results_table(results: Sequence[Result]) -> str:
    return markdown_table(TABLE_HEADER, [table_row(r) for r in results])


def results_notes(results: Sequence[Result]) -> str:
    """One bullet per row saying what was timed on each side, then any notes."""
    lines = []
    for r in results:
        lines.append(f"- **{r.case}**: ours = {r.ours_label}; baseline = {r.baseline_label}.")
        if r.unit == "s":
            lines.append(f"  Repeats: ours [{r.ours}], baseline [{r.baseline}].")
        if (paired := r.paired_ratio) is not None:
            lines.append(f"  Median of the per-run ratios: {paired:.2f}x.")
        lines.extend(f"  {note}" for note in r.notes)
    return "\n".join(lines)
