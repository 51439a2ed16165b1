"""Background jobs on daemon threads, and the writers still open at the interpreter's exit.

Background jobs: work on daemon threads, stopped and waited for before the interpreter exits.

A daemon thread still inside TensorStore or XLA when Python finalizes is ended as it takes the
GIL back (CPython ends it with ``pthread_exit``), and that unwinding through C++ frames calls
``std::terminate``: "terminate called without an active exception", the process killed with
SIGABRT (exit 134) after the script's last line. So every job started here is asked to stop,
and waited for, while the interpreter is still whole: by the exit hook (:func:`stop_all`), and
by whoever holds its :class:`Job` (:meth:`Job.stop`, :meth:`Job.join`).

The exit hook is registered with ``atexit`` at first use (the first job, or the first writer
opened): ``atexit`` runs its hooks last registered first, after the program's non-daemon
threads have ended, so it runs before the hooks JAX and zarr-python register when they are
imported (JAX tearing its backends down, zarr-python closing its event loop), and after the
program's own hooks registered later (one that hands a last record to a thread appending,
joins it and closes the store, say). The work registered with :func:`at_exit` (the writers'
last flush) runs in it before the jobs are stopped.

A job is a function of one argument, a :class:`threading.Event` that is set when it should
stop; it polls the event between steps (each load of a prefetch, say) and returns. Threads are
reused because glibc gives a new thread its own malloc arena: with a fresh thread per job (one
per epoch of batches, say), freed batch buffers stayed in old arenas and the process's memory
grew with every epoch. An idle thread waits in a queue, outside any library call, where the
interpreter's end harms nothing. A child process made by ``os.fork`` has none of its parent's
threads: it forgets them (and their jobs) and starts its own.

Example:
    >>> import threading
    >>> from pytreestore import _threads as background
    >>> seen = []
    >>> job = background.start(lambda stopping: seen.append(stopping.is_set()))
    >>> job.join(); seen
    [False]

The writers still open at the interpreter's exit: each is held, then commits what was
appended, as ``close()`` would (issue 44).

A store still open at the exit loses nothing it acknowledged. At the exit (the ``atexit`` hook of
:mod:`pytreestore._threads`: once the program's non-daemon threads have ended, after the
program's own hooks registered since the store was opened, before JAX's) an ``extend``
still running on another thread stops at its next chunk, appending none of its records
(:data:`STOPPING`); every writer still open is then taken for good, so that a daemon thread
still appending waits there (and ends with the process) instead of refilling the background
writer or being inside TensorStore as Python finalizes (an abort); then each commits its
buffered records and the chunks it handed to the background writer. A store that cannot
commit says so on standard error, with what stays committed.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-exiting", {"x": np.int32(0)})
    >>> store._core in tracked()
    True
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Protocol

from pytreestore._runtime import RUNTIME, at_fork, thread
from pytreestore.errors import ClosedStoreError

Work = Callable[[threading.Event], None]


_LOCK = threading.Lock()


_IDLE: list[queue.SimpleQueue[tuple[Work, Job]]] = []  # the inboxes of idle threads


_RUNNING: set[Job] = set()  # jobs started and not yet ended


_HOOKED: list[bool] = []  # the exit and fork hooks are registered (once, at first use)


_EXITING = threading.Event()


_AT_EXIT: list[Callable[[], None]] = []  # run by the exit hook before the jobs are stopped


class Job:
    """One job on a background thread: the stop request it polls, and its end."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._ended = threading.Event()
        self._thread: int | None = None  # the thread running it, once it runs
        #: it was running when this process was forked from another: its thread is there
        self.forked = False

    @property
    def ended(self) -> bool:
        """Whether the job has returned (and dropped what it held)."""
        return self._ended.is_set()

    @property
    def here(self) -> bool:
        """Whether the caller runs on this job's thread."""
        return self._thread == threading.get_ident()

    def stop(self) -> None:
        """Asks the job to stop; it returns at its next look at :attr:`stopping`."""
        self.stopping.set()

    def join(self) -> None:
        """Waits until the job has returned; at once on the job's own thread (a job that
        drops the last reference to its own owner cannot wait for itself)."""
        if self._thread != threading.get_ident():
            self._ended.wait()


def start(work: Work) -> Job:
    """Runs ``work(stopping)`` on a background thread; the :class:`Job` to stop or wait for.

    A job started while the interpreter exits is asked to stop before it begins.
    """
    job = Job()
    with _LOCK:
        _hook()
        _RUNNING.add(job)
        inbox = _IDLE.pop() if _IDLE else None
    if _EXITING.is_set():
        job.stop()
    if inbox is None:
        inbox = queue.SimpleQueue()
        thread(_serve, (inbox,), "pytreestore-background")
    inbox.put((work, job))
    return job


def at_exit(work: Callable[[], None]) -> None:
    """Runs ``work()`` at the interpreter's exit, before the jobs are stopped (once, however
    often it is registered); an exception it raises is printed, and the exit goes on."""
    with _LOCK:
        _hook()
        if work not in _AT_EXIT:
            _AT_EXIT.append(work)


