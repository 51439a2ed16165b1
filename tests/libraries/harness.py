"""What every library test does: write its cases on both backends, read them back in a fresh
process, and compare exactly.

A library's test module defines ``CASES``: case name -> :class:`Case`. Its module-scoped
``results`` fixture calls :func:`write_and_read`, which appends each case's records one per
step to a store on each of :data:`BACKENDS`, then starts **one** child for the module
(:func:`tests.libraries.reader.read_back`, forked from the session's zygote, so the library
is imported afresh there) that reads every store back. The child compares each record's
treedef with one the library builds in that process (``Case.like``: classes and static data
rebuilt from the schema must equal the library's own), describes every leaf (dtype, shape,
``weak_type``, bytes) and may run a module hook on what it read (``child_checks``, e.g. a
jitted step counting its traces). :meth:`Results.check` then asserts it all for one case.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import keystr, tree_flatten_with_path

import pytreestore
from pytreestore.testing import assert_trees_equal, weak_type
from tests.trial_harness import Zygote

#: the backends every library case is written on (the brief's pair; OCDBT is the parity suite's)
BACKENDS = ("tensorstore", "zarr")


@dataclasses.dataclass(frozen=True)
class Case:
    """One library state: its records in step order and how a store of them is created.

    Attributes:
        records: builds the records (the library's own state objects), one per step.
        like: the name of a zero-argument function of the test module that builds, in the
            reading process, a record of the same treedef (an initial state).
        options: keyword arguments of ``pytreestore.create`` (``ragged=``, ...).
    """

    records: Callable[[], Sequence[Any]]
    like: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


def describe(tree: Any) -> dict[str, list[Any]]:
    """``{keypath: [dtype, shape, weak_type, hex of the bytes]}`` of every leaf of ``tree``."""
    out = {}
    for path, leaf in tree_flatten_with_path(tree)[0]:
        array = np.asarray(leaf)
        out[keystr(path)] = [
            array.dtype.name,
            list(array.shape),
            weak_type(leaf),
            array.tobytes().hex(),
        ]
    return out


@dataclasses.dataclass
class Results:
    """What :func:`write_and_read` wrote and what the child read, per ``(case, backend)``."""

    records: dict[str, list[Any]]
    written: dict[tuple[str, str], str]
    errors: dict[tuple[str, str], BaseException]
    child: dict[str, Any]

    def open(self, case: str, backend: str) -> Any:
        """The store of ``case`` on ``backend``, opened with that backend (or the error that
        writing it raised)."""
        if (case, backend) in self.errors:
            raise self.errors[case, backend]
        return pytreestore.open(self.written[case, backend], backend=backend)

    def check(self, case: str, backend: str) -> dict[str, Any]:
        """Asserts that ``case`` on ``backend`` came back exactly, here and in the child.

        Returns:
            The child's report of the case (with its ``checks``, the module hook's result).
        """
        records = self.records[case]
        store = self.open(case, backend)
        assert len(store) == len(records)
        for i, record in enumerate(records):
            assert_trees_equal(store[i], record, err_msg=f"{case} record {i}, here")
        got = self.child[f"{case}/{backend}"]
        assert "error" not in got, got.get("error")
        assert got["treedefs_equal"] == [True] * len(records), got["treedef"]
        for i, record in enumerate(records):
            assert got["records"][i] == describe(record), f"{case} record {i}, in the child"
        if "load" in got:  # the whole store at once, against the records stacked by JAX
            stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *records)
            assert got["load"] == describe(stacked), f"{case} load(), in the child"
        return got


def write_and_read(
    module: str, cases: dict[str, Case], tmp: Path, zygote: Zygote, *, log: str = "child"
) -> Results:
    """Writes every case on every backend (a step at a time), then reads them in one child.

    Args:
        module: the test module's import name; the child imports it for ``like`` and hooks.
        cases: the module's ``CASES``.
        tmp: a folder for the stores and the child's files.
        zygote: the session's zygote (``tests.fixtures``).
        log: the child's log name.
    """
    records = {name: list(case.records()) for name, case in cases.items()}
    written, errors, manifest = {}, {}, []
    for name, case in cases.items():
        for backend in BACKENDS:
            path = str(tmp / f"{name}-{backend}")
            try:
                with pytreestore.create(
                    path, records[name][0], backend=backend, **case.options
                ) as store:
                    for record in records[name]:
                        store.append(record)
            except Exception as err:  # reported by the case's own test, with its traceback
                errors[name, backend] = err
                continue
            written[name, backend] = path
            manifest.append(
                {
                    "key": f"{name}/{backend}",
                    "case": name,
                    "like": case.like,
                    "path": path,
                    "backend": backend,
                    "load": not case.options,
                }
            )
    child: dict[str, Any] = {}
    if manifest:
        job = tmp / "manifest.json"
        job.write_text(json.dumps({"module": module, "cases": manifest}))
        out, log_path = tmp / "report.json", str(tmp / log)
        status = zygote.call(
            "tests.libraries.reader:read_back",
            str(job),
            str(out),
            log=log_path,
        )
        stderr = Path(log_path + ".stderr")
        assert status == 0, f"the reading child failed ({status}):\n{_tail(stderr)}"
        child = json.loads(out.read_text())
    return Results(records, written, errors, child)


def _tail(path: Path) -> str:
    try:
        return path.read_text()[-6000:]
    except FileNotFoundError:
        return "(no stderr)"
