"""Shared test settings: hypothesis profiles (select one with HYPOTHESIS_PROFILE=thorough) and
the one ``backend`` parametrization and ``path`` fixture of every test module.

A test that takes ``backend`` runs on every backend of :data:`BACKENDS`, unless it
parametrizes ``backend`` itself. One marked with a marker of :data:`OCDBT_LACKS` runs on
:data:`FILE_BACKENDS` only: ``plain_files`` (it reads, damages, links or lists the store's keys
as files on disk; OCDBT keeps them inside its database) or ``forked_reads`` (it reads in a
forked child, where TensorStore's reads abort). Mark a test so only where OCDBT truly lacks
that; a module where every test does, with ``pytestmark``.

A test marked ``slow`` runs only when ``-m`` names ``slow`` (``make test-long``); the default
run (``make test``) skips it.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Iterator, Sequence
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

import jax
import pytest
from hypothesis import HealthCheck, settings

from tests import durations
from tests.parity import kinds

#: every test process simulates 8 CPU devices (read only as JAX starts, so set before any test)
jax.config.update("jax_num_cpu_devices", 8)

settings.register_profile(
    "pytreestore",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=25,
)
settings.register_profile("thorough", parent=settings.get_profile("pytreestore"), max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "pytreestore"))

#: every backend a test of ``backend`` runs on (the parity matrix's: tensorstore, zarr, ocdbt)
BACKENDS = kinds.BACKENDS
#: the backends whose keys are plain files (``LocalFiles``), where marked tests run
FILE_BACKENDS = ("tensorstore", "zarr")

#: markers of what OCDBT lacks: a test so marked runs on :data:`FILE_BACKENDS` only
OCDBT_LACKS = {
    "plain_files": "reads, damages, links or lists the store's keys as plain files (OCDBT keeps "
    "them inside its database files)",
    "forked_reads": "reads in a forked child (TensorStore cannot run there: ForkedBackendError; "
    "OCDBT has no other reader)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, what in OCDBT_LACKS.items():
        config.addinivalue_line("markers", f"{name}: the test {what}; not run on OCDBT")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skips a test marked ``slow`` unless the run selects it with ``-m slow``."""
    if item.get_closest_marker("slow") and "slow" not in (item.config.getoption("markexpr") or ""):
        pytest.skip("a slow test: it runs with make test-long (pytest -m slow)")


def trials(default: int, full: int) -> list[Any]:
    """``range(full)`` as ``pytest.mark.parametrize`` values: the first ``default`` run in
    ``make test``, the rest are marked ``slow`` (``make test-long`` runs them all).

    Example:
        >>> [getattr(p, "values", (p,))[0] for p in trials(1, 3)]
        [0, 1, 2]
    """
    return [t if t < default else pytest.param(t, marks=pytest.mark.slow) for t in range(full)]


def tiered(cells: Sequence[Any], default: Sequence[Any]) -> list[Any]:
    """``cells`` as ``pytest.mark.parametrize`` values: those in ``default`` run in
    ``make test``, the rest are marked ``slow`` (``make test-long`` runs them all).

    A grid of kinds, backends and options often proves the same thing in many cells; the
    default tier keeps a covering subset (every kind and backend, and every pair of them where
    the behaviour depends on both) and the full grid still runs in the long tier.

    Example:
        >>> [bool(getattr(p, "marks", ())) for p in tiered(["a", "b"], ["a"])]
        [False, True]
    """
    return [c if c in default else pytest.param(*_values(c), marks=pytest.mark.slow) for c in cells]


def diagonal(kinds: Sequence[str], backends: Sequence[str], offset: int = 0) -> list[Any]:
    """A covering subset of ``kinds`` x ``backends``: each kind once, on the backends in turn
    (starting ``offset`` along), so each backend has a kind when there are at least as many
    kinds; two offsets cover two cells of each kind.

    Example:
        >>> diagonal(["a", "b", "c", "d"], ["x", "y", "z"], offset=1)
        [('a', 'y'), ('b', 'z'), ('c', 'x'), ('d', 'y')]
    """
    return [(k, backends[(i + offset) % len(backends)]) for i, k in enumerate(kinds)]


#: the dtypes the conformance suite's bit-for-bit case takes to S3 in ``make test``: each item
#: size (1, 2, 4, 8 and 16 bytes), a float8 and bfloat16. The S3 kvstores move a chunk's bytes
#: whatever they encode, and tests/test_conformance.py runs every dtype on every backend; the
#: rest of the dtypes go to S3 in ``make test-long``.
S3_DTYPES = ("bool", "bfloat16", "float8_e4m3fn", "int32", "uint64", "complex128")


def s3_dtypes() -> list[Any]:
    """Every supported dtype's name as ``parametrize`` values, those not in :data:`S3_DTYPES`
    marked ``slow``."""
    from pytreestore._format import dtypes

    return tiered(list(dtypes.SUPPORTED), S3_DTYPES)


