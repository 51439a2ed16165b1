"""The per-load costs cached in ``_commit`` (issue 29): the replaced-store check parses the
commit record only when its bytes changed, and ``atomic()`` tells a backend's transactions
once per class; both stay exact."""

from __future__ import annotations

import numpy as np
import pytest

import pytreestore
from pytreestore._log import committer as _atomic
from pytreestore._log import repair as _repair
from pytreestore._log.commit_record import Commit
from pytreestore.errors import StoreReplacedError
from tests.parity import kinds


@pytest.mark.parametrize("backend", kinds.BACKENDS)
def test_loads_parse_the_commit_record_only_when_it_changed(tmp_path, backend, monkeypatch):
    path = tmp_path / "s"
    with pytreestore.create(path, {"x": np.int32(0)}, backend=backend) as s:
        s.extend({"x": np.int32(i)} for i in range(10))
    parsed: list[int] = []
    from_bytes = Commit.from_bytes.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        Commit, "from_bytes", classmethod(lambda c, *a: parsed.append(1) or from_bytes(c, *a))
    )
    reader = pytreestore.open(path)
    assert [reader.load(i, as_numpy=True)["x"].item() for i in (1, 2)] == [1, 2]
    before = len(parsed)
    assert [reader.load(i, as_numpy=True)["x"].item() for i in range(3, 9)] == list(range(3, 9))
    assert len(parsed) == before  # the same bytes: parsed once
    with pytreestore.open(path, "a") as w:
        w.append({"x": np.int32(10)})
    assert reader.refresh() == 11 and reader.load(10, as_numpy=True)["x"].item() == 10
    assert len(parsed) > before  # new bytes: parsed again
    pytreestore.create(path, {"x": np.int32(0)}, backend=backend, overwrite=True).close()
    with pytest.raises(StoreReplacedError, match=r"replaced|deleted"):
        reader.load(0, as_numpy=True)
    reader.close()


def test_a_changed_commit_record_of_the_same_length_is_parsed_again():
    commit = Commit.from_bytes(b'{"records": 1, "generation": 1}', "loc")
    assert _repair._parsed(b'{"records": 1, "generation": 1}', "loc-a") == commit
    again = _repair._parsed(b'{"records": 2, "generation": 2}', "loc-a")
    assert (again.records, again.generation) == (2, 2)


def test_atomic_tells_transactions_once_per_backend_class(monkeypatch):
    class Plain:
        pass

    class WithTransactions:
        def __init__(self) -> None:
            self.entered = 0

        def transaction(self):
            import contextlib

            self.entered += 1
            return contextlib.nullcontext()

    txn = WithTransactions()
    for backend in (Plain(), Plain(), txn, txn):
        with _atomic.atomic(backend):  # type: ignore[arg-type]
            pass
    assert txn.entered == 2
    from pytreestore.backends import Transactions
    from pytreestore.backends import _registry as _capable

    assert _capable._CAPABLE[(Transactions, Plain)] is False
    assert _capable._CAPABLE[(Transactions, WithTransactions)] is True


def test_a_wrapper_is_told_by_what_it_wraps():
    from pytreestore.backends import Transactions, capable

    class Wrapper:
        def __init__(self, inner) -> None:
            self._inner = inner

        @property
        def inner(self):
            return self._inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

    class Plain:
        pass

    class WithTransactions:
        def transaction(self): ...

    assert capable(Wrapper(WithTransactions()), Transactions)
    assert not capable(Wrapper(Plain()), Transactions)  # not the first answer, kept by class
    assert capable(Wrapper(WithTransactions()), Transactions)
