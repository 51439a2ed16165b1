"""Runs class-change cases: stores written by one process whose modules define the classes'
old versions, read by a fresh process whose modules of the same names define the new ones.

All cases of one call share two subprocesses (one writes, one reads), so that each case
still runs in a fresh process without costing one each.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PRELUDE = """\
import dataclasses, typing
import numpy as np
import jax
from flax import struct
"""


@dataclasses.dataclass(frozen=True)
class Case:
    """One case: module ``cc_<name>`` defines ``v1`` when written and ``v2`` when read.

    Attributes:
        v1: the module's source (after a prelude importing np, jax, struct) for the writer.
        v2: the module's source for the reader.
        record: an expression of ``m`` (the module) and ``i`` giving record ``i``.
        read: statements run by the reader with ``path``, ``backend``, ``m`` and
            ``pytreestore`` in scope; they set ``result`` (JSON-able, see ``plain``).
        n: records written.
        write: statements run by the writer after the records, with ``store`` open (mode "a").
    """

    v1: str
    v2: str
    record: str
    read: str = "result = plain(pytreestore.open(path, backend=backend).load(as_numpy=True))"
    n: int = 3
    write: str = ""


_WRITER = """
import importlib, json, sys
import pytreestore
cases, root, backend = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.path.insert(0, root + "/v1")
for name, case in cases.items():
    m = importlib.import_module("cc_" + name)
    records = [eval(case["record"], {"m": m, "i": i, "np": m.np}) for i in range(case["n"])]
    store = pytreestore.create(root + "/" + name, records[0], backend=backend)
    store.extend(records)
    exec(case["write"], {"store": store, "m": m, "np": m.np, "pytreestore": pytreestore})
    store.close()
"""

_READER = """
import dataclasses, importlib, json, sys, traceback
import numpy as np
import pytreestore
from pytreestore.errors import PyTreeStoreError
cases, root, backend = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
sys.path.insert(0, root + "/v2")

def plain(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {"__class__": type(x).__name__,
                **{f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)
                   if hasattr(x, f.name)}}
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return {"__class__": type(x).__name__, **{k: plain(v) for k, v in zip(x._fields, x)}}
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if hasattr(x, "dtype"):
        return {"dtype": str(np.asarray(x).dtype), "value": np.asarray(x).tolist()}
    return x

out = {}
for name, case in cases.items():
    try:
        m = importlib.import_module("cc_" + name)
        scope = {"path": root + "/" + name, "backend": backend, "m": m, "np": np,
                 "pytreestore": pytreestore, "plain": plain}
        exec(case["read"], scope)
        out[name] = {"result": scope.get("result")}
    except PyTreeStoreError as err:
        out[name] = {"error": type(err).__name__, "message": str(err)}
    except Exception as err:
        out[name] = {"crash": type(err).__name__, "message": traceback.format_exc()}
print("RESULTS" + json.dumps(out))
"""


def run_cases(tmp_path: Path, backend: str, cases: dict[str, Case]) -> dict[str, Any]:
    """Writes every case with its ``v1`` classes, reads it with ``v2``; the reader's outcome
    per case: ``{"result": ...}``, ``{"error": name, "message": ...}`` (a PyTreeStoreError)
    or ``{"crash": name, "message": traceback}`` (anything else)."""
    for version in ("v1", "v2"):
        (tmp_path / version).mkdir()
        for name, case in cases.items():
            source = PRELUDE + textwrap.dedent(getattr(case, version))
            (tmp_path / version / f"cc_{name}.py").write_text(source)
    spec = json.dumps({k: dataclasses.asdict(c) for k, c in cases.items()})
    _run(_WRITER, spec, tmp_path, backend)
    out = _run(_READER, spec, tmp_path, backend)
    return json.loads(out.rpartition("RESULTS")[2])


def _run(script: str, spec: str, tmp_path: Path, backend: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", script, spec, str(tmp_path), backend],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc.stdout
