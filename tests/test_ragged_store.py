"""Ragged stores (issue #14): records whose lists, leading axes and optional subtrees vary,
stored with ``create(ragged=, optional=)`` and read back exactly, padded and as segments, on
both backends."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import flax.struct
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytreestore
from pytreestore import errors
from pytreestore.testing import assert_trees_equal
from tests import interpreters
from tests.conftest import BACKENDS, child_env


@flax.struct.dataclass
class Agent:
    pos: np.ndarray  # float32[2]
    energy: np.ndarray  # float32 scalar
    events: list  # ragged list of int32 scalars
    trail: np.ndarray  # float32[n, 2], ragged leading axis


@flax.struct.dataclass
class Step:
    t: np.ndarray  # int32
    agents: list  # ragged list of Agent
    storm: dict | None  # optional {"strength": float32, "cells": int16[n]}


DECL = {
    "ragged": [".agents", ".agents[*].events", ".agents[*].trail", ".storm['cells']"],
    "optional": [".storm"],
}


def _agent(rng: np.random.Generator, n_events: int, n_trail: int) -> Agent:
    return Agent(
        pos=rng.standard_normal(2).astype(np.float32),
        energy=np.float32(rng.standard_normal()),
        events=[np.int32(rng.integers(0, 100)) for _ in range(n_events)],
        trail=rng.standard_normal((n_trail, 2)).astype(np.float32),
    )


def _step(rng: np.random.Generator, t: int, n_agents: int, storm: bool) -> Step:
    agents = [
        _agent(rng, int(rng.integers(0, 4)), int(rng.integers(0, 3))) for _ in range(n_agents)
    ]
    cells = rng.integers(0, 9, size=int(rng.integers(0, 4))).astype(np.int16)
    return Step(
        np.int32(t),
        agents,
        {"strength": np.float32(rng.random()), "cells": cells} if storm else None,
    )


def _steps(seed: int = 0, n: int = 12) -> list[Step]:
    rng = np.random.default_rng(seed)
    return [_step(rng, t, int(rng.integers(0, 5)), bool(rng.random() < 0.5)) for t in range(n)]


def _same(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert_trees_equal(a, b)


def _like() -> Step:
    return _step(np.random.default_rng(99), 0, 1, True)


def _filled(path, backend, steps, **kw):
    store = pytreestore.create(path, _like(), backend=backend, **DECL, **kw)
    with store:
        store.extend(steps[:5])
        for s in steps[5:]:
            store.append(s)
    return pytreestore.open(path, backend=backend)


# ---- exact records ---------------------------------------------------------------------------


def test_records_come_back_exactly(tmp_path, backend):
    steps = _steps()
    store = _filled(tmp_path / "s", backend, steps)
    assert len(store) == len(steps)
    for i, want in enumerate(steps):
        _same(store.load(i, as_numpy=True), want)
    for got, want in zip(store.records(as_numpy=True), steps):
        _same(got, want)
    one = store[3]  # jax leaves
    assert isinstance(one.t, jax.Array) and type(one) is Step and type(one.agents) is list


_FRESH_READ = """
import json, sys, pytreestore
out = {}
for backend, path in json.loads(sys.argv[1]).items():
    r = pytreestore.open(path, backend=backend).load(4, as_numpy=True)
    out[backend] = [type(r).__name__, len(r.agents), r.storm is None,
                    [len(a.events) for a in r.agents], float(sum(a.energy for a in r.agents))]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh_reads(tmp_path_factory) -> dict[str, list]:
    """Record 4 of a store on each backend, as one fresh process (that never imported
    ``Step``) reads it: one interpreter for every backend, since each start imports JAX."""
    root = tmp_path_factory.mktemp("fresh")
    paths = {b: str(root / b) for b in BACKENDS}
    for backend, path in paths.items():
        _filled(path, backend, _steps(seed=3)).close()
    out = interpreters.run(  # forked (tests/interpreters.py): Step never imported
        [sys.executable, "-c", _FRESH_READ, json.dumps(paths)],
        capture_output=True,
        text=True,
        env=child_env(),
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_a_fresh_process_reads_the_same_records(fresh_reads, backend):
    want = _steps(seed=3)[4]
    assert fresh_reads[backend] == [
        "Step",
        len(want.agents),
        want.storm is None,
        [len(a.events) for a in want.agents],
        pytest.approx(float(sum(a.energy for a in want.agents))),
    ]


# ---- padded and segments ---------------------------------------------------------------------


def test_padded_load_equals_stack(tmp_path, backend):
    steps = _steps(seed=1)
    store = _filled(tmp_path / "s", backend, steps)
    for index in (slice(None), [7, 2, 2, 0], slice(3, 9, 2)):
        chosen = steps[index] if isinstance(index, slice) else [steps[i] for i in index]
        got = store.load(index, as_numpy=True)
        _same(got, pytreestore.stack(chosen, like=_like(), as_numpy=True, **DECL))
    for pad_to in (8, "pow2", [4, 16]):
        got = store.load(slice(None), pad_to=pad_to, as_numpy=True)
        _same(got, pytreestore.stack(steps, like=_like(), as_numpy=True, pad_to=pad_to, **DECL))


def test_padded_load_on_device_and_vmap_with_mask(tmp_path, backend):
    steps = _steps(seed=2)
    store = _filled(tmp_path / "s", backend, steps)
    batch, mask = store.load()
    assert isinstance(batch.agents.energy, jax.Array)

    def energy(step, m):
        return jax.numpy.sum(jax.numpy.where(m.agents.energy, step.agents.energy, 0))

    got = jax.jit(jax.vmap(energy))(batch, mask)
    want = [sum(float(a.energy) for a in s.agents) for s in steps]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_pad_to_below_a_length_raises_unless_truncate(tmp_path, backend):
    steps = _steps(seed=4)
    store = _filled(tmp_path / "s", backend, steps)
    longest = max(len(s.agents) for s in steps)
    with pytest.raises(errors.RaggedLengthError, match=r"above the limit 1 of pad_to=1"):
        store.load(pad_to=1)
    batch, mask = store.load(pad_to=1, truncate=True, as_numpy=True)
    assert batch.agents.energy.shape == (len(steps), 1) and longest > 1
    want = [float(s.agents[0].energy) if s.agents else 0.0 for s in steps]
    np.testing.assert_array_equal(batch.agents.energy[:, 0], np.float32(want))
    assert mask.agents.energy[:, 0].tolist() == [bool(s.agents) for s in steps]


def test_segments_form_and_segment_sum(tmp_path, backend):
    steps = _steps(seed=5)
    store = _filled(tmp_path / "s", backend, steps)
    values, segments = store.load(ragged="segments", as_numpy=True)
    seg = segments[".agents"]
    total = sum(len(s.agents) for s in steps)
    assert values.agents.energy.shape == (total,)
    sums = jax.ops.segment_sum(values.agents.energy, seg.record, num_segments=len(steps))
    want = [sum(float(a.energy) for a in s.agents) for s in steps]
    np.testing.assert_allclose(np.asarray(sums), want, rtol=1e-5, atol=1e-6)
    events = segments[".agents[*].events"]
    assert values.agents.events.shape == (sum(len(a.events) for s in steps for a in s.agents),)
    assert (events.record == seg.record[events.parent]).all()
    assert segments["present.storm"].tolist() == [s.storm is not None for s in steps]
    values, segments = store.load(ragged="segments", size=500, as_numpy=True)
    assert segments[".agents"].record.shape == (500,) and values.agents.energy.shape == (500,)
    assert segments[".agents"].valid.sum() == total
    assert (segments[".agents"].record[total:] == len(steps)).all()
    with pytest.raises(errors.RaggedLengthError, match="more than size=1"):
        store.load(ragged="segments", size=1)


def test_lengths_read_only_the_offsets(tmp_path, backend):
    steps = _steps(seed=6)
    store = _filled(tmp_path / "s", backend, steps)
    got = store.lengths([3, 0, 5])
    assert got[".agents"].tolist() == [len(steps[i].agents) for i in (3, 0, 5)]
    events = [max((len(a.events) for a in steps[i].agents), default=0) for i in (3, 0, 5)]
    assert got[".agents[*].events"].tolist() == events


def test_column_selection(tmp_path, backend):
    steps = _steps(seed=7)
    store = _filled(tmp_path / "s", backend, steps)
    batch, _ = store.load(columns=".agents[*].energy", as_numpy=True)
    assert batch.t is None and batch.agents.pos is None and batch.agents.energy is not None


# ---- appending ---------------------------------------------------------------------------------


def test_appending_in_pieces_equals_appending_once(tmp_path, backend):
    steps = _steps(seed=8, n=30)
    once = pytreestore.create(tmp_path / "a", _like(), backend=backend, chunk_records=4, **DECL)
    once.extend(steps)
    once.close()
    pieces = pytreestore.create(tmp_path / "b", _like(), backend=backend, chunk_records=4, **DECL)
    pieces.extend(steps[:7])
    pieces.close()
    for start in (7, 13, 22):
        with pytreestore.open(tmp_path / "b", mode="a", backend=backend) as s:
            stop = {7: 13, 13: 22, 22: 30}[start]
            for r in steps[start:stop]:
                s.append(r)
    a = pytreestore.open(tmp_path / "a", backend=backend)
    b = pytreestore.open(tmp_path / "b", backend=backend)
    _same(a.load(as_numpy=True), b.load(as_numpy=True))
    for i in range(len(steps)):
        _same(b.load(i, as_numpy=True), steps[i])


def test_a_refused_record_leaves_nothing(tmp_path, backend):
    steps = _steps(seed=9)
    store = pytreestore.create(tmp_path / "s", _like(), backend=backend, **DECL)
    store.extend(steps[:3])
    bad = steps[3].replace(t=[np.int32(1)])  # a list where a leaf was
    with pytest.raises(errors.SchemaMismatchError, match=r"at \.t"):
        store.append(bad)
    worse = steps[4].replace(agents=[steps[4].agents, 1] if steps[4].agents else [1])
    with pytest.raises(errors.SchemaMismatchError, match="extend\\(\\) refused record 1"):
        store.extend([steps[3], worse])
    store.append(steps[3])
    store.close()
    again = pytreestore.open(tmp_path / "s", backend=backend)
    assert len(again) == 4
    for i in range(4):
        _same(again.load(i, as_numpy=True), steps[i])


def test_undeclared_difference_names_every_keypath_and_the_declaration():
    like = {"p": [np.float32(0)], "q": [np.float32(0), np.float32(1)], "o": np.float32(0)}
    store = pytreestore.create("memory://ragged-undeclared", like, ragged=["['p']"])
    with pytest.raises(errors.SchemaMismatchError) as err:
        store.append({"p": [], "q": [np.float32(0)], "o": None})
    text = str(err.value)
    assert "at ['q']: expected a list of 2, got a list of 1" in text
    assert "ragged=[\"['q']\"]" in text
    assert "at ['o']" in text and "optional=[\"['o']\"]" in text


def test_bad_declarations_are_refused_before_anything_is_written(tmp_path):
    like = {"p": [np.float32(0)]}
    with pytest.raises(errors.RaggedDeclarationError, match="names nothing"):
        pytreestore.create(tmp_path / "s", like, ragged=["['nope']"])
    with pytest.raises(errors.RaggedDeclarationError, match="ragged="):
        pytreestore.create(tmp_path / "s", like, ragged="['p']")
    assert not (tmp_path / "s").exists()
    with pytest.raises(errors.RaggedDeclarationError, match="ragged="):
        store = pytreestore.create(tmp_path / "t", like, ragged=["['p']"])
        store.load(ragged="dense")


def test_a_fixed_store_refuses_ragged_read_options():
    store = pytreestore.create("memory://ragged-fixed", {"a": np.float32(0)})
    with pytest.raises(errors.RaggedDeclarationError, match="without ragged="):
        store.load(pad_to=4)
    assert store.lengths() == {}


# ---- structures learnt from the first record that has them ---------------------------------


def test_like_may_start_empty(tmp_path, backend):
    like = Step(np.int32(0), [], None)
    steps = _steps(seed=10)
    store = pytreestore.create(tmp_path / "s", like, backend=backend, **DECL)
    assert set(store.schema.pending) == {".agents", ".storm"}
    store.append(Step(np.int32(-1), [], None))
    store.extend(steps)
    assert store.schema.pending == ()
    store.close()
    again = pytreestore.open(tmp_path / "s", backend=backend)
    _same(again.load(0, as_numpy=True), Step(np.int32(-1), [], None))
    for i, want in enumerate(steps):
        _same(again.load(i + 1, as_numpy=True), want)
    batch, mask = again.load(as_numpy=True)
    assert not mask.storm["strength"][0] and batch.storm["strength"][0] == 0


# ---- damage ------------------------------------------------------------------------------------


def test_damaged_offsets_are_a_corrupt_store_error(tmp_path):
    steps = _steps(seed=11)
    store = _filled(tmp_path / "s", "tensorstore", steps, codec=None)
    store.close()
    import zarr

    offsets = zarr.open_array(str(tmp_path / "s" / "agents-offsets"), mode="r+")
    values = offsets[:]
    values[2] = values[1] - 1 if values[1] > 0 else 10**6
    offsets[:] = values
    again = pytreestore.open(tmp_path / "s")
    with pytest.raises(errors.CorruptStoreError, match="agents-offsets"):
        again.load(slice(None))


# ---- properties ---------------------------------------------------------------------------------


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 14), cut=st.integers(0, 14))
def test_property_round_trip(tmp_path_factory, seed, n, cut):
    steps = _steps(seed, n)
    path = tmp_path_factory.mktemp("prop") / "s"
    backend = BACKENDS[seed % 3]
    store = pytreestore.create(path, _like(), backend=backend, chunk_records=3, **DECL)
    store.extend(steps[:cut])
    store.close()
    with pytreestore.open(path, mode="a", backend=backend) as again:
        for r in steps[cut:]:
            again.append(r)
    reader = pytreestore.open(path, backend=backend)
    for i, want in enumerate(steps):
        _same(reader.load(i, as_numpy=True), want)
    _same(reader.load(as_numpy=True), pytreestore.stack(steps, like=_like(), as_numpy=True, **DECL))


