"""A corpus of bad inputs. Each case asserts the error's type, that its message names the tree
path where there is one, and that the store is unchanged afterwards: same length, same
committed records, same commit record and root metadata bytes, and ``verify()`` clean.

At the end: NaN and infinities are not bad input (stored exactly), empty appends are no-ops,
and opening a store never runs code its schema names.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from tests.conftest import FILE_BACKENDS
from tests.trees import Pair, Params, WithStatic

LIKE = {
    "params": [
        Params(np.float32(0), np.zeros(3, np.float32)),
        Params(np.float32(0), np.zeros(3, np.float32)),
    ],
    "meta": {"step": np.int32(0), "lr": np.float32(0)},
    "pair": Pair(np.int16(0), np.bool_(False)),
    "static": WithStatic(np.zeros(2, np.float32)),
}
N = 6


def good(i: int) -> dict[str, Any]:
    return {
        "params": [
            Params(np.float32(i), np.full(3, i, np.float32)),
            Params(np.float32(-i), np.full(3, -i, np.float32)),
        ],
        "meta": {"step": np.int32(i), "lr": np.float32(i / 10)},
        "pair": Pair(np.int16(i), np.bool_(i % 2)),
        "static": WithStatic(np.full(2, i, np.float32)),
    }


def replace(node: Any, route: list[str], value: Any) -> Any:
    """``node`` with the value at ``route`` (dict keys, list indices, field names) replaced."""
    if not route:
        return value
    head, rest = route[0], route[1:]
    if isinstance(node, dict):
        return {**node, head: replace(node[head], rest, value)}
    if isinstance(node, list):
        i = int(head)
        return [replace(v, rest, value) if j == i else v for j, v in enumerate(node)]
    if hasattr(node, "_replace"):
        return node._replace(**{head: replace(getattr(node, head), rest, value)})
    return dataclasses.replace(node, **{head: replace(getattr(node, head), rest, value)})


def bad(**changes: Any) -> dict[str, Any]:
    """``good(0)`` with changes at ``/``-separated routes, e.g. ``bad(**{"meta/step": 1.5})``."""
    record = good(0)
    for route, value in changes.items():
        record = replace(record, route.split("/"), value)
    return record


def stacked(n: int = 2, **changes: Any) -> dict[str, Any]:
    """``n`` good records as a batch, with changes as in :func:`bad`."""
    batch = pytreestore.stack([good(i) for i in range(n)], like=good(0), as_numpy=True)
    for route, value in changes.items():
        batch = replace(batch, route.split("/"), value)
    return batch


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("bad-inputs") / "template"
    with pytreestore.create(path, LIKE, chunk_records=4) as s:
        s.extend(good(i) for i in range(N))
    assert pytreestore.open(path).verify().ok
    return path


@pytest.fixture
def store(template, tmp_path):
    """A writer on a fresh copy of a store of ``N`` good records."""
    shutil.copytree(template, tmp_path / "s")
    s = pytreestore.open(tmp_path / "s", mode="a")
    yield s
    if not s.closed:
        s.close()


def fingerprint(path: Path) -> tuple[bytes, bytes]:
    return (path / ".pytreestore" / "commit.json").read_bytes(), (path / "zarr.json").read_bytes()


def assert_unchanged(store, before: tuple[bytes, bytes], root: Path) -> None:
    reader = pytreestore.open(root)
    assert len(reader) == N and reader.committed == N
    got = reader.load(as_numpy=True)
    want = pytreestore.stack([good(i) for i in range(N)], as_numpy=True)
    np.testing.assert_array_equal(got["meta"]["step"], want["meta"]["step"])
    np.testing.assert_array_equal(got["params"][1].y, want["params"][1].y)
    np.testing.assert_array_equal(got["pair"].right, want["pair"].right)
    assert fingerprint(root) == before
    if not store.closed and store.mode == "a":
        assert len(store) == N


def P(id: str, action, error: type, message: str):
    return pytest.param(action, error, message, id=id)


# ---- records: structure -----------------------------------------------------------------------

STRUCTURE = [
    P(
        "list-missing-element",
        lambda s, t: s.append(bad(params=[good(0)["params"][0]])),
        errors.SchemaMismatchError,
        "at ['params']: expected a list of 2, got a list of 1",
    ),
    P(
        "list-extra-element",
        lambda s, t: s.append(bad(params=[*good(0)["params"], good(0)["params"][0]])),
        errors.SchemaMismatchError,
        "at ['params']: expected a list of 2, got a list of 3",
    ),
    P(
        "dict-missing-key",
        lambda s, t: s.append(bad(meta={"step": np.int32(0)})),
        errors.SchemaMismatchError,
        "at ['meta']: expected a dict with keys ['lr', 'step'], got a dict with keys ['step']",
    ),
    P(
        "dict-extra-key",
        lambda s, t: s.append(
            bad(meta={"step": np.int32(0), "lr": np.float32(0), "mom": np.float32(0)})
        ),
        errors.SchemaMismatchError,
        "at ['meta']: expected a dict with keys ['lr', 'step']",
    ),
    P(
        "dict-renamed-key",
        lambda s, t: s.append(bad(meta={"step": np.int32(0), "LR": np.float32(0)})),
        errors.SchemaMismatchError,
        "at ['meta']",
    ),
    P(
        "top-level-key-missing",
        lambda s, t: s.append({k: v for k, v in good(0).items() if k != "pair"}),
        errors.SchemaMismatchError,
        "at the root: expected a dict with keys",
    ),
    P(
        "other-dataclass-for-a-field",
        lambda s, t: s.append(bad(**{"params/0": Pair(np.float32(0), np.zeros(3, np.float32))})),
        errors.SchemaMismatchError,
        "at ['params'][0]: expected Params",
    ),
    P(
        "tuple-for-a-list",
        lambda s, t: s.append(bad(params=tuple(good(0)["params"]))),
        errors.SchemaMismatchError,
        "at ['params']: expected a list of 2, got a tuple of 2",
    ),
    P(
        "plain-tuple-for-a-namedtuple",
        lambda s, t: s.append(bad(pair=(np.int16(0), np.bool_(False)))),
        errors.SchemaMismatchError,
        "at ['pair']: expected Pair (NamedTuple)",
    ),
    P(
        "none-for-a-leaf",
        lambda s, t: s.append(bad(**{"meta/step": None})),
        errors.SchemaMismatchError,
        "at ['meta']['step']: expected a leaf, got None",
    ),
    P(
        "python-list-for-an-array-leaf",
        lambda s, t: s.append(bad(**{"params/0/y": [1.0, 2.0, 3.0]})),
        errors.SchemaMismatchError,
        "at ['params'][0].y: expected a leaf, got a list of 3",
    ),
    P(
        "dict-for-a-leaf",
        lambda s, t: s.append(bad(**{"meta/lr": {"v": np.float32(0)}})),
        errors.SchemaMismatchError,
        "at ['meta']['lr']: expected a leaf, got a dict",
    ),
    P(
        "static-field-value",
        lambda s, t: s.append(bad(static=WithStatic(np.zeros(2, np.float32), name="other"))),
        errors.SchemaMismatchError,
        "['static'].name: stored 'run', got 'other'",
    ),
    P(
        "static-field-tuple",
        lambda s, t: s.append(bad(static=WithStatic(np.zeros(2, np.float32), sizes=(1, 3)))),
        errors.SchemaMismatchError,
        "['static'].sizes: stored (1, 2), got (1, 3)",
    ),
    P(
        "not-a-tree-at-all",
        lambda s, t: s.append(42),
        errors.SchemaMismatchError,
        "at the root: expected a dict with keys",
    ),
]

# ---- records: leaves --------------------------------------------------------------------------

LEAVES = [
    P(
        "wrong-shape",
        lambda s, t: s.append(bad(**{"params/0/y": np.zeros(2, np.float32)})),
        errors.SchemaMismatchError,
        "at ['params'][0].y: expected float32[3], got float32[2]",
    ),
    P(
        "extra-axis",
        lambda s, t: s.append(bad(**{"params/1/y": np.zeros((1, 3), np.float32)})),
        errors.SchemaMismatchError,
        "at ['params'][1].y: expected float32[3], got float32[1,3]",
    ),
    P(
        "array-for-a-scalar",
        lambda s, t: s.append(bad(**{"meta/step": np.zeros(2, np.int32)})),
        errors.SchemaMismatchError,
        "at ['meta']['step']: expected int32[], got int32[2]",
    ),
    P(
        "float-into-int",
        lambda s, t: s.append(bad(**{"meta/step": np.float32(1.5)})),
        errors.SchemaMismatchError,
        "at ['meta']['step']: expected int32[], got float32[]. float32 cannot be cast to int32",
    ),
    P(
        "python-float-into-int",
        lambda s, t: s.append(bad(**{"meta/step": 1.5})),
        errors.SchemaMismatchError,
        "at ['meta']['step']: expected int32[], got Python float 1.5",
    ),
    P(
        "complex-into-float",
        lambda s, t: s.append(bad(**{"params/0/y": np.zeros(3, np.complex64)})),
        errors.SchemaMismatchError,
        "at ['params'][0].y: expected float32[3], got complex64[3]",
    ),
    P(
        "int-into-bool",
        lambda s, t: s.append(bad(**{"pair/right": np.int32(1)})),
        errors.SchemaMismatchError,
        "at ['pair'].right: expected bool[], got int32[]",
    ),
    P(
        "python-int-overflow",
        lambda s, t: s.append(bad(**{"pair/left": 40000})),
        errors.SchemaMismatchError,
        "at ['pair'].left: expected int16[], got Python int 40000",
    ),
    P(
        "numpy-int-overflow",
        lambda s, t: s.append(bad(**{"pair/left": np.int64(1 << 40)})),
        errors.SchemaMismatchError,
        "at ['pair'].left: expected int16[], got int64[]. its values do not fit in int16",
    ),
    P(
        "str-leaf",
        lambda s, t: s.append(bad(**{"meta/lr": "0.1"})),
        errors.SchemaMismatchError,
        "at ['meta']['lr']: expected float32[], got a str",
    ),
    P(
        "bytes-leaf",
        lambda s, t: s.append(bad(**{"meta/lr": b"0.1"})),
        errors.SchemaMismatchError,
        "at ['meta']['lr']: expected float32[], got a bytes",
    ),
    P(
        "object-array",
        lambda s, t: s.append(bad(**{"params/0/y": np.array([1.0, None, 2.0], dtype=object)})),
        errors.SchemaMismatchError,
        "at ['params'][0].y: expected float32[3], got object[3]",
    ),
    P(
        "string-array",
        lambda s, t: s.append(bad(**{"params/0/y": np.array(["a", "b", "c"])})),
        errors.SchemaMismatchError,
        "at ['params'][0].y: expected float32[3], got str32[3]",
    ),
    P(
        "datetime-array",
        lambda s, t: s.append(bad(**{"params/0/y": np.zeros(3, "datetime64[s]")})),
        errors.SchemaMismatchError,
        "at ['params'][0].y: expected float32[3]",
    ),
    P(
        "jax-array-of-the-wrong-shape",
        lambda s, t: s.append(bad(**{"params/1/y": jnp.zeros(4)})),
        errors.SchemaMismatchError,
        "at ['params'][1].y: expected float32[3], got float32[4]",
    ),
    P(
        "arbitrary-object-leaf",
        lambda s, t: s.append(bad(**{"meta/lr": object()})),
        errors.SchemaMismatchError,
        "at ['meta']['lr']: expected float32[], got a object",
    ),
]

# ---- lists and batches ----------------------------------------------------------------------------

BATCHES = [
    P(
        "extend-bad-record-after-a-chunk",
        lambda s, t: s.extend([*(good(i) for i in range(N, N + 5)), bad(**{"meta/step": 1.5})]),
        errors.SchemaMismatchError,
        "extend() refused record 5 (none of this call's records were appended)",
    ),
    P("extend-not-iterable", lambda s, t: s.extend(7), TypeError, "int"),
    P(
        "extend-generator-that-raises",
        lambda s, t: s.extend(_raising(good, 6)),
        RuntimeError,
        "the source failed",
    ),
    P(
        "batch-leaves-disagree",
        lambda s, t: s.extend_batch(stacked(3, **{"meta/step": np.zeros(2, np.int32)})),
        errors.SchemaMismatchError,
        "batch leaves disagree on the number of records",
    ),
    P(
        "batch-leaf-without-record-axis",
        lambda s, t: s.extend_batch(stacked(2, **{"meta/lr": np.float32(0)})),
        errors.SchemaMismatchError,
        "batch leaf at ['meta']['lr'] has no leading record axis",
    ),
    P(
        "batch-wrong-leaf-shape",
        lambda s, t: s.extend_batch(stacked(2, **{"params/0/y": np.zeros((2, 4), np.float32)})),
        errors.SchemaMismatchError,
        "batch does not match the store schema at ['params'][0].y: expected float32[3], got float32[2,4]",
    ),
    P(
        "batch-wrong-dtype-kind",
        lambda s, t: s.extend_batch(stacked(2, **{"meta/step": np.zeros(2, np.float64)})),
        errors.SchemaMismatchError,
        "at ['meta']['step']: expected int32[], got float64[2]",
    ),
    P(
        "batch-of-records-not-a-batch",
        lambda s, t: s.extend_batch([good(0), good(1)]),
        errors.SchemaMismatchError,
        "batch does not match the store schema",
    ),
    P(
        "batch-python-list-leaf",
        lambda s, t: s.extend_batch(stacked(2, **{"meta/lr": [0.0, 1.0]})),
        errors.SchemaMismatchError,
        "['meta']['lr']",
    ),
]


def _raising(make, n):
    for i in range(N, N + n):
        yield make(i)
    raise RuntimeError("the source failed")


# ---- indices --------------------------------------------------------------------------------------

INDICES = [
    P(
        "index-past-the-end",
        lambda s, t: s[N],
        errors.StoreIndexError,
        f"record index {N} is out of range for a store of {N} records",
    ),
    P(
        "negative-index-past-the-start",
        lambda s, t: s[-N - 1],
        errors.StoreIndexError,
        f"record index {-N - 1} is out of range",
    ),
    P("float-index", lambda s, t: s[1.0], errors.StoreIndexError, "got float 1.0"),
    P("str-index", lambda s, t: s["meta"], errors.StoreIndexError, "got str 'meta'"),
    P("none-index", lambda s, t: s[None], errors.StoreIndexError, "got NoneType None"),
    P(
        "mask-of-the-wrong-length",
        lambda s, t: s[np.ones(N + 1, bool)],
        errors.StoreIndexError,
        f"a bool mask must have one entry per record: got {N + 1} for {N} records",
    ),
    P(
        "2d-index-array",
        lambda s, t: s[np.zeros((2, 2), int)],
        errors.StoreIndexError,
        "an index array must be 1-d, got shape (2, 2)",
    ),
    P(
        "float-index-array",
        lambda s, t: s[np.array([0.0, 1.0])],
        errors.StoreIndexError,
        "a store is indexed by an int",
    ),
    P(
        "index-list-out-of-range",
        lambda s, t: s[[0, 99]],
        errors.StoreIndexError,
        "record index 99 is out of range",
    ),
    P(
        "slice-with-float-bounds",
        lambda s, t: s[0:2.5],
        errors.StoreIndexError,
        "slice bounds must be ints or None",
    ),
    P(
        "columns-that-match-nothing",
        lambda s, t: s.load(columns="['nope']"),
        KeyError,
        "no column at or below \"['nope']\"",
    ),
    P(
        "columns-not-a-string",
        lambda s, t: s.load(columns=[3]),
        TypeError,
        "columns= takes tree-path strings, or a mask: a pytree of bools (True selects the "
        "column, False leaves it out); at [0] it holds int 3",
    ),
]

# ---- locations, modes and lifecycle ----------------------------------------------------------------

LOCATIONS = [
    P(
        "empty-path",
        lambda s, t: pytreestore.open(""),
        errors.BadLocationError,
        "a store path must not be empty",
    ),
    P(
        "int-path",
        lambda s, t: pytreestore.open(3),
        errors.BadLocationError,
        "a store path must be a str or os.PathLike, got int",
    ),
    P(
        "nul-in-path",
        lambda s, t: pytreestore.create(str(t / "a\x00b"), LIKE),
        errors.BadLocationError,
        "must not contain NUL bytes",
    ),
    P(
        "unsupported-scheme",
        lambda s, t: pytreestore.open("ftp://host/x"),
        errors.BadLocationError,
        "unsupported URL scheme 'ftp'",
    ),
    P(
        "memory-without-a-name",
        lambda s, t: pytreestore.open("memory://"),
        errors.BadLocationError,
        "names no store: use memory://NAME",
    ),
    P(
        "s3-without-a-bucket",
        lambda s, t: pytreestore.open("s3:///x"),
        errors.BadLocationError,
        "names no bucket",
    ),
    P(
        "s3-invalid-bucket-name",
        lambda s, t: pytreestore.open("s3://Bad_Bucket/x"),
        errors.BadLocationError,
        "'Bad_Bucket' in 's3://Bad_Bucket/x' is not a valid bucket name",
    ),
    P(
        "s3-dotdot-prefix",
        lambda s, t: pytreestore.open("s3://bucket-a/x/../y"),
        errors.BadLocationError,
        "an empty, '.' or '..' component",
    ),
    P(
        "s3-upper-case-scheme",
        lambda s, t: pytreestore.open("S3://bucket-a/x"),
        errors.BadLocationError,
        "write the URL scheme in lower case: s3://",
    ),
    P(
        "s3-query-string",
        lambda s, t: pytreestore.open("s3://bucket-a/x?endpoint=y"),
        errors.BadLocationError,
        "holds a query, fragment or backslash",
    ),
    P(
        "unknown-storage-option",
        lambda s, t: pytreestore.open(
            "s3://bucket-a/x", storage_options={"endpoint_url": "http://h"}
        ),
        errors.BadLocationError,
        "unknown storage option(s) 'endpoint_url'",
    ),
    P(
        "storage-option-of-the-wrong-type",
        lambda s, t: pytreestore.open("s3://bucket-a/x", storage_options={"max_retries": "3"}),
        errors.BadLocationError,
        "storage option 'max_retries' for 's3://bucket-a/x' must be an int >= 0",
    ),
    P(
        "bad-endpoint",
        lambda s, t: pytreestore.open(
            "s3://bucket-a/x", storage_options={"endpoint": "127.0.0.1:9000"}
        ),
        errors.BadLocationError,
        "must look like http(s)://HOST[:PORT]",
    ),
    P(
        "half-the-credentials",
        lambda s, t: pytreestore.open("s3://bucket-a/x", storage_options={"access_key_id": "AK"}),
        errors.BadLocationError,
        "give access_key_id and secret_access_key together",
    ),
    P(
        "storage-options-for-a-local-path",
        lambda s, t: pytreestore.open(t / "s", storage_options={"region": "x"}),
        errors.BadLocationError,
        "storage_options are for s3://, gs:// and http(s):// stores",
    ),
    P(
        "open-nothing",
        lambda s, t: pytreestore.open(t / "nothing"),
        errors.StoreNotFoundError,
        "no store at",
    ),
    P(
        "open-other-data",
        lambda s, t: (
            (t / "other").mkdir()
            or ((t / "other" / "f.txt").write_text("hi") and pytreestore.open(t / "other"))
        ),
        errors.NotAStoreError,
        "is not a pytreestore store: zarr.json is missing",
    ),
    P(
        "create-over-a-store",
        lambda s, t: pytreestore.create(t / "s", LIKE),
        errors.StoreExistsError,
        "already holds a store; pass overwrite=True",
    ),
    P(
        "bad-mode",
        lambda s, t: pytreestore.open(t / "s", mode="w"),
        ValueError,
        "mode must be 'r' (read) or 'a' (append), got 'w'",
    ),
    P(
        "generic-for-appending",
        lambda s, t: pytreestore.open(t / "s", generic=True).append(good(0)),
        errors.ReadOnlyError,
        "is open read-only",
    ),
    P(
        "second-writer",
        lambda s, t: pytreestore.open(t / "s", mode="a"),
        errors.StoreLockedError,
        "is open for writing elsewhere",
    ),
    P(
        "unknown-backend",
        lambda s, t: pytreestore.open(t / "s", backend="hdf5"),
        ValueError,
        "unknown backend 'hdf5'",
    ),
]


def _read_only_append(s, t):
    s.close()
    pytreestore.open(t / "s").append(good(0))


def _read_only_extend_batch(s, t):
    s.close()
    pytreestore.open(t / "s").extend_batch(stacked(2))


def _closed_append(s, t):
    s.close()
    s.append(good(0))


def _closed_load(s, t):
    s.close()
    s[0]


def _closed_len(s, t):
    s.close()
    len(s)


LIFECYCLE = [
    P(
        "append-to-a-read-only-store",
        _read_only_append,
        errors.ReadOnlyError,
        "is open read-only; open it with pytreestore.open(path, mode='a')",
    ),
    P(
        "extend-batch-to-a-read-only-store",
        _read_only_extend_batch,
        errors.ReadOnlyError,
        "is open read-only",
    ),
    P(
        "append-to-a-closed-store",
        _closed_append,
        errors.ClosedStoreError,
        "is closed; open it again",
    ),
    P("load-from-a-closed-store", _closed_load, errors.ClosedStoreError, "is closed"),
    P("len-of-a-closed-store", _closed_len, errors.ClosedStoreError, "is closed"),
]

# ---- example records that cannot be stores ----------------------------------------------------------


class Opaque:
    """Not registered as a pytree node: a leaf no column can hold."""


CREATION = [
    P(
        "unsupported-leaf-object",
        lambda s, t: pytreestore.create(t / "n", {"a": {"b": Opaque()}}),
        errors.UnsupportedTreeError,
        "unsupported leaf at ['a']['b']: Opaque",
    ),
    P(
        "float-dict-key",
        lambda s, t: pytreestore.create(t / "n", {"a": {1.5: np.float32(0)}}),
        errors.UnsupportedTreeError,
        "dict at ['a'] has a key 1.5 of type float; stored dicts need str or int keys",
    ),
    P(
        "bool-dict-key",
        lambda s, t: pytreestore.create(t / "n", {"a": {False: np.float32(0)}}),
        errors.UnsupportedTreeError,
        "dict at ['a'] has a key False of type bool; stored dicts need str or int keys",
    ),
    P(
        "mixed-int-and-str-dict-keys",
        lambda s, t: pytreestore.create(t / "n", {"a": {1: np.float32(0), "b": np.float32(0)}}),
        errors.UnsupportedTreeError,
        "A dict's keys must be sortable against each other (all str, or all int)",
    ),
    P(
        "defaultdict-node",
        lambda s, t: pytreestore.create(
            t / "n", {"d": collections.defaultdict(list, {"x": np.float32(0)})}
        ),
        errors.UnsupportedTreeError,
        "defaultdict at ['d'] cannot be stored",
    ),
    P(
        "str-leaf-in-example",
        lambda s, t: pytreestore.create(t / "n", {"name": "run-1"}),
        errors.UnsupportedTreeError,
        "unsupported leaf at ['name']: str",
    ),
    P(
        "object-dtype-in-example",
        lambda s, t: pytreestore.create(t / "n", {"o": np.zeros(2, object)}),
        errors.UnsupportedTreeError,
        "unsupported dtype at ['o']: object",
    ),
    P(
        "unserializable-static-field",
        lambda s, t: pytreestore.create(t / "n", WithStatic(np.float32(0), name=Opaque())),
        errors.UnsupportedTreeError,
        "WithStatic at the root has static field .name that cannot be stored: Opaque() of type Opaque",
    ),
    P(
        "example-without-leaves",
        lambda s, t: pytreestore.create(t / "n", {"a": [], "b": {}}),
        errors.SchemaMismatchError,
        "the example record has no leaves",
    ),
    P(
        "zero-chunk-records",
        lambda s, t: pytreestore.create(t / "n", LIKE, chunk_records=0),
        ValueError,
        "chunk_records must be a positive int, got 0",
    ),
    P(
        "float-chunk-records",
        lambda s, t: pytreestore.create(t / "n", LIKE, chunk_records=2.5),
        ValueError,
        "chunk_records must be a positive int, got 2.5",
    ),
    P(
        "unknown-codec",
        lambda s, t: pytreestore.create(t / "n", LIKE, codec="lzma"),
        ValueError,
        "unknown codec 'lzma'",
    ),
]

CASES = STRUCTURE + LEAVES + BATCHES + INDICES + LOCATIONS + LIFECYCLE + CREATION


def test_the_corpus_is_large_and_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 40, len(ids)


@pytest.mark.parametrize(("action", "error", "message"), CASES)
def test_bad_input(store, tmp_path, action, error, message):
    before = fingerprint(tmp_path / "s")
    with pytest.raises(error) as caught:
        action(store, tmp_path)
    text = str(caught.value.args[0]) if isinstance(caught.value, KeyError) else str(caught.value)
    assert message in text, f"{message!r} not in {text!r}"
    if issubclass(error, errors.PyTreeStoreError):
        assert type(caught.value).__mro__[1:] and isinstance(caught.value, errors.PyTreeStoreError)
    assert_unchanged(store, before, tmp_path / "s")
    assert not (tmp_path / "n").exists() or not any((tmp_path / "n").iterdir())


def test_refused_extends_leave_verify_clean(store, tmp_path):
    for case in BATCHES[:3]:
        action, error, _ = case.values
        with pytest.raises(error):
            action(store, tmp_path)
    assert pytreestore.open(tmp_path / "s").verify().ok


def test_appends_still_work_after_every_refusal(store, tmp_path):
    for case in STRUCTURE + LEAVES + BATCHES[:1]:
        action, error, _ = case.values
        with pytest.raises(error):
            action(store, tmp_path)
    store.extend(good(i) for i in range(N, N + 3))
    store.close()
    out = pytreestore.open(tmp_path / "s").load(as_numpy=True)
    np.testing.assert_array_equal(out["meta"]["step"], np.arange(N + 3))


# ---- not bad input -----------------------------------------------------------------------------------


def test_nan_and_infinities_are_stored_exactly(tmp_path):
    values = np.array([np.nan, np.inf, -np.inf, -0.0], np.float32)
    nan_payload = np.array([0x7FC00001], np.uint32).view(np.float32)[0]
    with pytreestore.create(
        tmp_path / "f", {"v": np.zeros(4, np.float32), "s": np.float64(0)}
    ) as s:
        s.append({"v": values, "s": np.float64(np.nan)})
        s.append({"v": np.full(4, nan_payload), "s": np.float64(-np.inf)})
    out = pytreestore.open(tmp_path / "f").load(as_numpy=True)
    assert out["v"][0].tobytes() == values.tobytes()
    assert out["v"][1].view(np.uint32).tolist() == [0x7FC00001] * 4  # the NaN payload too
    assert np.isnan(out["s"][0]) and out["s"][1] == -np.inf


def test_empty_appends_are_no_ops(store, tmp_path):
    before = fingerprint(tmp_path / "s")
    store.extend([])
    store.extend(iter(()))
    store.extend_batch(stacked(0))
    store.flush()
    assert_unchanged(store, before, tmp_path / "s")


# ---- no code execution from data -----------------------------------------------------------------------

EVIL = """
import pathlib
CALLED = pathlib.Path({marker!r})


