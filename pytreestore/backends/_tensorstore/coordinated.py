"""Writers sharing one OCDBT store through TensorStore's OCDBT coordinator.

:func:`ocdbt_coordinator` starts a coordinator server (``ts.ocdbt.DistributedCoordinatorServer``)
in this process; :class:`CoordinatedOcdbtBackend` is the OCDBT backend of one writer that
commits through it (``pytreestore.open(path, mode="a", backend="ocdbt", coordinator=ADDRESS)``).

What the coordinator gives and what it does not (TensorStore 0.1.86, read from
``tensorstore/kvstore/ocdbt/driver.cc`` and measured): each key's write, conditional writes
included, is atomic across every process of the coordinator, and B+tree leases keep
concurrent writers from rewriting each other's nodes; but with a coordinator OCDBT refuses an
atomic transaction over two keys ("Cannot read/write ... as single atomic transaction"). So
this backend does not declare :class:`~pytreestore.backends.Transactions`: its writes land one
by one, in the commit protocol's order (:mod:`pytreestore._commit.protocol`), and the writers
take turns through the commit claim (:mod:`pytreestore._commit.claim`). A coordinator that is gone fails every write that needs
a lease at once with ``UNAVAILABLE`` (a :class:`~pytreestore.errors.StorageError` here); one
that hangs is caught by the backend's ``timeout``.

Example:
    >>> with ocdbt_coordinator() as address:
    ...     address.startswith("127.0.0.1:")
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import tensorstore as ts

from pytreestore._location import Location
from pytreestore._runtime import RUNTIME
from pytreestore.backends._tensorstore.database import OcdbtDatabase
from pytreestore.errors import ArgumentError, BadLocationError, StorageError


@contextlib.contextmanager
def ocdbt_coordinator(host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Runs an OCDBT coordinator server in this process for the ``with`` block.

    Args:
        host: the address to bind; the default serves this machine only. The coordinator has
            no authentication: bind it only where every client is trusted.
        port: the port; 0 picks a free one.

    Yields:
        The coordinator's address, ``"HOST:PORT"``, for ``pytreestore.open(...,
        coordinator=address)`` in every writer process.

    Raises:
        StorageError: the server could not bind ``host:port``.

    Example:
        >>> with ocdbt_coordinator() as address:
        ...     int(address.rpartition(":")[2]) > 0
        True
    """
    try:
        server = ts.ocdbt.DistributedCoordinatorServer({"bind_addresses": [f"{host}:{port}"]})
    except ValueError as err:
        raise StorageError(
            f"cannot start an OCDBT coordinator on {host}:{port}: {err}. Choose another port "
            "(or port=0 for a free one)"
        ) from err
    try:
        yield f"{host}:{server.port}"
    finally:
        del server  # its destructor stops it


def check_address(address: object) -> str:
    """``address`` if it is ``"HOST:PORT"``, else ValueError saying what is expected."""
    host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ArgumentError(
            f"coordinator must be the address of an OCDBT coordinator, 'HOST:PORT' (for "
            f"example '127.0.0.1:5000', as pytreestore.backends.ocdbt_coordinator() yields), "
            f"got {address!r}"
        )
    return address  # type: ignore[return-value]


class CoordinatedOcdbtBackend(OcdbtDatabase):
    """The OCDBT backend of a writer that commits through the coordinator at ``address``.

    It has no transactions (:class:`~pytreestore.backends.Transactions`): through a
    coordinator OCDBT refuses a transaction over two keys, so every write lands on its own,
    in the commit protocol's order, as on the file kvstore, and the commit claim keeps the
    commits of writers apart. Its generations are kept and readable as on every OCDBT
    database (:class:`~pytreestore.backends.Snapshots`).

    Args:
        location: a local store (the OCDBT database's folder).
        address: the coordinator, ``"HOST:PORT"``.
        lease: seconds of each B+tree lease the writer asks the coordinator for.
        timeout: seconds one storage call may wait.

    Raises:
        BadLocationError: ``location`` is not a local directory.
    """

    def __init__(
        self,
        location: Location,
        address: str,
        *,
        lease: float = RUNTIME.waits.lease_s,
        timeout: float = RUNTIME.waits.coordinator_timeout_s,
    ) -> None:
        if location.kind != "file":
            raise BadLocationError(
                f"writers share a store through an OCDBT coordinator on local disk only, not "
                f"{location}; open it with mode='a' and no coordinator for one writer"
            )
        self.address = check_address(address)
        coordinator = {"address": self.address, "lease_duration": f"{lease:g}s"}
        super().__init__(location, ocdbt_options={"coordinator": coordinator})
        self._timeout = timeout


__all__ = [
    "CoordinatedOcdbtBackend",
    "check_address",
    "ocdbt_coordinator",
]
