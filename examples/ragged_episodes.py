"""Episodes of varying length in one ragged store, loaded padded with a mask and vmapped.

    python examples/ragged_episodes.py [DIRECTORY]

Plays 64 episodes of a toy random walk, each 3 to 40 steps long, and keeps every step's
observation, action and reward in a store whose ``steps`` share one ragged leading axis
(``ragged=["['steps']"]``). Then loads all episodes padded to one length with a mask (``load(
pad_to=...)``, one shape, so ``jit`` compiles once), computes each episode's discounted return
with a ``vmap``ped masked scan, and checks the masked mean return against a plain Python loop
over the exact episodes read back one by one. DIRECTORY defaults to a temporary one.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import pytreestore

EPISODES, GAMMA = 64, 0.97


def episode(rng: np.random.Generator, i: int) -> dict:
    """One episode: a walk on a line that ends when it leaves [-3, 3] (or after 40 steps)."""
    obs, actions, rewards, x = [], [], [], 0.0
    for _ in range(40):
        action = int(rng.integers(0, 2))
        x += (1.0 if action else -1.0) + rng.normal(0, 0.1)
        obs.append([x, x * x, 1.0])
        actions.append(action)
        rewards.append(1.0 - abs(x) / 3)
        if abs(x) > 3 and len(obs) >= 3:
            break
    return {
        "episode": np.int32(i),
        "steps": {
            "obs": np.asarray(obs, np.float32),
            "action": np.asarray(actions, np.int32),
            "reward": np.asarray(rewards, np.float32),
        },
    }


def discounted_return(rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """The discounted return of one padded episode: padded steps add nothing."""

    def step(carry: jax.Array, rm: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
        reward, valid = rm
        return jnp.where(valid, reward + GAMMA * carry, carry), None

    total, _ = jax.lax.scan(step, jnp.float32(0), (rewards, mask), reverse=True)
    return total


def main(directory: Path) -> None:
    rng = np.random.default_rng(0)
    like = episode(np.random.default_rng(1), 0)
    path = directory / "episodes.store"
    with pytreestore.create(path, like, ragged=["['steps']"], overwrite=True) as store:
        store.extend(episode(rng, i) for i in range(EPISODES))

    store = pytreestore.open(path)
    lengths = store.lengths()["['steps']"]
    print(f"{len(store)} episodes of {lengths.min()} to {lengths.max()} steps")
    longest = int(lengths.max())
    batch, mask = store.load(pad_to=longest)  # every episode padded to the longest
    assert batch["steps"]["reward"].shape == (EPISODES, longest)
    returns = jax.jit(jax.vmap(discounted_return))(
        batch["steps"]["reward"], mask["steps"]["reward"]
    )
    assert int(mask["steps"]["reward"].sum()) == int(lengths.sum())

    loop = []  # the reference: a Python loop over the exact, unpadded episodes
    for record in store.records(as_numpy=True):
        total = 0.0
        for reward in record["steps"]["reward"][::-1]:
            total = float(reward) + GAMMA * total
        loop.append(total)
    np.testing.assert_allclose(np.asarray(returns), loop, rtol=1e-5, atol=1e-5)
    rewards, valid = batch["steps"]["reward"], mask["steps"]["reward"]
    per_step = float(jnp.sum(jnp.where(valid, rewards, 0)) / jnp.sum(valid))
    every = [float(r) for rec in store.records(as_numpy=True) for r in rec["steps"]["reward"]]
    np.testing.assert_allclose(per_step, np.mean(every), rtol=1e-5)
    print(f"mean discounted return {float(returns.mean()):.4f}, mean reward a step {per_step:.4f}")
    print("masked mean return matches a Python loop over the episodes")
    print("ragged_episodes example OK")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
