"""Greedy evaluation episodes run inside a compiled training program."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def greedy_episodes(env, env_params, act: Callable, key: jax.Array, num_episodes: int):
    """Return and length of the first episode of each of `num_episodes` fresh envs.

    `act(obs[E, ...]) -> actions[E, ...]` is the (deterministic) policy on the batch of envs. Every env
    counts rewards until its first episode end (terminated or truncated); the loop stops once all have
    ended, after at most `max_steps_in_episode` steps (a `while_loop`, so short episodes cost little).
    Returns (returns[E], lengths[E]) as float32.
    """
    reset_key, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_episodes), env_params)
    max_steps = env_params.max_steps_in_episode
    zeros = jnp.zeros(num_episodes, jnp.float32)

    def running(carry):
        t, _, _, _, _, done, _ = carry
        return (t < max_steps) & ~jnp.all(done)

    def step(carry):
        t, obs, state, returns, lengths, done, key = carry
        key, step_key = jax.random.split(key)
        keys = jax.random.split(step_key, num_episodes)
        obs, state, reward, terminated, truncated, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(keys, state, act(obs), env_params)
        returns = returns + jnp.where(done, 0.0, reward)
        lengths = lengths + jnp.where(done, 0.0, 1.0)
        return t + 1, obs, state, returns, lengths, done | terminated | truncated, key

    init = (jnp.int32(0), obs, state, zeros, zeros, jnp.zeros(num_episodes, jnp.bool_), key)
    _, _, _, returns, lengths, _, _ = jax.lax.while_loop(running, step, init)
    return returns, lengths


def completed_episodes(rewards, dones, running_return, running_length):
    """Returns and lengths of the episodes that end inside a time-major rollout, with no loop over time.

    `rewards[T, ...]` and `dones[T, ...]` (an episode ended at step t: terminated or truncated);
    `running_return[...]`, `running_length[...]`: what each env's current episode had accumulated before
    the rollout. With C_t = r_0 + ... + r_t and k(t) the last step before t with a done (-1 if none),
    the episode that step t belongs to has, up to t,

        G_t = C_t - C_{k(t)} + [k(t) = -1] running_return,   L_t = t - k(t) + [k(t) = -1] running_length.

    Returns (sum of G_t over the done steps, sum of L_t over the done steps, number of done steps,
    G_{T-1} and L_{T-1} carried out: 0 where the last step ended an episode). Sums over the leading
    rollout axes; the carried values keep the env axes. Equal to accumulating step by step, up to the
    float rounding of the cumulative sum.
    """
    num_steps = rewards.shape[0]
    steps = jnp.arange(num_steps, dtype=jnp.int32).reshape((num_steps,) + (1,) * (rewards.ndim - 1))
    cumulative = jnp.cumsum(rewards, axis=0)
    last_done = jax.lax.cummax(jnp.where(dones, steps, -1), axis=0)
    previous_done = jnp.concatenate([jnp.full_like(last_done[:1], -1), last_done[:-1]])
    first_episode = previous_done < 0
    before = jnp.take_along_axis(cumulative, jnp.maximum(previous_done, 0), axis=0)
    returns = cumulative - jnp.where(first_episode, 0.0, before) + jnp.where(first_episode, running_return, 0.0)
    lengths = steps - previous_done + jnp.where(first_episode, running_length, 0)
    sum_return = jnp.sum(jnp.where(dones, returns, 0.0))
    sum_length = jnp.sum(jnp.where(dones, lengths, 0))
    episodes = jnp.sum(dones.astype(jnp.int32))
    carry_return = jnp.where(dones[-1], 0.0, returns[-1])
    carry_length = jnp.where(dones[-1], 0, lengths[-1])
    return sum_return, sum_length, episodes, carry_return, carry_length
