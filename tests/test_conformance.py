"""Every shipped backend runs the conformance suite (pytreestore.testing.conformance): the
file TensorStore, zarr-python, and both OCDBT backends, the one of a single writer
(transactions) and the one of a writer sharing its store through an OCDBT coordinator (no
transactions: each of its writes lands on its own)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore._location import Location
from pytreestore.backends import (
    OcdbtBackend,
    OcdbtDatabase,
    Snapshots,
    Transactions,
    ocdbt_coordinator,
    register_backend,
)
from pytreestore.backends._tensorstore.database import CoordinatedOcdbtBackend
from pytreestore.testing.conformance import BackendSuite


class TestTensorStore(BackendSuite):
    backend = "tensorstore"


class TestZarr(BackendSuite):
    backend = "zarr"


class TestOcdbt(BackendSuite):
    backend = "ocdbt"
    zarr_readable = False


COORDINATED = "test-ocdbt-coordinated"


@pytest.fixture(scope="class")
def coordinated_backend() -> Iterator[None]:
    """A coordinator on 127.0.0.1, and the backend of writers committing through it
    registered as :data:`COORDINATED`."""
    with ocdbt_coordinator() as address:
        factory = functools.partial(CoordinatedOcdbtBackend, address=address)
        register_backend(COORDINATED, factory, replace=True)
        yield


@pytest.mark.usefixtures("coordinated_backend")
class TestCoordinatedOcdbt(BackendSuite):
    """The coordinated backend as a store's only writer, behind a coordinator on 127.0.0.1."""

    backend = COORDINATED
    zarr_readable = False

    def test_memory_store_reopens(self) -> None:
        """Writers share a store through a coordinator on local disk only."""
        with pytest.raises(errors.BadLocationError, match="on local disk only"):
            self.create("memory://conformance-coordinated", {"x": np.int8(0)})
        assert pytreestore.backends.registered_backends().count(self.backend) == 1


class _PlainBlock(OcdbtDatabase, Transactions):
    """An OCDBT backend that claims transactions but whose block is a plain one: each write
    lands at once (what the coordinated backend did before it stopped claiming them)."""

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        yield


@pytest.mark.parametrize(
    "case",
    [
        "test_transaction_lands_whole_or_not_at_all",
        "test_transaction_that_raises_leaves_nothing",
        "test_inner_transaction_joins_the_outer",
        "test_stale_conditional_write_commits_nothing_of_its_block",
    ],
)
def test_the_suite_fails_a_transaction_that_is_not_atomic(case: str) -> None:
    """The Transactions cases check the promise, not the method: a backend declaring the
    capability with a block that is not atomic fails each of them."""
    register_backend("test-plain-block", _PlainBlock, replace=True)

    class Suite(BackendSuite):
        backend = "test-plain-block"

    with pytest.raises((AssertionError, pytest.fail.Exception)):
        getattr(Suite(), case)()


def test_the_coordinated_backend_declares_what_it_keeps(tmp_path) -> None:
    """No transactions through a coordinator (TensorStore refuses them over two keys), but
    every generation kept, as on every OCDBT database; OcdbtBackend refuses a coordinator."""
    location = Location.parse(str(tmp_path / "s"))
    with ocdbt_coordinator() as address:
        backend = CoordinatedOcdbtBackend(location, address)
        assert not isinstance(backend, Transactions)
        assert isinstance(backend, Snapshots) and isinstance(backend, OcdbtDatabase)
        assert isinstance(OcdbtBackend(location), Transactions)
        options = {"coordinator": {"address": address}}
        with pytest.raises(errors.PyTreeStoreError, match="may not set 'coordinator'"):
            OcdbtBackend(location, ocdbt_options=options)
