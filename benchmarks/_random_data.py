"""The records of ``bench_random.py`` and ``bench_layouts.py`` and the forms they read them in:
pytreestore stores of each layout of :data:`LAYOUTS` (the default one, plain chunks, inner
chunks of 4 to 32 KiB, packed), each written when first read, an ArrayRecord file (Grain's
format; each record a msgpack dict of leaf name -> bytes, dtype and shape) and a Lance
dataset, written once per process; the bound on the decoded-chunk cache the stores are read
through; and the switch between the direct reader and TensorStore.

Example (what a benchmark case does):
    >>> with _bounded_cache(_cache_bytes(n)) as (cache_bytes, how):  # doctest: +SKIP
    ...     data = _data(n)
    ...     store = pytreestore.open(str(data.store), cache_bytes=cache_bytes)
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import gc
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from _anchors_common import _arrow_table, _leaf_names, _need, _scratch, _Skip
from _common import Timed, Timing, measure_side_by_side

import pytreestore
from pytreestore._read import cache as _cache  # only to see whether the shared cache exists
from pytreestore._runtime import RUNTIME

CACHE_VAR = "PYTREESTORE_CACHE_BYTES"
CACHE_SHARE = 8  # the store's decoded bytes over the cache's bound
INDEX = "meta/index"  # the leaf holding each record's own index

# --- the record ---------------------------------------------------------------------------------

LEAVES: dict[str, tuple[str, tuple[int, ...]]] = {
    "obs/camera/pixels": ("float32", (10, 16)),
    "obs/camera/depth": ("float32", (32,)),
    "obs/lidar/ranges": ("float32", (48,)),
    "obs/lidar/hits": ("int32", (8,)),
    "obs/proprio/joints": ("float32", (12,)),
    "obs/proprio/velocity": ("float32", (12,)),
    "obs/proprio/contact": ("int32", (4,)),
    "action/continuous": ("float32", (8,)),
    "action/discrete": ("int32", ()),
    "action/logits": ("float32", (16,)),
    "policy/value": ("float32", ()),
    "policy/log_prob": ("float32", ()),
    "policy/hidden": ("float32", (32,)),
    "reward": ("float32", ()),
    "done": ("int32", ()),
    "meta/index": ("int32", ()),
    "meta/episode": ("int32", ()),
    "info/goal": ("float32", (3,)),
    "info/stats/returns": ("float32", (16,)),
    "info/stats/lengths": ("int32", ()),
}
QUANTISED = ("obs/camera/pixels", "obs/camera/depth")
RECORD_BYTES = sum(np.dtype(d).itemsize * math.prod(s) for d, s in LEAVES.values())


def _column(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    dtype, shape = LEAVES[name]
    if name == INDEX:
        return np.arange(n, dtype=dtype)
    if dtype != "float32":
        return rng.integers(0, 1_000, (n, *shape), dtype=dtype)
    if name in QUANTISED:
        return (rng.integers(0, 256, (n, *shape)) / np.float32(255)).astype(np.float32)
    return rng.standard_normal((n, *shape), dtype=np.float32)


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a/b/c": x}`` as ``{"a": {"b": {"c": x}}}``."""
    tree: dict[str, Any] = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


# --- the store, the ArrayRecord file and the Lance dataset, written once per run ----------------


#: the stores of the same records the benchmarks read, by layout name: their ``create`` options
#: ("" is the default layout, whatever ``create``'s defaults are in this checkout)
LAYOUTS: dict[str, dict[str, Any]] = {
    "": {},
    "plain": {"inner_chunk_bytes": 0},  # plain chunks: the layout before issue 47
    "inner-4k": {"inner_chunk_bytes": 4 << 10},
    "inner-8k": {"inner_chunk_bytes": 8 << 10},
    "inner-16k": {"inner_chunk_bytes": 16 << 10},
    "inner-32k": {"inner_chunk_bytes": 32 << 10},
    "packed": {"pack": True, "inner_chunk_bytes": "auto"},
}


@dataclass
class _Data:
    root: Path
    n: int
    like: Any
    batch: Any  # the stacked records, as ``extend_batch`` takes them
    names: list[str]  # leaf names in the order of ``expected``
    expected: list[np.ndarray]  # every leaf's column
    arecord: Path | None
    lance: Path | None
    skipped: dict[str, str]  # anchor -> why it is not there
    stores: dict[str, Path] = field(default_factory=dict)  # layout -> its store, once written

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.expected)

    @property
    def cache_bytes(self) -> int:
        return _cache_bytes(self.n)

    @property
    def index_leaf(self) -> int:
        return self.names.index(INDEX)

    @property
    def store(self) -> Path:
        """The store of the default layout."""
        return self.path("")

    def path(self, layout: str) -> Path:
        """The store of ``layout`` (a name of :data:`LAYOUTS`), written on first use."""
        if layout not in self.stores:
            path = self.root / (layout or "default")
            write_store(path, self.like, self.batch, LAYOUTS[layout])
            self.stores[layout] = path
        return self.stores[layout]

    def picked(self, idx: Any) -> list[np.ndarray]:
        return [e[idx] for e in self.expected]

    def need(self, anchor: str) -> Path:
        path = {"arrayrecord": self.arecord, "lance": self.lance}[anchor]
        if path is None:
            raise _Skip(self.skipped[anchor])
        return path


