"""Optimisers and target networks: the global gradient norm, its clip as an optax transform (which
can take the norm computed already), Adam on clipped gradients (optionally with a linearly annealed
step size), and Polyak averaging of target networks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

import kernels
from rl.config.loops import OnPolicyLoopConfig


def global_norm(tree) -> jax.Array:
    """||g|| = sqrt(sum over every element of every leaf of g^2), as one reduction over the leaves
    concatenated (XLA fuses the concatenation into it: one kernel, not one per leaf)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.float32(0.0)
    return jnp.sqrt(
        jnp.sum(jnp.concatenate([jnp.square(jnp.ravel(g).astype(jnp.float32)) for g in leaves]))
    )


def clip_by_global_norm(max_norm) -> optax.GradientTransformationExtraArgs:
    """g <- g where ||g|| < max_norm, else g max_norm / ||g|| (`global_norm`); stateless. The same
    rule as `optax.clip_by_global_norm`, whose norm reduces each leaf apart. The extra argument
    `grad_sq_norm` (optional, passed through `optax.chain`) is ||g||^2 of the updates this transform
    receives, computed already: no norm pass. So the clip must come first in a chain given it."""

    def update(updates, state, params=None, *, grad_sq_norm=None, **extra_args):
        norm = global_norm(updates) if grad_sq_norm is None else jnp.sqrt(grad_sq_norm)
        return jax.tree.map(
            lambda g: jnp.where(norm < max_norm, g, g / norm.astype(g.dtype) * max_norm), updates
        ), state

    return optax.GradientTransformationExtraArgs(lambda params: optax.EmptyState(), update)


def clipped_adam(learning_rate, max_grad_norm, eps: float = 1e-8, b1: float = 0.9):
    """Adam (step size `learning_rate`: a value or a schedule of the update count; first-moment
    decay `b1`) on gradients clipped to global norm `max_grad_norm`:
    g <- g min(1, max_grad_norm / ||g||)."""
    return optax.chain(
        clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, b1=b1, eps=eps)
    )


def annealed_clipped_adam(agent: OnPolicyLoopConfig, lr, max_grad_norm, eps: float = 1e-5):
    """`clipped_adam` whose step size, with `agent.anneal_lr`, decays linearly to 0 over the run:
    lr (1 - update / num_updates), one update being num_epochs * num_minibatches Adam steps."""
    steps_per_update = agent.num_epochs * agent.num_minibatches

    def learning_rate(count):
        if not agent.anneal_lr:
            return lr
        return lr * (1.0 - (count // steps_per_update) / agent.num_updates)

    return clipped_adam(learning_rate, max_grad_norm, eps=eps)


def polyak(target, online, tau):
    """tau * online + (1 - tau) * target, leaf by leaf (tau = 1: a copy)."""
    return jax.tree.map(lambda t, o: tau * o + (1.0 - tau) * t, target, online)


def periodic_polyak(target, online, tau, do_update):
    """`polyak(target, online, tau)` where `do_update` (a traced bool), else `target` unchanged."""
    return jax.tree.map(
        lambda t, o: jnp.where(do_update, tau * o + (1.0 - tau) * t, t), target, online
    )


def flat_step(optimizer, flat_params, opt_state, grads, grad_sq_norm=None):
    """One step of `optimizer` on a flat parameter vector (`jax.flatten_util.ravel_pytree`): one
    fused update for all arrays instead of one per array. `grad_sq_norm` (optional) is ||grads||^2,
    computed already (by a fused gradient kernel): it reaches `clip_by_global_norm` as an optax
    extra argument, so the optimiser must start with that clip (as `clipped_adam` does), and no norm
    pass re-reads the gradient. Returns (flat_params, opt_state)."""
    optimizer = optax.with_extra_args_support(optimizer)
    extra = {} if grad_sq_norm is None else {"grad_sq_norm": grad_sq_norm}
    updates, opt_state = optimizer.update(grads, opt_state, flat_params, **extra)
    return optax.apply_updates(flat_params, updates), opt_state


def flat_clipped_adam_polyak(
    flat_params, opt_state, grads, grad_sq_norm, target, lr, max_grad_norm, tau, sync, backend,
    active=True,
):  # fmt: skip
    """`flat_step(clipped_adam(lr, max_grad_norm), ...)` then `periodic_polyak(target, params',
    tau, sync)` on flat vectors as one `kernels.adam_step` (one launch for every seed under
    `vmap`, or XLA's fused loop where the automatic backend choice measured that faster).
    `opt_state` keeps `clipped_adam`'s optax layout (clip, (Adam's count, mu and nu, step size)),
    so a run may switch between this and the optax step. `grad_sq_norm` is ||grads||^2 where a
    fused gradient kernel computed it, else None; where the traced bool `active` is false
    everything comes back unchanged. Returns (params', opt_state', target')."""
    clip_state, (adam_state, lr_state) = opt_state
    params, mu, nu, target, count = kernels.adam_step(
        flat_params, grads, adam_state.mu, adam_state.nu, adam_state.count, lr, max_grad_norm,
        sq_norm=grad_sq_norm, target=target, tau=tau, sync=sync, active=active, backend=backend,
    )  # fmt: skip
    adam_state = adam_state._replace(count=count, mu=mu, nu=nu)
    return params, (clip_state, (adam_state, lr_state)), target
