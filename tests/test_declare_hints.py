"""Errors that name the fix: a record a store refuses gets the ``ragged=``/``optional=``
entry that would accept it, as ``stack()`` says it (pytreestore._tree.layout.with_hints)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore.errors import SchemaMismatchError


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Node:
    x: Any
    n: Any


def good():
    return {
        "x": np.zeros(3, np.float32),
        "l": [np.int32(0)],
        "o": {"v": np.int32(0)},
        "p": [Node(np.zeros(2, np.float32), np.int8(0))],
    }


def changed(**parts):
    return {**good(), **parts}


#: (the refused record, the entry that accepts it, the message's keypath and stored vs current)
CASES = {
    "leading axis": (
        changed(x=np.zeros(5, np.float32)),
        "ragged=[\"['x']\"]",
        "at ['x']: expected float32[3], got float32[5]",
    ),
    "list length": (
        changed(l=[np.int32(1), np.int32(2)]),
        "ragged=[\"['l']\"]",
        "at ['l']: expected a list of 1, got a list of 2",
    ),
    "None": (changed(o=None), "optional=[\"['o']\"]", "at ['o']: expected a dict"),
    "nested leaf": (
        changed(p=[Node(np.zeros(4, np.float32), np.int8(1))]),
        "ragged=[\"['p'][0].x\"]",
        "at ['p'][0].x: expected float32[2], got float32[4]",
    ),
}


def declaration(entry: str) -> dict[str, Any]:
    name, value = entry.split("=", 1)
    return {name: json.loads(value)}  # the suggested entry, exactly as the message spells it


def refusal(call) -> str:
    with pytest.raises(SchemaMismatchError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("how", ["append", "extend", "extend_batch"])
def test_fixed_store_names_the_fix(case, how, backend, path):
    bad, entry, where = CASES[case]
    store = pytreestore.create(path, good(), backend=backend)
    if how == "append":
        message = refusal(lambda: store.append(bad))
    elif how == "extend":
        message = refusal(lambda: store.extend([good(), bad]))
        assert message.startswith("extend() refused record 1 (none of this call's records")
    else:
        batch = pytreestore.stack([bad, bad], as_numpy=True)
        message = refusal(lambda: store.extend_batch(batch))
        assert message.startswith("batch does not match the store schema")
    assert entry in message
    if how != "extend_batch":  # a batch's leaves show the batch's shapes; its records are listed
        assert re.search(re.escape(where) + r".*" + re.escape(entry), message)
    assert len(store) == 0  # nothing was appended
    accepting = pytreestore.create(path + "-fixed", good(), backend=backend, **declaration(entry))
    accepting.extend([good(), bad])
    assert len(accepting) == 2
    jax.tree.map(np.testing.assert_array_equal, accepting.load(1, as_numpy=True), bad)


@pytest.mark.parametrize("case", ["leading axis", "list length", "None"])
def test_ragged_store_names_the_fix_where_nothing_was_declared(case, backend, path):
    bad, entry, where = CASES[case]
    declared: dict[str, Any] = {"ragged": ["['p']"]}
    store = pytreestore.create(path, good(), backend=backend, **declared)
    for call in (lambda: store.append(bad), lambda: store.extend([good(), bad])):
        message = refusal(call)
        assert entry in message and where in message
    assert len(store) == 0
    more = declaration(entry)
    both = {**declared, **more} if "ragged" not in more else {"ragged": ["['p']", *more["ragged"]]}
    accepting = pytreestore.create(path + "-fixed", good(), backend=backend, **both)
    accepting.extend([good(), bad])
    assert len(accepting) == 2


def test_stack_and_append_say_the_same(path):
    bad, _, _ = CASES["leading axis"]
    stacked = refusal(lambda: pytreestore.stack([good(), bad]))
    appended = refusal(lambda: pytreestore.create(path, good()).append(bad))
    assert stacked.removeprefix("stack() refused record 1: ") == appended
