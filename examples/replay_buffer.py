"""An RL replay buffer in a store: gymnax CartPole rollouts added, sampled, a DQN update.

    python examples/replay_buffer.py [DIRECTORY]

Collects CartPole-v1 transitions with an epsilon-greedy linear Q-function (a jitted scan over
steps of 16 vmapped environments), adds each rollout to a replay buffer
(``store.replay(capacity)``: every transition appended to the store, the last ``capacity``
kept in host memory), and trains the Q-function with double-Q TD updates on samples of 256.
Checks that samples are exactly transitions of the last ``capacity`` as the store holds
them, that training lowers the TD loss, and that reopening the store resumes the buffer with
the same window. DIRECTORY defaults to a temporary one.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import numpy as np

import pytreestore

ENVS, STEPS, ROUNDS, UPDATES = 16, 64, 4, 10
CAPACITY, BATCH, GAMMA, LR = 2_000, 256, 0.99, 0.05

env, env_params = gymnax.make("CartPole-v1")


def q_values(w: jax.Array, obs: jax.Array) -> jax.Array:
    """A linear Q-function: one value per action."""
    return jnp.concatenate([obs, jnp.ones((*obs.shape[:-1], 1))], -1) @ w


@jax.jit
def rollout(key: jax.Array, w: jax.Array, start: jax.Array) -> dict[str, jax.Array]:
    """``STEPS`` steps of ``ENVS`` environments, epsilon-greedy: transitions ``[STEPS, ENVS]``
    numbered from ``start``."""
    key, reset_key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, (0, None))(jax.random.split(reset_key, ENVS), env_params)

    def step(carry, i):
        key, obs, state = carry
        key, explore, pick, step_key = jax.random.split(key, 4)
        greedy = jnp.argmax(q_values(w, obs), -1)
        random = jax.random.randint(pick, (ENVS,), 0, 2)
        action = jnp.where(jax.random.uniform(explore, (ENVS,)) < 0.2, random, greedy)
        step_keys = jax.random.split(step_key, ENVS)
        next_obs, state, reward, done, _, info = jax.vmap(env.step, (0, 0, 0, None))(
            step_keys, state, action, env_params
        )  # next_obs starts the next episode where this one ended: the TD target needs
        # the last observation of the episode (and is cut only where it terminated)
        number = start + i * ENVS + jnp.arange(ENVS, dtype=jnp.int32)
        transition = {
            "obs": obs,
            "action": action.astype(jnp.int32),
            "reward": reward.astype(jnp.float32),
            "next_obs": info["final_observation"],
            "done": done,
            "number": number,
        }
        return (key, next_obs, state), transition

    _, out = jax.lax.scan(step, (key, obs, state), jnp.arange(STEPS, dtype=jnp.int32))
    return jax.tree.map(lambda x: x.reshape(STEPS * ENVS, *x.shape[2:]), out)


def td_loss(w: jax.Array, target: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    """The mean squared TD error of a batch of transitions, vmapped over the transitions."""

    def one(t: dict[str, jax.Array]) -> jax.Array:
        best = jnp.argmax(q_values(w, t["next_obs"]))
        bootstrap = q_values(target, t["next_obs"])[best] * (1.0 - t["done"])
        y = jax.lax.stop_gradient(t["reward"] + GAMMA * bootstrap)
        return (q_values(w, t["obs"])[t["action"]] - y) ** 2

    return jnp.mean(jax.vmap(one)(batch))


@jax.jit
def update(w: jax.Array, target: jax.Array, batch: dict[str, jax.Array]) -> jax.Array:
    return w - LR * jax.grad(td_loss)(w, target, batch)


def main(directory: Path) -> None:
    path = directory / "cartpole"
    like = jax.tree.map(
        lambda x: np.asarray(x[0]), rollout(jax.random.key(0), jnp.zeros((5, 2)), 0)
    )
    store = pytreestore.create(path, like, keep_versions=2)  # vacuum frees released chunks
    buffer = store.replay(CAPACITY, seed=0)
    key = jax.random.key(1)
    w = 0.01 * jax.random.normal(key, (5, 2))
    for _ in range(ROUNDS):
        key, collect = jax.random.split(key)
        buffer.add_batch(rollout(collect, w, store.dropped + len(store)))
        target = w
        for _ in range(UPDATES):
            key, draw = jax.random.split(key)
            w = update(w, target, buffer.sample(BATCH, draw))
    total = ROUNDS * STEPS * ENVS
    assert store.dropped + len(store) == total and len(buffer) == CAPACITY
    assert CAPACITY <= len(store) < 2 * CAPACITY  # the older ones released (bounded disk)
    print(
        f"{total:,} transitions added, the store keeps {len(store):,}, the buffer samples "
        f"the last {len(buffer):,}"
    )

    sample = buffer.sample(BATCH, as_numpy=True)
    drawn = sample["number"]
    assert drawn.min() >= total - CAPACITY and drawn.max() < total
    jax.tree.map(
        np.testing.assert_array_equal, sample, store.load(drawn - store.dropped, as_numpy=True)
    )
    print("samples are exactly transitions of the last capacity, as the store holds them")

    batch = buffer.sample(BATCH, jax.random.key(2))
    before, fitted = float(td_loss(w, w, batch)), w
    for _ in range(30):
        fitted = update(fitted, w, batch)
    after = float(td_loss(fitted, w, batch))
    assert np.isfinite(after) and after < before, (before, after)
    print(f"TD loss on a sample: {before:.4f} -> {after:.4f}")

    draw = jax.random.key(3)
    kept = buffer.sample(BATCH, draw, as_numpy=True)
    store.close()
    resumed = pytreestore.open(path, mode="a").replay(CAPACITY)
    jax.tree.map(np.testing.assert_array_equal, resumed.sample(BATCH, draw, as_numpy=True), kept)
    resumed.store.close()
    print("a reopened store resumes the buffer with the same window")
    print("replay buffer: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
