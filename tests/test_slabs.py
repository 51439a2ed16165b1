"""Big device loads in overlapping slabs (pytreestore/_read/slabs.py).

The slab path serves accelerators only; here the CPU is added to its platforms and the slab
size made small, so that every load below goes through it, on every backend.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest

import pytreestore
from pytreestore._read import slabs
from pytreestore._runtime import RUNTIME
from pytreestore.errors import CorruptChunkError
from tests import interpreters
from tests.conftest import BACKENDS, child_env, copying_cpu_puts, cpu_mesh, diagonal, tiered

#: every backend with and without compression (``make test-long``); ``make test`` runs each
#: backend with one codec, the codecs in turn, the other one in each of the two tests
CODECS = ("zstd", None)
GRID = [(b, c) for b in BACKENDS for c in CODECS]


@pytest.fixture
def on_cpu(monkeypatch):
    """The slab path on for CPU devices, with 64 KiB slabs; counts the slabs loaded."""
    monkeypatch.setattr(slabs, "PLATFORMS", {*slabs.PLATFORMS, "cpu"})
    monkeypatch.setattr(RUNTIME.reads, "slab_bytes", 64 << 10)
    monkeypatch.setattr(RUNTIME.reads, "slab_min_bytes", 128 << 10)
    monkeypatch.setattr(RUNTIME.reads, "whole_column_bytes", 32 << 10)
    calls: list[int] = []
    load = slabs.load

    def counted(read, pieces, columns, device):
        calls.append(len(pieces))
        return load(read, pieces, columns, device)

    monkeypatch.setattr(slabs, "load", counted)
    return calls


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Body:
    pos: np.ndarray
    flag: np.ndarray
    half: np.ndarray


def _record(i: int) -> dict:
    return {
        "body": Body(
            pos=np.arange(32, dtype=np.float32) + i,
            flag=np.bool_(i % 3 == 0),
            half=np.full(4, i, ml_dtypes.bfloat16),
        ),
        "step": np.int64(i),
        "key": jax.random.key(i),
        "scale": 0.5 * i,  # a weakly typed float
    }


def _store(path: str, backend: str, n: int = 3000, codec: str | None = "zstd"):
    store = pytreestore.create(
        path, _record(0), chunk_records=256, backend=backend, codec=codec, cast=True
    )
    store.extend(_record(i) for i in range(n))
    store.flush()
    return store


def _same(got, want) -> None:
    g, w = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(g) == len(w)
    for x, y in zip(g, w, strict=True):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize(("backend", "codec"), tiered(GRID, diagonal(BACKENDS, CODECS)))
def test_a_big_load_in_slabs_equals_the_whole_read(path, backend, codec, on_cpu):
    store = _store(path, backend, codec=codec)
    whole = store.load(slice(5, 2990), as_numpy=True)
    got = store.load(slice(5, 2990))
    assert on_cpu and on_cpu[-1] > 2, "the load went through the slab path"
    _same(got, whole)
    assert isinstance(got["body"], Body)
    assert got["step"].dtype == np.int32  # cast=True, as a whole read casts
    assert got["body"].half.dtype == ml_dtypes.bfloat16
    assert jax.dtypes.issubdtype(got["key"].dtype, jax.dtypes.prng_key)
    assert got["scale"].weak_type and not got["body"].pos.weak_type
    assert got["body"].pos.shape == (2985, 32)
    assert not got["body"].pos.committed  # as a whole read's: device=None commits nothing


def test_columns_and_device_are_kept(path, backend, eight_devices, on_cpu):
    store = _store(path, backend)
    got = store.load(columns=["['body'].pos", "['step']"], device=eight_devices[3])
    assert on_cpu
    assert got["key"] is None and got["body"].flag is None
    assert got["body"].pos.devices() == {eight_devices[3]}
    assert got["body"].pos.committed  # a device given is a device kept
    np.testing.assert_array_equal(np.asarray(got["step"]), np.arange(3000))


def test_small_loads_index_arrays_and_shardings_are_read_whole(path, eight_devices, on_cpu):
    store = _store(path, "tensorstore")
    store.load(slice(0, 2))
    store.load(np.arange(0, 3000, 2))
    mesh = cpu_mesh((8,), ("data",))
    sharded = store.load(
        sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    )
    assert on_cpu == []
    np.testing.assert_array_equal(np.asarray(sharded["step"]), np.arange(3000))


def test_the_slab_path_waits_for_free_device_memory(monkeypatch, on_cpu):
    device = jax.devices("cpu")[0]
    monkeypatch.setattr(slabs, "_memory_stats", lambda d: {"bytes_limit": 1 << 20})
    assert slabs.planned(slice(0, 10, 1), 1 << 20, device) is None  # 2x would not fit
    monkeypatch.setattr(slabs, "_memory_stats", lambda d: {"bytes_limit": 1 << 30})
    assert slabs.planned(slice(0, 10, 1), 1 << 20, device) == device
    monkeypatch.setattr(slabs, "PLATFORMS", {"tpu"})
    assert slabs.planned(slice(0, 10, 1), 1 << 20, device) is None  # the CPU: read whole


def test_plan_slabs_cuts_at_chunk_boundaries():
    cuts = slabs.plan_slabs(slice(100, 1000, 1), chunk=64, record_nbytes=100, slab_bytes=20_000)
    assert cuts[0].start == 100 and cuts[-1].stop == 1000
    assert all(a.stop == b.start for a, b in itertools.pairwise(cuts))
    assert all(c.start % 192 == 0 for c in cuts[1:])  # 200 records rounded down to 3 chunks
    one = slabs.plan_slabs(slice(0, 10, 1), chunk=64, record_nbytes=1 << 30, slab_bytes=1)
    assert one == [slice(0, 10, 1)]  # a slab is never less than a chunk


def test_a_damaged_chunk_in_one_slab_names_its_column(path, on_cpu):
    store = _store(path, "tensorstore", codec=None)
    chunk = Path(path) / store.schema.columns[0].key / "c" / "7" / "0"
    assert chunk.exists(), sorted(os.listdir(chunk.parent))[:5]
    data = bytearray(chunk.read_bytes())
    data[10] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptChunkError, match=r"body"):
        pytreestore.open(path, cast=True).load()
    assert on_cpu  # it was the slab path that raised


def test_small_leaves_go_in_one_copy_per_dtype(path, backend, monkeypatch):
    """A record's small leaves are packed by dtype, placed once and cut on the device: the
    same values, dtypes, shapes, classes and weak types as leaf by leaf."""
    from pytreestore._read import place as packed

    monkeypatch.setattr(slabs, "PLATFORMS", {*slabs.PLATFORMS, "cpu"})
    puts: list[int] = []
    real = jax.device_put

    def counting(x, *args, **kwargs):
        puts.append(len(x) if isinstance(x, list) else 1)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(packed.jax, "device_put", counting)
    like = {"a": [np.float32(0)] * 6, "b": np.zeros((2, 3), np.float32), "c": np.zeros(4, bool)}
    like["d"], like["e"] = [np.zeros(2, np.int32)] * 5, np.zeros(70_000, np.float32)  # too big
    store = pytreestore.create(path, like, backend=backend)
    records = [
        jax.tree.map(lambda x, i=i: (np.asarray(x) + i).astype(np.asarray(x).dtype), like)
        for i in range(3)
    ]
    store.extend(records)
    store.flush()
    got = store[1]
    assert puts == [2, 1, 1]  # c and e alone, then the float32 group, then the int32 group
    _same(got, records[1])
    assert [x.dtype for x in jax.tree.leaves(got)] == [
        np.asarray(x).dtype for x in jax.tree.leaves(like)
    ]
    many = store.load(slice(0, 3))
    _same(many, jax.tree.map(lambda *x: np.stack(x), *records))


@pytest.mark.parametrize(
    "nbytes",
    [[4] * 151, [256] * 20, [4, 4096, 1, 2048, 8] * 3, [1 << 20], [3]],
    ids=["wide", "narrow", "mixed", "one-big", "one-small"],
)
def test_plan_reads_every_row_of_every_column_once(nbytes, monkeypatch):
    monkeypatch.setattr(RUNTIME.reads, "whole_column_bytes", 64 << 10)
    index = slice(17, 5000, 1)
    pieces = slabs.plan(index, nbytes, chunk=64, slab_bytes=256 << 10)
    seen = np.zeros((len(nbytes), 5000), int)
    for p in pieces:
        for c in p.columns:
            seen[c, p.rows] += 1
        per = sum(nbytes[c] for c in p.columns)
        assert per * (p.rows.stop - p.rows.start) <= max(256 << 10, per * 64 + per * 64), (
            "a piece is about a slab (a chunk, or the part of one the index cuts, at the least)"
        )
    assert (seen[:, 17:] == 1).all() and (seen[:, :17] == 0).all()
    whole = [p for p in pieces if p.rows == index]
    assert all(nbytes[c] * 4983 <= 64 << 10 for p in whole for c in p.columns) or len(pieces) == 1


def test_threads_loading_in_slabs_at_once_each_get_their_rows(path, on_cpu):
    import threading

    store = _store(path, "tensorstore")
    want = store.load(as_numpy=True)
    out, errors = {}, []

    def work(k):
        try:
            lo = 100 * k
            out[k] = store.load(slice(lo, 3000 - lo))
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(on_cpu) == 6
    for k, got in out.items():
        _same(got, jax.tree.map(lambda x, k=k: x[100 * k : 3000 - 100 * k], want))


FORKED = """
import os, sys
import numpy as np, jax, pytreestore
from pytreestore._read import slabs
from pytreestore._runtime import RUNTIME
from pytreestore.errors import ForkedBackendError
slabs.PLATFORMS.add("cpu")
RUNTIME.reads.slab_bytes, RUNTIME.reads.slab_min_bytes = 64 << 10, 128 << 10
store = pytreestore.open(sys.argv[1])
want = store.load(as_numpy=True)["x"]
assert (np.asarray(store.load()["x"]) == want).all()  # the readers' pool now exists
pid = os.fork()
if pid == 0:
    try:
        pytreestore.open(sys.argv[1]).load()
    except ForkedBackendError as err:
        os._exit(0 if "spawn" in str(err) else 3)
    except BaseException:
        os._exit(4)
    os._exit(5)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_gets_the_fork_error_not_a_hang(path):
    """A child forked after slab loads (their readers' threads are not in it) is told to
    use 'spawn', as for any TensorStore read there, rather than waiting on a dead pool."""
    import sys

    store = pytreestore.create(path, {"x": np.zeros(64, np.float32)}, chunk_records=128)
    store.extend_batch({"x": np.arange(4096 * 64, dtype=np.float32).reshape(4096, 64)})
    store.close()
    env = child_env()
    done = interpreters.run(
        [sys.executable, "-W", "ignore", "-c", FORKED, path],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["child", "0"]


def test_a_failed_piece_stops_the_reading_of_the_others():
    import threading
    import time

    seen = []
    lock = threading.Lock()

    def read(piece, buffer):
        with lock:
            seen.append(piece.rows.start)
        if piece.rows.start == 0:
            raise CorruptChunkError("piece 0 is damaged", path="x", chunk=(0,), key="x/c/0")
        time.sleep(0.05)
        return [np.zeros(piece.rows.stop - piece.rows.start, np.float32)]

    pieces = [slabs.Piece((0,), slice(10 * k, 10 * k + 10, 1)) for k in range(40)]
    with pytest.raises(CorruptChunkError, match="piece 0"):
        slabs.load(read, pieces, 1, jax.devices("cpu")[0])
    assert len(seen) <= RUNTIME.threads.slab_readers + 1  # not the 40 pieces


AT_EXIT = """
import atexit
import numpy as np, pytreestore
from pytreestore._read import slabs
from pytreestore._runtime import RUNTIME
slabs.PLATFORMS.add("cpu")
RUNTIME.reads.slab_bytes, RUNTIME.reads.slab_min_bytes = 64 << 10, 128 << 10
s = pytreestore.create("memory://at-exit", {"a": np.zeros(256, np.float32)}, chunk_records=64)
s.extend({"a": np.full(256, i, np.float32)} for i in range(1000))
s.flush()
def last():
    got = np.asarray(s.load(slice(0, 1000))["a"])[:, 0]
    print("read", int(got.sum()))
atexit.register(last)
"""


def test_a_slab_load_in_an_exit_handler_reads_in_the_calling_thread():
    """Python refuses new pool work once it is exiting; a load from an ``atexit`` handler
    then reads its pieces itself (it raised RuntimeError: cannot schedule new futures)."""
    import sys

    env = child_env()
    done = interpreters.run(  # ends through the interpreter's own shutdown, as a fresh one does
        [sys.executable, "-c", AT_EXIT], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["read", str(sum(range(1000)))]


def test_the_default_device_is_the_one_jax_is_told_to_use(eight_devices):
    with jax.default_device(eight_devices[2]):
        assert slabs.device_of(None) == eight_devices[2]
    with jax.default_device("cpu"):
        assert slabs.device_of(None) == jax.devices("cpu")[0]
    assert slabs.device_of(None) == jax.devices()[0]
    mesh = cpu_mesh((8,), ("data",))
    assert slabs.device_of(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())) is None


@pytest.fixture
def copying_cpu(monkeypatch, on_cpu):
    """The CPU made to copy what it is given, as an accelerator does, so that host buffers are
    reused between pieces (pytreestore/_read/slabs.py) and a fresh pool to count them."""
    from pytreestore._read import slabs as hostpool

    copying_cpu_puts(monkeypatch)
    fresh = hostpool.HostBuffers()
    monkeypatch.setattr(hostpool, "pool", lambda: fresh)
    return fresh


@pytest.mark.parametrize(("backend", "codec"), tiered(GRID, diagonal(BACKENDS, CODECS, 1)))
def test_reused_host_buffers_give_every_load_its_own_values(path, backend, codec, copying_cpu):
    store = _store(path, backend, codec=codec)
    whole = store.load(as_numpy=True)
    for lo, hi in [(0, 3000), (7, 2900), (1000, 3000), (0, 3000)]:
        got = store.load(slice(lo, hi))
        _same(got, jax.tree.map(lambda a, lo=lo, hi=hi: a[lo:hi], whole))
    pieces = slabs.plan(slice(0, 3000, 1), [136, 1, 8, 8, 8, 4], 256, RUNTIME.reads.slab_bytes)
    assert len(pieces) > 8 and copying_cpu.made <= RUNTIME.threads.slab_readers + 2 * 4, (
        copying_cpu.made
    )
    assert copying_cpu.free_buffers() > 0


class _Copy:
    """A stand-in for a device array whose copy from the host ends when ``done`` is set."""

    def __init__(self) -> None:
        import threading

        self.done = threading.Event()

    def is_deleted(self) -> bool:
        return False

    def is_ready(self) -> bool:
        return self.done.is_set()

    def block_until_ready(self) -> None:
        self.done.wait()


def test_a_buffer_is_reused_only_when_its_device_arrays_are_ready():

    from pytreestore._read import slabs as hostpool

    pool = hostpool.HostBuffers(cap=2)
    a = pool.take(10_000)
    copy = _Copy()
    pool.give(a, [copy], reuse=True)
    b = pool.take(10_000)
    assert b is not a and pool.made == 2  # the copy from a is not over
    copy.done.set()
    assert pool.take(10_000) is a
    pool.give(b, [], reuse=False)
    assert pool.free_buffers() == 0  # a buffer a CPU array may alias is never handed out again
    pool.give(a, [], reuse=True)
    assert pool.free_buffers() == 1


def test_a_piece_waits_for_a_buffer_rather_than_making_more_than_the_cap():
    import threading

    from pytreestore._read import slabs as hostpool

    pool = hostpool.HostBuffers(cap=2)
    copies = [_Copy(), _Copy()]
    buffers = [pool.take(5000), pool.take(5000)]
    for buffer, copy in zip(buffers, copies):
        pool.give(buffer, [copy], reuse=True)
    got = []
    taker = threading.Thread(target=lambda: got.append(pool.take(5000)))
    taker.start()
    taker.join(0.2)
    assert taker.is_alive() and not got  # both copies running: it waits
    copies[0].done.set()
    taker.join(5)
    assert got[0] is buffers[0] and pool.made == 2


def test_a_failed_read_gives_its_buffer_back_never_to_be_reused(monkeypatch):
    from pytreestore._read import slabs as hostpool

    fresh = hostpool.HostBuffers(cap=1)
    monkeypatch.setattr(hostpool, "pool", lambda: fresh)
    monkeypatch.setattr(hostpool, "ALIASING", set())

    def read(piece, buffer):
        buffer(1000)
        raise CorruptChunkError("damaged", path="x", chunk=(0,), key="x/c/0")

    for _ in range(3):
        with pytest.raises(CorruptChunkError):
            slabs.load(read, [slabs.Piece((0,), slice(0, 10, 1))], 1, jax.devices("cpu")[0])
    # each given back (none counted out, so none shrinks the cap), none reused: a failed
    # read may still have been writing into it
    assert fresh._out == 0 and fresh.made == 3 and fresh.free_buffers() == 0


def test_views_begin_on_pages_and_do_not_overlap():
    from pytreestore._read import slabs as hostpool

    shapes = [((3, 5), np.dtype(np.float32)), ((7,), np.dtype(np.int64)), ((0, 2), np.dtype(bool))]
    buffer = hostpool.pool().take(hostpool.nbytes(shapes))
    views = hostpool.views(buffer, shapes)
    assert [(v.shape, v.dtype) for v in views] == [(s, d) for s, d in shapes]
    assert all(v.ctypes.data % RUNTIME.reads.host_align == 0 for v in views[:2])
    views[0][:] = 1.5
    views[1][:] = -1
    assert (views[0] == 1.5).all() and (views[1] == -1).all()
    assert views[0].flags.c_contiguous and views[1].flags.writeable


def test_packed_and_evolved_columns_read_in_reused_buffers(path, backend, copying_cpu, on_cpu):
    """A packed leaf (a part of its pack's rows) and a column evolve added (its first rows
    unstored) are read as a whole read reads them, beside columns read into the buffers."""
    like = {"a": np.zeros(3, np.float32), "b": np.int32(0), "w": np.zeros(40, np.float32)}
    rows = [
        {"a": np.full(3, i, np.float32), "b": np.int32(i), "w": np.full(40, i, np.float32)}
        for i in range(2000)
    ]
    store = pytreestore.create(path, like, chunk_records=128, backend=backend, pack=True)
    store.extend(rows)
    store.flush()
    store.evolve(add={"['n']": np.full(2, 7, np.int16)})
    store.extend({**r, "n": np.full(2, i, np.int16)} for i, r in enumerate(rows[:500]))
    store.flush()
    for _ in range(2):
        got = store.load()
        want = store.load(as_numpy=True)
        _same(got, want)
    assert on_cpu, "the loads went through the slab path"
    assert np.asarray(got["n"])[:2000].tolist() == [[7, 7]] * 2000
    assert np.asarray(got["b"]).tolist() == list(range(2000)) + list(range(500))


def test_a_load_of_one_piece_reads_in_the_calling_thread():
    import threading

    threads = []

    def read(piece, buffer):
        threads.append(threading.current_thread())
        return [np.arange(piece.rows.start, piece.rows.stop, dtype=np.float32)]

    one = [slabs.Piece((0,), slice(0, 10, 1))]
    got = slabs.load(read, one, 1, jax.devices("cpu")[0])
    assert threads == [threading.current_thread()]  # batches' loads keep their own threads
    np.testing.assert_array_equal(np.asarray(got[0]), np.arange(10))
    two = [slabs.Piece((0,), slice(0, 10, 1)), slabs.Piece((0,), slice(10, 20, 1))]
    got = slabs.load(read, two, 1, jax.devices("cpu")[0])
    assert threading.current_thread() not in threads[1:]
    np.testing.assert_array_equal(np.asarray(got[0]), np.arange(20))


def _taken(monkeypatch, pool) -> list:
    """The buffers ``pool`` hands out from now on."""
    taken = []
    take = pool.take

    def recorded(nbytes):
        taken.append(take(nbytes))
        return taken[-1]

    monkeypatch.setattr(pool, "take", recorded)
    return taken


def _written_after(buffers, seconds: float = 0.4) -> int:
    """Bytes written into ``buffers`` within ``seconds`` after they are zeroed."""
    for buffer in buffers:
        buffer[:] = 0
    time.sleep(seconds)
    return sum(int(np.count_nonzero(b)) for b in buffers)


def test_a_failed_load_leaves_nothing_writing_into_its_buffers(path, copying_cpu, monkeypatch):
    """A damaged chunk read from its file fails the piece while TensorStore still decodes a
    column TensorStore reads (bfloat16) into the same buffer: the load waits for it to stop,
    and the failed piece's buffer is not handed out again (an adversarial review saw 100 MB
    land in a buffer after the pool had handed it out again)."""
    monkeypatch.setattr(RUNTIME.reads, "slab_bytes", 512 << 20)  # one piece
    like = {"a": np.zeros(64, np.float32), "h": np.zeros(16384, ml_dtypes.bfloat16)}
    store = pytreestore.create(path, like, chunk_records=256, codec=None)
    rng = np.random.default_rng(0)
    store.extend_batch({k: rng.random((4096, *v.shape)).astype(v.dtype) for k, v in like.items()})
    store.flush()
    (Path(path) / "a" / "c" / "0" / "0").write_bytes(b"garbage")
    taken = _taken(monkeypatch, copying_cpu)
    with pytest.raises(CorruptChunkError, match=r"\['a'\]"):
        store.load()
    assert taken and _written_after(taken) == 0
    assert copying_cpu._out == 0 and copying_cpu.free_buffers() == 0  # not reused
    assert copying_cpu.take(100) is not taken[0]


class _Interrupted(BaseException):
    pass


@pytest.mark.parametrize("codec", [None, "zstd"])
def test_an_interrupted_load_leaves_nothing_writing_into_its_buffers(
    path, codec, copying_cpu, monkeypatch
):
    """Ctrl-C during a load of one piece (read in the calling thread): once it is raised,
    no reader thread, file or TensorStore, still writes into the piece's buffer."""
    import signal

    monkeypatch.setattr(RUNTIME.reads, "slab_bytes", 256 << 20)
    store = pytreestore.create(
        path, {"w": np.zeros(8192, np.float32)}, chunk_records=64, codec=codec
    )
    store.extend_batch({"w": np.random.default_rng(0).random((2048, 8192), dtype=np.float32)})
    store.flush()
    start = time.perf_counter()
    store.load()
    took = time.perf_counter() - start
    taken = _taken(monkeypatch, copying_cpu)

    def interrupt(*_):
        raise _Interrupted

    old = signal.signal(signal.SIGALRM, interrupt)
    delay, landed = took / 4, False
    try:
        for _ in range(8):  # until the interrupt lands while the piece is being read
            taken.clear()
            try:
                signal.setitimer(signal.ITIMER_REAL, delay)
                store.load()
                signal.setitimer(signal.ITIMER_REAL, 0)
                delay /= 2  # the load was faster this time
            except _Interrupted:
                if taken:
                    landed = True
                    break
                delay *= 1.5  # before the piece took its buffer
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert landed
    assert _written_after(taken) == 0
    assert copying_cpu._out == 0


@jax.jit
def _slow(x):
    """``x``, ready later: an accelerator's copy, not over when ``device_put`` returns."""
    y = jax.lax.fori_loop(0, 100, lambda i, a: a @ a / 64.0, jax.numpy.eye(128))
    return x + 0 * y[0, 0].astype(x.dtype)


def test_a_load_returns_once_its_copies_are_over_and_the_pool_holds_no_array(
    path, copying_cpu, monkeypatch
):
    """The pool held the last pieces' device arrays (device memory) until the next load; and
    a user who deleted (donated) an array before its copy ended freed its buffer early."""
    put = slabs._put
    monkeypatch.setattr(
        slabs, "_put", lambda arrays, device: [_slow(a) for a in put(arrays, device)]
    )
    store = pytreestore.create(path, {"w": np.zeros(64, np.float32)}, chunk_records=256)
    store.extend_batch({"w": np.ones((3000, 64), np.float32)})
    store.flush()
    got = store.load()
    assert not copying_cpu._pending and copying_cpu._out == 0
    assert copying_cpu.free_buffers() >= 1
    np.testing.assert_array_equal(np.asarray(got["w"]), np.ones((3000, 64), np.float32))


def test_a_failed_allocation_does_not_count_a_buffer_out(monkeypatch):
    from pytreestore._read import slabs as hostpool

    pool = hostpool.HostBuffers(cap=2)

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(hostpool.np, "empty", no_memory)
    with pytest.raises(MemoryError):
        pool.take(1 << 20)
    monkeypatch.undo()
    assert (pool._out, pool.made) == (0, 0)
    assert len(pool.take(10)) >= 10