# ---- batched appends, pipelines, copy, verify ---------------------------------------------------


def test_extend_batch_takes_a_loaded_pair(tmp_path, backend):
    steps = _steps(seed=12)
    source = _filled(tmp_path / "a", backend, steps)
    target = pytreestore.create(tmp_path / "b", _like(), backend=backend, **DECL)
    batch, mask = source.load([5, 1, 7])
    target.extend_batch(batch, mask=mask)
    target.extend_batch(*source.load(slice(0, 2), pad_to=8, as_numpy=True))
    for got, want in zip(target.records(as_numpy=True), [steps[i] for i in (5, 1, 7, 0, 1)]):
        _same(got, want)
    with pytest.raises(errors.SchemaMismatchError, match="mask=mask"):
        target.extend_batch(batch)
    broken = jax.tree.map(lambda m: np.asarray(m).copy(), mask)
    if broken.agents.energy.shape[1] > 1:
        broken.agents.energy[:, 0] = False
        broken.agents.energy[:, 1] = True
        with pytest.raises(errors.SchemaMismatchError, match=r"run of True then False|disagree"):
            target.extend_batch(batch, mask=broken)
    assert len(target) == 5


def test_batches_and_map_of_a_ragged_store(tmp_path, backend):
    steps = _steps(seed=13, n=10)
    store = _filled(tmp_path / "s", backend, steps)
    seen = []
    for batch, _mask in store.batches(4, pad_to=[2, 4, 8]):
        assert batch.agents.energy.shape[1] in (2, 4, 8)
        seen += np.asarray(batch.t).tolist()
    assert seen == list(range(10))

    def energy(step, m):
        return jax.numpy.sum(jax.numpy.where(m.agents.energy, step.agents.energy, 0))

    got = store.map(energy, batch_size=4, pad_to=8)
    want = [sum(float(a.energy) for a in s.agents) for s in steps]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    src = store.grain_source(padded=False)  # exact records; padded ones: tests/test_grain.py
    _same(src[3], steps[3])
    for got_one, want_one in zip(src._getitems([4, 2]), [steps[4], steps[2]]):
        _same(got_one, want_one)


