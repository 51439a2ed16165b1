"""Crash trials of truncate (issue 28): a writer SIGKILLed a few milliseconds into
``truncate``, on a store whose column was added by ``evolve(add=)`` and on a ragged store that
learnt its list elements and its optional subtree at later records, then truncates below
where they start.

Each trial makes the store in this process, starts a ``truncate_writer``
(:mod:`tests.truncate_harness`) that waits before the truncate to kill (the first, or a
second after appending past the first), lets it go and kills it after a random delay of up
to about the time such a truncate takes (measured by the earlier trials). Then the store

* opens with ``mode="r"`` and ``mode="a"`` (0 stores unreadable);
* holds a count the writer may have committed (the count before the call, the truncate's,
  or that of the flush it begins with), and exactly those records: every record acknowledged
  before the truncate up to the truncate point, or every one if the truncate never committed
  (0 records lost); in the evolved store each record holds the ``['lr']`` it was appended
  with, or the default if it was appended before the evolve and never again;
* reads the version before a committed truncate as it was;
* appends more records and reads them all back.

Counts are printed (``pytest -rP``); ``make test-long`` runs 300 trials.
"""

from __future__ import annotations

import dataclasses
import random
import time
from pathlib import Path
from typing import Any

import jax
import pytest

import pytreestore
from pytreestore.testing import assert_trees_equal
from tests import truncate_harness as h
from tests.conftest import BACKENDS
from tests.trial_harness import (
    RAGGED_DECL,
    Zygote,
    possible_commits,
    ragged_like,
    ragged_record,
    read_log,
    record,
    wait_for,
)

pytest_plugins = ("tests.fixtures",)
SCENARIOS = ("evolve", "ragged")


@dataclasses.dataclass
class Tally:
    trials: int = 0
    inside_truncate: int = 0
    truncate_committed: int = 0
    unreadable: int = 0
    lost: int = 0
    miscounts: int = 0
    records_checked: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    delay: dict[str, float] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        return (
            f"{self.trials} trials, {self.inside_truncate} killed inside truncate "
            f"({self.truncate_committed} of them after its commit), {self.records_checked} "
            f"records checked: {self.unreadable} stores unreadable, {self.lost} with records "
            f"lost or wrong, {self.miscounts} writers whose len() was wrong"
        )


def expected_records(scenario: str, flags: list[bool]) -> list[Any]:
    if scenario == "ragged":
        return [ragged_record(i) for i in range(len(flags))]
    return [h.evolved_record(i) if f else {**record(i), "lr": h.DEFAULT_LR} for i, f in
            enumerate(flags)]  # fmt: skip


def check_records(store: pytreestore.TreeStore, scenario: str, want: list[bool], note: str) -> None:
    """``store`` holds exactly the records ``want`` describes."""
    assert len(store) == len(want), f"{note}: {len(store)} records, want {len(want)}"
    records = expected_records(scenario, want)
    if not records:
        return
    if scenario == "ragged":
        for i, got in enumerate(store.records(as_numpy=True)):
            assert jax.tree.structure(got) == jax.tree.structure(records[i]), f"{note} [{i}]"
            assert_trees_equal(got, records[i], err_msg=f"{note}, record {i}")
        if not store.schema.pending:
            full = pytreestore.stack(records, like=ragged_like(False), as_numpy=True, **RAGGED_DECL)
            assert_trees_equal(store.load(as_numpy=True), full, err_msg=f"{note}, padded")
        return
    want_batch = pytreestore.stack(records, as_numpy=True)
    assert_trees_equal(store.load(as_numpy=True), want_batch, err_msg=note)


def check_after_kill(
    path: str,
    backend: str,
    scenario: str,
    options: set[int],
    rows: list[bool],
    note: str,
    cut: tuple[int, int] | None,
) -> tuple[int, bool]:
    """The checks after a kill; the count the store holds. Raises ``Unreadable`` when it
    does not open, AssertionError when it holds other records than it may. ``cut``: the
    writer was killed inside a truncate from that many records to that many; the second
    value returned says whether that truncate committed."""
    try:
        reader = pytreestore.open(path, backend=backend)
        n = len(reader)
    except pytreestore.errors.PyTreeStoreError as err:
        raise Unreadable(f"{note}: open(mode='r'): {type(err).__name__}: {err}") from err
    with reader:
        assert n in options, f"{note}: holds {n} records, may hold one of {sorted(options)}"
        check_records(reader, scenario, rows[:n], f"{note}, mode='r'")
    undone = cut is not None and n == cut[1] and check_undo(path, backend, scenario, rows, note)
    try:
        writer = pytreestore.open(path, "a", backend=backend)
    except pytreestore.errors.PyTreeStoreError as err:
        raise Unreadable(f"{note}: open(mode='a'): {type(err).__name__}: {err}") from err
    with writer:
        assert len(writer) == n, f"{note}: mode='a' holds {len(writer)}, mode='r' {n}"
        make = ragged_record if scenario == "ragged" else h.evolved_record
        writer.extend(make(i) for i in range(n, n + 3))
    with pytreestore.open(path, backend=backend) as again:
        check_records(again, scenario, rows[:n] + [True] * 3, f"{note}, appended after")
    return n, undone


