"""The test zygote (tests/interpreters.py): a forked child behaves as a fresh interpreter would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import interpreters
from tests.conftest import child_env

CHILD = """
import atexit, json, os, sys, threading, time
atexit.register(lambda: print("atexit", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread", flush=True))).start()
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("PTS_PROBE"),
                  "stdin": sys.stdin.read(), "main": __name__, "path0": sys.path[0]}), flush=True)
sys.stderr.write("to stderr\\n")
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_child_gets_argv_cwd_env_streams_and_the_interpreters_exit(tmp_path):
    env = {**child_env(), "PTS_PROBE": "probe"}
    done = interpreters.run(
        [sys.executable, "-c", CHILD, "3", "x y"],
        input="given",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    first, *rest = done.stdout.splitlines()
    assert json.loads(first) == {
        "argv": ["-c", "3", "x y"],
        "cwd": str(tmp_path),
        "env": "probe",
        "stdin": "given",
        "main": "__main__",
        "path0": "",
    }
    assert rest == ["thread", "atexit"]  # a non-daemon thread joined, then the atexit hooks
    assert (done.returncode, done.stderr) == (3, "to stderr\n")


def test_scripts_modules_and_uncaught_errors(tmp_path: Path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(__file__, sys.argv[1:])\nraise KeyError('lost')\n")
    env = child_env()
    done = interpreters.run([sys.executable, script, "a"], capture_output=True, text=True, env=env)
    assert done.stdout == f"{script} ['a']\n"
    assert done.returncode == 1 and done.stderr.endswith("KeyError: 'lost'\n")
    done = interpreters.run(
        [sys.executable, "-m", "json.tool"], input="[1]", capture_output=True, text=True, env=env
    )
    assert (done.returncode, done.stdout) == (0, "[\n    1\n]\n")


def test_what_a_fork_cannot_be_runs_as_a_plain_subprocess(monkeypatch):
    # a zygote of the test's own, started with today's child_env(): the worker's was started by
    # whichever test came first, perhaps while it had changed the environment
    monkeypatch.setattr(interpreters, "_CLIENT", [])
    try:
        x64 = "0" if os.environ.get("JAX_ENABLE_X64") == "1" else "1"
        env = {**child_env(), "JAX_ENABLE_X64": x64}  # read as JAX is imported: differs
        for args, kwargs in (((), {"env": env}), (("-X", "dev"), {"env": child_env()})):
            with interpreters.popen([sys.executable, *args, "-c", "pass"], **kwargs) as plain:
                assert type(plain) is subprocess.Popen
            assert plain.returncode == 0
        with interpreters.popen([sys.executable, "-c", "pass"], env=child_env()) as forked:
            assert isinstance(forked, interpreters.ForkedPopen)
        assert forked.returncode == 0
    finally:
        for client in interpreters._CLIENT:
            client.close()


def test_a_timeout_kills_the_child():
    with pytest.raises(subprocess.TimeoutExpired):
        interpreters.run(
            [sys.executable, "-c", "import time; time.sleep(60)"], env=child_env(), timeout=0.5
        )
