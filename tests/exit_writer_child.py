"""A script that ends with records appended and no ``close()`` (tests/test_exit_writes.py runs
it): the interpreter's exit must commit every one of them (issue 44, items 3 and 8).

``python exit_writer_child.py WHERE ENDING``: WHERE is a folder, one store per backend and kind
of tests/parity/kinds.py (``WHERE/BACKEND-KIND``). ENDING is

* ``appended``: 13 records appended to each store (``chunk_records=4``: 3 full chunks, which a
  fixed store hands to the background writer, and one record buffered), then the script ends;
  the zarr backend writes slowly (its background writer is behind at the end);
* ``daemon``: a daemon thread per store of ``DAEMON_KINDS`` appends records in a loop; once
  each has appended 10, the script prints how many each had appended (``acked BACKEND-KIND N``)
  and ends while they go on;
* ``extending``: ``ACKED`` records extended to each store of ``DAEMON_KINDS``, then a daemon
  thread per store extends it with an endless generator; the script ends while they go on;
* ``extending_hooked``: as ``extending``, with a slow ``threading.excepthook``;
* ``failing``: as ``appended``, then every write of a file by the zarr backend fails (a disk
  gone full): the exit's commit fails, and says so on standard error.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from tests.parity import kinds
from tests.parity.kinds import BACKENDS

APPENDED = 13
ACKED = 10  # records each daemon thread appends at least before the script ends
KINDS = ("fixed", "ragged_list", "ragged_axis", "optional", "nested")
DAEMON_KINDS = ("fixed", "nested")  # a store handing chunks over, one writing them itself


def stores(where: str, of: tuple[str, ...] = KINDS) -> dict[str, Any]:
    """A store per backend and kind, none closed."""
    return {
        f"{backend}-{kind}": kinds.create(
            f"{where}/{backend}-{kind}", kind, backend, chunk_records=4
        )
        for backend in BACKENDS
        for kind in of
    }


def appended(where: str) -> None:
    """Appends ``APPENDED`` records to each store; the zarr backend's files written slowly,
    so that its fixed store's background writer is still behind when the script ends (the
    chunks it was handed are printed: ``pending NAME N``)."""
    from pytreestore.backends._zarr import stores as zarr_stores

    put = zarr_stores.durable_put

    def slow(*args: object, **kwargs: object) -> None:
        time.sleep(0.02)
        put(*args, **kwargs)  # type: ignore[arg-type]

    zarr_stores.durable_put = slow
    made = stores(where)
    for name in sorted(made, key=lambda name: name == "zarr-fixed"):  # zarr-fixed last
        store = made[name]
        for record in kinds.records(name.split("-", 1)[1], APPENDED):
            store.append(record)
        writer = store._core.writer.tables[None]
        print("pending", name, len(writer.writes) if name.endswith("fixed") else 0)


def daemon(where: str) -> None:
    acked: dict[str, int] = {}

    def loop(name: str, store) -> None:
        kind, i = name.split("-", 1)[1], 0
        while True:
            store.append(kinds.record(kind, i))
            i += 1
            acked[name] = i

    for name, store in stores(where, DAEMON_KINDS).items():
        acked[name] = 0
        threading.Thread(target=loop, args=(name, store), daemon=True).start()
    deadline = time.monotonic() + 60
    while min(acked.values()) < ACKED and time.monotonic() < deadline:
        time.sleep(0.05)
    for name, n in list(acked.items()):  # each count is a prefix its thread had appended
        print("acked", name, n, flush=True)


def extending(where: str) -> None:
    yielded: dict[str, int] = {}

    def endless(name: str):
        kind, i = name.split("-", 1)[1], ACKED
        while True:
            yield kinds.record(kind, i)
            i += 1
            yielded[name] = i

    for name, store in stores(where, DAEMON_KINDS).items():
        store.extend(kinds.records(name.split("-", 1)[1], ACKED))
        yielded[name] = 0
        args = (endless(name),)
        threading.Thread(target=store.extend, args=args, daemon=True).start()
    deadline = time.monotonic() + 60
    while min(yielded.values()) < 2 * ACKED and time.monotonic() < deadline:
        time.sleep(0.05)


def extending_hooked(where: str) -> None:
    """As ``extending``, each stopped thread's error shown by a slow ``threading.excepthook``
    that says when it has ended (``hook ended``): a thread still writing its traceback as
    Python finalizes aborts the process ("Fatal Python error: _enter_buffered_busy")."""
    shown = threading.excepthook

    def slow(args: threading.ExceptHookArgs) -> None:
        time.sleep(0.3)
        shown(args)
        print("hook ended", file=sys.stderr, flush=True)

    threading.excepthook = slow
    extending(where)


def failing(where: str) -> None:
    from pytreestore.backends._zarr import stores as zarr_stores

    appended(where)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    zarr_stores.durable_put = full  # the zarr backend's every file write, from now on


if __name__ == "__main__":
    endings = {
        "appended": appended,
        "daemon": daemon,
        "extending": extending,
        "extending_hooked": extending_hooked,
        "failing": failing,
    }
    endings[sys.argv[2]](sys.argv[1])
