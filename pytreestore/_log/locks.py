"""Who may commit: the writer lock of a store's only writer, and the commit claim of writers sharing one.

One writer per store: an exclusive lock held while a store is open for writing.

* Local disk: ``flock`` on ``.pytreestore/lock``. The kernel releases it when the holder dies,
  so a writer killed with SIGKILL leaves no stale lock behind.
* ``memory://``: a set of held names within the process.
* S3 and GCS: a lock object ``.pytreestore/lock`` created with a conditional write (it is
  written only if absent), naming its holder: host, boot, pid namespace, pid and the pid's
  start time. A lock whose holder is provably dead (same host, boot and pid namespace, and
  that process gone) is replaced with a second conditional write, so exactly one of several
  writers racing to break it wins. A holder elsewhere cannot be proven dead; the error says
  who holds the lock and ``pytreestore.open(..., mode="a", break_lock=True)`` takes it over.
  The proof reads ``/proc`` (Linux): where it is missing, or hides other users' processes,
  no holder is provably dead and no lock is taken over unasked (see :func:`holder_is_dead`).

The lock keeps a second writer out; it does not by itself make commits safe. That is the
commit record's job: every commit is a conditional write on the generation the writer last
saw (:mod:`pytreestore._log.protocol`), so two writers can never both commit, lock or no lock.

Example:
    >>> from pytreestore._location import Location
    >>> lock = WriterLock.acquire(Location.parse("memory://doc-lock"))
    >>> lock.release()

The commit claim: how writers sharing a store (``open(mode="a", coordinator=...)``)
take turns to commit.

Through an OCDBT coordinator each key is written atomically, conditional writes included,
but a transaction over several keys is refused ("Cannot ... as single atomic transaction"),
so a commit (resizes, the tail chunk, the version record, the commit record, the root) cannot
be one atomic step. Writers therefore commit one at a time: a writer creates the claim
object ``.pytreestore/claim`` with a conditional write (only if absent), commits, and deletes
it with a conditional write on its own token. The claim names its holder (host, boot, pid
namespace, pid and start time, as the writer lock of object stores does,
:mod:`pytreestore._log.locks`) and when it expires.

A claim whose holder is provably dead (same host, boot and pid namespace, process gone) is
taken over at once; any other claim after it expires (``RUNTIME.waits.claim_s``). Two writers
racing to take a dead claim over both write conditionally on its token: one wins.

Example:
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import TensorStoreBackend
    >>> backend = TensorStoreBackend(Location.parse("memory://doc-claim"))
    >>> with CommitClaim.take(backend, "memory://doc-claim", wait=1.0):
    ...     backend.read_bytes(CLAIM_KEY) is not None
    True
    >>> backend.read_bytes(CLAIM_KEY) is None
    True
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import threading
import time
import uuid
from pathlib import Path

from pytreestore._format.keys import CLAIM_KEY, LOCK_KEY, NO_VALUE
from pytreestore._location import Location
from pytreestore._runtime import RUNTIME, flock_module
from pytreestore.backends import Backend, ConditionalWrites
from pytreestore.errors import CommitConflictError, StorageError, StoreLockedError

_HELD: set[str] = set()


_HELD_LOCK = threading.Lock()


#: where the kernel shows its processes (Linux); read only by :func:`holder_is_dead`'s proof
PROC = "/proc"


class WriterLock:
    """A held writer lock; :meth:`release` gives it back."""

    def __init__(
        self,
        location: Location,
        fd: int | None,
        backend: ConditionalWrites | None = None,
        token: bytes | None = None,
    ) -> None:
        self._location = location
        self._fd = fd
        self._backend = backend
        self._token = token
        self._pid = os.getpid()  # a forked child holds a copy, never the lock itself

    @classmethod
    def acquire(
        cls,
        location: Location,
        backend: Backend | None = None,
        *,
        break_lock: bool = False,
        shared: bool = False,
        sharing: bool = False,
    ) -> WriterLock:
        """Takes the lock or raises :class:`StoreLockedError` at once.

        Args:
            location: the store's location.
            backend: the store's backend; needed for S3 and GCS, whose lock is an object.
            break_lock: S3 and GCS only: take the lock over even from a holder that may be
                alive. Only for a writer known to be gone (a crashed host).
            shared: local disk only: a shared ``flock``, held by every writer sharing the
                store through an OCDBT coordinator (:mod:`pytreestore._write.coordinated`): they
                keep each other in, and an exclusive writer out (and are kept out by one).
                While the exclusive holder is a sharing writer repairing the store (``sharing``
                below), it is waited for (up to ``RUNTIME.waits.share_wait_s`` seconds).
            sharing: local disk only: exclusive, for a sharing writer that opens the store
                alone, repairs it and then calls :meth:`share`; the lock file says so.
        """
        if shared or sharing:
            if location.kind != "file":
                raise ValueError(f"a shared writer lock is for local stores, not {location}")
            if sharing:
                return cls(location, _acquire_flock(location, note="sharing "))
            return cls(location, _acquire_shared(location))
        if location.kind == "memory":
            with _HELD_LOCK:
                if location.root in _HELD:
                    raise _locked(location)
                _HELD.add(location.root)
            return cls(location, None)
        if location.is_object_store:
            if not isinstance(backend, ConditionalWrites):
                raise TypeError(f"the lock of {location} needs a backend with conditional writes")
            token = _acquire_object(location, backend, break_lock)
            return cls(location, None, backend, token)
        return cls(location, _acquire_flock(location))

    @property
    def owned(self) -> bool:
        """Whether this process took the lock (False in a process forked from the taker)."""
        return self._pid == os.getpid()

    def share(self) -> None:
        """Turns a held local ``flock`` into a shared one (the first writer sharing a store
        repairs it while it is still alone, then lets the others in).

        Raises:
            StoreLockedError: an exclusive writer took the lock in between (the kernel drops
                the old lock before it grants the new one); this lock is then released.
        """
        if self._fd is None:
            raise ValueError(
                f"only a local writer lock can be shared, not that of {self._location}"
            )
        fcntl = flock_module(self._location, "sharing the writer lock of")
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            location = self._location
            self.release()
            raise _locked(location) from None

    def release(self) -> None:
        """Gives the lock back; a second call does nothing.

        In a process forked from the one that took it, only this process's copy of the lock
        file's descriptor is closed: the ``flock`` (shared with the parent through the
        descriptor) and an object store's lock object stay the parent's.
        """
        if not self.owned:
            if self._fd is not None:
                os.close(self._fd)
        elif self._location.kind == "memory":
            with _HELD_LOCK:
                _HELD.discard(self._location.root)
        elif self._fd is not None:
            fcntl = flock_module(self._location, "releasing the writer lock of")
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
        elif self._backend is not None and self._token is not None:
            # a conditional delete: a lock someone has taken over since stays theirs
            with contextlib.suppress(StorageError):
                self._backend.write_bytes_if(LOCK_KEY, None, self._token)
        self._fd = None
        self._backend, self._token = None, None
        self._location = Location("released", "")


def _acquire_flock(location: Location, *, shared: bool = False, note: str = "") -> int:
    fcntl = flock_module(location, "taking the writer lock of")  # before anything is written
    path = Path(location.root) / LOCK_KEY
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _locked(location) from None
    if shared:
        return fd  # the file names the exclusive holder only
    os.ftruncate(fd, 0)
    os.write(fd, f"{note}{os.getpid()}\n".encode())
    return fd


def _acquire_shared(location: Location) -> int:
    """A shared ``flock``, waiting while a sharing writer holds it exclusively to repair."""
    deadline = time.monotonic() + RUNTIME.waits.share_wait_s
    while True:
        try:
            return _acquire_flock(location, shared=True)
        except StoreLockedError:
            holder = _read(str(Path(location.root) / LOCK_KEY))
            # empty: an exclusive holder between its flock and its note; look again
            if (holder and not holder.startswith("sharing ")) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def _acquire_object(location: Location, backend: ConditionalWrites, break_lock: bool) -> bytes:
    mine = json.dumps(holder_info()).encode()
    for _ in range(5):
        token = backend.write_bytes_if(LOCK_KEY, mine, NO_VALUE)
        if token is not None:
            _check_conditional_writes(location, backend, token, mine)
            return token
        raw, generation = backend.read_bytes_versioned(LOCK_KEY)
        if raw is None:
            continue  # released in between: try again
        holder = _parse_holder(raw)
        if not (break_lock or holder_is_dead(holder)):
            raise _locked(location, holder)
        token = backend.write_bytes_if(LOCK_KEY, mine, generation)
        if token is not None:
            return token
        # another writer replaced the stale lock first: look again
    raise _locked(location)


def _check_conditional_writes(
    location: Location, backend: ConditionalWrites, token: bytes, mine: bytes
) -> None:
    """Refuses servers that ignore ``If-None-Match``: with them no lock or commit is safe."""
    options = location.options
    if options is not None and not getattr(options, "conditional_write", True):
        return
    probe = backend.write_bytes_if(LOCK_KEY, mine, NO_VALUE)
    if probe is None:
        return
    backend.write_bytes_if(LOCK_KEY, None, probe)
    raise StorageError(
        f"the server of {location} ignored a conditional write (If-None-Match): it cannot "
        "keep two writers apart, so pytreestore will not write there. Use a server that "
        "supports conditional writes (AWS S3, MinIO, ...), or pass "
        "storage_options={'conditional_write': False} and make sure only one writer ever runs."
    )


def holder_info() -> dict[str, object]:
    """Who this process is, as a lock object records it."""
    pid = os.getpid()
    return {
        "owner": uuid.uuid4().hex,
        "host": socket.gethostname(),
        "boot_id": _read(f"{PROC}/sys/kernel/random/boot_id"),
        "pid_ns": _pid_namespace(),
        "pid": pid,
        "pid_start": _start_ticks(pid),
        "acquired": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def holder_is_dead(holder: dict[str, object]) -> bool:
    """Whether the lock's holder is provably gone: it ran here (same host, boot and pid
    namespace) and its process no longer exists (or its pid now belongs to another process).

    Anything that cannot be proven counts as alive, so a live writer's lock is never taken
    over: without ``/proc`` (not Linux) there is no boot id or pid namespace to compare, so
    no holder is provably gone; where ``/proc`` hides a process that exists (``hidepid``),
    its pid cannot be told from a reused one, so it is alive.
    """
    me = holder_info()
    same_machine = all(
        holder.get(k) and holder.get(k) == me[k] for k in ("host", "boot_id", "pid_ns")
    )
    pid = holder.get("pid")
    if not same_machine or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # the process exists, run by another user
    stat = _stat(pid)
    if stat is None:  # it exists, but /proc does not show it: whose it is cannot be told
        return False
    if stat[0] == "Z":  # a zombie: dead but not yet reaped
        return True
    return holder.get("pid_start") not in (None, stat[1])


def _parse_holder(raw: bytes) -> dict[str, object]:
    try:
        holder = json.loads(raw)
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _pid_namespace() -> str:
    try:
        return os.readlink(f"{PROC}/self/ns/pid")
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22)."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time, from ``/proc/PID/stat``; None if absent."""
    stat = _read(f"{PROC}/{pid}/stat")
    try:
        fields = stat.rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _locked(location: Location, holder: dict[str, object] | None = None) -> StoreLockedError:
    who = "another process or another TreeStore object holds its writer lock"
    if holder:
        who = (
            f"held by pid {holder.get('pid')} on host {holder.get('host')!r} "
            f"since {holder.get('acquired')}"
        )
    elif holder is not None:
        who = "held by a writer whose lock object cannot be read"
    hint = (
        " If that writer is gone for good (its host crashed), "
        "pytreestore.open(path, mode='a', break_lock=True) takes the lock over."
        if location.is_object_store
        else ""
    )
    return StoreLockedError(
        f"store {location} is open for writing elsewhere ({who}). "
        f"Close that writer first, or open this one with mode='r' to read.{hint}"
    )


