"""Epochs of shuffled minibatches: a scan over epochs, each a scan over the minibatches of a fresh
random permutation of the batch."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def minibatch_epochs(
    minibatch_step: Callable,
    carry,
    batch,
    key,
    num_epochs: int,
    num_minibatches: int,
    unroll: int = 1,
    refresh: Callable | None = None,
):
    """`num_epochs` passes over `batch` (a pytree of arrays with a leading batch axis), each a
    `lax.scan` of `minibatch_step(carry, minibatch) -> (carry, stats)` over `num_minibatches`
    minibatches of a fresh random permutation (`unroll` steps per loop trip). With `refresh`, every
    epoch after the first passes over `refresh(carry, batch)` from the carry at its start instead.
    Returns (carry, stats [num_epochs, num_minibatches])."""
    size = jax.tree.leaves(batch)[0].shape[0]
    shape = (num_minibatches, size // num_minibatches)

    def epoch(carry, key, batch=batch):
        order = jax.random.permutation(key, size)
        minibatches = jax.tree.map(
            lambda x: jnp.take(x, order, axis=0).reshape(shape + x.shape[1:]), batch
        )
        return jax.lax.scan(minibatch_step, carry, minibatches, unroll=min(unroll, num_minibatches))

    keys = jax.random.split(key, num_epochs)
    if refresh is None or num_epochs == 1:
        return jax.lax.scan(epoch, carry, keys)
    carry, first = epoch(carry, keys[0])
    carry, rest = jax.lax.scan(
        lambda carry, key: epoch(carry, key, refresh(carry, batch)), carry, keys[1:]
    )
    return carry, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, rest)
