"""equinox Modules (already supported; one case here so the set of libraries is complete):
a module with a static field and a function, and a list of submodules, trained a few steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import pytest

from tests.libraries.harness import BACKENDS, Case, Results, write_and_read
from tests.trial_harness import Zygote

eqx = pytest.importorskip("equinox")

pytest_plugins = ("tests.fixtures",)

STEPS = 3


class Net(eqx.Module):
    """Two linear layers, their activation (a static function) and a static tag."""

    layers: list[Any]
    activation: Callable[[Any], Any] = eqx.field(static=True)
    tag: str = eqx.field(static=True)

    def __call__(self, x: Any) -> Any:
        for layer in self.layers:
            x = self.activation(layer(x))
        return x


def net() -> Net:
    k1, k2 = jax.random.split(jax.random.key(0))
    return Net([eqx.nn.Linear(3, 4, key=k1), eqx.nn.Linear(4, 1, key=k2)], jax.nn.relu, "v1")


def trained() -> list[Net]:
    """The module after each of :data:`STEPS` gradient steps (plain SGD)."""
    model, out = net(), []
    x = jnp.linspace(-1, 1, 3)
    for _ in range(STEPS):
        out.append(model)
        grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(model)
        model = jax.tree.map(lambda p, g: p - 0.1 * g, model, grads)
    return out


CASES = {"module": Case(trained, "net")}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory, zygote: Zygote) -> Iterator[Results]:
    yield write_and_read(__name__, CASES, tmp_path_factory.mktemp("equinox"), zygote)


@pytest.mark.parametrize("backend", BACKENDS)
def test_module(results: Results, backend: str) -> None:
    results.check("module", backend)
