"""The reading side of :mod:`tests.libraries.harness`, run in a child forked from the zygote.

The zygote has imported pytreestore and JAX but no library: every class a store names is
imported here from its module path, and its static data rebuilt from the schema.
"""

from __future__ import annotations

import importlib
import json
import traceback
from typing import Any

from jax.tree_util import tree_structure

import pytreestore
from tests.libraries.harness import describe


def read_back(manifest: str, out: str) -> None:
    """Reads every store of ``manifest`` and writes the report :class:`Results` checks to ``out``.

    For each store: the treedef of every record (``store[i]``) against the module's ``like``
    built here, every record and the whole ``load()`` described leaf by leaf, and the module's
    ``child_checks(case, records)`` hook if it has one (a JSON-able dict).
    """
    with open(manifest) as f:
        job = json.load(f)
    module = importlib.import_module(job["module"])
    hook = getattr(module, "child_checks", None)
    report: dict[str, Any] = {}
    for entry in job["cases"]:
        try:
            report[entry["key"]] = _read(entry, module, hook)
        except Exception:
            report[entry["key"]] = {"error": traceback.format_exc()}
    with open(out, "w") as f:
        json.dump(report, f)


def _read(entry: dict[str, Any], module: Any, hook: Any) -> dict[str, Any]:
    store = pytreestore.open(entry["path"], backend=entry["backend"])
    records = [store[i] for i in range(len(store))]
    want = tree_structure(getattr(module, entry["like"])())
    got = {
        "treedefs_equal": [tree_structure(r) == want for r in records],
        "treedef": f"got  {tree_structure(records[0])}\nwant {want}",
        "records": [describe(r) for r in records],
    }
    if entry["load"]:
        got["load"] = describe(store.load())
    if hook is not None:
        got["checks"] = hook(entry["case"], records)
    return got
