"""A real S3-compatible server on 127.0.0.1 for tests: ``moto_server`` in a subprocess.

:class:`MotoServer` starts ``moto_server`` (from ``moto[server]``, a test dependency) on a free
port of 127.0.0.1, waits until it answers, and stops it afterwards. :class:`OutageProxy` sits
in front of it and can be taken down and brought back, so tests can stop "the server" in the
middle of a write without losing what it stored (moto keeps everything in memory).

Nothing here mocks pytreestore: the store talks HTTP to a real server through TensorStore.

Example (not run as a doctest: it starts a server)::

    with MotoServer() as server:
        bucket = server.make_bucket("runs")
        store = pytreestore.create(f"s3://{bucket}/a", like, storage_options=server.options)
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from typing import Any

from pytreestore._runtime import thread

__all__ = ["MotoServer", "OutageProxy", "free_port"]

HOST = "127.0.0.1"
#: environment a client process needs to talk to the server (any key works with moto)
CLIENT_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _moto_command() -> list[str]:
    """moto's server, through :mod:`pytreestore.testing._moto_main` (which keeps its lookup of
    each request's service instead of listing its package folder on every request)."""
    return [sys.executable, "-m", "pytreestore.testing._moto_main"]


class MotoServer:
    """``moto_server`` on 127.0.0.1; a context manager, or :meth:`start` and :meth:`stop`.

    Attributes:
        port: the port it listens on.
        endpoint: ``http://127.0.0.1:PORT``.
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://{HOST}:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)

    @property
    def options(self) -> dict[str, Any]:
        """``storage_options`` that point a store at this server."""
        return {"endpoint": self.endpoint, "region": "us-east-1"}

    def start(self, timeout: float = 60.0) -> MotoServer:
        """Starts the server and waits until it answers HTTP."""
        env = dict(os.environ, **CLIENT_ENV)
        self._proc = subprocess.Popen(
            [*_moto_command(), "-H", HOST, "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"moto_server exited at start:\n{self.log()}")
            if self.answers():
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"moto_server did not answer on {self.endpoint} in {timeout} s")

    def answers(self) -> bool:
        """Whether the server answers an HTTP request now."""
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1) as reply:
                return reply.status < 500
        except urllib.error.HTTPError as err:
            return err.code < 500
        except OSError:
            return False

    def stop(self) -> None:
        """Stops the server (its data is lost) and waits for it to exit."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def log(self) -> str:
        """What the server printed so far."""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def make_bucket(self, name: str | None = None) -> str:
        """Creates a bucket (a fresh random name by default) and returns its name."""
        name = name or f"b-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as reply:
            if reply.status != 200:
                raise RuntimeError(f"creating bucket {name} failed: HTTP {reply.status}")
        return name

    def __enter__(self) -> MotoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()


class OutageProxy:
    """A TCP proxy on 127.0.0.1 in front of a server, which :meth:`down` takes away.

    While down it refuses new connections and cuts the open ones, the way a stopped server
    looks to a client; :meth:`up` brings it back on the same port with the server's data
    intact.
    """

    def __init__(
        self, target_port: int, port: int | None = None, *, drop_headers: Sequence[str] = ()
    ) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        #: request headers removed on the way to the server (to play a server that ignores
        #: them, e.g. ``If-None-Match``); matched within each read, case-insensitively
        self._drop = (
            re.compile(
                rb"\r\n(?:" + b"|".join(re.escape(h.encode()) for h in drop_headers) + rb"):[^\r]*",
                re.IGNORECASE,
            )
            if drop_headers
            else None
        )
        self.endpoint = f"http://{HOST}:{self.port}"
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def up(self) -> OutageProxy:
        """Starts accepting connections (again)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, self.port))
        listener.listen(64)
        self._listener = listener
        self._thread = thread(self._accept, (listener,), "pytreestore-s3-proxy")
        return self

    def down(self) -> None:
        """Refuses new connections and resets the open ones."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((HOST, self.target_port), timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns.update((client, server))
            for a, b, drop in ((client, server, self._drop), (server, client, None)):
                thread(self._pipe, (a, b, drop), "pytreestore-s3-pipe")

    def _pipe(self, src: socket.socket, dst: socket.socket, drop: re.Pattern | None) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(drop.sub(b"", data) if drop is not None else data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._conns.discard(src)
            src.close()

    def __enter__(self) -> OutageProxy:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()
