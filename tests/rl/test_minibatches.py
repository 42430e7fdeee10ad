"""rl.core.minibatches.minibatch_epochs: epochs of shuffled minibatches, each epoch a fresh
permutation of the batch, optionally over a batch refreshed from the carry at each later epoch's
start."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rl.core import minibatches


def test_each_epoch_passes_once_over_a_fresh_permutation_of_the_batch():
    """Every epoch's minibatches hold every batch row exactly once, the leaves of a row stay
    together, the epochs' orders differ, and the stats stack as [num_epochs, num_minibatches]."""
    batch = {"x": jnp.arange(12.0), "y": 10 * jnp.arange(12)[:, None] + jnp.arange(2)}
    step = lambda carry, minibatch: (carry + 1, minibatch)
    count, seen = minibatches.minibatch_epochs(
        step, jnp.int32(0), batch, jax.random.PRNGKey(0), 3, 4
    )
    assert int(count) == 12
    assert seen["x"].shape == (3, 4, 3) and seen["y"].shape == (3, 4, 3, 2)
    for epoch in range(3):
        np.testing.assert_array_equal(np.sort(np.ravel(seen["x"][epoch])), np.arange(12.0))
    np.testing.assert_array_equal(seen["y"][..., 0], 10 * seen["x"].astype(np.int32))
    orders = {tuple(np.ravel(seen["x"][epoch]).tolist()) for epoch in range(3)}
    assert len(orders) == 3
    unrolled = minibatches.minibatch_epochs(
        step, jnp.int32(0), batch, jax.random.PRNGKey(0), 3, 4, unroll=4
    )
    for a, b in zip(jax.tree.leaves(unrolled), jax.tree.leaves((count, seen))):
        np.testing.assert_array_equal(a, b)


def test_minibatch_epochs_refresh_gives_each_later_epoch_a_batch_from_its_carry():
    """Epoch 1 passes over `batch`; epochs 2 and 3 over refresh(carry at their start, batch). The
    toy step adds each minibatch's sum to the carry, so the carry after the epochs is known by hand.
    """
    batch = jnp.arange(8.0)
    step = lambda carry, minibatch: (carry + minibatch.sum(), minibatch.sum())
    refresh = lambda carry, batch: batch + carry
    carry, stats = minibatches.minibatch_epochs(
        step, jnp.float32(0), batch, jax.random.PRNGKey(0), 3, 2, refresh=refresh
    )
    # epoch 1: 28; epoch 2 over batch + 28: 28 + 8 * 28 = 252, carry 280; epoch 3 over
    # batch + 280: 28 + 8 * 280, carry 2548
    assert float(carry) == 2548.0 and stats.shape == (3, 2)
    np.testing.assert_allclose(stats.sum(axis=1), [28.0, 252.0, 2268.0])
    plain, _ = minibatches.minibatch_epochs(
        step, jnp.float32(0), batch, jax.random.PRNGKey(0), 3, 2
    )
    assert float(plain) == 84.0
