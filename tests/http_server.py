"""A web server for tests: a folder served by Python's ``http.server`` on 127.0.0.1 in a
thread, answering byte ranges, with faults on demand (a path answered 404, a response cut off midway, a path answered
only after a delay) and a count of the requests it was sent."""

from __future__ import annotations

import functools
import http.server
import io
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Faults:
    """What the server does wrong: paths (below its folder, no leading slash) it answers with
    404, with half the body and a closed connection, or only after ``stall_seconds``; the
    requests it was sent."""

    def __init__(self) -> None:
        self.missing: set[str] = set()
        self.ranges = True  # False: Range headers ignored, as Python's http.server does
        self.cut: set[str] = set()
        self.stalled: set[str] = set()
        self.stall_seconds = 5.0
        self.requests: list[str] = []


class _Handler(http.server.SimpleHTTPRequestHandler):
    faults: Faults

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def send_head(self) -> Any:
        path = self.path.lstrip("/")
        self.faults.requests.append(f"{self.command} {path}")
        if path in self.faults.missing:
            self.send_error(404, "gone")
            return None
        if path in self.faults.stalled:
            time.sleep(self.faults.stall_seconds)
        if path in self.faults.cut:
            body = Path(self.translate_path(self.path)).read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # the server dies midway through the response
            return None
        ranged = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if ranged and self.faults.ranges and Path(self.translate_path(self.path)).is_file():
            return self._send_range(ranged[1], ranged[2])
        return super().send_head()

    def _send_range(self, first: str, last: str) -> Any:
        """A ``Range: bytes=FIRST-[LAST]`` or ``bytes=-SUFFIX`` request (OCDBT and sharded
        columns read parts of their files)."""
        body = Path(self.translate_path(self.path)).read_bytes()
        if not first:  # the last LAST bytes
            start, stop = max(0, len(body) - int(last)), len(body)
        else:
            start = int(first)
            stop = len(body) if not last else min(len(body), int(last) + 1)
        part = body[start:stop]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(body)}")
        self.send_header("Content-Length", str(len(part)))
        self.end_headers()
        return io.BytesIO(part)


class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 128  # the default 5 makes a burst of requests wait 1 s for a retry
    daemon_threads = True


@contextmanager
def serve(folder: Path) -> Iterator[tuple[str, Faults]]:
    """Serves ``folder`` at the URL given, until the block ends; its :class:`Faults`."""
    faults = Faults()
    handler = type("Handler", (_Handler,), {"faults": faults})
    server = Server(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", faults
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
