"""``moto_server``'s ``main``, with its lookup of each request's service remembered and its
connections kept open.

For every request, moto (5.x) finds the service by listing its own package folder (``listdir``
and an ``isdir`` per entry, about 200) and matching the host against every service's URL
patterns. Profiled under the S3 tests, that was a third of the server's CPU, taken from the
tests it serves. The service of a host never changes while the server runs, so both answers
are kept after the first request. The server also speaks HTTP/1.1, so clients keep their
connections instead of opening one (and the server a thread) per request. Everything else is
moto's own code.

Run as ``python -m pytreestore.testing._moto_main -H 127.0.0.1 -p PORT``
(:class:`pytreestore.testing.s3.MotoServer` does).
"""

from __future__ import annotations

import functools
from typing import Any


def _remember_services() -> None:
    from moto import backends
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules  # type: ignore[assignment]
    find = DomainDispatcherApplication.get_backend_for_host

    @functools.wraps(find)
    def remembered(self: DomainDispatcherApplication, host: str | None) -> Any:
        known = self.__dict__.setdefault("_pytreestore_hosts", {})
        if host not in known:
            known[host] = find(self, host)
        return known[host]

    DomainDispatcherApplication.get_backend_for_host = remembered  # type: ignore[method-assign]


def _keep_connections() -> None:
    from moto.moto_server.werkzeug_app import MotoRequestHandler

    MotoRequestHandler.protocol_version = "HTTP/1.1"


def main() -> None:
    """Starts moto's server (its command-line arguments), lookups remembered, connections kept."""
    _remember_services()
    _keep_connections()
    from moto.server import main as moto_main

    moto_main()


if __name__ == "__main__":
    main()
