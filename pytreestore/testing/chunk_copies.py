"""The conformance cases of :class:`~pytreestore.backends.ChunkCopies`,
:class:`~pytreestore.backends.ManyReads`, :class:`~pytreestore.backends.FolderDeletes` and of
fragments, mixed into :class:`~pytreestore.testing.conformance.BackendSuite`: each runs only where the
backend declares the capability (issue 17).

This module imports pytest; ``import pytreestore.testing`` does not.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore.backends import (
    ChunkCopies,
    ColumnLayout,
    FolderDeletes,
    ManyReads,
    Transactions,
)


class ChunkCopyCases:
    """The cases; :class:`~pytreestore.testing.conformance.BackendSuite` provides the
    helpers (``location``, ``capable``, ``create``)."""

    if TYPE_CHECKING:  # BackendSuite's
        backend: str

        def location(self) -> contextlib.AbstractContextManager[str]: ...

        def capable(self, path: str, capability: type) -> Any: ...

        def create(self, path: str, like: Any, **kwargs: Any) -> Any: ...

    def test_chunk_copies_place_encoded_chunks(self) -> None:
        lay = ColumnLayout("f/x", np.dtype("int32"), (2,), (4, 2), "zstd", ("record", "d"), 0)
        with self.location() as path:
            backend = self.capable(path, ChunkCopies)
            backend.create_columns([lay, ColumnLayout(**{**lay.__dict__, "key": "x"})])
            backend.resize(["f/x"], 6)
            values = np.arange(12, dtype=np.int32).reshape(6, 2)
            backend.write(["f/x"], 0, [values])
            backend.write_bytes("x/c/3/0", b"stale")  # replaced whole
            backend.copy_chunks([("f/x/c/0/0", "x/c/2/0"), ("f/x/c/1/0", "x/c/3/0")])
            backend.resize(["x"], 14)
            np.testing.assert_array_equal(backend.read(["x"], slice(8, 14), 14)[0], values)
            np.testing.assert_array_equal(backend.read(["f/x"], slice(0, 6), 6)[0], values)
            with pytest.raises(errors.CorruptChunkError, match="f/x/c/9/0"):
                backend.copy_chunks([("f/x/c/9/0", "x/c/9/0")])

    def test_a_copied_chunk_written_again_in_one_transaction(self) -> None:
        """A fragment's last chunk copied, then the next fragment's rows written into it, in
        one block (TensorStore's OCDBT once never committed such a transaction)."""
        lay = ColumnLayout("f/x", np.dtype("int32"), (), (4,), "zstd", ("record",), 0)
        with self.location() as path:
            backend = self.capable(path, ChunkCopies)
            backend.create_columns([lay, ColumnLayout(**{**lay.__dict__, "key": "x"})])
            backend.resize(["f/x"], 3)
            backend.write(["f/x"], 0, [np.arange(3, dtype=np.int32)])
            with _one_block(backend):
                backend.resize(["x"], 6)
                backend.copy_chunks([("f/x/c/0", "x/c/0")])
                backend.write(["x"], 3, [np.arange(10, 13, dtype=np.int32)])
            got = backend.read(["x"], slice(0, 6), 6)[0]
            np.testing.assert_array_equal(got, [0, 1, 2, 10, 11, 12])

    def test_many_reads_read_every_key_at_once(self) -> None:
        with self.location() as path:
            backend = self.capable(path, ManyReads)
            backend.write_many_bytes({"a/1": b"one", "a/2": b"two"})
            assert backend.read_many_bytes(["a/2", "a/3", "a/1"]) == [b"two", None, b"one"]
            assert backend.read_many_bytes([]) == []

    def test_folder_deletes_remove_every_key_below(self) -> None:
        with self.location() as path:
            backend = self.capable(path, FolderDeletes)
            keys = ["f/1/x", "f/1/c/0/0", "f/10/x", "f/2/x", "f/1x"]
            backend.write_many_bytes({k: b"v" for k in keys})
            backend.delete_folders(["f/1", "f/3"])  # an absent folder is no error
            assert [backend.read_bytes(k) for k in keys] == [None, None, b"v", b"v", b"v"]

    def test_fragments_commit_through_chunk_copies(self) -> None:
        like = {"a": np.float32(0), "b": np.zeros(3, np.int16)}
        with self.location() as path:
            self.capable(path, ChunkCopies)
            store = self.create(path, like, chunk_records=4)
            where = store.reopen_options()  # the suite's location, with its storage options
            opts = {k: where[k] for k in ("backend", "storage_options")}
            frags = [
                pytreestore.write_fragment(path, _batch(s, n), **opts)
                for s, n in ((0, 4), (4, 8), (12, 3), (15, 2), (17, 3))
            ]  # the third starts aligned and ends inside a chunk the fourth writes into
            store.commit_fragments(frags)
            got = store.load(as_numpy=True)
            np.testing.assert_array_equal(got["a"], np.arange(20, dtype=np.float32))
            np.testing.assert_array_equal(got["b"], _batch(0, 20)["b"])
            with pytest.raises(errors.FragmentError, match="committed already"):
                store.commit_fragments(frags[:1])
            store.close()


def _one_block(backend: Any) -> contextlib.AbstractContextManager[Any]:
    """One transaction where the backend has them, else a plain block."""
    return backend.transaction() if isinstance(backend, Transactions) else contextlib.nullcontext()


def _batch(start: int, n: int) -> dict[str, np.ndarray]:
    a = np.arange(start, start + n, dtype=np.float32)
    return {"a": a, "b": np.repeat(a[:, None], 3, axis=1).astype(np.int16)}
