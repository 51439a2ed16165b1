"""The crash trials of truncate (issue 28): a writer killed inside ``truncate`` after an
``evolve(add=)``, and after a ragged store learnt its structures.

The store is made in the test's process (:func:`make_store`): a fixed store whose column
``['lr']`` was added by ``evolve`` at record ``a`` (records before it read the default), or
a ragged store created *pending* that learnt its list elements and its optional subtree at
later records (:func:`tests.trial_harness.ragged_record`). A ``truncate_writer`` child of the
zygote (:mod:`tests.trial_harness`) opens it for appending and runs a plan of ``extend``,
``flush`` and ``truncate`` calls, logging each as the other trial writers do (``op KIND FROM
TO`` / ``done COMMITTED``); before the call numbered ``wait_at`` (a truncate) it logs
``waiting`` and spins until the ``go`` file appears, so that the test kills it a few
milliseconds into that truncate.

:func:`expected_rows` says what each record must hold afterwards: in the fixed store, the
value of ``['lr']`` a record was appended with, or the default for a record appended before
the evolve and never written again.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from tests.trial_harness import RAGGED_DECL, Log, ragged_like, ragged_record, record

DEFAULT_LR = np.float32(-1)


def lr(i: int) -> np.float32:
    return np.float32(i + 0.5)


def evolved_record(i: int) -> dict[str, Any]:
    """Record ``i`` appended after the evolve: with its own ``['lr']``."""
    return {**record(i), "lr": lr(i)}


def make_store(scenario: str, path: str, backend: str, chunk: int, a: int, b: int) -> list[bool]:
    """Creates the store of ``scenario`` holding records ``0 .. b-1``, committed: in "evolve",
    ``['lr']`` added at record ``a``. Returns, per record, whether it holds its own ``lr``."""
    import pytreestore

    if scenario == "ragged":
        with pytreestore.create(
            path, ragged_like(True), chunk_records=chunk, backend=backend, **RAGGED_DECL
        ) as store:
            store.extend(ragged_record(i) for i in range(b))
        return [True] * b
    with pytreestore.create(path, record(0), chunk_records=chunk, backend=backend) as store:
        store.extend(record(i) for i in range(a))
        store.evolve(add={"['lr']": DEFAULT_LR})
        store.extend(evolved_record(i) for i in range(a, b))
    return [False] * a + [True] * (b - a)


def make_plan(rng: Any, b: int, chunk: int) -> tuple[list[list[Any]], int]:
    """A plan of calls and the index of the truncate to kill: an optional buffered extend, a
    truncate below where the structures start (mostly), an extend past it and a flush, a
    second truncate, and an extend."""
    plan: list[list[Any]] = []
    n = b
    if rng.random() < 0.5:
        n += rng.randint(1, 2 * chunk)
        plan.append(["extend", n])  # buffered, unless it filled a chunk: the truncate flushes
    first = rng.randint(0, min(n, 12)) if rng.random() < 0.8 else rng.randint(0, n)
    plan.append(["truncate", first])
    wait_at = len(plan) - 1
    top = first + rng.randint(1, 3 * chunk)
    plan += [["extend", top], ["flush", top]]
    second = rng.randint(max(0, first - 3), top)
    plan.append(["truncate", second])
    if rng.random() < 0.5:
        wait_at = len(plan) - 1
    plan.append(["extend", second + rng.randint(1, 2 * chunk)])
    return plan, wait_at


def expected_rows(flags: list[bool], plan: list[list[Any]], log: list[str]) -> list[bool]:
    """The records a writer killed at the end of ``log`` may have committed, longest: those
    before the call it was killed in, and what that call appends (each ``True`` where the
    record holds its own ``lr``). A committed count ``n`` holds the first ``n`` of them."""
    rows = list(flags)
    started = sum(line.startswith("op ") for line in log)
    inside = bool(log) and log[-1].startswith("op ")
    for index, (kind, upto) in enumerate(plan[:started]):
        if kind == "extend":
            rows += [True] * (upto - len(rows))
        elif kind == "truncate" and not (inside and index == started - 1):
            rows = rows[:upto]
    return rows


def run_truncate_writer(job: dict[str, Any], log: Log) -> None:
    """The zygote's ``truncate_writer`` job (see the module's docstring)."""
    import pytreestore

    ragged = job["scenario"] == "ragged"
    make = ragged_record if ragged else evolved_record
    store = pytreestore.open(job["path"], mode="a", backend=job["backend"])
    log("ready", store.committed)
    n = store.committed
    for index, (kind, upto) in enumerate(job["plan"]):
        if index == job["wait_at"]:
            log("waiting")
            while not os.path.exists(job["go"]):
                pass
        log("op", kind, n, upto)
        if kind == "extend":
            store.extend(make(i) for i in range(n, upto))
        elif kind == "truncate":
            store.truncate(upto)
        else:
            store.flush()
        n = upto
        # a truncate that returned committed its count; the plan goes on from its own count
        log("done", n if kind == "truncate" else store.committed)
        if (len(store), store.committed) != (n, n if kind != "extend" else store.committed):
            log("miscount", f"len {len(store)}, committed {store.committed} after {kind} to {n}")
    log("finished")
    time.sleep(3600)
