"""Python child processes of tests, forked from one interpreter that imported JAX and pytreestore.

A test that runs a script, ``python -c CODE`` or ``python -m MODULE`` in another process pays
for a fresh interpreter importing numpy, JAX, TensorStore, zarr and pytreestore: 4-5 s of CPU
on a 2-core machine, a third of the suite's CPU over about a hundred such processes. Here each
test process starts one *zygote* (``python tests/zygote.py FD``) the first time it needs one;
it imports :data:`PRELOAD` (which starts no thread and does not initialise JAX's backend) and
then forks one child per program it is sent. The child takes the program's argv, environment,
working directory, standard input, output and error (the test's pipes, passed as file
descriptors), becomes ``__main__`` as the interpreter would make it, and ends as an interpreter
ends: by returning or ``sys.exit`` through the interpreter's own shutdown (non-daemon threads
joined, ``atexit`` hooks run), or with a traceback on standard error and status 1.

:func:`popen` and :func:`run` take :class:`subprocess.Popen`'s and :func:`subprocess.run`'s
arguments. A command the zygote cannot run as a fresh interpreter would (interpreter options but
``-u`` and ``-W``,
``pass_fds``, ``preexec_fn``, a new session, or an environment that differs from the
zygote's in a variable read as an interpreter or a library starts: :data:`STARTUP`) runs as a
plain subprocess instead. What a fork does not give, and so what needs a plain subprocess
(``subprocess.run``): a test of what ``import pytreestore`` imports or does, or of anything
else that happens as numpy, JAX, TensorStore, zarr or pytreestore are imported (they are
imported already), and a different interpreter binary. A forked child has the zygote's hash
seed and is the zygote's child, not the test's.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
#: what the zygote imports before it forks (what nearly every child program imports)
PRELOAD = ("numpy", "jax", "jax.numpy", "pytreestore")
#: environment variables read as the interpreter or a preloaded library starts: a child whose
#: environment differs from the zygote's in one of them runs as a plain subprocess
STARTUP = ("PYTHON", "JAX_", "XLA_", "TF_", "TPU_", "LIBTPU", "TENSORSTORE", "ZARR", "NUMPY")
STARTUP += ("OPENBLAS", "OMP_", "MKL_", "LD_", "LC_", "LANG", "MALLOC", "CUDA")


def popen(args: Sequence[str | os.PathLike[str]], **kwargs: Any) -> subprocess.Popen[Any]:
    """:class:`subprocess.Popen`, forked from the zygote where the command allows it.

    Args:
        args: ``[sys.executable, SCRIPT | -c CODE | -m MODULE, *ARGS]``, or the path of a
            console script of this interpreter's environment and its arguments.
        **kwargs: :class:`subprocess.Popen`'s keyword arguments.

    Returns:
        A :class:`ForkedPopen` or, where the command needs it, a :class:`subprocess.Popen`.
    """
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    if _program(args) is None or not _forkable(kwargs) or not _client().accepts(env):
        return subprocess.Popen(args, **kwargs)
    return ForkedPopen(args, **kwargs)


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """:func:`subprocess.run` through :func:`popen`: the same arguments and result."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    with popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except BaseException:
            process.kill()
            process.wait()
            raise
        code = process.poll()
        assert code is not None
        if check and code:
            raise subprocess.CalledProcessError(code, process.args, stdout, stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)


class ForkedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """A :class:`subprocess.Popen` whose child is forked by the zygote, not executed."""

    # what the POSIX Popen keeps and does (CPython's Lib/subprocess.py), untyped in typeshed
    _waitpid_lock: threading.Lock
    _zygote: _Client
    _close_pipe_fds: Any
    _handle_exitstatus: Any

    def _execute_child(  # type: ignore[override]
        self,
        args: Sequence[Any],
        executable: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Any,
        cwd: Any,
        env: Mapping[str, str] | None,
        startupinfo: Any,
        creationflags: Any,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        *rest: Any,
    ) -> None:
        fds = [p2cread, c2pwrite, errwrite]
        job = {
            "program": _program(args),
            "env": dict(os.environ if env is None else env),
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
        }
        self._zygote = _client()  # the one that forked it reports its exit
        self.pid = self._zygote.spawn(job, [fd if fd != -1 else i for i, fd in enumerate(fds)])
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        status = self._zygote.wait(self.pid, block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)

    def _internal_poll(self, _deadstate: Any = None, *args: Any, **kwargs: Any) -> int | None:
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    pid, status = self._try_wait(os.WNOHANG)
                    if pid == self.pid:
                        self._handle_exitstatus(status)
            finally:
                self._waitpid_lock.release()
        return self.returncode


