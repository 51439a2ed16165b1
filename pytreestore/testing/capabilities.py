"""The conformance cases of the optional capabilities (:mod:`pytreestore.backends._base`),
mixed into :class:`~pytreestore.testing.conformance.BackendSuite`: each runs only where the
backend declares the capability (it is reported as skipped, naming the capability,
elsewhere), and checks what the capability promises, not only that it is there
(:class:`~pytreestore.backends.ChunkCopies` has its own, in
:mod:`pytreestore.testing.chunk_copies`).

* **ConditionalWrites**: compare-and-swap on one key; a second writer's commit is refused.
* **KeyListing**, **BatchedReads**, **CheckedReads**, **PartialReads**, **ReadsInto**:
  listing by prefix, batched reads equal to single ones, each damaged chunk named, parts of a
  column's second axis equal to slices of whole reads, rows read into the caller's arrays.
* **Transactions**: a block's writes (bytes, deletions, resizes, chunks) are invisible to
  another backend on the same store until the block ends, and all visible after; the block
  reads its own writes; a block that raises leaves nothing; an inner block joins the outer
  one; a conditional write whose token goes stale before the block commits makes the whole
  block commit nothing (``CommitConflictError``).
* **Snapshots**: every generation stays readable as it was, through a read-only backend, and
  ``open(path, version=N)`` reads rows the storage pinned (a chunk lost later does not touch
  them).

This module imports pytest; ``import pytreestore.testing`` does not.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from pytreestore import errors
from pytreestore._format.keys import LOCK_KEY, NO_VALUE
from pytreestore.backends import (
    BatchedReads,
    CheckedReads,
    ColumnLayout,
    ConditionalWrites,
    KeyListing,
    PartialReads,
    ReadsInto,
    Snapshots,
    Transactions,
)

_LAYOUT = ColumnLayout("x", np.dtype("int32"), (), (4,), "zstd", ("record",), 0)
_RECORD_LIKE = {"v": np.zeros(3, np.float32), "n": np.int32(0)}


def _record(i: int) -> dict[str, Any]:
    return {"v": np.arange(3, dtype=np.float32) + i, "n": np.int32(i)}


class CapabilityCases:
    """The cases; :class:`~pytreestore.testing.conformance.BackendSuite` provides the
    helpers (``location``, ``capable``, ``raw_backend``, ``create``, ``open``)."""

    if TYPE_CHECKING:  # BackendSuite's
        backend: str

        def location(self) -> contextlib.AbstractContextManager[str]: ...

        def capable(self, path: str, capability: type) -> Any: ...

        def raw_backend(self, path: str) -> Any: ...

        def create(self, path: str, like: Any, **kwargs: Any) -> Any: ...

        def open(self, path: str, mode: str = "r", **kwargs: Any) -> Any: ...

    # ---- conditional writes, listing, batched and checked reads ---------------------------------

    def test_conditional_writes_compare_and_swap(self) -> None:
        with self.location() as path:
            backend = self.capable(path, ConditionalWrites)
            assert backend.read_bytes_versioned("k") == (None, NO_VALUE)
            first = backend.write_bytes_if("k", b"one", NO_VALUE)
            assert first is not None and backend.read_bytes("k") == b"one"
            assert backend.write_bytes_if("k", b"again", NO_VALUE) is None  # create only
            second = backend.write_bytes_if("k", b"two", first)
            assert second is not None and second != first
            assert backend.write_bytes_if("k", b"stale", first) is None
            assert backend.read_bytes_versioned("k") == (b"two", second)
            assert backend.write_bytes_if("k", None, second) is not None  # a conditional delete
            assert backend.read_bytes_versioned("k") == (None, NO_VALUE)

    def test_second_writer_gets_commit_conflict(self) -> None:
        """Two writers that both saw commit n: the second commit fails, nothing is lost."""
        with self.location() as path:
            self.capable(path, ConditionalWrites)
            with self.create(path, _RECORD_LIKE, chunk_records=2) as store:
                store.append(_record(0))
            first = self.open(path, "a")
            # the lock broken behind the first writer's back: its file or object deleted
            self.raw_backend(path).delete_keys([LOCK_KEY])
            second = self.open(path, "a")
            second.extend(_record(i) for i in (1, 2))
            second.flush()
            first.append(_record(9))
            with pytest.raises(errors.CommitConflictError, match="another writer"):
                first.flush()
            second.close()
            np.testing.assert_array_equal(self.open(path).load(as_numpy=True)["n"], [0, 1, 2])

    def test_list_keys_by_prefix(self) -> None:
        with self.location() as path:
            backend = self.capable(path, KeyListing)
            backend.write_many_bytes({"a/b": b"1", "a/bc": b"2", "a/c/0": b"3", "b": b"4"})
            assert backend.list_keys("a/") == ["a/b", "a/bc", "a/c/0"]
            assert backend.list_keys("a/c/") == ["a/c/0"]
            assert backend.list_keys("z/") == []

    def test_batched_reads_equal_single_reads(self) -> None:
        lays = [ColumnLayout(k, np.dtype("int32"), (), (4,), "zstd", ("record",), 0) for k in "xy"]
        with self.location() as path:
            backend = self.capable(path, BatchedReads)
            backend.create_columns(lays)
            backend.resize(["x", "y"], 10)
            backend.write(
                ["x", "y"], 0, [np.arange(10, dtype=np.int32), -np.arange(10, dtype=np.int32)]
            )
            got = backend.read_many([("x", slice(2, 7)), ("y", np.array([9, 0]))], 10)
            np.testing.assert_array_equal(got[0], [2, 3, 4, 5, 6])
            np.testing.assert_array_equal(got[1], [-9, 0])

    def test_checked_reads_name_each_damaged_chunk(self) -> None:
        lay = ColumnLayout("x", np.dtype("int32"), (), (4,), "zstd", ("record",), 0)
        with self.location() as path:
            backend = self.capable(path, CheckedReads)
            backend.create_columns([lay])
            backend.resize(["x"], 8)
            backend.write(["x"], 0, [np.arange(8, dtype=np.int32)])
            assert backend.read_checked([("x", slice(0, 4)), ("x", slice(4, 8))], 8) == [None] * 2
            backend.write_bytes("x/c/1", b"not zstd")
            ok, bad = backend.read_checked([("x", slice(0, 4)), ("x", slice(4, 8))], 8)
            assert ok is None and isinstance(bad, errors.CorruptChunkError)
            assert "x/c/1" in str(bad)

    def test_partial_reads_equal_slices_of_whole_reads(self) -> None:
        p = ColumnLayout("p", np.dtype("int32"), (6,), (4, 6), "zstd", ("record", "p_0"), 0)
        with self.location() as path:
            backend = self.capable(path, PartialReads)
            backend.create_columns([p, _LAYOUT])
            backend.resize(["p", "x"], 10)
            values = np.arange(60, dtype=np.int32).reshape(10, 6)
            backend.write(["p", "x"], 0, [values, values[:, 0]])
            requests = [
                ("p", slice(2, 9), slice(1, 4)),
                ("p", np.array([9, 0, 9]), slice(5, 6)),
                ("p", slice(0, 10), None),
                ("x", slice(3, 5), None),
            ]
            got = backend.read_parts(requests, 10)
            wants = [values[2:9, 1:4], values[[9, 0, 9], 5:6], values, values[3:5, 0]]
            for array, want in zip(got, wants):
                assert array.dtype == want.dtype
                np.testing.assert_array_equal(array, want)
            backend.write_bytes("p/c/1/0", b"not zstd")
            with pytest.raises(errors.CorruptChunkError, match="p/c/1"):
                backend.read_parts([("p", slice(4, 8), slice(0, 2))], 10)

    def test_reads_into_fill_the_given_arrays(self) -> None:
        plain = ColumnLayout("u", np.dtype("float32"), (3,), (4, 3), None, ("record", "u_0"), 0)
        with self.location() as path:
            backend = self.capable(path, ReadsInto)
            backend.create_columns([plain, _LAYOUT])
            backend.resize(["u", "x"], 10)
            values = np.arange(30, dtype=np.float32).reshape(10, 3)
            backend.write(["u", "x"], 0, [values, np.arange(10, dtype=np.int32)])
            outs = [np.full((7, 3), -1, np.float32), np.full(7, -1, np.int32)]
            got = backend.read_into(["u", "x"], slice(2, 9, 1), 10, outs)
            np.testing.assert_array_equal(got[0], values[2:9])
            np.testing.assert_array_equal(got[1], np.arange(2, 9, dtype=np.int32))
            assert all(g is o or not np.shares_memory(g, o) for g, o in zip(got, outs))
            assert backend.read_into(["x"], slice(0, 0, 1), 10, [np.empty(0, np.int32)])[
                0
            ].shape == (0,)
            backend.write_bytes("x/c/1", b"not zstd")
            with pytest.raises(errors.CorruptChunkError, match="x/c/1"):
                backend.read_into(["x"], slice(4, 8, 1), 10, [np.empty(4, np.int32)])

    # ---- transactions --------------------------------------------------------------------------

    def _observer(self, path: str) -> Any:
        """Another backend on the store at ``path``: what other processes see."""
        observer = self.raw_backend(path)
        observer.open_columns([_LAYOUT])
        return observer

    @staticmethod
    def _seen(backend: Any, *, rows: bool = True) -> tuple[Any, ...]:
        """What the block of the atomicity case changes, as ``backend`` sees it (without
        the rows: chunks written in a block are read once it has committed)."""
        shape = backend.column_shapes(["x"])[0]
        keys = ("kept", "gone", "a", "b")
        values = tuple(backend.read_bytes(k) for k in keys)
        if not rows:
            return (shape, *values)
        return (shape, backend.read(["x"], slice(0, shape[0]), shape[0])[0].tolist(), *values)

    def test_transaction_lands_whole_or_not_at_all(self) -> None:
        before = ((2,), [1, 2], b"0", b"0", None, None)
        after = ((6,), [0, 1, 2, 3, 4, 5], b"1", None, b"A", b"B")
        with self.location() as path:
            backend = self.capable(path, Transactions)
            backend.create_columns([_LAYOUT])
            backend.resize(["x"], 2)
            backend.write(["x"], 0, [np.array([1, 2], np.int32)])
            backend.write_many_bytes({"kept": b"0", "gone": b"0"})
            with backend.transaction():
                backend.resize(["x"], 6)
                backend.write(["x"], 0, [np.arange(6, dtype=np.int32)])
                backend.write_bytes("kept", b"1")
                backend.write_many_bytes({"a": b"A", "b": b"B"})
                backend.delete_keys(["gone"])
                mine = self._seen(backend, rows=False)  # the block reads its own writes
                assert mine == (after[0], *after[2:])
                assert self._seen(self._observer(path)) == before  # nobody else does
            assert self._seen(self._observer(path)) == after
            assert self._seen(backend) == after

    def test_transaction_that_raises_leaves_nothing(self) -> None:
        with self.location() as path:
            backend = self.capable(path, Transactions)
            backend.create_columns([_LAYOUT])
            backend.write_many_bytes({"kept": b"0", "gone": b"0"})
            with pytest.raises(KeyError, match="cut"), backend.transaction():
                backend.resize(["x"], 4)
                backend.write(["x"], 0, [np.arange(4, dtype=np.int32)])
                backend.write_bytes("kept", b"1")
                backend.delete_keys(["gone"])
                raise KeyError("cut")
            for seer in (backend, self._observer(path)):
                assert seer.column_shapes(["x"]) == [(0,)]
                assert (seer.read_bytes("kept"), seer.read_bytes("gone")) == (b"0", b"0")

    def test_inner_transaction_joins_the_outer(self) -> None:
        with self.location() as path:
            backend = self.capable(path, Transactions)
            with backend.transaction():
                backend.write_bytes("outer", b"1")
                with backend.transaction():
                    backend.write_bytes("inner", b"2")
                assert self._observer(path).read_bytes("inner") is None  # not yet
            observer = self._observer(path)
            assert (observer.read_bytes("outer"), observer.read_bytes("inner")) == (b"1", b"2")

    def test_stale_conditional_write_commits_nothing_of_its_block(self) -> None:
        """Two writers that both saw the same token: one wins, and nothing of the loser's
        block lands, whether its token was stale when it wrote or went stale before its
        block committed."""
        with self.location() as path:
            backend = self.capable(path, Transactions)
            other = self.raw_backend(path)
            token = backend.write_bytes_if("k", b"0", NO_VALUE)
            assert token is not None
            with pytest.raises(errors.CommitConflictError), backend.transaction():
                assert backend.write_bytes_if("k", b"loser", token) is not None
                backend.write_bytes("side", b"1")
                assert other.write_bytes_if("k", b"winner", token) is not None
            observer = self._observer(path)
            assert (observer.read_bytes("k"), observer.read_bytes("side")) == (b"winner", None)
            with pytest.raises(errors.CommitConflictError), backend.transaction():
                backend.write_bytes("side", b"2")
                if backend.write_bytes_if("k", b"late", token) is None:  # stale already
                    raise errors.CommitConflictError("the caller gives the block up")
            observer = self._observer(path)
            assert (observer.read_bytes("k"), observer.read_bytes("side")) == (b"winner", None)

    # ---- snapshots -----------------------------------------------------------------------------

    def test_every_generation_stays_readable(self) -> None:
        with self.location() as path:
            backend = self.capable(path, Snapshots)
            backend.create_columns([_LAYOUT])
            backend.resize(["x"], 4)
            backend.write(["x"], 0, [np.arange(4, dtype=np.int32)])
            backend.write_bytes("k", b"old")
            then = backend.latest_generation()
            backend.write(["x"], 0, [np.full(4, -1, np.int32)])
            backend.resize(["x"], 2)
            backend.write_bytes("k", b"new")
            backend.delete_keys(["x/c/0"])
            assert backend.latest_generation() > then > 0
            pinned = backend.at_generation(then)
            assert pinned.read_bytes("k") == b"old"
            assert pinned.column_shapes(["x"]) == [(4,)]
            np.testing.assert_array_equal(pinned.read(["x"], slice(0, 4), 4)[0], np.arange(4))
            with pytest.raises(errors.ReadOnlyError):
                pinned.write_bytes("k", b"changed")
            assert backend.read_bytes("k") == b"new"

    def test_a_version_reads_the_rows_its_generation_pinned(self) -> None:
        like = {"n": np.int32(0)}
        with self.location() as path:
            self.capable(path, Snapshots)
            with self.create(path, like, chunk_records=2) as store:
                store.extend_batch({"n": np.arange(4, dtype=np.int32)})
                store.flush()
                store.extend_batch({"n": np.arange(4, 6, dtype=np.int32)})
            self.raw_backend(path).delete_keys(["n/c/0"])  # a chunk lost after the fact
            with pytest.raises(errors.CorruptChunkError, match="n/c/0"):
                self.open(path).load(as_numpy=True)
            old = self.open(path, version=1).load(as_numpy=True)["n"]
            np.testing.assert_array_equal(old, np.arange(4))