def payload(*args, **kwargs):
    CALLED.write_text("called")
    return object


class Meta(type):
    def __call__(cls, *args, **kwargs):
        CALLED.write_text("instantiated")
        return super().__call__(*args, **kwargs)


class Gadget(metaclass=Meta):
    def __init_subclass__(cls, **kw):
        CALLED.write_text("subclassed")

    def __reduce__(self):
        CALLED.write_text("reduced")
        return (payload, ())
"""


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    marker = tmp_path / "called"
    (tmp_path / "evilmod.py").write_text(EVIL.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    import evilmod  # already imported, so only *calls* could have effects

    yield marker
    sys.modules.pop("evilmod", None)
    del evilmod


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("custom", "evilmod:payload"),
        ("custom", "evilmod:Gadget"),
        ("namedtuple", "evilmod:Gadget"),
        ("custom", "os:system"),
        ("custom", "builtins:eval"),
        ("custom", "subprocess:Popen"),
    ],
)
def test_opening_never_calls_what_the_schema_names(tmp_path, evil_module, kind, name):
    path = tmp_path / "s"
    with pytreestore.create(path, {"x": np.float32(0)}) as s:
        s.append({"x": np.float32(1)})
    root = json.loads((path / "zarr.json").read_text())
    info = root["attributes"]["pytreestore"]
    leaf = info["tree"]["children"][0]
    node = {"node": kind, "type": name, "children": [leaf]}
    if kind == "custom":
        node.update(aux={"tuple": ["echo pwned"]}, keys=[{"attr": "x"}])
    else:
        node.update(fields=["x"])
    info["tree"] = node
    (path / "zarr.json").write_text(json.dumps(root))
    with pytest.raises((errors.ClassResolutionError, errors.CorruptStoreError)) as caught:
        pytreestore.open(path).schema
    assert re.search(
        r"not a class|not a registered pytree node|not a NamedTuple|schema", str(caught.value)
    )
    assert not evil_module.exists(), evil_module.read_text()
    # the generic view needs no classes at all
    assert float(pytreestore.open(path, generic=True)[0]["x"]) == 1.0


# ---- issue 12: places and inputs that raised raw builtin errors ---------------------------------

X = {"x": np.int32(0)}


def small(path: Path, backend: str, n: int = 5) -> Path:
    with pytreestore.create(path, X, chunk_records=2, backend=backend) as s:
        s.extend({"x": np.int32(i)} for i in range(n))
    return path


def test_a_path_that_is_a_file_or_below_one(tmp_path: Path, backend: str) -> None:
    (tmp_path / "file").write_text("data")
    for path, what in [("file", "is a file"), ("file/s", "is below")]:
        with pytest.raises(errors.BadLocationError, match=f"{what}.*a store is a directory"):
            pytreestore.create(tmp_path / path, X, backend=backend)
        with pytest.raises(errors.BadLocationError, match=f"{what}.*a store is a directory"):
            pytreestore.open(tmp_path / path, backend=backend)
    assert (tmp_path / "file").read_text() == "data"


def test_a_root_that_is_a_symlink_loop(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(errors.BadLocationError, match="Remove the symlink loop"):
        pytreestore.create(tmp_path / "loop", X)
    with pytest.raises(errors.BadLocationError, match="Remove the symlink loop"):
        pytreestore.open(tmp_path / "loop")


@pytest.mark.plain_files
def test_a_lock_that_is_a_directory_or_a_meta_folder_that_is_a_file(
    tmp_path: Path, backend: str
) -> None:
    path = small(tmp_path / "s", backend)
    commit = (path / ".pytreestore" / "commit.json").read_bytes()
    (path / ".pytreestore" / "lock").unlink(missing_ok=True)
    (path / ".pytreestore" / "lock").mkdir()
    with pytest.raises(errors.CorruptStoreError, match=r"cannot take the writer lock.*Is a dir"):
        pytreestore.open(path, mode="a", backend=backend)
    shutil.rmtree(path / ".pytreestore")
    (path / ".pytreestore").write_text("")
    with pytest.raises(errors.PyTreeStoreError):  # no commit record: a damaged store
        pytreestore.open(path, mode="a", backend=backend)
    (path / ".pytreestore").unlink()
    (path / ".pytreestore").mkdir()
    (path / ".pytreestore" / "commit.json").write_bytes(commit)
    np.testing.assert_array_equal(pytreestore.open(path).load(as_numpy=True)["x"], np.arange(5))


def test_a_read_only_mount_refuses_append_clearly(tmp_path: Path) -> None:
    import subprocess

    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", mount]).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root); chmod does not stop root")
    try:
        for backend in FILE_BACKENDS:
            small(mount / backend, backend)
        subprocess.run(["mount", "-o", "remount,ro", mount], check=True)
        for backend in FILE_BACKENDS:
            with pytest.raises(errors.StorageError, match=r"Read-only file system.*mode='r'"):
                pytreestore.open(mount / backend, mode="a", backend=backend)
            got = pytreestore.open(mount / backend, backend=backend).load(as_numpy=True)
            np.testing.assert_array_equal(got["x"], np.arange(5))
    finally:
        subprocess.run(["umount", mount])


@pytest.mark.parametrize("codec", ["zstd", None])
def test_a_symlink_loop_inside_a_column(tmp_path: Path, codec: str | None) -> None:
    with pytreestore.create(tmp_path / "s", X, chunk_records=2, codec=codec) as s:
        s.extend({"x": np.int32(i)} for i in range(5))
    chunk = tmp_path / "s" / "x" / "c" / "1"
    chunk.unlink()
    chunk.symlink_to(chunk)
    store = pytreestore.open(tmp_path / "s")
    with pytest.raises(errors.PyTreeStoreError, match="Too many levels of symbolic links"):
        store.load(as_numpy=True)
    np.testing.assert_array_equal(store.load(slice(0, 2), as_numpy=True)["x"], [0, 1])


@pytest.mark.plain_files
@pytest.mark.parametrize("codec", ["zstd", None])
@pytest.mark.parametrize("where", ["x/c/1", "x/c", "x"], ids=["chunk", "chunk-folder", "column"])
def test_a_symlink_loop_is_a_corrupt_store_naming_its_path(
    tmp_path: Path, backend: str, codec: str | None, where: str
) -> None:
    # issue 28 (13): open(mode="a") raised the OSError of the loop
    with pytreestore.create(tmp_path / "s", X, chunk_records=2, codec=codec, backend=backend) as s:
        s.extend({"x": np.int32(i)} for i in range(5))
    loop = tmp_path / "s" / where
    shutil.rmtree(loop) if loop.is_dir() else loop.unlink()
    loop.symlink_to(loop)
    named = re.escape(str(loop)) + r".* is a symbolic link loop inside the store"
    try:
        pytreestore.open(tmp_path / "s", mode="a", backend=backend).close()
    except errors.CorruptStoreError as err:
        assert re.search(named, str(err)), err
    else:  # a loop where the writer never looks: a full chunk it does not rewrite
        assert (backend, where) == ("zarr", "x/c/1")
    reader = pytreestore.open(tmp_path / "s", backend=backend)
    with pytest.raises(errors.CorruptStoreError, match=named):
        reader.load(as_numpy=True)
    try:
        assert not reader.verify().ok
    except errors.CorruptStoreError as err:
        assert re.search(named, str(err)), err


def test_a_slice_step_beyond_any_length(tmp_path: Path, backend: str) -> None:
    store = pytreestore.open(small(tmp_path / "s", backend), backend=backend)
    for step in (2**70, -(2**70), 2**63):
        want = np.arange(5)[slice(None, None, step)]
        got = store.load(slice(None, None, step), as_numpy=True)["x"]
        np.testing.assert_array_equal(got, want)


def test_dict_keys_of_mixed_types_in_like(tmp_path: Path) -> None:
    with pytest.raises(errors.UnsupportedTreeError, match="one key type per dict"):
        pytreestore.create(tmp_path / "s", {1: np.int32(0), "a": np.int32(0)})
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, "bfloat16"])
def test_finite_floats_that_would_overflow_to_inf_are_refused(tmp_path: Path, dtype) -> None:
    import ml_dtypes

    dt = np.dtype(getattr(ml_dtypes, dtype) if isinstance(dtype, str) else dtype)
    store = pytreestore.create(tmp_path / "s", {"x": dt.type(0)}, chunk_records=4)
    store.extend({"x": dt.type(i)} for i in range(3))
    where = re.escape(f"at ['x']: expected {dt.name}[]")
    for value in (1e300, np.float64(-1e300), np.array(1e300)):
        with pytest.raises(errors.SchemaMismatchError, match=where + ".*would become infinite"):
            store.append({"x": value})
    with pytest.raises(errors.SchemaMismatchError, match=r"refused record 1 .*would become inf"):
        store.extend([{"x": 1.0}, {"x": 1e300}])
    with pytest.raises(errors.SchemaMismatchError, match="would become infinite"):
        store.extend_batch({"x": np.array([1.0, 1e300])})
    store.extend([{"x": float("inf")}, {"x": float("nan")}])  # not finite to begin with: kept
    store.close()
    got = pytreestore.open(tmp_path / "s").load(as_numpy=True)["x"].astype(np.float64)
    np.testing.assert_array_equal(got, [0, 1, 2, np.inf, np.nan])


@pytest.mark.plain_files
def test_a_reader_notices_its_store_was_replaced(tmp_path: Path, backend: str) -> None:
    path = small(tmp_path / "s", backend, n=10)
    reader = pytreestore.open(path, backend=backend)
    with pytreestore.create(path, X, chunk_records=2, backend=backend, overwrite=True) as s:
        s.extend({"x": np.int32(100 + i)} for i in range(3))
    want = "was replaced since this reader opened it: it now holds 3 records at commit 2, "
    for call in (
        lambda: reader.load(as_numpy=True),
        lambda: reader.load(slice(0, 2), as_numpy=True),
        reader.verify,
        reader.refresh,
    ):
        with pytest.raises(errors.StoreReplacedError, match=re.escape(want)):
            call()
    again = pytreestore.open(path, backend=backend)
    np.testing.assert_array_equal(again.load(as_numpy=True)["x"], [100, 101, 102])


@pytest.mark.plain_files
def test_a_reader_notices_a_replacement_that_grew_past_it(tmp_path: Path, backend: str) -> None:
    # issue 12 (14): records and generation alone miss a new store that is already longer
    path = small(tmp_path / "s", backend, n=3)
    reader = pytreestore.open(path, backend=backend)
    with pytreestore.create(path, X, chunk_records=2, backend=backend, overwrite=True) as s:
        s.extend({"x": np.int32(100 + i)} for i in range(12))
    for call in (lambda: reader.load(as_numpy=True), reader.verify, reader.refresh):
        with pytest.raises(errors.StoreReplacedError, match=r"its store id is now [0-9a-f]{32}"):
            call()
    np.testing.assert_array_equal(
        pytreestore.open(path, backend=backend).load(slice(0, 2), as_numpy=True)["x"], [100, 101]
    )