def write_store(path: Path, like: Any, batch: Any, options: dict[str, Any]) -> None:
    """A new store at ``path`` of the records ``batch``, created with ``options``, closed."""
    with pytreestore.create(str(path), like, **options) as store:
        store.extend_batch(batch)


def _cache_bytes(n: int) -> int:
    """The cache's bound for a store of ``n`` records: an eighth of its decoded bytes."""
    return n * RECORD_BYTES // CACHE_SHARE


def _disk_bytes(path: Path) -> int:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files)


@functools.cache
def _data(n: int) -> _Data:
    """The records, as an ArrayRecord file and a Lance dataset, under a directory removed when
    the process exits; the stores of each layout are written when first asked for
    (:meth:`_Data.path`)."""
    rng = np.random.default_rng(31)
    flat = {name: _column(name, n, rng) for name in LEAVES}
    batch = _nest(flat)
    like = jax.tree.map(lambda c: c[0], batch)
    names = _leaf_names(like)
    expected = [flat[name] for name in names]
    stack = contextlib.ExitStack()
    root = stack.enter_context(_scratch("pytreestore-random-"))
    atexit.register(stack.close)
    data = _Data(root, n, like, batch, names, expected, None, None, {})
    data.path("")
    try:
        data.arecord = _write_arecord(data)
    except _Skip as why:
        data.skipped["arrayrecord"] = str(why)
    try:
        data.lance = _write_lance(data)
    except _Skip as why:
        data.skipped["lance"] = str(why)
    # Move what is alive now out of the collector's way: the full collection before each
    # timed run then costs microseconds, not a walk over JAX's and the anchors' objects.
    gc.freeze()
    return data


def _record(data: _Data, i: int) -> dict[str, Any]:
    """Record ``i`` as a Grain user writes it: leaf name -> its bytes, dtype and shape."""
    return {
        name: {"data": e[i].tobytes(), "dtype": e.dtype.str, "shape": list(e.shape[1:])}
        for name, e in zip(data.names, data.expected, strict=True)
    }


def _write_arecord(data: _Data) -> Path:
    module = _need("array_record.python.array_record_module", "array-record")
    packb = _need("msgpack", "msgpack").packb
    path = data.root / "records.arecord"
    writer = module.ArrayRecordWriter(str(path), "group_size:1")
    try:
        for i in range(data.n):
            writer.write(packb(_record(data, i)))
    finally:
        writer.close()
    return path


def _write_lance(data: _Data) -> Path:
    lance = _need("lance", "pylance")
    path = data.root / "records.lance"
    lance.write_dataset(_arrow_table(data.names, data.expected), str(path))
    return path


@contextlib.contextmanager
def _arecord_reader(data: _Data) -> Iterator[Any]:
    """A reader of the ArrayRecord file with the options Grain's data source gives it."""
    path = data.need("arrayrecord")
    module = _need("array_record.python.array_record_module", "array-record")
    reader = module.ArrayRecordReader(
        str(path), "readahead_buffer_size:0", file_reader_buffer_size=32768
    )
    try:
        yield reader
    finally:
        reader.close()


def _arecord_read(reader: Any, idx: Sequence[int], names: Sequence[str]) -> list[np.ndarray]:
    """Records ``idx`` as one array per leaf: each record unpacked, each leaf's bytes joined."""
    unpackb = _need("msgpack", "msgpack").unpackb
    records = [unpackb(blob) for blob in reader.read(list(idx))]
    out = []
    for name in names:
        first = records[0][name]
        joined = b"".join(r[name]["data"] for r in records)
        array = np.frombuffer(joined, dtype=np.dtype(first["dtype"]))
        out.append(array.reshape(len(records), *first["shape"]))
    return out


def _lance_dataset(data: _Data) -> tuple[Any, Any]:
    lance = _need("lance", "pylance")
    return lance, lance.dataset(str(data.need("lance")))


def _shapes(data: _Data) -> list[tuple[int, ...]]:
    return [e.shape[1:] for e in data.expected]


# --- the direct reader or TensorStore -----------------------------------------------------------


@contextlib.contextmanager
def _direct(on: bool) -> Iterator[None]:
    """``RUNTIME.reads.direct = on`` for the block, restored after: False reads every column
    through TensorStore (the engine before issue 47), True lets the direct reader read what
    it covers."""
    old = RUNTIME.reads.direct
    RUNTIME.reads.direct = on
    try:
        yield
    finally:
        RUNTIME.reads.direct = old


