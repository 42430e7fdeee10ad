"""The pieces of a training loop that the agents share: the env they train on, exploration and
step-size schedules, target-network updates, the act-then-train phase of off-policy agents,
episode statistics and the scan over log points.

    env, env_params = loop.make_env(config)            # episode statistics; Box actions in [-1, 1]
    phase = loop.act_then_train(env_step, gradient_step, env_iterations, gradient_steps, learning_starts)
    state, metrics = loop.scan_log_points(log_period, state, num_log_points)

Every function is pure and traceable; none holds state between calls.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import envs
from envs.spaces import Box
from envs.wrappers import EpisodeStatistics, RescaleAction
from rl.logging import emit

# ---------------------------------------------------------------- the env an agent trains on


def make_env(config):
    """(env, env_params) for `config.env`, wrapped for training:

    - Box actions are rescaled: the agent acts in [-1, 1]^d, the env receives
      L + (clip(a, -1, 1) + 1) (H - L) / 2 (`envs.wrappers.RescaleAction`; needs finite bounds);
    - `envs.wrappers.EpisodeStatistics` reports each episode's undiscounted return and length in
      `info` when it ends (terminated or truncated).
    """
    env, env_params = envs.make(config.env.id, **dict(config.env.params))
    space = env.action_space(env_params)
    if isinstance(space, Box) and np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)):
        env = RescaleAction(env)
    return EpisodeStatistics(env), env_params


def batched(env):
    """(reset, step) of `env` vmapped over a leading env axis: `reset(keys[E], params)`,
    `step(keys[E], states, actions[E], params)`; params are shared."""
    return jax.vmap(env.reset, in_axes=(0, None)), jax.vmap(env.step, in_axes=(0, 0, 0, None))


# ---------------------------------------------------------------- schedules and exploration


def linear_schedule(start, end, duration, step):
    """start + (end - start) min(step / duration, 1): epsilon decay, PER's beta annealing to 1."""
    return start + (end - start) * jnp.minimum(step / duration, 1.0)


def epsilon_greedy(key, q_values, epsilon):
    """Per row of `q_values` [..., A]: a uniformly random action with probability epsilon, else
    argmax_a Q (first index on ties). int32 [...]."""
    k_explore, k_action = jax.random.split(key)
    explore = jax.random.uniform(k_explore, q_values.shape[:-1]) < epsilon
    random_action = jax.random.randint(k_action, q_values.shape[:-1], 0, q_values.shape[-1])
    return jnp.where(explore, random_action, jnp.argmax(q_values, axis=-1)).astype(jnp.int32)


def epsilon_greedy_random_ties(q_values, epsilon, explore_u, choice_u):
    """Epsilon-greedy over one row `q_values` [A] with uniformly random tie-breaking, from two
    uniforms in [0, 1).

    The candidates are every action if explore_u < epsilon, else the maximisers of Q; the action is
    candidate floor(choice_u * #candidates), so P(a) = epsilon / A + (1 - epsilon) [a maximal] / #maximal.
    """
    candidates = jnp.where(explore_u < epsilon, True, q_values == q_values.max())
    count = candidates.sum()
    pick = jnp.minimum(jnp.floor(choice_u * count).astype(jnp.int32), count - 1)
    rank = jnp.cumsum(candidates) - 1
    return jnp.argmax(candidates & (rank == pick)).astype(jnp.int32)


def clipped_adam(learning_rate, max_grad_norm, eps: float = 1e-8):
    """Adam (step size `learning_rate`: a value or a schedule of the update count) on gradients
    clipped to global norm `max_grad_norm`: g <- g min(1, max_grad_norm / ||g||)."""
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=eps))


# ---------------------------------------------------------------- target networks


def polyak(target, online, tau):
    """tau * online + (1 - tau) * target, leaf by leaf (tau = 1: a copy)."""
    return jax.tree.map(lambda t, o: tau * o + (1.0 - tau) * t, target, online)


def periodic_polyak(target, online, tau, do_update):
    """`polyak(target, online, tau)` where `do_update` (a traced bool), else `target` unchanged."""
    return jax.tree.map(lambda t, o: jnp.where(do_update, tau * o + (1.0 - tau) * t, t), target, online)


# ---------------------------------------------------------------- episode statistics


class EpisodeTotals(NamedTuple):
    """Sums over the episodes that ended in a period: return, length and how many ended."""

    returns: jax.Array
    lengths: jax.Array
    count: jax.Array


def no_episodes() -> EpisodeTotals:
    return EpisodeTotals(jnp.float32(0.0), jnp.int32(0), jnp.int32(0))


def add_episodes(totals: EpisodeTotals, info: dict) -> EpisodeTotals:
    """`totals` plus the episodes that end in `info` (from `EpisodeStatistics`, any batch shape):
    sum(done * episode_return), sum(done * episode_length), sum(done)."""
    done = info["episode_done"]
    return EpisodeTotals(
        totals.returns + jnp.sum(jnp.where(done, info["episode_return"], 0.0)),
        totals.lengths + jnp.sum(jnp.where(done, info["episode_length"], 0)),
        totals.count + jnp.sum(done.astype(jnp.int32)),
    )


def episode_metrics(totals: EpisodeTotals) -> dict:
    """Mean return and length of the episodes in `totals` (NaN if none ended) and their number."""
    some = totals.count > 0
    count = jnp.maximum(totals.count, 1)
    return {
        "episode_return": jnp.where(some, totals.returns / count, jnp.nan),
        "episode_length": jnp.where(some, totals.lengths / count, jnp.nan),
        "episodes": totals.count,
    }


# ---------------------------------------------------------------- off-policy phase and log points


def act_then_train(env_step: Callable, gradient_step: Callable, env_iterations: int, gradient_steps: int, learning_starts: int) -> Callable:
    """`phase((state, totals), key) -> ((state, totals), aux)`: `env_iterations` calls of
    `env_step((state, totals), key) -> ((state, totals), None)`, then, once
    state["step"] >= learning_starts, `gradient_steps` calls of `gradient_step(state, key) ->
    (state, aux)`; aux is stacked over the gradient steps ([gradient_steps, ...], NaN before learning)."""

    def train(state, key):
        return jax.lax.scan(gradient_step, state, jax.random.split(key, gradient_steps))

    def skip(state, key):
        shapes = jax.eval_shape(train, state, key)[1]
        return state, jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)

    def phase(carry, key):
        k_act, k_train = jax.random.split(key)
        (state, totals), _ = jax.lax.scan(env_step, carry, jax.random.split(k_act, env_iterations))
        state, aux = jax.lax.cond(state["step"] >= learning_starts, train, skip, state, k_train)
        return (state, totals), aux

    return phase


def scan_log_points(log_period: Callable, state, num_log_points: int):
    """`lax.scan` of `log_period(state) -> (state, metrics)` over `num_log_points` log points, each
    log point's metrics sent to the host sinks (`rl.logging.emit`). Returns (state, stacked metrics)."""

    def body(state, _):
        state, metrics = log_period(state)
        return state, emit(metrics)

    return jax.lax.scan(body, state, None, length=num_log_points)


def kernel_backend(config) -> str:
    """The kernel backend the agent passes to every kernels op: `config.kernels.backend`, or with
    "auto" the choice `kernels.resolve_backend` makes (the caller's own setting, then the device)."""
    import kernels

    choice = config.kernels.backend
    return kernels.resolve_backend(None if choice == "auto" else choice)
