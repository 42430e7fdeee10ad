"""Greedy evaluation episodes run inside a compiled training program."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from envs.multi_agent import is_multi_agent


def greedy_episodes(env, env_params, act: Callable, key: jax.Array, num_episodes: int, carry=None):
    """Return and length of the first episode of each of `num_episodes` fresh envs.

    `act(obs[E, ...]) -> actions[E, ...]` is the (deterministic) policy on the batch of envs; a
    policy with memory passes its initial state for the E envs as `carry` and is called as
    `act(carry, obs) -> (carry, actions)`. Every env counts rewards until its first episode end
    (terminated or truncated); the loop stops once all have ended, after at most
    `max_steps_in_episode` steps (a `while_loop`, so short episodes cost little). Returns
    (returns[E], lengths[E]) as float32.

    For a multi-agent env (`envs.multi_agent`) the policy also reads the action masks,
    `act(obs[E, A, ...], mask[E, A, n]) -> actions[E, A]` (`act(carry, obs, mask)` with memory),
    the return is the team's (sum over steps of the mean reward over agents) and an env's episode
    ends at `info["episode_end"]`.
    """
    if is_multi_agent(env):
        return _team_greedy_episodes(env, env_params, act, key, num_episodes, carry)
    reset_key, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, num_episodes), env_params
    )
    max_steps = env_params.max_steps_in_episode
    zeros = jnp.zeros(num_episodes, jnp.float32)

    policy = (lambda memory, obs: (memory, act(obs))) if carry is None else act

    def running(loop_state):
        t, _, _, _, _, _, done, _ = loop_state
        return (t < max_steps) & ~jnp.all(done)

    def step(loop_state):
        t, obs, state, memory, returns, lengths, done, key = loop_state
        key, step_key = jax.random.split(key)
        keys = jax.random.split(step_key, num_episodes)
        memory, action = policy(memory, obs)
        obs, state, reward, terminated, truncated, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            keys, state, action, env_params
        )
        returns = returns + jnp.where(done, 0.0, reward)
        lengths = lengths + jnp.where(done, 0.0, 1.0)
        return t + 1, obs, state, memory, returns, lengths, done | terminated | truncated, key

    init = (
        jnp.int32(0),
        obs,
        state,
        () if carry is None else carry,
        zeros,
        zeros,
        jnp.zeros(num_episodes, jnp.bool_),
        key,
    )
    _, _, _, _, returns, lengths, _, _ = jax.lax.while_loop(running, step, init)
    return returns, lengths


def _team_greedy_episodes(env, env_params, act, key, num_episodes: int, carry=None):
    """`greedy_episodes` for a multi-agent env: masked acting, team returns, episode_end."""
    reset_key, key = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(reset_key, num_episodes), env_params
    )
    masks = jax.vmap(env.action_mask, in_axes=(0, None))
    policy = (lambda memory, obs, mask: (memory, act(obs, mask))) if carry is None else act
    zeros = jnp.zeros(num_episodes, jnp.float32)

    def running(loop_state):
        t, *_, done, _ = loop_state
        return (t < env_params.max_steps_in_episode) & ~jnp.all(done)

    def step(loop_state):
        t, obs, state, memory, returns, lengths, done, key = loop_state
        key, step_key = jax.random.split(key)
        memory, action = policy(memory, obs, masks(state, env_params))
        obs, state, reward, _, _, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(step_key, num_episodes), state, action, env_params
        )
        returns = returns + jnp.where(done, 0.0, reward.mean(axis=-1))
        lengths = lengths + jnp.where(done, 0.0, 1.0)
        return t + 1, obs, state, memory, returns, lengths, done | info["episode_end"], key

    memory = () if carry is None else carry
    done = jnp.zeros(num_episodes, jnp.bool_)
    init = (jnp.int32(0), obs, state, memory, zeros, zeros, done, key)
    _, _, _, _, returns, lengths, _, _ = jax.lax.while_loop(running, step, init)
    return returns, lengths