def _values(cell: Any) -> tuple[Any, ...]:
    return cell if isinstance(cell, tuple) else (cell,)


def _parametrized(names: str | Sequence[str]) -> list[str]:
    return [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Runs each test that takes ``backend`` on :data:`BACKENDS` (:data:`FILE_BACKENDS` if
    marked with a marker of :data:`OCDBT_LACKS`), unless it parametrizes ``backend`` itself or
    its module defines a ``backend`` fixture."""
    if "backend" not in metafunc.fixturenames:
        return
    if metafunc._arg2fixturedefs.get("backend"):  # a module's own ``backend`` fixture
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        if "backend" in _parametrized(marker.args[0]):
            return
    lacks = any(metafunc.definition.get_closest_marker(name) for name in OCDBT_LACKS)
    metafunc.parametrize("backend", FILE_BACKENDS if lacks else BACKENDS)


@pytest.fixture
def path(tmp_path) -> str:
    """Where a test's store goes: ``s`` in its own temporary folder."""
    return str(tmp_path / "s")


def copying_cpu_puts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Makes the CPU copy what a load in pieces gives it, as an accelerator does (a CPU
    ``device_put`` may alias host memory), so the pieces' host buffers are reused from load
    to load (pytreestore/_read/slabs.py)."""
    import numpy as np

    from pytreestore._read import slabs
    from pytreestore._read import slabs as hostpool

    monkeypatch.setattr(hostpool, "ALIASING", set())
    monkeypatch.setattr(
        slabs,
        "_put",
        lambda arrays, device: [jax.device_put(np.array(a, copy=True), device) for a in arrays],
    )


def child_env() -> dict[str, str]:
    """The environment of a Python child process of a test: this checkout first on its
    ``PYTHONPATH`` (which keeps what it held: on an accelerator's host the packages live
    there), and JAX on the CPU (the parent may hold the chip)."""
    root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}


def cpu_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    """``jax.make_mesh`` over the simulated CPU devices: the same mesh on a CPU-only machine
    and on an accelerator's host, where the default devices are the one chip."""
    count = 1
    for n in shape:
        count *= n
    return jax.make_mesh(shape, names, devices=jax.devices("cpu")[:count])


@pytest.fixture
def eight_devices() -> list[jax.Device]:
    """The 8 simulated CPU devices every test process has (beside the chip, on an
    accelerator's host)."""
    devices = jax.devices("cpu")
    assert len(devices) >= 8, "JAX started before conftest set jax_num_cpu_devices"
    return devices[:8]


@pytest.fixture(scope="session")
def pool() -> Iterator[Pool]:
    """Two other processes, started once for the session, that tests of work done in another
    process share: forked from multiprocessing's ``forkserver``, which imports JAX and
    pytreestore once (it starts no thread, so its forks are clean), rather than two ``spawn``
    interpreters importing them each."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["numpy", "jax", "pytreestore"])
    with context.Pool(2) as workers:
        yield workers


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    """Ray on this machine, every address 127.0.0.1, two worker CPUs, the dataset's order
    kept; started once per test process, when the first test of ``tests/test_ray*.py`` needs
    it (``make test`` puts those modules on one worker: :func:`pytest_xdist_make_scheduler`),
    shut down at the end of the session."""
    import ray
    from ray._private import ray_constants

    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "PYTHONPATH")}
    # Ray binds its servers to the node's address, which is 127.0.0.1 only when it believes
    # it is on a one-machine platform: the variable for the processes it starts, the
    # constant for this one (read when ray was imported)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    cluster, ray_constants.ENABLE_RAY_CLUSTER = ray_constants.ENABLE_RAY_CLUSTER, False
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, saved["PYTHONPATH"]]))
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=False,
            configure_logging=False,
        )
    finally:  # the processes Ray started took the environment; the other tests' children
        _restore(saved)  # keep theirs (tests/interpreters.py compares it)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False
    assert ray.nodes()[0]["NodeManagerAddress"] == "127.0.0.1"
    yield
    with warnings.catch_warnings():  # the last test of the session, whichever it is, ends it
        warnings.simplefilter("ignore", DeprecationWarning)
        ray.shutdown()
    ray_constants.ENABLE_RAY_CLUSTER = cluster


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collects the modules longest first (``tests/durations.py``), each module's tests in
    their own order, so the worker that takes the last module has little left to run."""
    seconds = durations.load()
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], durations.UNKNOWN))


#: modules that share one Ray instance (:func:`local_ray`): ``make test`` runs them on one worker
RAY_MODULES = ("tests/test_ray.py", "tests/test_ray_read.py")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: the controller asks for a scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile`` (``make test``), a worker takes whole modules (their module
    fixtures, servers and child processes stay together), in the order collected, and the
    modules of :data:`RAY_MODULES` as one (their Ray starts once)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return "ray" if module in RAY_MODULES else module

    return ModuleScheduling(config, log)
