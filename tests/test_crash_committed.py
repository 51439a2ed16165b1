"""``store.committed`` against a fresh reader after a SIGKILL (issue 44): a writer that kills
itself the moment ``committed`` rises leaves at least that many records, exactly those
appended, on every backend.

The writer is a child forked by a trial zygote (:mod:`tests.trial_harness`) running
:func:`writer_main`. It follows a plan hypothesis draws (appends, generator ``extend``\\ s,
``extend_batch``\\ es and flushes of records of a drawn size, under a drawn ``chunk_records``);
a thread of its own polls ``store.committed`` and, the first time it reaches the plan's
``kill_at``, logs the count and SIGKILLs the process, while the background writer may still
be committing. The test then opens the store afresh and checks that it holds at least the
count logged, at most what was appended, each record exact.

``make test`` runs a few plans per backend; ``make test-long`` (``-m slow``) many more.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import pytreestore
from pytreestore.testing import assert_trees_equal
from tests.conftest import child_env
from tests.trial_harness import Log, Zygote, read_log

QUICK = settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
LONG = settings(QUICK, max_examples=25, derandomize=False)

OPS = st.tuples(st.sampled_from(["append", "extend", "batch", "flush"]), st.integers(1, 12))
PLANS = st.fixed_dictionaries(
    {
        "chunk": st.sampled_from([2, 4, 16]),
        "width": st.sampled_from([3, 50_000]),  # floats a record: 12 B, or 200 KB
        "ops": st.lists(OPS, min_size=1, max_size=12),
        "kill_at": st.integers(1, 40),
    }
)


def record(i: int, width: int) -> dict[str, Any]:
    """Record ``i``: a function of ``i`` only."""
    return {"i": np.int64(i), "v": np.full(width, i, np.float32), "b": np.bool_(i % 3 == 0)}


def appended(plan: dict[str, Any]) -> int:
    return sum(k for op, k in plan["ops"] if op != "flush")


# ---- the writer ----------------------------------------------------------------------------------


def writer_main(path: str, spec_file: str, log_file: str) -> None:
    """Runs in the forked child: follows the plan; a thread kills the process when
    ``committed`` reaches ``kill_at`` (the plan ends with a flush that gets it there)."""
    plan = json.loads(Path(spec_file).read_text())
    width, log = plan["width"], Log(log_file)
    store = pytreestore.create(
        path, record(0, width), chunk_records=plan["chunk"], backend=plan["backend"]
    )
    target = min(plan["kill_at"], appended(plan))
    threading.Thread(target=_kill_when, args=(store, target, log), daemon=True).start()
    n = 0
    for op, k in plan["ops"]:
        rows = [record(i, width) for i in range(n, n + k)]
        if op == "flush":
            store.flush()
            continue
        if op == "append":
            for r in rows:
                store.append(r)
        elif op == "extend":
            store.extend(iter(rows))
        else:
            store.extend_batch(pytreestore.stack(rows, as_numpy=True))
        n += k
    store.flush()
    time.sleep(60)  # the thread kills the process
    log("ALIVE")


def _kill_when(store: pytreestore.TreeStore, target: int, log: Log) -> None:
    while True:
        committed = store.committed
        if committed >= target:
            log(f"COMMITTED {committed}")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.0002)


# ---- the test ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """A zygote importing this checkout's pytreestore (``child_env``'s ``PYTHONPATH``)."""
    z = Zygote(env=child_env())
    yield z
    z.close()


def killed_at_commit(zygote: Zygote, backend: str, plan: dict[str, Any]) -> None:
    """Runs ``plan`` in a writer on ``backend``; the fresh reader's check."""
    folder = Path(tempfile.mkdtemp(prefix="crash-committed-"))
    path, spec, log = str(folder / "s"), folder / "plan.json", str(folder / "writer.log")
    spec.write_text(json.dumps({**plan, "backend": backend}))
    target = "tests.test_crash_committed:writer_main"
    pid = zygote.start(kind="call", target=target, args=[path, str(spec), log], log=log)
    try:
        status = os.waitstatus_to_exitcode(zygote.wait(pid, timeout=120))
    except TimeoutError:
        zygote.kill(pid)
        raise
    lines = read_log(log)
    stderr = "\n".join(read_log(log + ".stderr")[-20:])
    assert status == -signal.SIGKILL, f"the writer exited {status}: {lines[-3:]}\n{stderr}"
    said = [int(x.split()[1]) for x in lines if x.startswith("COMMITTED")]
    assert said, f"the writer was killed before it said what was committed: {lines}"
    with pytreestore.open(path, backend=backend) as store:
        held, total = len(store), appended(plan)
        assert said[-1] <= held <= total, (
            f"committed said {said[-1]}; a fresh reader after the SIGKILL holds {held} "
            f"(of {total} appended), plan {plan}"
        )
        if held:
            rows = [record(i, plan["width"]) for i in range(held)]
            want = pytreestore.stack(rows, as_numpy=True)
            assert_trees_equal(store.load(as_numpy=True), want, err_msg=f"plan {plan}")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("backend", ["tensorstore", "ocdbt", "zarr"])
def test_committed_holds_after_a_sigkill(zygote, backend):
    QUICK(given(PLANS)(lambda plan: killed_at_commit(zygote, backend, plan)))()


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["tensorstore", "ocdbt", "zarr"])
def test_committed_holds_after_a_sigkill_long(zygote, backend):
    LONG(given(PLANS)(lambda plan: killed_at_commit(zygote, backend, plan)))()
