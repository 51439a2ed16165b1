"""pytest fixtures of the reliability tests: a real S3-compatible server (``moto_server`` on
127.0.0.1) and the zygote that forks writer and reader processes. A test module uses them with
``pytest_plugins = ("tests.fixtures",)``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pytreestore.testing.s3 import CLIENT_ENV, MotoServer
from tests.trial_harness import Zygote


@pytest.fixture(scope="session")
def _moto() -> Iterator[MotoServer]:
    """One moto server per test process, started when a module first needs it (each start
    imports moto and Flask); every test makes its own bucket."""
    with MotoServer() as server:
        yield server


@pytest.fixture(scope="module")
def s3_server(_moto: MotoServer) -> Iterator[MotoServer]:
    """The moto server, with the AWS environment variables a client needs for the module."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in CLIENT_ENV.items():
            mp.setenv(k, v)
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
            mp.delenv(k, raising=False)
        yield _moto


@pytest.fixture
def bucket(s3_server: MotoServer) -> str:
    """A fresh, empty bucket on the module's server."""
    return s3_server.make_bucket()


@pytest.fixture(scope="session")
def zygote() -> Iterator[Zygote]:
    """One zygote for the session: pytreestore is imported once, not once per process."""
    z = Zygote(env=CLIENT_ENV)
    yield z
    z.close()
