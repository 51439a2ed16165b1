"""What pytreestore needs of the operating system (``pytreestore._runtime``): ``import
pytreestore`` and every read work where ``fcntl`` and ``fork`` are missing (Windows,
simulated here by hiding them before the import, in a child interpreter); writing a local
store is then refused by name, before anything is written.

The ``/proc`` half (the lock's liveness proof) is tested in tests/test_lock.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._runtime import at_fork, flock_module

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent(
    """
    import json, os, sys
    sys.modules["fcntl"] = None  # import fcntl raises ImportError, as where there is none
    del os.register_at_fork, os.fork  # and no fork either
    import numpy as np
    import pytreestore
    from pytreestore import errors

    stores, out = json.loads(sys.argv[1]), {}
    for backend in ("tensorstore", "zarr"):
        got = out[backend] = {}
        for kind, path in stores.items():
            with pytreestore.open(path, backend=backend) as reader:
                got[kind] = json.dumps(list(reader.records(as_numpy=True)),
                                      default=lambda a: a.tolist())
        memory = pytreestore.create(f"memory://no-fcntl-{backend}", {"x": np.int32(0)},
                                    backend=backend)
        memory.extend({"x": np.int32(i)} for i in range(3))
        memory.flush()
        got["memory"] = memory.load(as_numpy=True)["x"].tolist()
        refused = got["refused"] = []
        new = os.path.join(os.path.dirname(stores["fixed"]), f"new-{backend}")
        for call in (lambda: pytreestore.create(new, {"x": np.int32(0)}, backend=backend),
                     lambda: pytreestore.open(stores["fixed"], mode="a", backend=backend)):
            try:
                call()
            except errors.UnsupportedPlatformError as err:
                refused.append(str(err))
        got["nothing_written"] = not os.path.exists(new)
    print(json.dumps(out))
    """
)


def test_without_fcntl_and_fork_reads_work_and_local_writes_are_refused(tmp_path: Path) -> None:
    fixed, ragged = tmp_path / "fixed", tmp_path / "ragged"
    records = [{"x": np.int32(i), "v": np.arange(i, dtype=np.float32)} for i in range(3)]
    with pytreestore.create(fixed, {"x": np.int32(0)}) as store:
        store.extend({"x": np.int32(i)} for i in range(4))
    with pytreestore.create(ragged, records[0], ragged=True) as store:
        store.extend(records)
    stores = {"fixed": str(fixed), "ragged": str(ragged)}
    want = {}
    for kind, path in stores.items():
        with pytreestore.open(path) as reader:
            want[kind] = json.dumps(
                list(reader.records(as_numpy=True)), default=lambda a: a.tolist()
            )
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(stores)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    for backend in ("tensorstore", "zarr"):
        got = out[backend]
        assert {k: got[k] for k in stores} == want
        assert got["memory"] == [0, 1, 2]
        assert len(got["refused"]) == 2 and got["nothing_written"]
        for message in got["refused"]:
            assert "needs file locks (fcntl.flock), which this platform lacks" in message
            assert "needs a POSIX system (Linux, macOS, BSD)" in message
    assert "taking the writer lock of " + str(tmp_path / "new-zarr") in out["zarr"]["refused"][0]
    assert len(pytreestore.open(fixed)) == 4


def test_flock_module_names_what_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import fcntl

    assert flock_module("/s", "taking the writer lock of") is fcntl
    monkeypatch.setitem(sys.modules, "fcntl", None)
    with pytest.raises(errors.UnsupportedPlatformError) as caught:
        flock_module("/data/s", "committing to")
    assert str(caught.value).startswith(
        "committing to /data/s needs file locks (fcntl.flock), which this platform lacks: "
    )
    assert isinstance(caught.value, OSError)


def test_at_fork_does_nothing_without_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr("os.register_at_fork", lambda **kw: calls.append(kw))
    at_fork(print)
    assert calls == [{"after_in_child": print}]
    monkeypatch.delattr("os.register_at_fork")
    at_fork(print)
    assert len(calls) == 1