class Unreadable(Exception):
    pass


def check_undo(path: str, backend: str, scenario: str, rows: list[bool], note: str) -> bool:
    """After a committed truncate and nothing since, the version before it reads as it was;
    whether the truncate committed (its count may also be the count it began with)."""
    with pytreestore.open(path, backend=backend) as reader:
        listed = reader.versions()
    if listed[-1].operation != "truncate":
        return False
    before = listed[-2]
    assert before.readable, f"{note}: {before}"
    with pytreestore.open(path, backend=backend, version=before.version) as old:
        check_records(old, scenario, rows[: before.records], f"{note}, version {before.version}")
    return True


def run_trial(zyg: Zygote, tmp: Path, rng: random.Random, trial: int, tally: Tally) -> None:
    scenario, backend = SCENARIOS[trial % 2], BACKENDS[trial // 2 % 3]
    chunk = rng.choice([2, 4, 8])
    a = rng.randint(3, 14)
    b = a + rng.randint(1, 8)
    if scenario == "ragged":
        a, b = 0, rng.randint(10, 24)  # learnt at records 3, 6 and about 3-9
    path, log, go = (str(tmp / f"{trial}-{x}") for x in ("store", "log", "go"))
    flags = h.make_store(scenario, path, backend, chunk, a, b)
    plan, wait_at = h.make_plan(rng, b, chunk)
    key = scenario
    pid = zyg.start(
        kind="truncate_writer",
        scenario=scenario,
        path=path,
        backend=backend,
        plan=plan,
        wait_at=wait_at,
        go=go,
        log=log,
    )
    wait_for(log, "waiting")
    Path(go).touch()
    time.sleep(rng.uniform(0, tally.delay.get(key, 0.02)))
    zyg.kill(pid)
    lines = read_log(log)
    assert not [x for x in lines if x.startswith("FAIL")], "\n".join(lines[-5:])
    wrong = [x for x in lines if x.startswith("miscount")]
    if wrong:
        tally.miscounts += 1
        tally.failures.append(f"trial {trial} ({scenario}, {backend}): {wrong[0]}")
    lines = [x for x in lines if not x.startswith("miscount")]
    note = f"trial {trial} ({scenario}, {backend}, chunk {chunk}, a={a} b={b}, plan {plan})"
    note += f" log tail {lines[-3:]}"
    tune_delay(lines, wait_at, tally, key)
    options, _ = possible_commits(lines, chunk)
    rows = h.expected_rows(flags, plan, lines)
    tally.trials += 1
    cut = None
    if lines[-1].startswith("op truncate"):
        tally.inside_truncate += 1
        cut = (int(lines[-1].split()[2]), int(lines[-1].split()[3]))
    try:
        n, undone = check_after_kill(path, backend, scenario, options, rows, note, cut)
        tally.records_checked += n + 3
        tally.truncate_committed += undone
    except Unreadable as err:
        tally.unreadable += 1
        tally.failures.append(str(err))
    except pytreestore.errors.PyTreeStoreError as err:  # opened, but its records do not read
        tally.unreadable += 1
        tally.failures.append(f"{note}: {type(err).__name__}: {err}")
    except AssertionError as err:
        tally.lost += 1
        tally.failures.append(str(err))


def tune_delay(lines: list[str], wait_at: int, tally: Tally, key: str) -> None:
    """Kills land inside the truncate, before and after its commit: the longest delay grows
    while kills land before the truncate ends, and shrinks when one lands after it."""
    done = sum(x.startswith("done") for x in lines)
    factor = 0.7 if done > wait_at else 1.25
    tally.delay[key] = min(2.0, tally.delay.get(key, 0.02) * factor)


def run_trials(zyg: Zygote, tmp: Path, seed: int, trials: int) -> Tally:
    tally, rng = Tally(), random.Random(seed)
    for t in range(trials):
        run_trial(zyg, tmp, rng, t, tally)
    return tally


def report(tally: Tally, label: str, seed: int) -> None:
    print(f"\n{label} (seed {seed}): {tally}")
    for line in tally.failures[:10]:
        print("  ", line[:2000])
    assert (tally.unreadable, tally.lost, tally.miscounts) == (0, 0, 0), "\n".join(
        tally.failures[:5]
    )


def test_truncate_crash_trials(zygote, tmp_path):
    seed = 28
    tally = run_trials(zygote, tmp_path, seed, 6)
    report(tally, "truncate crash trials", seed)
    assert tally.trials == 6


@pytest.mark.slow
def test_truncate_crash_trials_long(zygote, tmp_path):
    seed = random.randrange(1 << 30)
    tally = run_trials(zygote, tmp_path, seed, 300)
    report(tally, "truncate crash trials, long", seed)
    assert tally.trials == 300
