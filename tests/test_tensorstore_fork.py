"""A TensorStore store used in a forked child: a clear ForkedBackendError, never an abort.

TensorStore aborts a child forked from a process that used it (``fork() use detected``,
signal 6) at the first read or write it issues; pytreestore.backends._tensorstore.futures raises
:class:`ForkedBackendError` before that call, and the zarr backend opens the same store in the
child. (Local columns the direct reader reads, without TensorStore, read exactly in the child.)
"""

from __future__ import annotations

import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore.backends._tensorstore import direct
from tests.test_misuse import run_in_child


def refused(call) -> int:
    """1 if ``call`` raises ForkedBackendError with the fix in its text, else 0."""
    try:
        call()
    except errors.ForkedBackendError as err:
        return int("'spawn'" in str(err) and "backend='zarr'" in str(err))
    return 0


@pytest.mark.parametrize("backend", ["tensorstore", "ocdbt"])
def test_a_forked_child_gets_a_clear_error_not_an_abort(tmp_path, backend):
    path = str(tmp_path / "s")
    store = pytreestore.create(
        path, {"x": np.zeros(3, np.float32)}, chunk_records=2, backend=backend
    )
    store.extend({"x": np.full(3, i, np.float32)} for i in range(10))
    store.close()
    reader = pytreestore.open(path, backend=backend)
    np.testing.assert_array_equal(reader.load(slice(0, 2), as_numpy=True)["x"][1], [1, 1, 1])

    def child() -> int:
        count = refused(lambda: pytreestore.open(path, backend=backend).load(as_numpy=True))
        count += refused(
            lambda: pytreestore.create(str(tmp_path / "new"), {"y": np.int32(0)}, backend=backend)
        )
        if backend == "tensorstore" and direct.native() is not None:
            # the direct reader reads local chunk files without TensorStore: exact, no error
            got = reader.load(slice(4, 6), as_numpy=True)["x"][:, 0].tolist()
            return count + 10 * (got == [4.0, 5.0])
        return count + refused(lambda: reader.load(slice(4, 6), as_numpy=True))

    direct_reads = backend == "tensorstore" and direct.native() is not None
    assert run_in_child(child) == (12 if direct_reads else 3)
    # the parent is unaffected
    np.testing.assert_array_equal(reader.load(slice(4, 6), as_numpy=True)["x"][:, 0], [4, 5])


def test_the_zarr_backend_reads_a_tensorstore_store_in_the_forked_child(tmp_path):
    path = str(tmp_path / "s")
    store = pytreestore.create(path, {"x": np.zeros(3, np.float32)}, chunk_records=2)
    store.extend({"x": np.full(3, i, np.float32)} for i in range(10))
    store.close()
    assert len(pytreestore.open(path)) == 10  # TensorStore used in the parent

    def child() -> int:
        got = pytreestore.open(path, backend="zarr").load(as_numpy=True)["x"][:, 0]
        return 7 if got.tolist() == list(range(10)) else 1

    assert run_in_child(child) == 7