class CommitClaim:
    """A held commit claim; leaving the ``with`` block (or :meth:`release`) gives it back."""

    def __init__(self, backend: ConditionalWrites, token: bytes) -> None:
        self._backend = backend
        self._token: bytes | None = token
        #: the token of this claim if giving it back failed (storage down): pass it to the
        #: next :meth:`take` as ``leftover``, which deletes it first
        self.left: bytes | None = None

    @classmethod
    def take(
        cls,
        backend: ConditionalWrites,
        where: str,
        *,
        wait: float = RUNTIME.waits.claim_wait_s,
        leftover: bytes | None = None,
    ) -> CommitClaim:
        """Takes the claim, waiting up to ``wait`` seconds while a live writer holds it;
        ``leftover`` (a claim of the caller's that could not be given back, :attr:`left`)
        is deleted first, if it is still there.

        Raises:
            CommitConflictError: another live writer held the claim for all of ``wait``.
            StorageError: storage (or the coordinator) could not be reached.
        """
        if leftover is not None:
            backend.write_bytes_if(CLAIM_KEY, None, leftover)
        deadline = time.monotonic() + wait
        pause = 0.0005
        while True:
            mine = _claim_json()
            token = backend.write_bytes_if(CLAIM_KEY, mine, NO_VALUE)
            if token is not None:
                return cls(backend, token)
            raw, generation = backend.read_bytes_versioned(CLAIM_KEY)
            holder = _parse(raw)
            if raw is not None and (holder_is_dead(holder) or _expired(holder)):
                token = backend.write_bytes_if(CLAIM_KEY, mine, generation)
                if token is not None:
                    return cls(backend, token)
            if time.monotonic() > deadline:
                raise _busy(where, holder, wait)
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 0.005)  # a commit takes a few ms: look again soon

    def release(self) -> None:
        """Deletes the claim if it is still this writer's; a second call does nothing.

        A storage failure here leaves the claim behind (its token kept as :attr:`left`),
        which the holder's next :meth:`take`, its expiry or this process's death frees; the
        commit it guarded stands or fails on its own.
        """
        token, self._token = self._token, None
        if token is None:
            return
        try:
            self._backend.write_bytes_if(CLAIM_KEY, None, token)
        except StorageError:
            self.left = token

    def __enter__(self) -> CommitClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _claim_json() -> bytes:
    return json.dumps({**holder_info(), "expires": time.time() + RUNTIME.waits.claim_s}).encode()


def _parse(raw: bytes | None) -> dict[str, object]:
    try:
        holder = json.loads(raw) if raw is not None else {}
    except ValueError:
        return {}  # damaged: it expires like any other (no expiry: at once)
    return holder if isinstance(holder, dict) else {}


def _expired(holder: dict[str, object]) -> bool:
    expires = holder.get("expires")
    if not isinstance(expires, int | float) or isinstance(expires, bool):
        return True  # not a claim this format writes: nothing keeps it
    return time.time() > expires


def _busy(where: str, holder: dict[str, object], wait: float) -> CommitConflictError:
    who = (
        f"pid {holder.get('pid')} on host {holder.get('host')!r} since {holder.get('acquired')}"
        if holder
        else "another writer"
    )
    return CommitConflictError(
        f"could not commit to {where} within {wait:g} s: its commit claim ({CLAIM_KEY}) is held "
        f"by {who}, and writers sharing a store commit one at a time; nothing was committed by "
        "this writer. A claim whose holder died on this host is taken over at once, any other "
        f"after {RUNTIME.waits.claim_s:g} s"
    )


__all__ = ["CommitClaim"]
