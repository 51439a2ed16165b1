"""Run the benchmarks and write ``docs/benchmarks.md``.

    python benchmarks/run.py                 # every case, full sizes; rewrites docs/benchmarks.md
    python benchmarks/run.py --quick         # small sizes (CI smoke test); writes no docs
    python benchmarks/run.py --only append   # a case, a module (``core``) or ``core.append``
    python benchmarks/run.py --list          # the cases, without running them

Every ``benchmarks/bench_*.py`` is a benchmark module; see ``_common.py`` for what one defines.
A module that sets ``IN_QUICK_TIER = False`` (the layout sweep, ``bench_layouts.py``) runs in
full runs, and with ``--quick`` only when ``--only`` names it or one of its cases.
Nothing here asserts anything about time: the exit status is 1 only when a case raised.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs" / "benchmarks.md"
sys.path[:0] = [str(HERE), str(ROOT)]  # `_common` for the modules; this checkout's pytreestore

from _common import (  # noqa: E402
    Case,
    Result,
    markdown_table,
    results_notes,
    results_table,
    table_row,
)

VERSIONED = (
    "pytreestore",
    "jax",
    "jaxlib",
    "tensorstore",
    "zarr",
    "numpy",
    "flax",
    "ml_dtypes",
    # the anchors of bench_anchors.py and bench_random.py (the `bench` extra); "not installed"
    # when absent
    "orbax-checkpoint",
    "pylance",
    "pyarrow",
    "h5py",
    "array-record",
    "msgpack",
    "flashbax",  # bench_replay.py's anchor
)


@dataclass(frozen=True)
class Module:
    name: str  # "core" for bench_core.py
    title: str
    doc: str
    cases: list[Case]
    quick_tier: bool = True  # run by ``--quick`` without ``--only`` naming it


def discover(quick: bool) -> list[Module]:
    modules = []
    for path in sorted(HERE.glob("bench_*.py")):
        name = path.stem.removeprefix("bench_")
        try:
            mod = importlib.import_module(path.stem)
        except Exception as err:  # report it as a failed case, and run the other modules
            modules.append(Module(name, name, "", [Case("import", _reraise(err))]))
            continue
        title, tier = getattr(mod, "TITLE", name), getattr(mod, "IN_QUICK_TIER", True)
        modules.append(Module(name, title, mod.__doc__ or "", _cases(mod, quick), tier))
    return modules


def _reraise(err: Exception) -> Callable[[], list[Result]]:
    def case() -> list[Result]:
        raise err

    return case


def _cases(mod: ModuleType, quick: bool) -> list[Case]:
    if hasattr(mod, "cases"):
        return list(mod.cases(quick))
    if hasattr(mod, "run"):
        return [Case("*", lambda: list(mod.run(quick)))]
    raise TypeError(f"{mod.__file__} defines neither cases(quick) nor run(quick)")


def select(modules: Sequence[Module], only: Sequence[str]) -> list[Module]:
    """Keep the modules and cases that ``--only`` names; all of them when it names none."""
    if not only:
        return list(modules)
    wanted = {w.replace(":", ".") for w in only}
    chosen, matched = [], set()
    for m in modules:
        names = {m.name, f"bench_{m.name}"}
        if names & wanted:
            matched |= names & wanted
            chosen.append(m)
            continue
        keep = [c for c in m.cases if {c.name, f"{m.name}.{c.name}"} & wanted]
        matched |= {n for c in keep for n in (c.name, f"{m.name}.{c.name}")} & wanted
        if keep:
            chosen.append(replace(m, cases=keep))
    if missing := sorted(wanted - matched):
        known = [f"{m.name}.{c.name}" for m in modules for c in m.cases]
        raise SystemExit(f"--only {', '.join(missing)}: no such module or case; known: {known}")
    return chosen


@dataclass
class Outcome:
    module: Module
    results: list[Result]
    errors: list[str]
    seconds: float


def run_module(module: Module) -> Outcome:
    results, errors = [], []
    start = time.perf_counter()
    for case in module.cases:
        print(f"[{module.name}] {case.name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            rows = [replace(r, module=module.name) for r in case.run()]
        except Exception:
            errors.append(f"{case.name}: {traceback.format_exc()}")
            print(f"[{module.name}] {case.name} FAILED\n{traceback.format_exc()}", flush=True)
            continue
        results.extend(rows)
        print(results_table(rows), flush=True)
        print(f"[{module.name}] {case.name} took {time.perf_counter() - t0:.1f} s\n", flush=True)
    return Outcome(module, results, errors, time.perf_counter() - start)


def machine() -> list[tuple[str, str]]:
    rows = [
        ("cpus", f"{os.cpu_count()} ({_cpu_model()})"),
        ("memory", _memory()),
        ("os", platform.platform()),
        ("python", platform.python_version()),
        ("load average (1, 5, 15 min)", ", ".join(f"{x:.2f}" for x in os.getloadavg())),
    ]
    for dist in VERSIONED:
        rows.append((dist, _version(dist)))
    rows.append(("pytreestore checkout", _git_revision()))
    rows.append(("jax devices", _jax_devices()))
    return rows


def _jax_devices() -> str:
    """The devices of a JAX backend this process already started, without starting one: on
    an accelerator only one process may hold the chip, and bench_device's workers need it."""
    jax = sys.modules.get("jax")
    if jax is None:
        return "JAX not imported"
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        return "not started in this process (bench_device's rows name theirs)"
    return ", ".join(str(d) for d in jax.devices())