def _through(on: bool, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn`` run with the direct reader ``on`` or off (:func:`_direct`)."""

    def run(state: Any) -> Any:
        with _direct(on):
            return fn(state)

    return run


class CpuTimes:
    """The process's CPU seconds (every thread: ours, TensorStore's, Lance's) of each call of
    the functions :meth:`wrap` returns; on a loaded machine they move less than wall times.

    Example:
        >>> cpu = CpuTimes()
        >>> cpu.wrap(lambda x: x + 1)(1), len(cpu.times)
        (2, 1)
    """

    def __init__(self) -> None:
        self.times: list[float] = []

    def wrap(self, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(state: Any) -> Any:
            start = time.process_time()
            try:
                return fn(state)
            finally:
                self.times.append(time.process_time() - start)

        return run

    def __str__(self) -> str:
        if not self.times:
            return "n/a"
        median = statistics.median(self.times)
        return f"{median * 1e3:,.1f} ms" if median >= 1e-3 else f"{median * 1e6:,.0f} us"


def _metered(timed: Timed) -> tuple[Timed, CpuTimes]:
    """``timed``, its runs' CPU times kept (warm-up runs too) in the :class:`CpuTimes`."""
    cpu = CpuTimes()
    return dataclasses.replace(timed, fn=cpu.wrap(timed.fn)), cpu


def _side_by_side(timed: dict[Any, Timed]) -> dict[Any, tuple[Timing, CpuTimes]]:
    """``measure_side_by_side`` of ``timed``'s values, each with its CPU times, by key."""
    metered = {key: _metered(t) for key, t in timed.items()}
    got = measure_side_by_side(*(t for t, _ in metered.values()))
    return {key: (g, m[1]) for (key, m), g in zip(metered.items(), got, strict=True)}


def _cpu_note(ours: CpuTimes, anchor: CpuTimes) -> str:
    return f"CPU time per run (median, every thread of the process): ours {ours}, anchor {anchor}."


# --- the cache bound ----------------------------------------------------------------------------


@contextlib.contextmanager
def _bounded_cache(limit: int) -> Iterator[tuple[int | None, str]]:
    """``PYTREESTORE_CACHE_BYTES=limit`` for the block (restored after): the ``cache_bytes`` to
    open a store with (None: the default) so that it reads through a cache of ``limit`` bytes,
    and a note saying how."""
    old = os.environ.get(CACHE_VAR)
    os.environ[CACHE_VAR] = str(limit)
    made = _cache._SHARED  # the shared cache, once a store made it (pytreestore/_read/cache.py)
    fresh = not made
    try:
        if fresh or (made[0] is not None and made[0].limit == limit):
            yield (
                None,
                (
                    "The store was opened with the defaults (no `cache_bytes`): the shared cache "
                    f"was made under `{CACHE_VAR}={limit}` ({limit / 2**20:.1f} MiB)."
                ),
            )
        else:
            yield (
                limit,
                (
                    "The shared cache was made before this module ran, under another bound, so "
                    f"`{CACHE_VAR}` could not apply: the store was opened with "
                    f"`cache_bytes={limit}` ({limit / 2**20:.1f} MiB), a cache of its own."
                ),
            )
    finally:
        if old is None:
            os.environ.pop(CACHE_VAR, None)
        else:
            os.environ[CACHE_VAR] = old
        if fresh:  # the next store makes the shared cache again, under the restored bound
            made.clear()


def _about(data: _Data, store: Any, layout: str = "") -> str:
    chunk = min(c.chunks[0] for c in store.schema.columns)
    inner = store.schema.inner_chunk_bytes
    shape = f"inner chunks of {inner / 2**10:g} KiB" if inner else "plain chunks"
    packs = f", {len(store.schema.packs)} pack arrays" if store.schema.packs else ""
    sizes = [f"store {_disk_bytes(data.path(layout)) / 2**20:.0f} MiB on disk"]
    if data.arecord is not None:
        sizes.append(f"ArrayRecord {_disk_bytes(data.arecord) / 2**20:.0f} MiB")
    if data.lance is not None:
        sizes.append(f"Lance {_disk_bytes(data.lance) / 2**20:.0f} MiB")
    return (
        f"{data.n:,} records of {data.nbytes // data.n:,} bytes in {len(data.names)} leaves: "
        f"{data.nbytes / 2**20:.0f} MiB decoded, {chunk:,} records per chunk, {shape}{packs} "
        f"({_layout_name(layout)}); {', '.join(sizes)}."
    )


def _layout_name(layout: str) -> str:
    """How the notes name a layout: its ``create`` options."""
    options = LAYOUTS[layout]
    if not options:
        return "the default layout: `create(path, like)`"
    return "`create(path, like, " + ", ".join(f"{k}={v!r}" for k, v in options.items()) + ")`"
