"""The host's read rate: raw TensorStore reading a store into fresh arrays and into reused ones.

Run it on the accelerator's host (``python benchmarks/host_reads.py [--mib 512]``): it says
how fast the host can read a store at all, the bound under every load to the device
(docs/benchmarks.md, "Feeding a TPU"). It writes one float32 array of ``--mib`` MiB in chunks
of 64 rows, zstd and uncompressed, then reads it in 8 slices, 1, 3 and 8 side by side: each
slice ``read()`` into a new array (fresh memory: on a host without transparent hugepages every
page is a fault), or written into one of 8 arrays made once (``ts.array(buf, copy=False)``),
as the loads' pieces are (pytreestore/_read/slabs.py).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tensorstore as ts


def _open(path: str, codecs: list[dict], shape: tuple[int, int], create: bool) -> ts.TensorStore:
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": path},
        "metadata": {
            "shape": list(shape),
            "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [64, shape[1]]}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, *codecs],
        },
    }
    return ts.open(spec, create=create, open=not create).result()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    args = parser.parse_args(argv)
    width = 16_384  # 64 KiB rows; chunks of 64 rows (4 MiB), 8 slices of whole chunks
    rows = max(512, (args.mib << 20) // (4 * width) // 512 * 512)
    data = np.round(np.random.default_rng(0).standard_normal((rows, width)), 2).astype(np.float32)
    part = rows // 8
    gib = data.nbytes / 2**30
    with tempfile.TemporaryDirectory(prefix="host-reads-") as tmp:
        for name, codecs in (
            ("zstd", [{"name": "zstd", "configuration": {"level": 1}}]),
            ("none", []),
        ):
            _open(f"{tmp}/{name}", codecs, data.shape, True).write(data).result()
            handle = _open(f"{tmp}/{name}", codecs, data.shape, False)
            buffers = [np.zeros((part, width), np.float32) for _ in range(8)]

            def fresh(i: int, h: ts.TensorStore = handle) -> np.ndarray:
                return h[i * part : (i + 1) * part].read().result()

            def reused(i: int, h: ts.TensorStore = handle, b: list = buffers) -> np.ndarray:
                ts.array(b[i], copy=False, write=True).write(h[i * part : (i + 1) * part]).result()
                return b[i]

            for readers in (1, 3, 8):
                with ThreadPoolExecutor(readers) as pool:
                    for label, read in (("fresh", fresh), ("reused", reused)):
                        times = []
                        for _ in range(4):
                            start = time.perf_counter()
                            got = list(pool.map(read, range(8)))
                            times.append(time.perf_counter() - start)
                        assert np.array_equal(np.concatenate(got), data)
                        t = statistics.median(times)
                        print(
                            f"codec={name} readers={readers} {label}: {t * 1e3:.0f} ms "
                            f"({gib / t:.2f} GiB/s)",
                            flush=True,
                        )


if __name__ == "__main__":
    main()