def _version(dist: str) -> str:
    version = getattr(sys.modules.get(dist), "__version__", None)  # the imported one wins
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no commit yet)"
    return f"{rev}{' with uncommitted changes' if dirty else ''}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def render(
    outcomes: Sequence[Outcome],
    started: datetime.datetime,
    quick: bool,
    machine_rows: Sequence[tuple[str, str]],
) -> str:
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by `make bench` (benchmarks/run.py); edit benchmarks/, not this file. -->",
        "",
        f"Measured {started:%Y-%m-%d %H:%M} UTC with `python benchmarks/run.py"
        f"{' --quick' if quick else ''}`. Each case times our code and a baseline side by side in "
        "one process; times are medians of the repeats listed under each table. **ratio** is "
        "`ours/baseline` where lower is better (a slowdown against a floor) and `baseline/ours` "
        "where higher is better (a speedup or a throughput ratio); **met?** compares it with "
        "the goal. Spreads of 2x between runs happen on this kind of VM; nothing asserts on "
        "these numbers.",
        "",
        "## Machine",
        "",
        markdown_table(("", ""), machine_rows),
    ]
    for o in outcomes:
        lines += ["", f"## {o.module.title} (`benchmarks/bench_{o.module.name}.py`)", ""]
        if doc := o.module.doc.strip():
            lines += [doc, ""]
        if o.results:
            lines += [results_table(o.results), "", results_notes(o.results)]
        lines += [f"- **failed**: `{e.splitlines()[0]}`" for e in o.errors]
        lines += ["", f"Module wall time: {o.seconds:.0f} s."]
    return "\n".join(lines) + "\n"


def summary(outcomes: Sequence[Outcome]) -> str:
    rows = []
    for o in outcomes:
        rows += [(o.module.name, *table_row(r)) for r in o.results]
        rows += [
            (o.module.name, e.split(":", 1)[0], "", "", "", "FAILED", "", "") for e in o.errors
        ]
    header = ("module", "case", "N", "ours", "baseline", "ratio", "goal", "met?")
    return markdown_table(header, rows)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, for a CI smoke test")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this module (core), case (append) or module.case; repeatable",
    )
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument(
        "--write",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite the docs page (default: only for a full run of every case)",
    )
    p.add_argument("--output", type=Path, default=DOCS, help=f"docs page (default {DOCS})")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    only = [n for arg in args.only for n in arg.split(",") if n]
    modules = select(discover(args.quick), only)
    if args.quick and not only:
        modules = [m for m in modules if m.quick_tier]
    if args.list:
        for m in modules:
            print("\n".join(f"{m.name}.{c.name}" for c in m.cases))
        return 0
    started = datetime.datetime.now(datetime.UTC)
    machine_rows = machine()  # before the run, so the load average is the other processes'
    outcomes = [run_module(m) for m in modules]
    total = sum(o.seconds for o in outcomes)
    print(f"Summary{' (quick sizes)' if args.quick else ''}, {total:.0f} s in all:")
    print(summary(outcomes))
    failed = any(o.errors for o in outcomes)
    write = args.write if args.write is not None else not (args.quick or only)
    if write and failed:
        print(f"Not rewriting {args.output}: a case failed.")
    elif write:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(render(outcomes, started, args.quick, machine_rows))
        print(f"Wrote {args.output}")
    if args.json is not None:
        rows = [r.to_json() for o in outcomes for r in o.results]
        args.json.write_text(
            json.dumps({"started": started.isoformat(), "results": rows}, indent=2)
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
