"""A writer sharing an OCDBT store through a coordinator whose commit fails, then is retried:
every record appended ends in the store exactly once (issue 45, coordfix).

A storage failure is injected at one step of a coordinated commit
(:mod:`pytreestore._write.coordinated`): taking the claim, writing the chunks, the version
record, the commit record, after the commit record landed but before its acknowledgement,
and giving the claim back. The failing call is retried as a caller told of a failure does,
and a fresh open reads every record once, in order, with its values. Where the commit's
outcome cannot be read back either, the error says the records stay buffered, and they are
not appended again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pytreestore
from pytreestore import errors
from pytreestore._format.keys import CLAIM_KEY, COMMIT_KEY, VERSIONS_DIR
from pytreestore.backends import ocdbt_coordinator
from tests.parity import kinds

N = 12
CHUNK = 4
#: the steps of a commit a failure is injected at, in their order
STEPS = ("claim", "chunks", "version", "record", "ack", "release")
#: the steps after which the commit has landed: the call does not fail
LANDED = ("ack", "release")


@pytest.fixture(scope="module")
def coordinator() -> Iterator[str]:
    with ocdbt_coordinator() as address:
        yield address


class Faults:
    """Makes the first write of one step of a commit through ``engine`` fail (a
    StorageError, or ``error``); with ``unreadable``, the first read of the commit record after
    that failure fails too."""

    def __init__(
        self,
        engine: Any,
        step: str,
        *,
        unreadable: bool = False,
        error: type[Exception] = errors.StorageError,
    ) -> None:
        self.step, self.armed, self.unreadable, self.error = step, True, unreadable, error
        self.raised = 0
        self._write_if, self._write, self._read = (
            engine.write_bytes_if,
            engine.write,
            engine.read_bytes,
        )
        engine.write_bytes_if, engine.write = self.write_bytes_if, self.write
        engine.read_bytes = self.read_bytes

    def _fail(self, step: str) -> None:
        if self.armed and step == self.step:
            self.armed = False
            raise self.error(f"injected at the {step} step")

    def write_bytes_if(self, key: str, data: bytes | None, token: bytes) -> bytes | None:
        if key == CLAIM_KEY:
            self._fail("claim" if data is not None else "release")
        elif key == COMMIT_KEY:
            self._fail("record")
        elif key.startswith(f"{VERSIONS_DIR}/"):
            self._fail("version")
        got = self._write_if(key, data, token)
        if key == COMMIT_KEY:
            self._fail("ack")
        return got

    def write(self, *args: Any, **kwargs: Any) -> None:
        self._fail("chunks")
        self._write(*args, **kwargs)

    def read_bytes(self, key: str) -> bytes | None:
        if self.unreadable and not self.armed and key == COMMIT_KEY:
            self.unreadable = False
            raise errors.StorageError("injected: the commit record cannot be read back")
        return self._read(key)

    def retried(self, call: Callable[[], None]) -> None:
        """``call``, once more if it fails (as a caller told of the failure does)."""
        try:
            call()
        except errors.StorageError as err:
            assert "injected" in str(err), err
            self.raised += 1
            call()


def _shared(tmp_path: Path, name: str, coordinator: str) -> tuple[Path, pytreestore.TreeStore]:
    path = tmp_path / "s"
    kinds.create(path, name, "ocdbt", chunk_records=CHUNK).close()
    return path, pytreestore.open(path, "a", backend="ocdbt", coordinator=coordinator)


def _check(path: Path, recs: list[Any]) -> None:
    """A fresh open reads ``recs``, each once, in order, and the store verifies."""
    store = pytreestore.open(path, backend="ocdbt")
    assert store.committed == len(recs)
    kinds.assert_same(list(store), recs)
    assert store.verify().ok


def _append(store: pytreestore.TreeStore, faults: Faults, recs: list[Any]) -> None:
    for rec in recs:  # the fourth append commits (and fails)
        faults.retried(lambda rec=rec: store.append(rec))


def _extend(store: pytreestore.TreeStore, faults: Faults, recs: list[Any]) -> None:
    faults.retried(lambda: store.extend(recs[:2]))  # buffered, not committed
    faults.retried(lambda: store.extend(recs[2:]))  # committed with the two before


def _flush(store: pytreestore.TreeStore, faults: Faults, recs: list[Any]) -> None:
    store.extend(recs[:3])
    faults.retried(store.flush)
    store.extend(recs[3:])


CALLS = {"append": _append, "extend": _extend, "flush": _flush}
CASES = [(k, s, "append") for k in kinds.KINDS for s in STEPS] + [
    (k, s, c) for k in ("fixed", "nested") for s in STEPS for c in ("extend", "flush")
]


@pytest.mark.parametrize(("name", "step", "call"), CASES, ids=["-".join(c) for c in CASES])
def test_a_failed_call_retried_writes_each_record_once(
    tmp_path: Path, coordinator: str, name: str, step: str, call: str
) -> None:
    path, store = _shared(tmp_path, name, coordinator)
    recs = kinds.records(name, N)
    faults = Faults(store._backend, step)
    CALLS[call](store, faults, recs)
    assert not faults.armed  # the step was reached
    assert faults.raised == (0 if step in LANDED else 1)  # a commit that landed stands
    store.close()
    _check(path, recs)


def test_a_failed_commit_says_what_it_kept(tmp_path: Path, coordinator: str) -> None:
    path, store = _shared(tmp_path, "nested", coordinator)
    recs = kinds.records("nested", 6)
    Faults(store._backend, "record")
    store.extend(recs[:2])
    with pytest.raises(
        errors.StorageError,
        match=re.escape(
            "injected at the record step. This call's records (3) were not appended: append "
            "them again. 2 records appended before stay buffered: flush() commits them"
        ),
    ):
        store.extend(recs[2:5])
    assert (store.committed, len(store)) == (0, 2)
    store.extend(recs[2:])
    store.close()
    _check(path, recs)


def test_a_call_whose_commit_conflicts_keeps_none_of_its_records(
    tmp_path: Path, coordinator: str
) -> None:
    """Another writer holds the claim too long: the call's record is taken back, the
    records appended before it stay buffered."""
    path, store = _shared(tmp_path, "fixed", coordinator)
    recs = kinds.records("fixed", 5)
    Faults(store._backend, "claim", error=errors.CommitConflictError)
    for rec in recs[:3]:
        store.append(rec)
    with pytest.raises(
        errors.CommitConflictError,
        match=re.escape(
            "injected at the claim step. This call's records (1) were not appended: append "
            "them again. 3 records appended before stay buffered: flush() commits them"
        ),
    ):
        store.append(recs[3])
    assert (store.committed, len(store)) == (0, 3)
    store.extend(recs[3:])
    store.close()
    _check(path, recs)


UNKNOWN = [(k, s, c) for k in ("fixed", "nested") for s in ("record", "ack") for c in CALLS]


@pytest.mark.parametrize(("name", "step", "call"), UNKNOWN, ids=["-".join(c) for c in UNKNOWN])
def test_a_commit_of_unknown_outcome_keeps_its_records_once(
    tmp_path: Path, coordinator: str, name: str, step: str, call: str
) -> None:
    """The commit record's write fails (before or after it landed) and it cannot be read
    back: the records stay buffered (the error says not to append them again), and the next
    commit writes them only if they did not land."""
    path, store = _shared(tmp_path, name, coordinator)
    recs = kinds.records(name, N)
    faults = Faults(store._backend, step, unreadable=True)
    store.extend(recs[:3])  # buffered (a chunk is 4)
    calls = {
        "append": lambda: store.append(recs[3]),
        "extend": lambda: store.extend(recs[3:6]),
        "flush": store.flush,
    }
    held = {"append": 4, "extend": 6, "flush": 3}[call]
    told = "landed could not be read back (they may be in storage): do not append them again"
    with pytest.raises(errors.StorageError, match=re.escape(f"commit of {held} of them {told}")):
        calls[call]()  # not retried: the error says so
    assert not faults.unreadable  # the read back failed
    assert (store.committed, len(store)) == (0, held)
    store.extend(recs[held:])
    store.close()
    _check(path, recs)