def _forkable(kwargs: Mapping[str, Any]) -> bool:
    plain = ("preexec_fn", "pass_fds", "start_new_session", "process_group", "shell")
    plain += ("user", "group", "extra_groups", "umask", "executable")
    return not any(kwargs.get(name) not in (None, False, (), -1) for name in plain)


def _program(args: Sequence[str | os.PathLike[str]] | str) -> list[str] | None:
    """The command as ``[OPTIONS, KIND, TARGET, *ARGS]``: ``OPTIONS`` the ``-u`` and ``-W ARG``
    options it gives (``"u"`` and ``"W:ARG"`` words in one string), ``KIND`` ``script``, ``-c``
    or ``-m``; None for a command this interpreter does not run so (another program, other
    options)."""
    if isinstance(args, (str, bytes)) or not args:
        return None
    argv = [os.fspath(a) for a in args]
    if not all(isinstance(a, str) for a in argv):
        return None
    if argv[0] != sys.executable:
        return ["", "script", *argv] if _console_script(str(argv[0])) else None
    options, rest = [], [str(a) for a in argv[1:]]
    while rest and rest[0] in ("-u", "-W"):
        option = rest.pop(0)
        options.append("u" if option == "-u" else f"W:{rest.pop(0) if rest else ''}")
    if rest and rest[0] in ("-c", "-m") and len(rest) >= 2:
        return [" ".join(options), *rest]
    if rest and not rest[0].startswith("-"):
        return [" ".join(options), "script", *rest]
    return None


def _console_script(path: str) -> bool:
    """Whether ``path`` is a Python script run by this interpreter (``#!`` + ``sys.executable``)."""
    try:
        with open(path, "rb") as file:
            first = file.readline(4096)
    except OSError:
        return False
    return first.strip() == b"#!" + os.fsencode(sys.executable)


# ---- the test side ---------------------------------------------------------------------------


class _Client:
    """The test process's end of its zygote: starts it, sends jobs, collects exit statuses."""

    def __init__(self) -> None:
        from tests.conftest import child_env

        self.env = child_env()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        self.sock = mine
        self.lock = threading.Lock()
        self.exits: dict[int, int] = {}
        self.pids: list[int] = []
        self.pending = b""
        self.owner = os.getpid()
        self._read(timeout=600.0, until=lambda: bool(self.pids))  # "ready"
        self.pids.clear()

    def accepts(self, env: Mapping[str, str]) -> bool:
        """Whether a child with ``env`` starts as a fresh interpreter with it would."""

        def startup(e: Mapping[str, str]) -> dict[str, str]:
            return {k: v for k, v in e.items() if k.startswith(STARTUP)}

        return startup(env) == startup(self.env)

    def spawn(self, job: dict[str, Any], fds: list[int]) -> int:
        """Sends ``job`` with the child's standard ``fds``; the forked child's pid."""
        with self.lock:
            socket.send_fds(self.sock, [json.dumps(job).encode() + b"\n"], fds)
            self._read(timeout=120.0, until=lambda: bool(self.pids))
            return self.pids.pop()

    def wait(self, pid: int, *, block: bool) -> int | None:
        """Child ``pid``'s wait status, or None if it has not exited (and ``block`` is false)."""
        while True:
            with self.lock:
                if pid not in self.exits:
                    self._read(timeout=0.05 if block else 0.0, until=lambda: pid in self.exits)
                if pid in self.exits:
                    return self.exits.pop(pid)
            if not block:
                return None

    def _read(self, timeout: float, until: Any) -> None:
        deadline, first = time.monotonic() + timeout, True
        while not until():
            left = deadline - time.monotonic()
            if left < 0 and not first:
                return
            first = False
            self.sock.settimeout(max(left, 0.0))
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, BlockingIOError):
                return
            if not data:
                raise RuntimeError(f"the test zygote died (exit {self.proc.poll()})")
            self.pending += data
            *lines, self.pending = self.pending.split(b"\n")
            for line in lines:
                word, *rest = line.decode().split()
                if word == "exit":
                    self.exits[int(rest[0])] = int(rest[1])
                elif word in ("pid", "ready"):
                    self.pids.append(int(rest[0]))

    def close(self) -> None:
        if os.getpid() == self.owner:
            self.sock.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