def test_copy_and_verify_of_a_ragged_store(tmp_path, backend):
    steps = _steps(seed=14)
    _filled(tmp_path / "s", backend, steps).close()
    assert pytreestore.copy(tmp_path / "s", tmp_path / "c", chunk_records=2, codec=None) == 12
    copied = pytreestore.open(tmp_path / "c")
    for i, want in enumerate(steps):
        _same(copied.load(i, as_numpy=True), want)
    report = copied.verify()
    assert report.ok and report.columns == len(copied.schema.storage_columns)
    chunk = next((tmp_path / "c" / "agents" / "-2A" / "energy" / "c").iterdir())
    chunk.unlink()
    report = pytreestore.open(tmp_path / "c").verify()
    assert not report.ok and ".agents[*].energy" in str(report)
    with pytest.raises(errors.CorruptChunkError, match=r"column \.agents\[\*\]\.energy"):
        pytreestore.open(tmp_path / "c", cache_bytes=0).load(slice(None))  # not from memory


def test_sharded_load_of_a_ragged_store(tmp_path):
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    steps = _steps(seed=15, n=8)
    store = _filled(tmp_path / "s", "tensorstore", steps)
    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    batch, mask = store.load(slice(0, 8), sharding=NamedSharding(mesh, P("d")))
    assert batch.agents.energy.sharding.spec == P("d")
    want = pytreestore.stack(steps, like=_like(), as_numpy=True, **DECL)
    _same(jax.tree.map(np.asarray, (batch, mask)), want)
    batch, mask = store.load(slice(0, 8), pmap_devices=jax.devices()[:2])  # records split
    assert batch.agents.energy.shape[:2] == mask.agents.energy.shape[:2] == (2, 4)


