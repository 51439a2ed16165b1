"""A real headless Chromium for the tests of the notebook view, driven over the DevTools protocol.

Chromium comes from the npm registry's ``@sparticuz/chromium`` package (a self-contained
build: the binary, its libraries, SwiftShader and fonts, each brotli-compressed), fetched
and unpacked once into :data:`CACHE` (``$PYTREESTORE_CHROMIUM``, else ``.venv/chromium``)::

    python tests/browser.py fetch        # fetch and unpack Chromium (make test does it)
    python tests/browser.py screenshots  # regenerate docs/images/notebook-view-*.png

This build hangs in ``--screenshot`` and ``--dump-dom`` modes, so it runs with a remote
debugging port and :class:`Page` drives it: load a page, switch ``prefers-color-scheme``,
evaluate JavaScript, click, take a screenshot. Brotli is decoded by the ``brotli`` package
where it is installed, else by Node's ``zlib``.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VERSION = "147.0.0"
URL = f"https://registry.npmjs.org/@sparticuz/chromium/-/chromium-{VERSION}.tgz"
CACHE = Path(os.environ.get("PYTREESTORE_CHROMIUM") or ROOT / ".venv" / "chromium")
FETCH = "python tests/browser.py fetch"
_PARTS = ("chromium", "al2023.tar", "swiftshader.tar", "fonts.tar")
#: the package's fonts (Open Sans) and the machine's, with the machine's aliases (monospace)
_FONTS = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig>
  <dir>{cache}/fonts</dir>
  <dir>/usr/share/fonts</dir>
  <cachedir>{cache}/fonts-cache</cachedir>
  <include ignore_missing="yes">/etc/fonts/conf.d</include>
</fontconfig>
"""


def executable(cache: Path = CACHE) -> Path | None:
    """The unpacked Chromium, or None if :func:`fetch` has not run."""
    done = cache / f".complete-{VERSION}"
    return cache / "chromium" if done.exists() else None


def fetch(cache: Path = CACHE) -> Path:
    """Fetches and unpacks Chromium into ``cache`` (once); its executable."""
    found = executable(cache)
    if found is not None:
        return found
    with urllib.request.urlopen(URL, timeout=30) as response:
        package = response.read()
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(package), mode="r:gz") as tgz:
        for part in _PARTS:
            member = tgz.extractfile(f"package/bin/{part}.br")
            assert member is not None, f"{URL} lacks bin/{part}.br"
            raw = _unbrotli(member.read())
            if part.endswith(".tar"):
                with tarfile.open(fileobj=io.BytesIO(raw)) as inner:
                    inner.extractall(cache, filter="data")
            else:
                (cache / part).write_bytes(raw)
    (cache / "chromium").chmod(0o755)
    (cache / "fonts.conf").write_text(_FONTS.format(cache=cache))
    (cache / f".complete-{VERSION}").touch()
    return cache / "chromium"


def _unbrotli(data: bytes) -> bytes:
    try:
        import brotli  # type: ignore[import-not-found]
    except ImportError:
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("decoding Chromium needs the brotli package or node") from None
        script = (
            "const z=require('zlib');const c=[];process.stdin.on('data',d=>c.push(d));"
            "process.stdin.on('end',()=>process.stdout.write(z.brotliDecompressSync("
            "Buffer.concat(c))))"
        )
        return subprocess.run(
            [node, "-e", script], input=data, capture_output=True, check=True
        ).stdout
    return brotli.decompress(data)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def chromium(path: Path) -> Iterator[Page]:
    """Chromium started on 127.0.0.1 at a free port, its one page; killed after."""
    folder = path.parent
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": f"{folder / 'lib'}:{folder}",
        "FONTCONFIG_PATH": str(folder),
    }
    with tempfile.TemporaryDirectory(prefix="pytreestore-chromium-") as home:
        env["HOME"] = home
        port = _free_port()
        args = [str(path), "--headless", "--no-sandbox", "--no-zygote", "--single-process"]
        args += ["--disable-gpu", f"--remote-debugging-port={port}", f"--user-data-dir={home}"]
        process = subprocess.Popen(
            [*args, "about:blank"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            with Page.connect(_page_url(port, process)) as page:
                yield page
        finally:
            process.kill()
            process.wait()


def _page_url(port: int, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Chromium exited at start with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as r:
                pages = [t for t in json.load(r) if t["type"] == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("Chromium's DevTools endpoint did not answer within 30 s")


class Page:
    """One browser page over the DevTools protocol (a blocking websocket)."""

    def __init__(self, socket: Any) -> None:
        self._socket = socket
        self._ids = itertools.count(1)

    @classmethod
    @contextmanager
    def connect(cls, url: str) -> Iterator[Page]:
        from websockets.sync.client import connect

        with connect(url, max_size=1 << 28) as ws:
            yield cls(ws)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Calls ``method``; its result (events meanwhile are dropped)."""
        call = next(self._ids)
        self._socket.send(json.dumps({"id": call, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv(timeout=60))
            if message.get("id") == call:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (awaited if a promise)."""
        got = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression}: {got['exceptionDetails']}")
        return got["result"].get("value")

    def show(self, body: str, *, dark: bool = False, width: int = 1100) -> None:
        """Loads a page whose body is ``body``, in the light or dark colour scheme."""
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=600,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        scheme = [{"name": "prefers-color-scheme", "value": "dark" if dark else "light"}]
        self.send("Emulation.setEmulatedMedia", features=scheme)
        background = "#0d1117" if dark else "#ffffff"
        page = f"<!doctype html><html><body style='margin:12px;background:{background}'>{body}"
        self.send("Page.navigate", url="data:text/html;base64," + base64.b64encode(
            page.encode()).decode())  # fmt: skip
        deadline = time.monotonic() + 30
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise RuntimeError("the page did not load within 30 s")
            time.sleep(0.05)

    def visible(self, selector: str) -> bool:
        """Whether the first element ``selector`` matches is shown: rendered (not in a closed
        ``<details>``, not ``display:none``) and of a height."""
        return bool(
            self.evaluate(
                f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                " return !!e && e.checkVisibility() && e.getBoundingClientRect().height > 0; })()"
            )
        )

    def click(self, selector: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def screenshot(self) -> bytes:
        """A PNG of the whole page."""
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        width = int(self.evaluate("document.documentElement.scrollWidth"))
        clip = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        shot = self.send("Page.captureScreenshot", format="png", clip=clip,
                         captureBeyondViewport=True)  # fmt: skip
        return base64.b64decode(shot["data"])


def _screenshots() -> None:
    """Writes docs/images/notebook-view-light.png and -dark.png from the example store."""
    sys.path.insert(0, str(ROOT))
    from tests.notebook_store import example_view

    images = ROOT / "docs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, chromium(fetch()) as page:
        view = example_view(Path(tmp)).replace(tmp, "/data")  # no temporary folder's name
        for dark in (False, True):
            page.show(view, dark=dark, width=1000)
            name = f"notebook-view-{'dark' if dark else 'light'}.png"
            (images / name).write_bytes(page.screenshot())
            print(images / name)


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "fetch":
        print(fetch())
    elif command == "screenshots":
        _screenshots()
    else:
        sys.exit(__doc__)