_CLIENT: list[_Client] = []
_STARTING = threading.Lock()


def _client() -> _Client:
    """This test process's zygote, started at first use (by one thread of those asking)."""
    with _STARTING:
        if not _CLIENT or _CLIENT[0].owner != os.getpid():
            _CLIENT[:] = [_Client()]
            import atexit

            atexit.register(_CLIENT[0].close)
        return _CLIENT[0]


# ---- the zygote ------------------------------------------------------------------------------


def serve(fd: int) -> dict[str, Any] | None:
    """Forks a child per job read from socket ``fd``; in a child, returns its job.

    Replies ``ready 0`` once :data:`PRELOAD` is imported, ``pid N`` per job and ``exit N
    STATUS`` per child that ended. Returns None (the zygote ends) when the test process
    closes its end. It starts no thread, so every fork is of a one-thread process.
    """
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=fd)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    import gc

    gc.freeze()  # the children's collections skip what the zygote made (fewer pages copied)
    sock.sendall(b"ready 0\n")
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_read:
                os.read(wake_read, 4096)
                _reap(sock)
                continue
            message, fds, _, _ = socket.recv_fds(sock, 1 << 22, 3)
            if not message:
                return None
            pid = os.fork()
            if pid == 0:
                for own in (wake_read, wake_write):
                    os.close(own)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                return {**json.loads(message), "fd_list": fds}
            for passed in fds:
                os.close(passed)
            sock.sendall(f"pid {pid}\n".encode())


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.sendall(f"exit {pid} {status}\n".encode())


def become(job: dict[str, Any]) -> None:
    """Turns this forked child into the job's fresh interpreter and runs its program."""
    for target, fd in enumerate(job["fd_list"]):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    options, kind, target, *args = job["program"]
    _reopen_standard_streams(unbuffered="u" in options.split())
    warnings = [word[2:] for word in options.split() if word.startswith("W:")]
    if warnings:
        import warnings as module

        sys.warnoptions.extend(warnings)
        # what the interpreter does with -W
        module._processoptions(warnings)  # pyright: ignore[reportAttributeAccessIssue]
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    import random
    import tempfile

    import numpy as np

    tempfile.tempdir = None
    random.seed()
    np.random.seed()
    sys.orig_argv = [sys.executable, *([] if kind == "script" else [kind]), target, *args]
    if kind == "-m":
        sys.argv, sys.path[0] = ["-m", *args], os.getcwd()
        import runpy

        # what ``python -m`` calls
        runpy._run_module_as_main(target, alter_argv=True)  # pyright: ignore[reportAttributeAccessIssue]
        return
    _run_main(kind, target, args)


def _run_main(kind: str, target: str, args: list[str]) -> None:
    """Runs a script or ``-c`` code as ``__main__``, as the interpreter does."""
    import builtins
    import types
    from importlib.machinery import BuiltinImporter, SourceFileLoader

    main = types.ModuleType("__main__")
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    if kind == "-c":
        sys.argv, sys.path[0] = ["-c", *args], ""
        main.__loader__ = BuiltinImporter  # type: ignore[assignment]
        code = compile(target, "<string>", "exec", dont_inherit=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
        main.__file__, main.__cached__ = target, None  # type: ignore[attr-defined]
        main.__loader__ = SourceFileLoader("__main__", target)
        code = compile(Path(target).read_bytes(), target, "exec", dont_inherit=True)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _reopen_standard_streams(unbuffered: bool) -> None:
    """New ``sys.stdin``/``stdout``/``stderr`` on the new descriptors, buffered as the
    interpreter would buffer them (a terminal line by line; none with ``-u``)."""
    import io

    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        if fd == 0:
            buffered: Any = io.BufferedReader(raw)
        else:
            buffered = raw if unbuffered else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffered,
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=not unbuffered and (fd == 2 or (fd == 1 and os.isatty(1))),
            write_through=unbuffered or fd == 2,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


if __name__ == "__main__":
    child_job = serve(int(sys.argv[1]))
    if child_job is not None:
        become(child_job)
