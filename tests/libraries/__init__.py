"""Tests with the real libraries whose states users store: MJX, flax nnx, optax, jraph, gymnax
and equinox (one module per library, sharing :mod:`tests.libraries.harness`)."""