def stop_all() -> None:
    """Asks every running job to stop, then waits for each, and for jobs started meanwhile
    (each asked to stop before it begins), ``RUNTIME.waits.exit_rounds`` times at most (a
    thread still appending to a store the exit could not hold keeps starting them: the exit
    does not wait for it forever)."""
    _EXITING.set()
    for _ in range(RUNTIME.waits.exit_rounds):
        with _LOCK:
            jobs = list(_RUNNING)
        if not jobs:
            return
        for job in jobs:
            job.stop()
        for job in jobs:
            job.join()


def _hook() -> None:
    """Under the lock: registers the exit and fork hooks, once."""
    if _HOOKED:
        return
    atexit.register(_exit)
    at_fork(_forget_threads)
    _HOOKED.append(True)


def _exit() -> None:
    """The exit hook: the work of :func:`at_exit`, then every job stopped and waited for."""
    for work in list(_AT_EXIT):
        try:
            work()
        except BaseException:  # the exit goes on; the failure is shown
            traceback.print_exc()
    stop_all()


def _forget_threads() -> None:
    """In a child made by ``os.fork``: the parent's threads are not here, so its jobs count
    as ended (an inherited prefetcher yields what it had loaded, then raises, never ends as
    if its items were all loaded)."""
    global _LOCK
    _LOCK = threading.Lock()  # another thread may have held it at the fork
    for job in _RUNNING:
        job.forked = True
        job.stopping.set()
        job._ended.set()
    _IDLE.clear()
    _RUNNING.clear()
    for core in tracked():
        core.forked()  # every writer is the parent's


def _serve(inbox: queue.SimpleQueue[tuple[Work, Job]]) -> None:
    """A background thread: runs the jobs put in its inbox, one after another."""
    while True:
        work, job = inbox.get()
        job._thread = threading.get_ident()
        try:
            work(job.stopping)
        except BaseException as err:  # a job's own failure; the thread serves on
            sys.excepthook(type(err), err, err.__traceback__)
        finally:
            del work  # what the job held goes before it counts as ended
            with _LOCK:
                _RUNNING.discard(job)
                _IDLE.append(inbox)
            job._ended.set()
            del job


#: set as the exit begins: an ``extend`` still running stops (it appends none of its records)
STOPPING = threading.Event()


class Writing(Protocol):
    """What the exit asks of a store object holding a writer
    (:class:`~pytreestore._core.StoreCore`)."""

    @property
    def path(self) -> str: ...

    def committed_records(self) -> int: ...

    def hold_at_exit(self, wait: float) -> bool | None: ...

    def forked(self) -> None: ...

    def flush_at_exit(self) -> str | None: ...


_WRITERS: weakref.WeakSet[Writing] = weakref.WeakSet()


#: the threads whose ``extend`` the exit stopped: each is let end (and print its error) before
#: the interpreter finalizes, since a daemon thread still writing its traceback to standard
#: error as Python finalizes aborts the process ("Fatal Python error: _enter_buffered_busy")
_STOPPED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()


def track(core: Writing) -> None:
    """Counts ``core`` among the writers the exit commits (while it lives)."""
    _WRITERS.add(core)
    at_exit(end_writers)


def tracked() -> list[Writing]:
    """The store objects holding a writer, alive now."""
    return list(_WRITERS)


def end_writers() -> None:
    """The exit hook: every writer still open is held (no thread appends any more), then
    commits what was appended; what could not be is said on standard error."""
    STOPPING.set()
    held = {core: core.hold_at_exit(RUNTIME.waits.exit_wait_s) for core in tracked()}
    for core, hold in held.items():
        if hold is None:
            continue  # closed, or another process's
        busy = f"another thread held it {RUNTIME.waits.exit_wait_s:g} s: an extend still running?"
        problem = core.flush_at_exit() if hold else busy
        if problem is not None:
            print(
                f"pytreestore: at the interpreter's exit, store {core.path} (never closed) "
                f"could not commit the records appended since its last commit ({problem}); "
                f"they are lost, {core.committed_records()} stay committed. close() a store "
                "(or flush() it) before the program ends to see such a failure where it "
                "happens.",
                file=sys.stderr,
            )
    _let_stopped_end(RUNTIME.waits.exit_wait_s)


def _let_stopped_end(wait: float) -> None:
    """Waits, ``wait`` seconds at most in all, for the threads whose ``extend`` the exit
    stopped to end (a thread that catches the error and goes on is not waited for longer)."""
    deadline = time.monotonic() + wait
    for stopped_thread in list(_STOPPED):
        if stopped_thread is not threading.current_thread():
            stopped_thread.join(max(0.0, deadline - time.monotonic()))


def stopped(i: int) -> ClosedStoreError:
    """The error of an ``extend`` that the exit stopped at its record ``i`` (the thread
    raising it is let end before the interpreter finalizes)."""
    _STOPPED.add(threading.current_thread())
    return ClosedStoreError(
        f"the interpreter is exiting: extend() stopped at its record {i} and appended none of "
        "its records (those appended before it are committed by the exit). Let an extend end "
        "before the program does (join its thread), or close the store."
    )


__all__ = [
    "STOPPING",
    "Job",
    "Work",
    "Writing",
    "at_exit",
    "end_writers",
    "start",
    "stop_all",
    "stopped",
    "track",
    "tracked",
]
