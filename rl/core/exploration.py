"""Exploration and schedules: linear schedules (epsilon decay, PER's beta) and epsilon-greedy
action choice over Q-values, with first-index or uniformly random tie-breaking, and its masked form
for envs with action masks (only available actions are chosen, greedily or at random)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def linear_schedule(start, end, duration, step):
    """start + (end - start) min(step / duration, 1): epsilon decay, PER's beta annealing to 1."""
    return start + (end - start) * jnp.minimum(step / duration, 1.0)


def epsilon_greedy(key, q_values, epsilon):
    """Per row of `q_values` [..., A]: a uniformly random action with probability epsilon, else
    argmax_a Q (first index on ties). int32 [...].

    Both choices come from one draw of two uniforms per row, (u, v) in [0, 1)^2: explore if
    u < epsilon, and the random action is floor(A v), uniform up to float32's 2^-23 grid of v
    (exactly uniform when A is a power of two)."""
    u = jax.random.uniform(key, q_values.shape[:-1] + (2,))
    num_actions = q_values.shape[-1]
    random_action = jnp.minimum(
        jnp.floor(u[..., 1] * num_actions).astype(jnp.int32), num_actions - 1
    )
    return jnp.where(u[..., 0] < epsilon, random_action, jnp.argmax(q_values, axis=-1)).astype(
        jnp.int32
    )


def epsilon_greedy_random_ties(q_values, epsilon, explore_u, choice_u):
    """Epsilon-greedy over one row `q_values` [A] with uniformly random tie-breaking, from two
    uniforms in [0, 1).

    The candidates are every action if explore_u < epsilon, else the maximisers of Q; the action is
    candidate floor(choice_u * #candidates), so

        P(a) = epsilon / A + (1 - epsilon) [a maximal] / #maximal.
    """
    candidates = jnp.where(explore_u < epsilon, True, q_values == q_values.max())
    count = candidates.sum()
    pick = jnp.minimum(jnp.floor(choice_u * count).astype(jnp.int32), count - 1)
    rank = jnp.cumsum(candidates) - 1
    return jnp.argmax(candidates & (rank == pick)).astype(jnp.int32)


def masked_argmax(q_values, mask):
    """argmax over the available actions of each row: argmax_{a: mask[..., a]} Q[..., a] (first
    index on ties). q_values [..., n], mask bool [..., n] with at least one True per row. int32
    [...]."""
    return jnp.argmax(jnp.where(mask, q_values, -jnp.inf), axis=-1).astype(jnp.int32)


def masked_epsilon_greedy(key, q_values, mask, epsilon):
    """Epsilon-greedy over the available actions: per row of `q_values` [..., n] and `mask` bool
    [..., n] (at least one True per row), a uniformly random available action with probability
    epsilon, else `masked_argmax`. int32 [...]. With m available actions,

        P(a) = [mask_a] (epsilon / m + (1 - epsilon) [a = argmax over available]),

    so an unavailable action is never chosen. Both choices come from one draw of two uniforms per
    row, (u, v) in [0, 1)^2: explore if u < epsilon; the random action is the k-th available one,
    k = floor(m v) (uniform up to float32's 2^-23 grid of v). With every action available this is
    `epsilon_greedy` draw for draw."""
    u = jax.random.uniform(key, q_values.shape[:-1] + (2,))
    count = mask.sum(axis=-1)
    pick = jnp.minimum(jnp.floor(u[..., 1] * count).astype(jnp.int32), count - 1)
    rank = jnp.cumsum(mask, axis=-1) - 1
    random_action = jnp.argmax(mask & (rank == pick[..., None]), axis=-1).astype(jnp.int32)
    return jnp.where(u[..., 0] < epsilon, random_action, masked_argmax(q_values, mask))
