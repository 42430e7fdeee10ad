"""Epochs of shuffled minibatches: a scan over epochs, each a scan over the minibatches of a fresh
random permutation of the batch; and the update epochs of an on-policy agent, an Adam step along a
loss's gradient per minibatch."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from rl.config.unrolling import unroll_of
from rl.core.optimizers import annealed_clipped_adam, flat_step


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


def adam_epochs(agent, hparams, loss: Callable, params, opt_state, batch, key):
    """An on-policy agent's update epochs (`agent`: a `PPOLoopConfig`): `minibatch_epochs` over
    `batch`, each minibatch one step of `optimizers.annealed_clipped_adam` (hparams["lr"] and
    ["max_grad_norm"], `agent.adam_eps`) on the flat parameter vector along the gradient of
    `loss(params, minibatch) -> (L, stats)`. Returns (params, opt_state, stats [num_epochs,
    num_minibatches])."""
    flat_params, unravel = ravel_pytree(params)
    adam = annealed_clipped_adam(agent, hparams["lr"], hparams["max_grad_norm"], eps=agent.adam_eps)

    def minibatch_step(carry, minibatch):
        flat_params, opt_state = carry
        grads, stats = jax.grad(loss, has_aux=True)(unravel(flat_params), minibatch)
        return flat_step(adam, flat_params, opt_state, ravel_pytree(grads)[0]), stats

    epochs = (agent.num_epochs, agent.num_minibatches, unroll_of(agent))
    (flat_params, opt_state), stats = minibatch_epochs(
        minibatch_step, (flat_params, opt_state), batch, key, *epochs
    )
    return unravel(flat_params), opt_state, stats
