"""Two processes under ``jax.distributed`` on 127.0.0.1: the one launcher of the multi-host tests.

The test side calls :func:`run_two` with a child module (``tests.multihost_child``) or script;
it starts two interpreters, ``ID PORT ARGS...`` each, on CPU, and returns the JSON report each
printed last. The child side calls :func:`join` first: it reads ``ID PORT`` from ``sys.argv``,
gives the process 4 CPU devices and joins the other one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pytreestore.testing.s3 import free_port
from tests import interpreters

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 2
DEVICES = 4  # CPU devices per process


def join(*, x64: bool = False) -> tuple[int, list[str]]:
    """Joins the two-process ``jax.distributed`` run this child was started in.

    Args:
        x64: turn on ``jax_enable_x64`` before joining.

    Returns:
        This process's id (0 or 1) and the arguments after ``ID PORT``.
    """
    process_id, port, rest = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    if x64:
        jax.config.update("jax_enable_x64", True)
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=PROCESSES,
        process_id=process_id,
        initialization_timeout=60,
    )
    return process_id, rest


def run_two(child: str | Path, *args: str | Path, timeout: float = 240) -> list[dict[str, Any]]:
    """Runs ``child`` in two processes under ``jax.distributed``; their reports, by process.

    Args:
        child: a module name (run with ``python -m``) or the path of a script.
        *args: the arguments after ``ID PORT``.
        timeout: seconds each process may take; a hang fails the test, not the run.

    Returns:
        The JSON object each process printed on its last line, process 0's first.
    """
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    program = [str(child)] if isinstance(child, Path) else ["-m", child]
    procs = [
        interpreters.popen(  # forked from the test zygote (tests/interpreters.py)
            [sys.executable, *program, str(i), port, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for i in range(PROCESSES)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{out}\n{err[-6000:]}"
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return sorted(outputs, key=lambda o: o["process"])
