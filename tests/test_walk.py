"""The compiled walk of a ragged store's records (``pytreestore._write.walk``): every kind of
ragged store appends exactly what it is given, and a record refused anywhere (midway
through a list, at a leading axis, in the record's own leaves) leaves nothing in any
table, on both backends."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import flax.struct
import jax.numpy as jnp
import numpy as np
import pytest

import pytreestore
from pytreestore._tree.convert import LeafCaster
from pytreestore._write.walk import Plan, Stage, column_block, one_by_one
from pytreestore.errors import SchemaMismatchError, StorageError
from pytreestore.testing import assert_trees_equal

F32, I32 = np.float32, np.int32


@flax.struct.dataclass
class Point:
    a: Any  # float32
    b: Any  # int32


class Pair(NamedTuple):
    a: Any  # float32
    b: Any  # int32


def _points(*values: tuple[float, int]) -> list[Point]:
    return [Point(F32(a), I32(b)) for a, b in values]


def _nested(*lists: list[int]) -> list[dict[str, Any]]:
    return [{"w": F32(len(q)), "q": [I32(v) for v in q]} for q in lists]


#: per kind of ragged store: (like, create options, good records, a bad record with what
#: its refusal says)
KINDS: dict[str, tuple[Any, dict[str, Any], list[Any], tuple[Any, str]]] = {
    "list of dataclasses": (
        {"x": I32(0), "p": _points((0, 0))},
        {"ragged": ["['p']"]},
        [
            {"x": I32(1), "p": _points((1.5, 1), (2.5, 2), (3.5, 3))},
            {"x": I32(2), "p": []},
            {"x": I32(3), "p": _points((4.5, 4))},
        ],
        (
            {"x": I32(4), "p": [*_points((5, 5), (6, 6)), Point(F32(7.5), F32(7.5))]},
            "['p'][*].b: expected int32[], got float32[]",
        ),
    ),
    "list of dicts": (
        {"p": [{"a": F32(0), "b": I32(0)}]},
        {"ragged": ["['p']"]},
        [{"p": [{"a": F32(i), "b": I32(-i)} for i in range(n)]} for n in (2, 0, 5)],
        ({"p": [{"a": F32(1), "b": I32(1)}, {"a": F32(2)}]}, "['p'][*]"),
    ),
    "list of NamedTuples": (
        {"p": [Pair(F32(0), I32(0))]},
        {"ragged": ["['p']"]},
        [{"p": [Pair(F32(i), I32(i * i)) for i in range(n)]} for n in (3, 1, 0)],
        ({"p": [Pair(F32(1), I32(1)), (F32(2), I32(2))]}, "['p'][*]"),
    ),
    "list of scalars": (
        {"p": [F32(0)]},
        {"ragged": ["['p']"]},
        [{"p": [F32(i) for i in range(n)]} for n in (4, 0, 1)],
        ({"p": [F32(1), F32(2), np.zeros(2, F32)]}, "['p'][*]"),
    ),
    "ragged leading axis": (
        {"x": I32(0), "trail": np.zeros((1, 2), F32)},
        {"ragged": ["['trail']"]},
        [{"x": I32(i), "trail": np.full((i, 2), i, F32)} for i in (2, 0, 3)],
        ({"x": I32(9), "trail": np.zeros((2, 3), F32)}, "['trail']"),
    ),
    "shared leading axis": (
        {"s": {"u": np.zeros(1, F32), "v": np.zeros(1, I32)}},
        {"ragged": ["['s']"]},
        [{"s": {"u": np.arange(n, dtype=F32), "v": -np.arange(n, dtype=I32)}} for n in (3, 0, 1)],
        (
            {"s": {"u": np.zeros(2, F32), "v": np.zeros(3, I32)}},
            "share one ragged leading axis, but their lengths differ",
        ),
    ),
    "optional subtree": (
        {"x": I32(0), "o": {"y": F32(0), "z": np.zeros(2, I32)}},
        {"optional": ["['o']"]},
        [
            {"x": I32(1), "o": None},
            {"x": I32(2), "o": {"y": F32(2), "z": np.array([2, 3], I32)}},
            {"x": I32(3), "o": None},
        ],
        ({"x": I32(4), "o": {"y": F32(1), "z": np.zeros(3, I32)}}, "['o']['z']"),
    ),
    "nested ragged": (
        {"p": _nested([0])},
        {"ragged": ["['p']", "['p'][*]['q']"]},
        [{"p": _nested([1, 2], [], [3])}, {"p": []}, {"p": _nested([4, 5, 6])}],
        ({"p": [*_nested([1], [2, 3]), {"w": F32(0), "q": [F32(1.5)]}]}, "['p'][*]['q'][*]"),
    ),
}


def _read_all(path: str, backend: str) -> list[Any]:
    with pytreestore.open(path, backend=backend) as store:
        return [store[i] for i in range(len(store))]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_appends_and_extends_exactly(kind, backend, path):
    like, options, records, _ = KINDS[kind]
    with pytreestore.create(path, like, backend=backend, **options) as store:
        for record in records:
            store.append(record)
        store.extend(records)
    got = _read_all(path, backend)
    assert len(got) == 2 * len(records)
    for want, back in zip(records + records, got, strict=True):
        assert_trees_equal(back, want)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_record_refused_midway_leaves_nothing_in_any_table(kind, backend, path):
    like, options, records, (bad, says) = KINDS[kind]
    store = pytreestore.create(path, like, backend=backend, **options)
    store.append(records[0])
    writer = store._core.writer
    assert writer is not None
    rows = {t: writer.rows(t) for t in writer.tables}
    with pytest.raises(SchemaMismatchError, match=re.escape(says)):
        store.append(bad)
    assert {t: writer.rows(t) for t in writer.tables} == rows  # nothing of it, anywhere
    with pytest.raises(SchemaMismatchError, match=r"extend\(\) refused record 1"):
        store.extend([records[1], bad])
    assert {t: writer.rows(t) for t in writer.tables} == rows
    store.append(records[2])
    store.close()
    got = _read_all(path, backend)
    assert len(got) == 2
    assert_trees_equal(got[0], records[0])
    assert_trees_equal(got[1], records[2])


def test_element_leaves_may_be_python_numpy_or_jax_scalars(backend, path):
    like = {"p": _points((0, 0))}
    given = [
        [Point(1.5, 2), Point(2.5, -3)],  # Python scalars
        [Point(np.float64(1.5), np.int64(2)), Point(np.float16(2.5), np.int8(-3))],  # cast
        [Point(jnp.float32(1.5), jnp.int32(2)), Point(jnp.float32(2.5), jnp.int32(-3))],
        [Point(F32(1.5), np.array(2, I32)), Point(np.array(2.5, F32), I32(-3))],  # 0-d arrays
        [Point(F32(1.5), I32(2)), Point(F32(2.5), I32(-3))],  # exact numpy scalars
    ]
    with pytreestore.create(path, like, backend=backend, ragged=["['p']"]) as store:
        for p in given:
            store.append({"p": p})
    for record in _read_all(path, backend):
        leaves = [(np.asarray(q.a), np.asarray(q.b)) for q in record["p"]]
        assert [(a.dtype, b.dtype) for a, b in leaves] == [(np.dtype(F32), np.dtype(I32))] * 2
        assert [(float(a), int(b)) for a, b in leaves] == [(1.5, 2), (2.5, -3)]


@pytest.mark.parametrize(
    ("leaf", "says"),
    [
        (F32(1.5), "expected int32[], got float32[]"),
        (2.5, "Python float 2.5"),
        (2**40, "does not fit in int32"),
        (np.zeros(2, I32), "expected int32[], got int32[2]"),
        ("x", "got a str"),
    ],
)
def test_a_leaf_refused_in_the_third_element_is_named(backend, path, leaf, says):
    store = pytreestore.create(path, {"p": _points((0, 0))}, backend=backend, ragged=["['p']"])
    store.append({"p": _points((1, 1))})
    with pytest.raises(SchemaMismatchError, match=re.escape(says)) as err:
        store.append({"p": [*_points((2, 2), (3, 3)), Point(F32(4), leaf)]})
    assert "['p'][*].b" in str(err.value)
    store.append({"p": _points((5, 5))})
    store.close()
    got = _read_all(path, backend)
    assert [[int(q.b) for q in r["p"]] for r in got] == [[1], [5]]


def test_the_first_record_with_an_element_teaches_the_structure(backend, path):
    store = pytreestore.create(path, {"x": I32(0), "p": []}, backend=backend, ragged=["['p']"])
    assert list(store.schema.pending) == ["['p']"]
    store.extend([{"x": I32(0), "p": []}, {"x": I32(1), "p": []}])
    store.append({"x": I32(2), "p": _points((1, 1), (2, 2))})  # learnt here
    assert not store.schema.pending
    store.append({"x": I32(3), "p": []})
    store.append({"x": I32(4), "p": _points((3, 3))})
    store.close()
    got = _read_all(path, backend)
    assert [int(r["x"]) for r in got] == [0, 1, 2, 3, 4]
    assert [[(float(q.a), int(q.b)) for q in r["p"]] for r in got] == [
        [],
        [],
        [(1.0, 1), (2.0, 2)],
        [],
        [(3.0, 3)],
    ]


def test_an_optional_subtree_teaches_its_structure_and_reads_absent(backend, path):
    like = {"x": I32(0), "o": None}
    store = pytreestore.create(path, like, backend=backend, optional=["['o']"])
    store.append({"x": I32(1), "o": None})
    store.append({"x": I32(2), "o": {"y": F32(2.5), "p": [F32(1), F32(2)]}})
    store.append({"x": I32(3), "o": None})
    store.close()
    got = _read_all(path, backend)
    assert got[0]["o"] is None and got[2]["o"] is None
    assert_trees_equal(got[1], {"x": I32(2), "o": {"y": F32(2.5), "p": [F32(1), F32(2)]}})


def test_a_failed_chunk_write_keeps_nothing_of_the_record_and_loses_nothing(
    backend, path, monkeypatch
):
    like = {"x": I32(0), "trail": np.zeros((1, 2), F32)}
    store = pytreestore.create(path, like, backend=backend, ragged=["['trail']"])
    writer = store._core.writer
    assert writer is not None
    table = writer.tables["['trail']"]
    big = np.ones((table.chunk + 1, 2), F32)  # fills a chunk of its table: a write
    store.append({"x": I32(1), "trail": np.zeros((2, 2), F32)})
    engine = store._core.backend

    def failing(*args: Any, **kwargs: Any) -> None:
        raise StorageError("disk full (injected)")

    monkeypatch.setattr(engine, "write", failing)
    with pytest.raises(StorageError, match="injected"):
        store.append({"x": I32(2), "trail": big})
    assert (len(writer), writer.rows("['trail']")) == (1, 2)
    monkeypatch.undo()
    store.append({"x": I32(3), "trail": np.full((1, 2), 3, F32)})
    store.close()
    got = _read_all(path, backend)
    assert [int(r["x"]) for r in got] == [1, 3]
    np.testing.assert_array_equal(got[1]["trail"], np.full((1, 2), 3, F32))


def test_staging_writes_nothing_until_write(path):
    store = pytreestore.create(path, {"x": I32(0), "p": _points((0, 0))}, ragged=["['p']"])
    writer = store._core.writer
    assert writer is not None
    plan = writer._plan
    assert isinstance(plan, Plan)
    row, stage = plan.stage({"x": I32(5), "p": _points((1, 1), (2, 2))})
    assert isinstance(stage, Stage) and stage.counts == [2]
    assert (len(writer), writer.rows("['p']")) == (0, 0)
    plan.write(row, stage, undo=True)
    assert (len(writer), writer.rows("['p']")) == (1, 2)
    store.close()
    assert [(float(q.a), int(q.b)) for q in _read_all(path, "tensorstore")[0]["p"]] == [
        (1.0, 1),
        (2.0, 2),
    ]


def test_column_blocks_convert_leaves_and_refuse_nodes():
    caster = LeafCaster("['p'][*].v", np.dtype(F32), (2,))
    block = column_block(caster, [np.ones(2, F32), np.zeros(2, np.float16)])
    assert block is not None and block.dtype == F32 and block.tolist() == [[1, 1], [0, 0]]
    assert column_block(caster, [np.ones(2, F32), (F32(1), F32(2))]) is None  # a tuple node
    assert column_block(caster, [np.ones(2, F32), np.ones(3, F32)]) is None  # shapes differ
    scalars = LeafCaster("['p'][*].b", np.dtype(I32), ())
    with pytest.raises(SchemaMismatchError, match=re.escape("expected int32[], got float32[]")):
        one_by_one([scalars], [[I32(1)], [F32(2.5)]])
    blocks = one_by_one([scalars], [[1], [np.int8(2)]])
    assert blocks[0].dtype == I32 and blocks[0].tolist() == [1, 2]


def test_a_refused_leaf_of_the_record_keeps_none_of_its_elements(backend, path):
    like = {"x": I32(0), "p": _points((0, 0))}
    store = pytreestore.create(path, like, backend=backend, ragged=["['p']"])
    store.append({"x": I32(1), "p": _points((1, 1))})
    with pytest.raises(SchemaMismatchError, match=re.escape("at ['x']: expected int32[]")):
        store.append({"x": F32(1.5), "p": _points((2, 2), (3, 3))})  # elements all fine
    writer = store._core.writer
    assert writer is not None and (len(writer), writer.rows("['p']")) == (1, 1)
    store.append({"x": I32(4), "p": _points((4, 4))})
    store.close()
    got = _read_all(path, backend)
    assert [[int(q.b) for q in r["p"]] for r in got] == [[1], [4]]
