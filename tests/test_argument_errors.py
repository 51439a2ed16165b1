"""Every public call given malformed arguments raises a PyTreeStoreError, and writes nothing
(issue 28, defect 10).

Each row of the table calls one public function or method with a list of bad values (None,
numbers, strings, bools, huge ints, lists, dicts, objects): each must raise a
:class:`~pytreestore.errors.PyTreeStoreError` (argument checks raise ``ArgumentError``, a
``ValueError``, or ``ArgumentTypeError``, also a ``TypeError``), and afterwards every file of
the stores is as it was and no new store exists. Where an int is wanted a numpy integer is
taken; a bool or a float never is.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pytreestore
from pytreestore import errors

X = {"x": np.int32(0), "y": np.zeros(2, np.float32)}
RX = {"x": np.int32(0), "l": [np.float32(0)]}
N = 5


def rec(i: int) -> dict[str, Any]:
    return {"x": np.int32(i), "y": np.full(2, i, np.float32)}


def ragged_rec(i: int) -> dict[str, Any]:
    return {"x": np.int32(i), "l": [np.float32(j) for j in range(i)]}


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("arguments")
    with pytreestore.create(root / "fixed", X, chunk_records=2) as s:
        s.extend(rec(i) for i in range(N))
        s.flush()
        s.tag("five")
    with pytreestore.create(root / "ragged", RX, chunk_records=2, ragged=["['l']"]) as s:
        s.extend(ragged_rec(i) for i in range(N))
    return root / "fixed", root / "ragged"


@dataclasses.dataclass
class Ctx:
    """The stores a call works on: writers and readers opened on first use, closed after."""

    path: Path
    ragged_path: Path
    out: Path
    opened: list[Any] = dataclasses.field(default_factory=list)

    def _open(self, path: Path, mode: str) -> Any:
        store = pytreestore.open(path, mode)
        self.opened.append(store)
        return store

    @property
    def w(self) -> Any:
        return self._cached("_w", lambda: self._open(self.path, "a"))

    @property
    def r(self) -> Any:
        return self._cached("_r", lambda: self._open(self.path, "r"))

    @property
    def rw(self) -> Any:
        return self._cached("_rw", lambda: self._open(self.ragged_path, "a"))

    @property
    def rr(self) -> Any:
        return self._cached("_rr", lambda: self._open(self.ragged_path, "r"))

    def _cached(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self.__dict__:
            self.__dict__[name] = make()
        return self.__dict__[name]


def snapshot(*roots: Path) -> dict[str, bytes]:
    """Every file below ``roots`` with its bytes (the writer lock's holder id aside)."""
    out = {}
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for name in files:
                full = Path(dirpath) / name
                out[str(full)] = b"" if name == "lock" else full.read_bytes()
    return out


BAD_COUNT = [None, "3", 1.5, True, np.bool_(True), np.float64(2), [], {}, object()]
NOT_ITERABLE = [None, 5, 1.5, True, np.int64(3), object()]
NOT_MAPPING = [5, "x", 1.5, True, np.int64(3), [("a", 1)], object()]
NOT_FLAG = [None, 5, "x", 1.5, [], object()]
EVERYTHING = [None, 5, "x", -1, 1.5, True, np.int64(3), 2**70, [], {}, object()]
RAGGED_BATCH = {"x": np.arange(2, dtype=np.int32), "l": np.zeros((2, 3), np.float32)}


def _mask(l_shape: tuple[int, ...]) -> dict[str, Any]:
    return {"x": np.ones(2, bool), "l": np.ones(l_shape, bool)}


#: (id, call(ctx, value), bad values)
CALLS: list[tuple[str, Callable[[Ctx, Any], Any], list[Any]]] = [
    ("append", lambda c, v: c.w.append(v), EVERYTHING),
    ("extend", lambda c, v: c.w.extend(v), NOT_ITERABLE),
    ("extend-progress", lambda c, v: c.w.extend([rec(0)], progress=v), [None, 5, "x", 0, []]),
    ("verify-progress", lambda c, v: c.r.verify(progress=v), [None, 5, "x", []]),
    ("copy-progress", lambda c, v: pytreestore.copy(c.path, c.out, progress=v), [None, 1, "x"]),
    ("map-progress", lambda c, v: c.r.map(lambda r: r, progress=v), [None, 1, "x"]),
    ("extend_batch", lambda c, v: c.w.extend_batch(v), EVERYTHING),
    ("commit_fragments", lambda c, v: c.w.commit_fragments(v), NOT_ITERABLE),
    ("commit_fragments-item", lambda c, v: c.w.commit_fragments([v]), EVERYTHING),
    ("truncate", lambda c, v: c.w.truncate(v), [*BAD_COUNT, -1, N + 1, 2**70]),
    ("keep_last", lambda c, v: c.w.keep_last(v), [*BAD_COUNT, -1]),
    ("replay", lambda c, v: c.w.replay(v), [*BAD_COUNT, 0, -1]),
    ("replay-seed", lambda c, v: c.w.replay(4, seed=v), ["3", 1.5, -1, [], object()]),
    ("recorder", lambda c, v: c.w.recorder(v), [*BAD_COUNT, 0, -1]),
    ("tag-name", lambda c, v: c.w.tag(v), [x for x in EVERYTHING if x != "x"] + ["-x", "a b"]),
    ("tag-version", lambda c, v: c.w.tag("new", v), [*BAD_COUNT[1:], -1, 2**70]),
    (
        "vacuum",
        lambda c, v: c.w.vacuum(fragments_older_than=v),
        [None, "3", True, np.bool_(True), [], -1, np.nan, 1j],
    ),
    ("evolve-add", lambda c, v: c.w.evolve(add=v), NOT_MAPPING),
    ("evolve-add-default", lambda c, v: c.w.evolve(add={"['z']": v}), [None, "x", 2**70, []]),
    ("evolve-drop", lambda c, v: c.w.evolve(drop=v), [5, 1.5, True, [3], {"a": 1}, object()]),
    ("evolve-rename", lambda c, v: c.w.evolve(rename=v), NOT_MAPPING),
    ("evolve-rename_class", lambda c, v: c.w.evolve(rename_class=v), NOT_MAPPING),
    ("pytreestore.evolve", lambda c, v: pytreestore.evolve(c.path, add=v), NOT_MAPPING),
    ("open-mode", lambda c, v: pytreestore.open(c.path, v), EVERYTHING),
    ("open-version", lambda c, v: pytreestore.open(c.path, version=v), [*BAD_COUNT[1:], -1]),
    ("open-version-writer", lambda c, v: pytreestore.open(c.path, "a", version=v), [1, "five"]),
    ("open-keep_versions", lambda c, v: pytreestore.open(c.path, keep_versions=v), BAD_COUNT[1:]),
    ("open-cache_bytes", lambda c, v: pytreestore.open(c.path, cache_bytes=v), BAD_COUNT[1:]),
    ("open-backend", lambda c, v: pytreestore.open(c.path, backend=v), [5, [], {}, "nope"]),
    ("open-cast", lambda c, v: pytreestore.open(c.path, cast=v), NOT_FLAG),
    ("open-generic", lambda c, v: pytreestore.open(c.path, generic=v), NOT_FLAG),
    ("open-break_lock", lambda c, v: pytreestore.open(c.path, "a", break_lock=v), NOT_FLAG),
    ("open-multihost", lambda c, v: pytreestore.open(c.path, "a", multihost=v), NOT_FLAG),
    ("open-coordinator", lambda c, v: pytreestore.open(c.path, "a", coordinator=v), [5, "x"]),
    (
        "create-chunk_records",
        lambda c, v: pytreestore.create(c.out, X, chunk_records=v),
        [*BAD_COUNT[1:], 0, -1],
    ),
    ("create-codec", lambda c, v: pytreestore.create(c.out, X, codec=v), [5, "x", True, []]),
    (
        "create-keep_versions",
        lambda c, v: pytreestore.create(c.out, X, keep_versions=v),
        [*BAD_COUNT[1:], 0],
    ),
    (
        "create-pack",
        lambda c, v: pytreestore.create(c.out, X, pack=v),
        ["3", 1.5, np.float64(2), 0, -1, []],
    ),
    ("create-overwrite", lambda c, v: pytreestore.create(c.out, X, overwrite=v), NOT_FLAG),
    ("create-multihost", lambda c, v: pytreestore.create(c.out, X, multihost=v), NOT_FLAG),
    ("create-cast", lambda c, v: pytreestore.create(c.out, X, cast=v), NOT_FLAG),
    ("create-backend", lambda c, v: pytreestore.create(c.out, X, backend=v), [5, [], "nope"]),
    ("create-like", lambda c, v: pytreestore.create(c.out, v), ["x", [], {}, object()]),
    (
        "copy-pack",
        lambda c, v: pytreestore.copy(c.path, c.out, pack=v),
        ["3", 1.5, np.float64(2), 0, "x"],
    ),
    (
        "copy-chunk_records",
        lambda c, v: pytreestore.copy(c.path, c.out, chunk_records=v),
        [*BAD_COUNT[1:], 0],
    ),
    ("copy-codec", lambda c, v: pytreestore.copy(c.path, c.out, codec=v), [5, "x", True, []]),
    ("load-index", lambda c, v: c.r.load(v), [None, "x", 1.5, N, 2**70, {}, object()]),
    ("load-columns", lambda c, v: c.r.load(columns=v), [5, 1.5, [3], {}, object(), "['z']"]),
    ("load-cast", lambda c, v: c.r.load(cast=v), [5, "x", 1.5, []]),
    ("load-device", lambda c, v: c.r.load(device=v), [5, "x", [], object()]),
    ("load-sharding", lambda c, v: c.r.load(sharding=v), [5, "x", [], object()]),
    ("load-pad", lambda c, v: c.r.load(pad=v), [5, "x", True]),
    ("load-pmap_devices", lambda c, v: c.r.load(pmap_devices=v), [5, "x", [], object()]),
    ("load-as_numpy", lambda c, v: c.r.load(as_numpy=v), [5, "x", [], object()]),
    (
        "ragged-load-pad_to",
        lambda c, v: c.rr.load(pad_to=v),
        [0, -1, "x", 1.5, True, 2**70, [3, 2]],
    ),
    ("ragged-load-truncate", lambda c, v: c.rr.load(pad_to=1, truncate=v), NOT_FLAG),
    ("ragged-load-size", lambda c, v: c.rr.load(ragged="segments", size=v), ["x", -1, 1.5, True]),
    ("ragged-load-ragged", lambda c, v: c.rr.load(ragged=v), EVERYTHING),
    ("getitem", lambda c, v: c.r[v], [None, "x", 1.5, N, 2**70, object()]),
    ("records-columns", lambda c, v: list(c.r.records(columns=v)), [5, 1.5, object()]),
    ("batches-batch_size", lambda c, v: c.r.batches(v), [*BAD_COUNT, 0, -1]),
    ("batches-shuffle", lambda c, v: c.r.batches(2, shuffle=v), NOT_FLAG),
    ("batches-seed", lambda c, v: c.r.batches(2, shuffle=True, seed=v), [*BAD_COUNT, -1]),
    ("batches-drop_last", lambda c, v: c.r.batches(2, drop_last=v), NOT_FLAG),
    ("batches-prefetch", lambda c, v: c.r.batches(2, prefetch=v), [*BAD_COUNT[1:], -1]),
    ("batches-start", lambda c, v: c.r.batches(2, start=v), BAD_COUNT),
    ("batches-stop", lambda c, v: c.r.batches(2, stop=v), BAD_COUNT[1:]),
    ("batches-epochs", lambda c, v: c.r.batches(2, epochs=v), [*BAD_COUNT[1:], -1]),
    ("batches-state", lambda c, v: c.r.batches(2, state=v), [5, "x", [], {}, {"epoch": "a"}]),
    ("batches-columns", lambda c, v: c.r.batches(2, columns=v), [5, 1.5, object()]),
    ("map-fn", lambda c, v: c.r.map(v), [None, 5, "x", []]),
    ("map-batch_size", lambda c, v: c.r.map(lambda r: r, batch_size=v), [*BAD_COUNT[1:], 0, 2**70]),
    ("map-out", lambda c, v: c.r.map(lambda r: r, out=v), [5, 1.5, [], object()]),
    ("map-prefetch", lambda c, v: c.r.map(lambda r: r, prefetch=v), [*BAD_COUNT[1:], -1]),
    ("grain_source-columns", lambda c, v: c.r.grain_source(columns=v), [5, object()]),
    ("grain_source-getitem", lambda c, v: c.r.grain_source()[v], BAD_COUNT),
    ("lengths", lambda c, v: c.rr.lengths(v), [None, "x", 1.5, N, 2**70]),
    ("ragged-extend", lambda c, v: c.rw.extend(v), NOT_ITERABLE),
    (
        "write_fragment",
        lambda c, v: pytreestore.write_fragment(c.path, v),
        [None, 5, "x", -1, 1.5, True, np.int64(3), 2**70],
    ),
    (
        "write_fragment-mask",
        lambda c, v: pytreestore.write_fragment(c.path, [rec(0)], mask=v),
        [5, "x", np.ones(1, bool)],
    ),
    (
        "write_fragment-like",
        lambda c, v: pytreestore.write_fragment(c.path, [rec(0)], like=v),
        [5, "x", {}],
    ),
    (
        "write_fragment-backend",
        lambda c, v: pytreestore.write_fragment(c.path, [rec(0)], backend=v),
        [5, "nope", [], ""],
    ),
    (
        "open-storage_options",
        lambda c, v: pytreestore.open(c.path, storage_options=v),
        [[], 0, "", {"endpoint": "x"}],
    ),
    (
        "ragged-extend_batch-mask",
        lambda c, v: c.rw.extend_batch(RAGGED_BATCH, mask=v),
        [None, 5, "x", _mask((2, 9)), _mask((2, 2)), _mask((3, 3)), _mask((2,))],
    ),
    (
        "ragged-write_fragment-mask",
        lambda c, v: pytreestore.write_fragment(c.ragged_path, RAGGED_BATCH, mask=v),
        [None, 5, _mask((2, 9)), _mask((2, 2)), _mask((3, 3))],
    ),
    ("stack", lambda c, v: pytreestore.stack(v), [None, 5, 1.5, True, [], object()]),
    ("stack-like", lambda c, v: pytreestore.stack([rec(0)], like=v), [5, "x", {}]),
    (
        "stack-pad_to",
        lambda c, v: pytreestore.stack([{"l": [1.0]}], ragged=True, pad_to=v),
        [0, "x", 1.5, True, 2**70],
    ),
    (
        "unstack",
        lambda c, v: pytreestore.unstack(v),
        [5, 1.5, {"a": np.zeros(2), "b": np.zeros(3)}, "x", None, {"a": "x"}],
    ),
    (
        "unstack-mask",
        lambda c, v: pytreestore.unstack({"x": np.zeros(2)}, mask=v),
        [5, "x", {"y": 1}],
    ),
]


@pytest.mark.parametrize(("call", "values"), [c[1:] for c in CALLS], ids=[c[0] for c in CALLS])
def test_bad_arguments_raise_pytreestore_errors_and_write_nothing(
    templates, tmp_path, call, values
):
    path, ragged = tmp_path / "fixed", tmp_path / "ragged"
    shutil.copytree(templates[0], path)
    shutil.copytree(templates[1], ragged)
    before = snapshot(path, ragged)
    ctx = Ctx(path, ragged, tmp_path / "out")
    try:
        for value in values:
            with pytest.raises(errors.PyTreeStoreError) as caught:
                call(ctx, value)
            assert str(caught.value), f"{value!r}: an empty message"
            assert snapshot(path, ragged) == before, f"{value!r} changed a store"
            assert not ctx.out.exists(), f"{value!r} left {ctx.out}"
    finally:
        for store in ctx.opened:
            store.close()
    assert snapshot(path, ragged) == before
    assert len(pytreestore.open(path)) == N and len(pytreestore.open(ragged)) == N


def test_the_table_calls_every_public_method_and_function():
    called = " ".join(c[0] for c in CALLS)
    public = [n for n in dir(pytreestore.TreeStore) if not n.startswith("_")]
    takes_nothing = {"close", "closed", "flush", "commit_now", "committed", "mode", "path"}
    takes_nothing |= {"read_context", "refresh", "reopen_options", "schema"}
    takes_nothing |= {"dropped", "version", "versions"}
    missing = [n for n in public if n not in takes_nothing and n not in called]
    assert missing == []
    functions = ["create", "open", "copy", "evolve", "stack", "unstack", "write_fragment"]
    assert [f for f in functions if f not in called] == []


def test_the_argument_errors_are_builtin_errors_too():
    assert issubclass(errors.ArgumentError, ValueError)
    assert issubclass(errors.ArgumentTypeError, TypeError)
    assert issubclass(errors.ArgumentTypeError, errors.ArgumentError)
    with pytest.raises(errors.ArgumentTypeError, match=r"truncate\(\) takes a record count"):
        pytreestore.create("memory://arguments-truncate", X, overwrite=True).truncate(1.0)


# ---- numpy integers are integers --------------------------------------------------------------


def test_numpy_integers_are_taken_where_an_int_is_wanted(templates, tmp_path):
    path = tmp_path / "fixed"
    shutil.copytree(templates[0], path)
    i = np.int64
    with pytreestore.open(path, "a", keep_versions=i(50)) as store:
        store.truncate(i(3))
        three = store.version
        store.tag("three", np.uint8(three))
        store.append(rec(7))
        assert store.vacuum(fragments_older_than=i(3600)).chunks >= 0
        assert [b["x"].tolist() for b in store.batches(i(2), seed=i(1), prefetch=i(1))] == [
            [0, 1],
            [2, 7],
        ]
        assert int(store.grain_source()[i(3)]["x"]) == 7
    assert pytreestore.open(path, version="three").load(as_numpy=True)["x"].tolist() == [0, 1, 2]
    old = pytreestore.open(path, version=i(three), cache_bytes=np.int32(1 << 20))
    assert len(old) == 3 and old.version == three
    with pytreestore.create(tmp_path / "c", X, chunk_records=i(4), pack=i(64)) as made:
        assert made.schema.chunk_records == 4 and type(made.schema.chunk_records) is int
    assert pytreestore.copy(path, tmp_path / "copy", chunk_records=np.int32(2)) == N - 1
    assert pytreestore.open(tmp_path / "copy").schema.chunk_records == 2


# ---- ragged masks of the wrong shape --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["tensorstore", "zarr", "ocdbt"])
def test_a_ragged_mask_of_another_padded_length_is_refused(tmp_path, backend):
    path = tmp_path / "s"
    with pytreestore.create(path, RX, chunk_records=2, ragged=["['l']"], backend=backend) as s:
        s.extend(ragged_rec(i) for i in range(N))
    batch, mask = pytreestore.open(path, backend=backend).load(as_numpy=True)
    before = snapshot(path)
    for length in (3, 9):
        wrong = {"x": mask["x"], "l": np.ones((N, length), bool)}
        below = r"below \['l'\] the mask says"
        with (
            pytreestore.open(path, "a", backend=backend) as store,
            pytest.raises(errors.SchemaMismatchError, match=below),
        ):
            store.extend_batch(batch, mask=wrong)
        with pytest.raises(errors.SchemaMismatchError, match=rf"shape \({N}, {length}\)"):
            pytreestore.write_fragment(path, batch, mask=wrong, backend=backend)
    if backend != "ocdbt":  # an OCDBT database's files change with every open
        assert snapshot(path) == before
    got = pytreestore.open(path, backend=backend)
    assert len(got) == N and got[4]["l"] == [0.0, 1.0, 2.0, 3.0]


# ---- what was taken before stays taken ---------------------------------------------------------


class _Indexed:
    """A sequence by ``__getitem__`` alone (no ``__iter__``), which ``iter()`` takes."""

    def __init__(self, n: int, make: Callable[[int], Any]) -> None:
        self.n, self.make = n, make

    def __getitem__(self, k: int) -> Any:
        if k >= self.n:
            raise IndexError(k)
        return self.make(k)


def test_a_sequence_with_only_getitem_is_taken_as_records(tmp_path):
    with pytreestore.create(tmp_path / "s", X) as s:
        s.extend(_Indexed(3, lambda k: {**X, "x": np.int32(k)}))
    assert pytreestore.open(tmp_path / "s").load(as_numpy=True)["x"].tolist() == [0, 1, 2]
    with pytreestore.create(tmp_path / "r", RX, ragged=["['l']"]) as s:
        s.extend(_Indexed(3, ragged_rec))
    assert pytreestore.open(tmp_path / "r")[2]["l"] == [0.0, 1.0]
    assert pytreestore.stack(_Indexed(2, lambda k: X))["x"].tolist() == [0, 0]