def test_cli_and_repr_of_a_ragged_store(tmp_path):
    from click.testing import CliRunner

    from pytreestore.cli import main

    steps = _steps(seed=16, n=4)
    store = _filled(tmp_path / "s", "tensorstore", steps)
    elements = sum(len(s.agents) for s in steps)
    assert f"records={len(steps)}" in repr(store)
    nbytes = store.schema.ragged and sum(
        (len(steps) if c.table is None else store.commit_now().rows(c.table)) * c.record_nbytes
        for c in store.schema.storage_columns
    )
    assert f"nbytes={nbytes} B" in repr(store) and elements > 0
    runner = CliRunner()
    out = runner.invoke(main, ["head", str(tmp_path / "s"), "-n", "4", "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    assert [len(r["agents"]) for r in got] == [len(s.agents) for s in steps]
    assert [r["storm"] is None for r in got] == [s.storm is None for s in steps]
    assert runner.invoke(main, ["verify", str(tmp_path / "s")]).exit_code == 0
    assert runner.invoke(main, ["info", str(tmp_path / "s")]).exit_code == 0


def test_a_reader_refreshes_into_a_structure_learnt_since_it_opened(tmp_path, backend):
    like = {"p": [], "t": np.int32(0)}
    writer = pytreestore.create(tmp_path / "s", like, backend=backend, ragged=["['p']"])
    writer.append({"p": [], "t": np.int32(0)})
    writer.flush()
    reader = pytreestore.open(tmp_path / "s", backend=backend)
    assert reader.schema.pending == ("['p']",)
    writer.append({"p": [np.float32(1), np.float32(2)], "t": np.int32(1)})
    writer.flush()
    assert reader.refresh() == 2 and reader.schema.pending == ()
    assert [float(x) for x in reader[1]["p"]] == [1.0, 2.0]
    stale = pytreestore.open(tmp_path / "s", backend=backend)
    old = pytreestore.create(tmp_path / "o", like, backend=backend, ragged=["['p']"])
    stale._schema = old.schema  # a schema still pending, against learnt rows: refused
    with pytest.raises(errors.SchemaMismatchError, match=r"refresh\(\)"):
        stale.load(1)


@pytest.mark.parametrize("nothing", [{"ragged": False}, {"ragged": []}, {"optional": ()}])
def test_nothing_declared_ragged_is_a_fixed_store(tmp_path: Path, backend: str, nothing: dict):
    """``ragged=False`` (or an empty list) declares nothing: the store is a fixed one, whose
    load returns the batch, not ``(batch, mask)`` (it made a ragged store without tables)."""
    path = tmp_path / "s"
    with pytreestore.create(path, {"x": np.int32(0)}, backend=backend, **nothing) as store:
        store.extend({"x": np.int32(i)} for i in range(3))
    store = pytreestore.open(path, backend=backend)
    assert store.schema.ragged is None
    np.testing.assert_array_equal(store.load(as_numpy=True)["x"], np.arange(3, dtype=np.int32))


def test_learning_again_ignores_what_a_cut_off_learning_left(tmp_path: Path, backend: str):
    """A writer cut off while learning a structure leaves its arrays (metadata and chunks),
    which no commit names; learning the structure again starts from empty arrays (a chunk
    left there, here of another encoding, was read back into the new array's rows)."""

    def rec(i: int, present: bool) -> dict:
        opt = {"w": np.float32(i), "cells": [np.int16(i)]} if present else None
        return {"i": np.int64(i), "opt": opt}

    path = tmp_path / "s"
    decl = {"optional": ["['opt']"], "ragged": ["['opt']['cells']"], "chunk_records": 4}
    with pytreestore.create(path, rec(0, False), backend=backend, **decl) as store:
        store.extend(rec(i, False) for i in range(6))
    left = path / "opt" / "w" / "c"
    left.mkdir(parents=True)
    (left / "1").write_bytes(b"a chunk a cut-off learning wrote, of another layout")
    with pytreestore.open(path, "a", backend=backend) as store:
        store.append(rec(6, True))  # learnt at record 6: its chunk 1 is written in part
    store = pytreestore.open(path, backend=backend)
    assert [store.load(i, as_numpy=True)["opt"] is None for i in range(7)] == [True] * 6 + [False]
    got = store.load(6, as_numpy=True)["opt"]
    assert float(got["w"]) == 6.0 and [int(c) for c in got["cells"]] == [6]


def test_trim_and_its_old_name_truncate_read_alike(tmp_path, backend):
    store = _filled(tmp_path / "s", backend, _steps())
    trimmed = store.load(pad_to=1, trim=True, as_numpy=True)
    _same(store.load(pad_to=1, truncate=True, as_numpy=True), trimmed)
    batches = [b for b, _ in store.batches(len(store), pad_to=1, trim=True, cast=False)]
    _same(jax.tree.map(np.asarray, batches[0]), trimmed[0])
    src = store.grain_source(pad_to=1, trim=True)
    _same(src[3][0], jax.tree.map(lambda v: v[3], trimmed[0]))
    with pytest.raises(errors.ArgumentError, match="old name of trim"):
        store.load(pad_to=1, trim=True, truncate=False)
